"""The worker's decisions, free of I/O: which assignments to serve, how engine outputs
become request-path events, and which terminal event ends a request."""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from inferbus.contracts import (
    ChoiceEnd,
    FailureCode,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestStarted,
    StageTimings,
    TokenChunk,
    TokenLogprob,
    Usage,
    WorkAssigned,
    WorkerHeartbeat,
    WorkerState,
    request_failed,
)

from .engine import EngineOutput, EngineRequest, EngineStats, KvRestore


def served_name(assignment: WorkAssigned) -> str:
    """The name the request runs under: a canary's version, or the one asked for."""
    return assignment.served_model or assignment.request.model


def engine_request(
    assignment: WorkAssigned, adapter: str = "", weights: str = "", adapter_weights: str = ""
) -> EngineRequest:
    """What the engine runs. A continuation runs the output so far as more prompt,
    with the tokens it sent counted off ``max_tokens`` and ``min_tokens``."""
    r = assignment.request
    sampling, carried = r.sampling, carried_ids(assignment)
    if carried:
        sampling = msgspec.structs.replace(
            sampling,
            max_tokens=sampling.max_tokens - len(carried),
            min_tokens=max(0, sampling.min_tokens - len(carried)),
        )
    return EngineRequest(
        request_id=r.request_id,
        model=served_name(assignment),
        adapter=adapter,
        prompt=r.prompt,
        messages=r.messages,
        token_prompt=r.token_prompt,
        chat_template=r.chat_template,
        tools=r.tools,
        embed=r.embed,
        sampling=sampling,
        weights=weights,
        adapter_weights=adapter_weights,
        prompt_token_ids=r.prompt_token_ids,
        prompt_tokenizer=r.prompt_tokenizer,
        resume_ids=carried,
    )


def carried_ids(assignment: WorkAssigned) -> list[int]:
    """A continuation's output ids so far (empty for a first run)."""
    return assignment.resume.output_ids if assignment.resume is not None else []


def nothing_left(assignment: WorkAssigned) -> str:
    """A continuation whose earlier attempt sent its last token (the finish reason it
    ends with, else ""): it only ends the stream."""
    resume = assignment.resume
    if resume is None:
        return ""
    if resume.finish_reason:
        return resume.finish_reason
    done = resume.output_ids and len(resume.output_ids) >= assignment.request.sampling.max_tokens
    return "length" if done else ""


class ServedAssignments:
    """The assignments this worker took, so that one delivered again (its ack was lost
    when a NATS node went away, or JetStream redelivered it) is served once."""

    def __init__(self, remember: int = 100_000) -> None:
        self.remember = remember
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def take(self, assignment: WorkAssigned, running: bool) -> bool:
        """Whether to serve it: not while its request runs here, nor an attempt this
        worker served already (the oldest are forgotten past ``remember``)."""
        key = (assignment.request.request_id, assignment.attempt)
        if running or key in self._seen:
            return False
        self._remember(key)
        return True

    def refuse(self, request_id: str, attempt: int) -> None:
        """Never serve this attempt: the scheduler gave up on it (a cancel of that
        attempt can come before its assignment to a worker that was stalled)."""
        self._remember((request_id, attempt))

    def _remember(self, key: tuple[str, int]) -> None:
        self._seen[key] = None
        if len(self._seen) > self.remember:
            self._seen.popitem(last=False)


def expires_in(assignment: WorkAssigned, wall: float) -> float | None:
    """Seconds until the request's deadline (0 when past; None: it has none). The
    worker ends it then, whoever else is watching the clock."""
    deadline = assignment.request.deadline
    return max(0.0, deadline - wall) if deadline else None


Terminal = RequestFinished | RequestFailed | RequestCancelled


class RequestStream:
    """Numbers the chunks of one request and closes it with exactly one terminal event.

    ``started`` is emitted before the first chunk so the scheduler knows that a lost
    worker had begun streaming (and the request can no longer be silently retried).
    """

    __slots__ = (
        "assignment",
        "carried",
        "ends",
        "first_token_at",
        "migratable",
        "prompt_ids_given",
        "prompt_logprobs",
        "restored",
        "seq",
        "served_model",
        "started_at",
        "worker_id",
    )

    def __init__(
        self, assignment: WorkAssigned, worker_id: str, now: float, served_model: str = ""
    ) -> None:
        self.assignment = assignment
        self.served_model = served_model
        """The version that answers it (``name@version``), for its end."""
        self.worker_id = worker_id
        resume = assignment.resume
        self.seq = resume.next_seq if resume is not None else 0
        self.carried = len(carried_ids(assignment))
        """Output tokens earlier attempts streamed (a continuation's)."""
        self.migratable = False
        """It sends the scheduler a copy of each chunk (set before it starts)."""
        self.started_at = now
        self.first_token_at: float | None = None
        self.restored: KvRestore | None = None
        """What its prefix restored from a KV spill tier (set at its end)."""
        self.prompt_ids_given = False
        """The engine ran the sanitizer's prompt ids rather than tokenizing again."""
        self.ends: dict[int, ChoiceEnd] = {}
        """Each choice's end and token count so far, by index."""
        if self.carried:
            self.ends[0] = ChoiceEnd(index=0, finish_reason="", completion_tokens=self.carried)
        self.prompt_logprobs: list[TokenLogprob] = []

    @property
    def request_id(self) -> str:
        return self.assignment.request.request_id

    @property
    def resumed(self) -> bool:
        """A continuation of a stream an earlier attempt began on another worker."""
        return self.assignment.resume is not None

    @property
    def resumed_from(self) -> int | None:
        """A continuation's first ``seq`` of its own (what its readers check theirs by)."""
        resume = self.assignment.resume
        return resume.next_seq if resume is not None else None

    def started(self, now: float) -> RequestStarted | None:
        if self.first_token_at is not None:
            return None
        self.first_token_at = now
        return RequestStarted(
            request_id=self.request_id,
            worker_id=self.worker_id,
            attempt=self.assignment.attempt,
            resumed=self.resumed,
            migratable=self.migratable,
        )

    def replay(self) -> TokenChunk | None:
        """A continuation's first chunk: the last one the earlier attempt sent, again
        (a reader that has it drops it by its ``seq``; one whose copy was lost with the
        worker gets it now)."""
        resume = self.assignment.resume
        if resume is None or resume.last_chunk is None:
            return None
        return msgspec.structs.replace(
            resume.last_chunk,
            attempt=self.assignment.attempt,
            resumed=True,
            resumed_from=self.resumed_from,
        )

    def chunk(self, out: EngineOutput) -> TokenChunk | None:
        end = self.ends.get(out.index)
        if end is None:
            end = self.ends[out.index] = ChoiceEnd(index=out.index, finish_reason="")
        end.completion_tokens += len(out.token_ids)
        if out.choice_finish_reason is not None:
            end.finish_reason = _finish(out.choice_finish_reason)
            end.stop_reason = out.stop_reason
        if out.embedding:
            end.embedding = out.embedding
        if out.prompt_logprobs:
            self.prompt_logprobs = out.prompt_logprobs
        if not out.text and not out.token_ids and not out.tool_calls and not out.reasoning:
            return None
        chunk = TokenChunk(
            request_id=self.request_id,
            seq=self.seq,
            text=out.text,
            token_ids=out.token_ids,
            attempt=self.assignment.attempt,
            index=out.index,
            logprobs=out.logprobs,
            tool_calls=out.tool_calls,
            reasoning=out.reasoning,
            resumed=self.resumed,
            resumed_from=self.resumed_from,
        )
        self.seq += 1
        return chunk

    def finished(self, out: EngineOutput, now: float) -> RequestFinished:
        """The request's end, after ``chunk`` took its last output. A choice whose end
        the engine did not name ended with the request (``out.finish_reason``)."""
        n = max(self.assignment.request.sampling.n, len(self.ends))
        ends = []
        for i in range(n):
            end = self.ends.get(i) or ChoiceEnd(index=i, finish_reason="")
            if not end.finish_reason:
                end.finish_reason = _finish(out.finish_reason)
            end.prompt_logprobs = self.prompt_logprobs
            ends.append(end)
        # a continuation's engine saw the output so far as prompt: the client's usage
        # counts it as output, as the first attempt would have
        prompt = max(0, out.prompt_tokens - self.carried)
        return RequestFinished(
            request_id=self.request_id,
            finish_reason="length" if ends[0].finish_reason == "length" else "stop",
            choices=ends,
            usage=Usage(
                prompt_tokens=prompt,
                completion_tokens=out.completion_tokens + self.carried,
                cached_prompt_tokens=min(out.cached_tokens, prompt),
            ),
            chunks=self.seq,
            worker_id=self.worker_id,
            attempt=self.assignment.attempt,
            timings=out.timings or self.timings(now),
            served_model=self.served_model,
            resumed=self.resumed,
            resumed_from=self.resumed_from,
        )

    @property
    def end_record_id(self) -> str:
        """The Nats-Msg-Id of its end on ``ib.req.ended``: a later attempt's end is
        recorded too (one of an attempt given up on may have come first, and readers
        follow the newest attempt)."""
        rid, attempt = self.request_id, self.assignment.attempt
        return f"{rid}:end" if attempt == 1 else f"{rid}:end:{attempt}"

    def stopped(self, *, expired: bool, cancel_reason: str | None) -> Terminal:
        """The end of a generation stopped before it finished: its deadline passed
        (first: the timer fired, whatever else came), a cancel, else the worker's own
        shutdown (retryable)."""
        if expired:
            return self.failed(
                FailureCode.DEADLINE_EXCEEDED,
                f"the request's deadline passed after {self.seq} chunks",
            )
        if cancel_reason is None:
            return self.failed(
                FailureCode.WORKER_SHUTDOWN,
                "the worker shut down before the request finished; retry it",
            )
        return RequestCancelled(
            request_id=self.request_id, reason=cancel_reason, attempt=self.assignment.attempt
        )

    def failed(self, code: str, reason: str) -> RequestFailed:
        """A failure of this attempt, naming the version it ran on."""
        failed = request_failed(self.request_id, code, reason)
        failed.attempt = self.assignment.attempt  # a newer attempt's reader ignores it
        failed.served_model = self.served_model
        return failed

    def unfinished(self) -> RequestFailed:
        """The engine's outputs ended without a finish reason."""
        return self.failed(FailureCode.ENGINE_ERROR, "engine ended without a finish reason")

    def backup_end(self) -> RequestFailed:
        """What the client hears directly when the output filter may have lost the end."""
        return self.failed(
            FailureCode.STREAM_INTERRUPTED,
            "the output filter did not pass this stream's end on (it may have restarted): "
            "the text may be incomplete; submit the request again",
        )

    def timings(self, now: float) -> StageTimings:
        """Timings seen from the worker, for engines that report none of their own."""
        first = self.first_token_at if self.first_token_at is not None else now
        return StageTimings(first_token_s=first - self.started_at, decode_s=now - first)


def _finish(reason: str | None) -> str:
    """An engine's finish reason as the contract's: ``length``, ``tool_calls`` (the
    engine's parser found calls), else ``stop``."""
    return reason if reason in ("length", "tool_calls") else "stop"


class Voice:
    """When this worker last spoke to the scheduler (a heartbeat, a chunk's copy) and
    how often it fell silent past a lease: after such a silence the scheduler may have
    moved its streams, so each one syncs with the bus (and hears any stop) before it
    streams on. A silence is counted when the worker speaks again, whatever speaks
    first."""

    def __init__(self, now: float) -> None:
        self.last = now
        self.silences = 0

    def spoke(self, now: float, lease_s: float) -> None:
        if lease_s and now - self.last > lease_s:
            self.silences += 1
        self.last = max(self.last, now)

    def must_sync(self, now: float, lease_s: float, seen: int, synced_at: float = 0.0) -> bool:
        """Whether a stream that last synced at ``synced_at`` (silence count ``seen``)
        checks first."""
        quiet = now - max(self.last, synced_at)
        return bool(lease_s) and (quiet > lease_s or self.silences != seen)


class StallWatch:
    """How long the engine has produced nothing while requests stream on it: a hung
    engine is moved away from (the scheduler) and restarted (the worker exits, so its
    supervisor or Kubernetes starts a fresh one), not waited on."""

    def __init__(self, now: float) -> None:
        self.last = now

    def progressed(self, now: float) -> None:
        self.last = now

    def stalled_s(self, now: float, streaming: int) -> float:
        """0 while nothing streams (an idle engine, or one prefilling a first token)."""
        if not streaming:
            self.last = now
            return 0.0
        return max(0.0, now - self.last)


class CostMeter:
    """What a prompt token costs this worker to compute and to restore from a KV spill
    tier, from its requests' ends (moving averages): the scheduler weighs restorable
    prefixes by it."""

    MIN_TOKENS = 16
    """Fewer computed tokens than this say more about the step than about prefill."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.prefill_s_per_token = 0.0
        self.restore_s_per_token = 0.0

    def observe(
        self, prefill_s: float, prompt_tokens: int, cached_tokens: int, restored: KvRestore | None
    ) -> None:
        restore_s = restored.seconds if restored is not None and restored.timed else 0.0
        computed = prompt_tokens - cached_tokens
        if computed >= self.MIN_TOKENS and prefill_s > restore_s:
            self.prefill_s_per_token = self._avg(
                self.prefill_s_per_token, (prefill_s - restore_s) / computed
            )
        if restored is not None and restored.timed and restored.tokens and restore_s > 0:
            self.restore_s_per_token = self._avg(
                self.restore_s_per_token, restore_s / restored.tokens
            )

    def _avg(self, old: float, new: float) -> float:
        return new if old == 0.0 else old + self.alpha * (new - old)


def heartbeat(
    *,
    worker_id: str,
    engine_name: str,
    models: list[str],
    max_num_seqs: int,
    state: WorkerState,
    stats: EngineStats,
    inflight: list[str],
    interval_s: float,
    now: float,
    reason: str = "",
    adapters: list[str] | None = None,
    max_model_len: int = 0,
    kv_capacity_tokens: int = 0,
    kv_block_size: int = 0,
    versions: dict[str, str] | None = None,
    loading: str = "",
    costs: CostMeter | None = None,
    stalled_s: float = 0.0,
    handover: list[str] | None = None,
    telling: list[str] | None = None,
) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=worker_id,
        models=models,
        engine=engine_name,
        state=state,
        reason=reason,
        max_num_seqs=max_num_seqs,
        running=stats.running,
        waiting=stats.waiting,
        inflight=inflight,
        interval_s=interval_s,
        sent_at=now,
        kv_cache_usage=stats.kv_cache_usage,
        prefix_cache_hits=stats.prefix_cache_hits,
        prefix_cache_queries=stats.prefix_cache_queries,
        adapters=adapters or [],
        max_model_len=max_model_len,
        kv_capacity_tokens=kv_capacity_tokens,
        kv_block_size=kv_block_size,
        versions=versions or {},
        loading=loading,
        prefill_s_per_token=costs.prefill_s_per_token if costs else 0.0,
        kv_restore_s_per_token=costs.restore_s_per_token if costs else 0.0,
        stalled_s=stalled_s,
        handover=handover or [],
        telling=telling or [],
    )
