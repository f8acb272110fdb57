"""The scheduler's decisions as a state machine with no I/O.

Fed events with the time as a parameter; returns effects for the adapter to carry
out: per-model queues in lanes (``lanes.py``), placement on live workers that serve
the model and have room (slots and KV tokens), routed by the strategy
``SchedulerPolicy.routing`` names (``routing.py``), reassignment of work a lost
worker had not started, and of work it was streaming as a continuation from the
last chunk its worker reported (``migration.py``); a clear failure for what cannot
move.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from inferbus.contracts import (
    HANDOVER_FRESH_S,
    FailureCode,
    KvEvent,
    LLMServiceSettings,
    ModelLoad,
    RequestSubmitted,
    Resume,
    Terminal,
    TokenChunk,
    WorkAssigned,
    WorkerHeartbeat,
)

from .effects import Assign, Cancel, Effect, Fail, HandOff, Refuse, Retell, Supersede
from .goodput import Fleet, slo_s
from .kvindex import KvIndex, prefix_blocks
from .lanes import ModelQueue, cost_tokens, prompt_tokens
from .migration import Progress, unmovable
from .pool import Pool
from .routing import Fits, Router, make_router
from .state import (
    Inflight,
    Queued,
    RecordedEnd,
    SchedulerPolicy,
    UntoldEnd,
    Worker,
    restore_worth,
)

__all__ = [
    "Assign",
    "Cancel",
    "Effect",
    "Fail",
    "HandOff",
    "Inflight",
    "Queued",
    "RecordedEnd",
    "Refuse",
    "Retell",
    "SchedulerCore",
    "SchedulerPolicy",
    "Supersede",
    "UntoldEnd",
    "Worker",
    "restore_worth",
]


UNTOLD_SPAN_S = 10.0
"""An end a frozen worker never sent was recorded at most this long before its last
record: a live worker sends an end milliseconds after recording it, and its heartbeats
list what it is still telling (``restore`` keeps ends this recent as untold)."""


def _attempt(end: Terminal) -> int:
    """The attempt an end names (0: none, as a rejection's or the scheduler's)."""
    return int(getattr(end, "attempt", 0))


class SchedulerCore:
    def __init__(self, policy: SchedulerPolicy | None = None) -> None:
        self.policy = policy or SchedulerPolicy()
        self.workers: dict[str, Worker] = {}
        self._pools: dict[str, Pool] = {}
        """Model → its ready workers (``pool.py``), built when first needed after a
        worker joined, left, or changed state or models."""
        self._changes = 0
        """Counts what may let a queued request be placed: a worker's books, who is in
        a pool, what is queued."""
        self._stuck: dict[str, int] = {}
        """Model → ``_changes`` when a pass over its queue last placed nothing: a
        heartbeat that changed nothing does not try again (a tick does)."""
        self.queues: dict[str, ModelQueue] = {}
        self.inflight: dict[str, Inflight] = {}
        self._queued_ids: set[str] = set()
        self._ended: OrderedDict[str, tuple[str, float] | None] = OrderedDict()
        self._copies: OrderedDict[str, str] = OrderedDict()
        """Request id → the accepted copy it was taken from (its Nats-Msg-Id: where
        its submit is stored), to tell a resend from a redelivery once it ended."""
        """Recently ended ids → the identity of their request, when known."""
        self._arrivals = 0
        self._cancelled_unseen: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        """Cancels that came before their request (id → reason): a client that went
        away while its request was still in the sanitizer."""
        self._stalled: OrderedDict[str, None] = OrderedDict()
        self._stopped_on: dict[str, dict[str, tuple[int, RequestSubmitted]]] = {}
        """Worker → the attempts taken from it (request id → attempt, request) while it
        may still run them: its stop went out on core NATS, which a worker cut off at
        the time never got, so it goes again while the worker says it runs them."""
        """Workers whose engines hung: never given work again (a restart is a new id)."""
        self.kv = KvIndex(self.policy.approx_cache_blocks)
        self.router: Router = make_router(self.policy, self.kv)
        """The routing strategy ``policy.routing`` names (ValueError for an unknown one)."""
        self._kv_orphans: dict[str, float] = {}
        self.canaries: dict[str, dict[str, float]] = {}
        """model → {other model name: share of its requests}."""
        self.routed_blocks = 0
        self.routed_hits = 0
        """Prefix blocks of routed requests, and those already on the chosen worker."""
        self.routed_exact = 0
        """Routed blocks in the engine's own hashes (the rest were text blocks)."""
        self._dispatched: dict[str, int] = {}
        self._rates: dict[str, tuple[float, int, float]] = {}
        """model → (time, dispatched count, smoothed dispatch rate) at the last load()."""
        self._scaling: dict[str, tuple[int, float]] = {}
        """Model → (the autoscaler's target, until when that word holds)."""
        self.objectives: dict[str, float] = {}
        """model → the TTFT SLO its LLMService sets (``set_objective``)."""

    # -- inputs ----------------------------------------------------------------------

    def on_accepted(
        self,
        request: RequestSubmitted,
        now: float,
        wall: float | None = None,
        redelivered: bool = False,
        copy: str = "",
    ) -> list[Effect]:
        """``wall`` is the Unix time matching ``now``, to place the request's deadline.
        ``redelivered``: JetStream delivered this message before. ``copy``: which
        stored copy of the request this is (the accepted event's Nats-Msg-Id)."""
        rid = request.request_id
        if self.knows(rid):
            resent = rid in self._ended and self._copies.get(rid, copy) != copy
            if redelivered or (self._same_request(request) and not resent):
                # a redelivery, or a resend of one still running (its sender hears its
                # events on the same reply subject): idempotent
                return []
            # the id was reused (past JetStream's duplicate window), or its first use is
            # unknown here (it ended before we saw it): without an answer this sender
            # would wait forever
            return [
                Refuse(
                    request=request,
                    code=FailureCode.DUPLICATE_REQUEST,
                    reason=f"request id {request.request_id!r} was already used; "
                    "submit with a new id",
                )
            ]
        if copy:
            self._copies[rid] = copy
            if len(self._copies) > self.policy.remember_ended:
                self._copies.popitem(last=False)
        unseen = self._cancelled_unseen.pop(request.request_id, None)
        if unseen is not None and unseen[1] in (None, request.tenant):
            self._remember_ended(request.request_id, request)
            return [Cancel(request=request, reason=unseen[0])]
        deadline = float("inf")
        if request.deadline:
            deadline = now + (request.deadline - (now if wall is None else wall))
            if deadline <= now:
                self._remember_ended(request.request_id, request)
                return [self._deadline_fail(request, "before it was queued")]
        queued = len(self.queues.get(request.model, ()))
        room: list[Effect] = []
        if queued >= self.policy.max_queue_per_model:
            evicted = self._make_room(request)
            if evicted is None:
                self._remember_ended(request.request_id, request)
                return [
                    Fail.of(
                        request,
                        FailureCode.QUEUE_FULL,
                        f"{queued} requests for {request.model!r} are already waiting; retry later",
                    )
                ]
            room.append(evicted)
        objective = self.slo(request)
        item = Queued(
            request=request,
            since=now,
            order=self._arrivals + 1,
            deadline=deadline,
            due=now + objective,
        )
        if self.policy.admit_by_slo:
            refused = self._admit(item, now, min(objective, deadline - now))
            if refused is not None:
                self._remember_ended(request.request_id, request)
                return [refused]
        self._arrivals += 1
        self._enqueue(item)
        return room + self._dispatch(now)

    def _make_room(self, request: RequestSubmitted) -> Effect | None:
        """A full queue takes ``request`` only from a tenant holding less of it than
        the tenant holding most, whose newest waiting request then ends ``queue_full``
        (longest-queue drop): one tenant's flood cannot refuse the others (issue 42
        item 9), and with one tenant a full queue refuses as before."""
        queue = self.queues.get(request.model)
        held = queue.held_by() if queue is not None else {}
        if not held:
            return None
        mine = held.get(request.tenant, 0)
        hog = max(held, key=lambda t: (held[t], t))
        if held[hog] <= mine + 1:
            return None
        victim = queue.newest_of(hog) if queue is not None else None
        if victim is None:
            return None
        rid = victim.request.request_id
        self._drop_queued(rid)
        self._remember_ended(rid, victim.request)
        return Fail.of(
            victim.request,
            FailureCode.QUEUE_FULL,
            f"the queue for {request.model!r} is full and tenant {hog!r} holds most of it "
            f"({held[hog]} requests): its newest made room for another tenant's; retry later",
        )

    def slo(self, request: RequestSubmitted) -> float:
        """Its TTFT objective in seconds (inf: none)."""
        p = self.policy
        return slo_s(
            prompt_tokens(request),
            request.priority,
            self.objective(request.model),
            p.slo_prefill_tokens_per_s,
        )

    def objective(self, model: str) -> float:
        """``model``'s TTFT objective before its prompt's share: its LLMService's, else
        the policy's ``ttft_slo_s``."""
        return self.objectives.get(model, self.policy.ttft_slo_s)

    def set_objective(self, model: str, ttft_slo_s: float | None) -> None:
        """An LLMService's TTFT SLO for ``model`` (the one its autoscaling sizes for);
        None: the policy's again (the service removed, or without one)."""
        if ttft_slo_s is None:
            self.objectives.pop(model, None)
        else:
            self.objectives[model] = ttft_slo_s

    def on_service(self, record: LLMServiceSettings) -> float | None:
        """An LLMService's record: its TTFT SLO becomes its model's objective (the
        one admission judges by is the one the autoscaler sizes for); returns it
        (None: the policy's). A SLO of 0 or less is refused (ValueError)."""
        slo = None if record.removed or record.scaling is None else record.scaling.ttft_slo_s
        if slo is not None and slo <= 0:
            raise ValueError(f"ttft_slo_s {slo} (must be positive)")
        self.set_objective(record.model, slo)
        return slo

    def _admit(self, item: Queued, now: float, limit: float) -> Fail | None:
        """Refused now when the fleet would not start it within ``limit`` seconds:
        served late it would count as missed anyway, and hold others back."""
        if limit == float("inf"):
            return None
        request = item.request
        fleet = self.fleet(request.model, self._ahead_of(item))
        rate = self.policy.slo_prefill_tokens_per_s
        granted = prompt_tokens(request) / rate if rate > 0 else 0.0
        wait = None if fleet.idle else fleet.wait(prompt_tokens(request), granted)
        if wait is None or wait <= limit:
            return None
        return Fail.of(
            request,
            FailureCode.OVERLOADED,
            f"the workers serving {request.model!r} would start it in about {wait:.1f}s, "
            f"past its {limit:.1f}s objective; retry later or elsewhere",
            retry_after_s=min(60.0, max(1.0, wait - limit)),
        )

    def _ahead_of(self, item: Queued) -> Callable[[Queued], bool]:
        """Which queued requests go before ``item``, as the queue orders them."""
        q = self.queues.get(item.request.model)
        if q is not None and q.lanes and q.lane_of(item) == "short":
            return lambda other: q.lane_of(other) == "short"
        return lambda other: True

    def fleet(self, model: str, ahead: Callable[[Queued], bool] = lambda _: True) -> Fleet:
        """What stands ahead of a new request for ``model`` (``ahead``: the queued
        requests that go before it) and how fast it goes."""
        pool = self._pool(model)
        out = Fleet(
            workers=len(pool),
            pending=pool.pending,
            least_pending=pool.least_pending,
            slots=pool.slots,
            free_seqs=pool.free_seqs,
            hold_s=pool.hold_sum / pool.holds_measured if pool.holds_measured else None,
        )
        # a worker not measured yet (never saturated) goes about as fast as the rest
        if pool.rates_measured:
            out.prefill_rate = pool.rate_sum / pool.rates_measured * out.workers
        for item in self.queues.get(model, ()):
            if ahead(item):
                out.prefill_ahead += prompt_tokens(item.request)
                out.queued_seqs += item.request.sampling.n
        return out

    def on_heartbeat(
        self, hb: WorkerHeartbeat, now: float, wall: float | None = None
    ) -> list[Effect]:
        """``wall``: the Unix time matching ``now`` (a handover asked longer ago than
        ``HANDOVER_FRESH_S`` is not acted on: its worker streams on by then)."""
        known = self.workers.get(hb.worker_id)
        if known is not None and known.untold:  # said sent by now: no longer ours to tell
            # a heartbeat sent before the request reached the worker lists it nowhere
            # either, and heartbeats and ends come on different subscriptions: only one
            # read a heartbeat interval after the end vouches for it
            listed = set(hb.inflight).union(hb.telling)
            known.untold = {
                r: u
                for r, u in known.untold.items()
                if r in listed or now - u.read_at < known.interval_s
            }
        if hb.state in ("stopped", "failed"):
            return self._lose_worker(hb.worker_id, now, hb.state) + self._dispatch(now)
        if hb.worker_id in self._stalled:
            return []  # its engine hung: it gets nothing until it restarts (a new id)
        stall = self.policy.engine_stall_s
        if stall and hb.stalled_s > stall:  # a hung engine: moved from, not waited on
            self._stalled[hb.worker_id] = None
            if len(self._stalled) > self.policy.remember_ended:
                self._stalled.popitem(last=False)
            return self._lose_worker(hb.worker_id, now, "stalled") + self._dispatch(now)
        w = self.workers.get(hb.worker_id)
        joined = w is None or w.state != hb.state or w.models != list(hb.models)
        if w is None:
            w = self.workers[hb.worker_id] = Worker(
                worker_id=hb.worker_id,
                models=list(hb.models),
                max_num_seqs=hb.max_num_seqs,
                state=hb.state,
                last_seen=now,
                engine=hb.engine,
                kv_capacity_tokens=hb.kv_capacity_tokens,
            )
        else:
            w.models, w.max_num_seqs, w.state, w.last_seen, w.kv_capacity_tokens = (
                list(hb.models),
                hb.max_num_seqs,
                hb.state,
                now,
                hb.kv_capacity_tokens,
            )
        w.interval_s = hb.interval_s
        w.foreign = {rid for rid in hb.inflight if rid not in w.assigned and rid not in self._ended}
        w.spill_weight = restore_worth(hb.prefill_s_per_token, hb.kv_restore_s_per_token)
        w.rates.reported = 1.0 / hb.prefill_s_per_token if hb.prefill_s_per_token > 0 else None
        if joined:
            self._regroup()
        else:
            self._touch(w)
        if hb.kv_block_size:
            self.kv.set_block_size(hb.worker_id, hb.kv_block_size)
        fresh = wall is None or not hb.sent_at or wall - hb.sent_at <= HANDOVER_FRESH_S
        moved = self._hand_over(w, hb.handover, now) if hb.handover and fresh else []
        return self._stop_again(hb) + moved + self._dispatch(now, skip_unchanged=True)

    def _stop_again(self, hb: WorkerHeartbeat) -> list[Effect]:
        """The stops of attempts taken from this worker that it still says it runs."""
        stopped = self._stopped_on.get(hb.worker_id)
        if not stopped:
            return []
        running = set(hb.inflight)
        for rid in [r for r in stopped if r not in running]:
            del stopped[rid]
        if not stopped:
            del self._stopped_on[hb.worker_id]
            return []
        return [
            Supersede(request=request, worker_id=hb.worker_id, attempt=attempt)
            for attempt, request in stopped.values()
        ]

    def _stopping(self, request: RequestSubmitted, worker_id: str, attempt: int) -> Supersede:
        """The stop of ``attempt`` on ``worker_id``, kept to send again (``_stop_again``)."""
        stopped = self._stopped_on.setdefault(worker_id, {})
        stopped[request.request_id] = (attempt, request)
        if len(stopped) > self.policy.remember_ended:
            del stopped[next(iter(stopped))]
        return Supersede(request=request, worker_id=worker_id, attempt=attempt)

    def _hand_over(self, w: Worker, request_ids: list[str], now: float) -> list[Effect]:
        """A draining worker's streams, moved where other workers have seats for them
        (the rest it finishes)."""
        effects: list[Effect] = []
        seats: dict[str, int] = {}
        for rid in request_ids:
            f = self.inflight.get(rid)
            if f is None or f.worker_id != w.worker_id or not f.started:
                continue
            target = f.target or f.request.model
            if target not in seats:
                seats[target] = self._seats_elsewhere(target, w.worker_id)
            if self._why_not_moved(f) or seats[target] < f.request.sampling.n:
                continue  # it runs to its end where it is
            seats[target] -= f.request.sampling.n
            effects += self._take_off(w, f, now, "drain")
        return effects

    def _take_off(self, w: Worker, f: Inflight, now: float, cause: str) -> list[Effect]:
        """Move ``f`` off ``w``, which stays: its slot is free again."""
        del self.inflight[f.request.request_id]
        self._release(w, f)
        return self._move(f, w.worker_id, now, cause)

    def _seats_elsewhere(self, target: str, worker_id: str) -> int:
        """Free sequence slots on the other ready workers serving ``target``."""
        return sum(
            max(0, x.max_num_seqs - x.assigned_seqs - len(x.foreign))
            for x in self.workers.values()
            if x.worker_id != worker_id and x.state == "ready" and target in x.models
        )

    def restore(
        self,
        assignments: list[tuple[RequestSubmitted, str, int]],
        ended: Mapping[str, Sequence[RecordedEnd]],
        now: float,
    ) -> None:
        """Take back what a scheduler before a restart had placed and not seen end
        ((request, worker, attempt), oldest first): it holds its slots, and if its worker
        is lost it ends ``worker_lost`` (retryable; whether it had started is unknown,
        so it is never silently run twice), unless the progress its worker sent since
        covers the whole stream (it began after the restart): then it moves.

        What did end may not have been told: a worker frozen between its record and
        its send tells it no more, and the scheduler that kept it untold (``on_ended``)
        is gone. Each worker's latest ends are kept with it as if read now: a heartbeat
        an interval later clears those it sent, and its loss sends the rest.
        ``ended``: every end on record for a request (a worker's per attempt, the
        scheduler's or the sanitizer's with attempt 0), with when each was stored."""
        latest: dict[str, tuple[RequestSubmitted, str, int]] = {}
        for request, worker_id, attempt in assignments:
            latest[request.request_id] = (request, worker_id, attempt)

        def over(ends: Sequence[RecordedEnd], attempt: int) -> bool:
            # an abandoned attempt's late end (recorded under its own id, maybe first)
            # ends nothing: the latest attempt runs on, as in ``on_ended``
            return any(not 0 < _attempt(r.end) < attempt for r in ends)

        for rid, ends in ended.items():
            held = latest.get(rid)
            if held is None or over(ends, held[2]):
                self._remember_ended(rid)
        recorded: dict[str, list[tuple[float, UntoldEnd]]] = {}
        for rid, (request, worker_id, attempt) in latest.items():
            ends = ended.get(rid, ())
            own = [r for r in ends if _attempt(r.end) == attempt]
            if own:  # its worker's own end, which it may not have sent
                first = min(own, key=lambda r: r.at)
                told = UntoldEnd(request, first.end, now, restored=True)
                recorded.setdefault(worker_id, []).append((first.at, told))
            if over(ends, attempt) or self.knows(rid):
                continue
            w = self._known_or_placeholder(worker_id, now)
            self._arrivals += 1
            tokens = cost_tokens(request)
            w.assigned.add(rid)
            w.assigned_tokens += tokens
            w.assigned_seqs += request.sampling.n
            self._touch(w)
            self.inflight[rid] = Inflight(
                request=request,
                worker_id=worker_id,
                attempt=attempt,
                assigned_at=now,
                order=self._arrivals,
                started=True,
                tokens=tokens,
                unmovable=unmovable(request) if self.policy.migrate else "migration is off",
            )
        for worker_id, its in recorded.items():
            last = max(at for at, _ in its)
            w = self._known_or_placeholder(worker_id, now)
            for at, told in sorted(its, key=lambda e: e[0]):
                if at >= last - UNTOLD_SPAN_S:
                    w.untold.setdefault(told.request.request_id, told)
            while len(w.untold) > self.policy.remember_ended:
                del w.untold[next(iter(w.untold))]

    def _known_or_placeholder(self, worker_id: str, now: float) -> Worker:
        """A worker named on record: known from its heartbeats soon, or lost after
        ``worker_timeout_s`` (it serves nothing meanwhile: no models, no slots)."""
        w = self.workers.get(worker_id)
        if w is None:
            w = self.workers[worker_id] = Worker(
                worker_id=worker_id, models=[], max_num_seqs=0, state="ready", last_seen=now
            )
            self._regroup()
        return w

    def let_go(self, worker_ids: Collection[str]) -> list[str]:
        """Workers another scheduler instance books from now on (a partition given to
        it), forgotten with the requests they run and without an effect: those run on
        and end there, and the new owner takes them back from the assignments on record,
        as after a takeover (``restore``). Returns the request ids let go."""
        gone: list[str] = []
        for wid in worker_ids:
            w = self.workers.pop(wid, None)
            self.kv.drop_worker(wid)
            self._stopped_on.pop(wid, None)
            if w is None:
                continue
            for rid in w.assigned:
                if self.inflight.pop(rid, None) is not None:
                    gone.append(rid)
        self._regroup()
        return gone

    def set_canary(self, model: str, weights: dict[str, float]) -> None:
        """Route these shares of ``model``'s requests to other model names (a new
        version); the rest stays. Weights outside 0..1 or summing over 1 are refused."""
        if any(not 0.0 <= w <= 1.0 for w in weights.values()) or sum(weights.values()) > 1.0:
            raise ValueError(
                f"canary weights for {model!r} must be shares summing to at most 1, got {weights}"
            )
        if any(w > 0 for w in weights.values()):
            self.canaries[model] = {k: v for k, v in weights.items() if v > 0}
        else:
            self.canaries.pop(model, None)

    def _target(self, model: str, item: Queued, ready: dict[str, int]) -> str:
        """The model name this request runs on: a canary's by a stable hash of its id,
        or its own (also when the canary has no ready worker)."""
        if item.target is not None and (item.target == model or ready.get(item.target)):
            return item.target  # kept while its version is there (retries stay with it)
        weights = self.canaries.get(model)
        target = model
        if weights:
            x = zlib.crc32(item.request.request_id.encode()) % 10_000 / 10_000
            acc = 0.0
            for name, share in sorted(weights.items()):
                acc += share
                if x < acc:
                    target = name if ready.get(name) else model
                    break
        item.target = target
        return target

    def on_kv_event(self, event: KvEvent) -> None:
        self.kv.on_event(event)

    def on_started(
        self,
        request_id: str,
        attempt: int,
        worker_id: str = "",
        migratable: bool = False,
        now: float = 0.0,
    ) -> float | None:
        """The request's first token is on its way. Taken from the worker it is placed
        on whatever the attempt: a worker that kept streaming an earlier attempt (and
        ignored the new one) has started it all the same. ``migratable``: the worker
        sends a copy of each chunk (``on_progress``). Returns, for a continuation, how
        long its stream stood still (the client's gap, up to this new first token)."""
        f = self.inflight.get(request_id)
        if f is None or not (f.attempt == attempt or worker_id == f.worker_id):
            return None
        first = not f.started
        self._started(f, now)
        if migratable and f.attempt == attempt and f.progress is None:
            f.progress = Progress(f.resume)
        if first and f.resume is not None and f.attempt == attempt and f.quiet_since:
            return max(0.0, now - f.quiet_since)
        return None

    def on_progress(
        self, worker_id: str, chunk: TokenChunk, now: float = 0.0, finish_reason: str = ""
    ) -> None:
        """A migratable request's chunk, as its worker sent it to the reader
        (``finish_reason``: its last)."""
        f = self.inflight.get(chunk.request_id)
        if f is None or f.worker_id != worker_id or f.attempt != chunk.attempt:
            return  # ended, or an attempt given up on
        if f.progress is None:  # the copy came before the start
            f.progress = Progress(f.resume)
        self._started(f, now)  # its reader has (or is about to have) this chunk
        f.progress.add(chunk, now, finish_reason)
        w = self.workers.get(worker_id)
        if w is not None:
            w.last_progress = now

    def _started(self, f: Inflight, now: float) -> None:
        """``f``'s first token is out: its prefill is done, and measured."""
        if f.started:
            return
        f.started = True
        w = self.workers.get(f.worker_id)
        if w is None:
            return
        w.prefilling_long.pop(f.request.request_id, None)
        w.pending_prefill -= f.prefill
        if now and f.resume is None:
            w.rates.on_start(f.prefill, f.assigned_at, now)
        elif now:  # a continuation's prefill is not the prompt's: not measured, but
            w.rates.last_start = max(w.rates.last_start, now)  # the worker was busy
        self._touch(w)

    def on_ended(
        self, request_id: str, now: float, attempt: int = 0, end: Terminal | None = None
    ) -> list[Effect]:
        """A request's end (``attempt``: the one it names, 0 for none). The end of an
        attempt older than the one running is a presumed-lost worker's late word: the
        newer attempt keeps its slot and runs on, as its reader follows it.

        ``end``, the recorded event, is kept with the worker that ran the request until
        its heartbeat says the end was sent: a worker stopped between its record and its
        send (a SIGSTOP, a hung host) would leave the reader waiting, so its loss tells
        the end instead."""
        running = self.inflight.get(request_id)
        if running is not None and 0 < attempt < running.attempt:
            return []
        if running is None and attempt and 0 < attempt < self._queued_attempt(request_id):
            return []  # the end of an attempt given up on: its successor waits to run
        f = self.inflight.pop(request_id, None)
        held = f.request if f else None
        if held is None and request_id in self._queued_ids:
            item = self._drop_queued(request_id)
            held = item.request if item else None
        self._remember_ended(request_id, held)
        if f is not None:
            w = self.workers.get(f.worker_id)
            if w is not None:
                if end is not None:
                    w.untold[request_id] = UntoldEnd(f.request, end, now)
                    if len(w.untold) > self.policy.remember_ended:
                        del w.untold[next(iter(w.untold))]
                if f.started and now:
                    w.rates.on_end(f.assigned_at, now)
                self._release(w, f)
            return self._dispatch(now)
        return []

    def _release(self, w: Worker, f: Inflight) -> None:
        """``w`` no longer holds ``f``: its slots and tokens are free."""
        rid = f.request.request_id
        w.assigned.discard(rid)
        w.prefilling_long.pop(rid, None)
        w.assigned_tokens -= f.tokens
        w.assigned_seqs -= f.request.sampling.n
        if not f.started:
            w.pending_prefill -= f.prefill
        self._touch(w)

    def on_cancel(self, request_id: str, reason: str, tenant: str | None = None) -> list[Effect]:
        """Queued requests are cancelled here; running ones by their worker; ones not
        seen yet when they arrive. A tenant's cancel (``tenant`` set) touches only that
        tenant's requests."""
        for q in self.queues.values():
            for item in q:
                if item.request.request_id == request_id:
                    if tenant is not None and item.request.tenant != tenant:
                        return []
                    self._drop_queued(request_id)
                    self._remember_ended(request_id, item.request)
                    return [Cancel(request=item.request, reason=reason)]
        if not self.knows(request_id):
            self._cancelled_unseen[request_id] = (reason, tenant)
            if len(self._cancelled_unseen) > self.policy.remember_ended:
                self._cancelled_unseen.popitem(last=False)
        return []

    def heard_nothing(self, now: float) -> None:
        """The scheduler's own bus connection was down until ``now``: it heard no
        heartbeat and no chunk's copy, so no worker's silence until now counts."""
        for w in self.workers.values():
            w.last_seen = max(w.last_seen, now)

    def tick(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for w in list(self.workers.values()):
            if now - w.last_seen > self.policy.worker_timeout_s:
                effects += self._lose_worker(w.worker_id, now, "lost")
            elif self._streams_stopped(w, now):
                effects += self._stop_streams(w, now)
        # KV events of workers that never heartbeat here (gone before a restart)
        for wid in [w for w in self._kv_orphans if w in self.workers]:
            del self._kv_orphans[wid]
        for wid in self.kv.workers() - self.workers.keys():
            since = self._kv_orphans.setdefault(wid, now)
            if now - since > self.policy.worker_timeout_s:
                self.kv.drop_worker(wid)
                del self._kv_orphans[wid]
        live = self.live_models()

        def limit_for(model: str) -> float:
            _, until = self._scaling.get(model, (0, 0.0))
            if now < until and not live.get(model):  # the autoscaler is starting one
                return max(self.policy.queue_timeout_s, self.policy.cold_start_wait_s)
            return self.policy.queue_timeout_s

        moving = self.policy.migration_wait_s
        for model, q in self.queues.items():
            limit = limit_for(model)

            def expired(item: Queued, limit: float = limit) -> bool:
                wait = moving if item.resume is not None else limit
                return now - item.since > wait or now >= item.deadline

            # a full scan: re-queued work sits at the front with a newer ``since``
            if any(expired(item) for item in q):
                for item in q.drop_where(expired):
                    self._queued_ids.discard(item.request.request_id)
                    self._remember_ended(item.request.request_id, item.request)
                    effects.append(
                        self._deadline_fail(item.request, "while queued")
                        if now >= item.deadline
                        else self._not_moved(item, moving)
                        if item.resume is not None
                        else self._timed_out(item.request, limit)
                    )
        return effects + self._dispatch(now)

    def hand_off(self, elsewhere: Collection[str], now: float, after_s: float) -> list[Effect]:
        """A partitioned scheduler's requests queued ``after_s`` or more for a model no
        worker of its serves while another partition's does (``elsewhere``): they go
        there. A continuation stays (where its stream stopped is known here only)."""
        live = self.live_models()
        effects: list[Effect] = []
        for model, q in self.queues.items():
            if live.get(model) or model not in elsewhere:
                continue

            def waited(item: Queued) -> bool:  # a retry's attempt numbers are this one's
                return item.attempt == 1 and item.resume is None and now - item.since >= after_s

            for item in q.drop_where(waited):
                self._queued_ids.discard(item.request.request_id)
                self._changes += 1
                effects.append(HandOff(request=item.request))
        return effects

    # -- views -----------------------------------------------------------------------

    def is_queued(self, request_id: str) -> bool:
        return request_id in self._queued_ids

    def knows(self, request_id: str) -> bool:
        """Queued, running, or recently ended: another copy of it changes nothing."""
        return (
            request_id in self._queued_ids
            or request_id in self.inflight
            or request_id in self._ended
        )

    def _same_request(self, request: RequestSubmitted) -> bool:
        """A resend of the held copy: same reply subject and same creation time (one
        gateway reuses its reply subject for a reused id, but not the creation time)."""
        rid = request.request_id
        held = self.inflight.get(rid)
        if held is not None:
            return _identity(held.request) == _identity(request)
        for q in self.queues.values():
            for item in q:
                if item.request.request_id == rid:
                    return _identity(item.request) == _identity(request)
        return self._ended.get(rid) == _identity(request)

    def queue_depths(self) -> dict[str, int]:
        return {m: len(q) for m, q in self.queues.items()}

    def load(self, now: float) -> dict[str, ModelLoad]:
        """Per-model queue state for the gateways' backpressure."""
        out: dict[str, ModelLoad] = {}
        models = set(self.queues) | {m for w in self.workers.values() for m in w.models}
        for model in sorted(models):
            q = self.queues.get(model, ())
            ready = [w for w in self.workers.values() if model in w.models and w.state == "ready"]
            fleet = self.fleet(model)
            out[model] = ModelLoad(
                queued=len(q),
                queue_limit=self.policy.max_queue_per_model,
                ready_workers=len(ready),
                free_slots=sum(max(0, w.max_num_seqs - w.assigned_seqs) for w in ready),
                oldest_wait_s=max((now - item.since for item in q), default=0.0),
                dispatch_per_s=self._dispatch_rate(model, now),
                wait_s=0.0 if fleet.idle else round(fleet.wait(0) or 0.0, 3),
                ttft_slo_s=self.objective(model) if self.policy.admit_by_slo else 0.0,
            )
        return out

    def _dispatch_rate(self, model: str, now: float) -> float:
        count = self._dispatched.get(model, 0)
        last = self._rates.get(model)
        if last is None:
            self._rates[model] = (now, count, 0.0)
            return 0.0
        then, before, rate = last
        if now - then < 0.05:
            return rate
        instant = (count - before) / (now - then)
        rate = instant if rate == 0.0 else 0.7 * rate + 0.3 * instant
        self._rates[model] = (now, count, rate)
        return rate

    def on_scaling(self, targets: dict[str, int], now: float, valid_s: float) -> None:
        """The autoscaler's targets, good for ``valid_s``: a model it sizes that has no
        worker is one it is starting, so its queue waits the cold-start bound."""
        for model, target in targets.items():
            self._scaling[model] = (target, now + valid_s)

    def _pool(self, model: str) -> Pool:
        pool = self._pools.get(model)
        if pool is None:
            pool = self._pools[model] = Pool(
                w for w in self.workers.values() if model in w.models and w.state == "ready"
            )
        return pool

    def _regroup(self) -> None:
        """Who is in a pool changed: each is built again when next needed."""
        self._pools.clear()
        self._changes += 1

    def _touch(self, w: Worker) -> None:
        """``w``'s books may have changed: the pools it is in keep their sums."""
        pools = [pool for m in w.models if (pool := self._pools.get(m)) is not None]
        if not pools or any([pool.touch(w) for pool in pools]):
            self._changes += 1

    def live_models(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.workers.values():
            for m in w.models:
                out[m] = out.get(m, 0) + (w.state == "ready")
        return out

    def status(self) -> dict[str, object]:
        return {
            "workers": {
                w.worker_id: {
                    "models": w.models,
                    "state": w.state,
                    "assigned": len(w.assigned),
                    "max_num_seqs": w.max_num_seqs,
                }
                for w in self.workers.values()
            },
            "queued": self.queue_depths(),
            "lanes": {m: q.depths() for m, q in self.queues.items()},
            "tenants": {m: dict(q.counters) for m, q in self.queues.items()},
            "inflight": len(self.inflight),
            "canaries": self.canaries,
            "routing": {
                "policy": self.policy.routing,
                "prefix_blocks_routed": self.routed_blocks,
                "prefix_blocks_exact": self.routed_exact,
                "prefix_blocks_cached": self.routed_hits,
                "prefix_hit_rate": round(self.routed_hits / self.routed_blocks, 4)
                if self.routed_blocks
                else None,
                "kv_event_gaps": self.kv.gaps,
                "kv_blocks": self.kv.blocks(),
            },
        }

    # -- internals -------------------------------------------------------------------

    def _enqueue(self, item: Queued, front: bool = False) -> None:
        q = self.queues.get(item.request.model)
        if q is None:
            p = self.policy
            q = self.queues[item.request.model] = ModelQueue(
                p.short_prompt_tokens, p.long_wait_bound_s, lanes=p.lanes, by_slack=p.order_by_slack
            )
        q.push(item, front)
        self._queued_ids.add(item.request.request_id)
        self._changes += 1

    def _queued_attempt(self, request_id: str) -> int:
        """The attempt a queued request will run as (0: not queued)."""
        if request_id not in self._queued_ids:
            return 0
        for q in self.queues.values():
            for item in q:
                if item.request.request_id == request_id:
                    return item.attempt
        return 0

    def _drop_queued(self, request_id: str) -> Queued | None:
        self._queued_ids.discard(request_id)
        self._changes += 1
        for q in self.queues.values():
            for item in q:
                if item.request.request_id == request_id:
                    q.remove(item)
                    return item
        return None

    def _remember_ended(self, request_id: str, request: RequestSubmitted | None = None) -> None:
        self._ended[request_id] = (
            _identity(request) if request is not None else self._ended.get(request_id)
        )
        if len(self._ended) > self.policy.remember_ended:
            self._ended.popitem(last=False)

    @staticmethod
    def _deadline_fail(request: RequestSubmitted, where: str) -> Fail:
        return Fail.of(
            request, FailureCode.DEADLINE_EXCEEDED, f"the request's deadline passed {where}"
        )

    def _timed_out(self, request: RequestSubmitted, limit: float) -> Fail:
        wait = f"{limit:g}s"
        if self.live_models().get(request.model):
            return Fail.of(
                request,
                FailureCode.QUEUE_TIMEOUT,
                f"every worker serving {request.model!r} stayed busy for {wait}",
            )
        return Fail.of(
            request,
            FailureCode.NO_WORKER,
            f"no worker serving model {request.model!r} appeared within {wait}",
        )

    def _streams_stopped(self, w: Worker, now: float) -> bool:
        """Streaming and silent (no heartbeat, no chunk's copy) for ``stream_silence_s``
        (and one and a half of its heartbeat intervals): a dead worker's streams stop at
        once, a live one's copies come every few tokens."""
        silence = self.policy.stream_silence_s
        if not silence:
            return False
        if now - max(w.last_seen, w.last_progress) <= max(silence, 1.5 * w.interval_s):
            return False
        return any(
            (f := self.inflight.get(rid)) is not None and f.progress is not None
            for rid in w.assigned
        )

    def _stop_streams(self, w: Worker, now: float) -> list[Effect]:
        """Move a silent worker's migratable streams; it gets no new work until it is
        heard from again, and the rest of its work waits for ``worker_timeout_s``."""
        w.state = "silent"  # its next heartbeat says what it is
        self._regroup()  # out of its pools: no placement, no slots counted
        effects: list[Effect] = []
        for rid in sorted(w.assigned, key=lambda r: self.inflight[r].order, reverse=True):
            f = self.inflight[rid]
            if f.started and not self._why_not_moved(f):
                effects += self._take_off(w, f, now, "lost")
        return effects

    def _not_moved(self, item: Queued, wait: float) -> Fail:
        return Fail.of(
            item.request,
            FailureCode.WORKER_LOST,
            f"its worker was lost mid-stream and no worker could take the stream over "
            f"within {wait:g}s; submit the request again (with a new request id)",
            served_model=item.target or "",
        )

    def _move(self, f: Inflight, worker_id: str, now: float, cause: str) -> list[Effect]:
        """Queue ``f`` (taken off ``worker_id``) as a continuation, ahead of newer work,
        and stop its attempt there."""
        assert f.progress is not None
        self._requeue(f, now, f.progress.resume(f.attempt), cause, f.progress.at or now)
        return [self._stopping(f.request, worker_id, f.attempt)]

    def _requeue(
        self, f: Inflight, now: float, resume: Resume | None, cause: str, quiet_since: float
    ) -> None:
        """``f`` as its next attempt, ahead of newer work (kept in arrival order)."""
        self._enqueue(
            Queued(
                request=f.request,
                since=now,
                order=f.order,
                attempt=f.attempt + 1,
                deadline=f.deadline,
                target=f.target or None,
                resume=resume,
                cause=cause,
                quiet_since=quiet_since,
                due=float("-inf"),
            ),
            front=True,
        )

    def _lease(self, f: Inflight) -> float:
        """How long its worker may fall silent before it must check for a stop: a
        movable stream moves after ``stream_silence_s``; any other ends ``worker_lost``
        after ``worker_timeout_s`` (half of it: the worker's clock is not ours)."""
        if f.unmovable or not self.policy.migrate:
            return self.policy.worker_timeout_s / 2
        return self.policy.stream_silence_s

    def _why_not_moved(self, f: Inflight) -> str:
        """Why a started request of a lost worker cannot continue elsewhere ("": it can)."""
        if not self.policy.migrate:
            return "migration is off"
        if f.unmovable:
            return f.unmovable
        if f.progress is None:
            return "its worker sent no progress to continue from"
        if f.progress.gap:
            return "some of its progress was lost on the way"
        if f.attempt >= self.policy.max_attempts:
            return f"it was assigned {f.attempt} times"
        return ""

    def _lose_worker(self, worker_id: str, now: float, cause: str) -> list[Effect]:
        """``cause``: ``lost`` (heartbeats stopped), or the state the worker reported."""
        w = self.workers.pop(worker_id, None)
        self._regroup()
        self.kv.drop_worker(worker_id)
        if w is None:
            return []
        effects: list[Effect] = [
            Retell(request=u.request, end=u.end, restored=u.restored) for u in w.untold.values()
        ]
        # newest first, each pushed to the front: the oldest ends up first in line
        for rid in sorted(w.assigned, key=lambda r: self.inflight[r].order, reverse=True):
            f = self.inflight.pop(rid)
            why = self._why_not_moved(f) if f.started else ""
            if f.started and not why:
                effects += self._move(f, worker_id, now, cause)
                continue
            # whatever becomes of it, the presumed-lost worker stops this attempt if it
            # was only stalled: it must not run it beside the next one
            effects.append(self._stopping(f.request, worker_id, f.attempt))
            if f.started:
                effects.append(
                    Fail.of(
                        f.request,
                        FailureCode.WORKER_LOST,
                        f"worker {worker_id} was lost after streaming began, and the "
                        f"stream could not move to another worker ({why}); submit the "
                        "request again (with a new request id)",
                        served_model=f.target,
                    )
                )
            elif f.attempt >= self.policy.max_attempts:
                effects.append(
                    Fail.of(
                        f.request,
                        FailureCode.WORKER_LOST,
                        f"lost {f.attempt} workers in a row while serving this request",
                        served_model=f.target,
                    )
                )
            else:
                # not started: hand it to another worker ahead of newer requests (a
                # continuation stays one: its reader holds the earlier text)
                self._requeue(
                    f, now, f.resume, cause if f.resume is not None else "", f.quiet_since
                )
        return effects

    def _dispatch(self, now: float, skip_unchanged: bool = False) -> list[Effect]:
        """Place what can be placed. ``skip_unchanged``: not for a model whose last pass
        placed nothing while nothing changed since (a heartbeat's pass: with a standing
        queue each would scan a full fleet for the room none has)."""
        effects: list[Effect] = []
        ready = self.live_models() if self.canaries else {}
        for model, q in self.queues.items():
            if not q or (skip_unchanged and self._stuck.get(model) == self._changes):
                continue
            placed = self._dispatch_model(model, q, now, ready)
            if placed:
                self._stuck.pop(model, None)
                effects += placed
            else:
                self._stuck[model] = self._changes
        return effects

    def _dispatch_model(
        self,
        model: str,
        q: ModelQueue,
        now: float,
        ready: dict[str, int],
    ) -> list[Effect]:
        """Place what ``model``'s queue can place now, lane by lane until no worker
        can take more of a lane."""
        effects: list[Effect] = []
        blocked: set[str] = set()  # lanes no worker can take more of in this pass
        # long prompts backed up: no worker is held back for short ones in this pass
        backlog = self.policy.lanes and q.oldest_wait("long", now) >= self.policy.reserve_release_s
        while q:
            item = q.next(now, allow=lambda lane: lane not in blocked)
            if item is None:
                break
            lane = q.lane_of(item)
            unreserved = lane == "long" and (
                backlog or now - item.since >= self.policy.long_wait_bound_s
            )
            tokens = cost_tokens(item.request)
            target = self._target(model, item, ready)
            w = self._place(target, item, lane, unreserved, tokens)
            if w is None and target != model:
                # the new version has no room now: this one runs on the current one
                item.target = target = model
                w = self._place(model, item, lane, unreserved, tokens)
            if w is None:
                blocked.add(lane)
                pool = self._pool(target)
                if lane == "short" and pool.least_loaded(lambda x: x.can_take()) is not None:
                    # slots are free but not the tokens it needs: keep the long lane
                    # from taking them, so running work drains until it fits
                    blocked.add("long")
                continue
            q.take(item)
            effects.append(self._assign(model, target, item, w, lane, tokens, now))
        return effects

    def _place(
        self, target: str, item: Queued, lane: str, unreserved: bool, tokens: int
    ) -> Worker | None:
        """The worker serving ``target`` that takes ``item`` now, if any: one with room
        for it, that its lane allows. Long prompts prefill within each worker's budget
        (``_prefills_more``), off the reserved share unless ``unreserved`` (past its
        bound, or long prompts backed up); short ones go where no long prompt
        prefills when such a worker has room (it would stall their first token)."""
        pool = self._pool(target)
        if not pool:
            return None
        p = self.policy
        seqs = item.request.sampling.n
        prompt = prompt_tokens(item.request)

        def fits(w: Worker) -> bool:
            return w.can_take(tokens, seqs)

        if not p.lanes:
            return self._route(target, item, pool, fits)
        if unreserved:
            return self._route(
                target, item, pool, lambda w: fits(w) and self._prefills_more(w, prompt)
            )
        if lane == "short":
            clear = self._route(target, item, pool, lambda w: not w.prefilling_long and fits(w))
            return clear if clear is not None else self._route(target, item, pool, fits)
        reserved = (
            max(1, round(p.short_reserve * len(pool)))
            if len(pool) > 1 and p.short_reserve > 0 and prompt >= p.reserve_above_tokens
            else 0
        )
        if pool.holding_long >= len(pool) - reserved:  # only workers already holding one
            return self._route(
                target,
                item,
                pool,
                lambda w: bool(w.prefilling_long) and fits(w) and self._prefills_more(w, prompt),
            )
        return self._route(target, item, pool, lambda w: fits(w) and self._prefills_more(w, prompt))

    def _assign(
        self, model: str, target: str, item: Queued, w: Worker, lane: str, tokens: int, now: float
    ) -> Assign:
        """Book ``item`` (taken off its queue) on worker ``w``."""
        rid = item.request.request_id
        self._queued_ids.discard(rid)
        w.foreign.discard(rid)  # listed by its heartbeat, now placed here
        w.assigned.add(rid)
        w.assigned_tokens += tokens
        w.assigned_seqs += item.request.sampling.n
        if lane == "long" and self.policy.lanes:
            w.prefilling_long[rid] = prompt_tokens(item.request)
        prefill = max(1, prompt_tokens(item.request) - item.cached_blocks * item.block_tokens)
        w.pending_prefill += prefill
        self._touch(w)
        self.inflight[rid] = Inflight(
            request=item.request,
            worker_id=w.worker_id,
            attempt=item.attempt,
            assigned_at=now,
            order=item.order,
            deadline=item.deadline,
            tokens=tokens,
            long=lane == "long",
            target=target,
            unmovable=unmovable(item.request) if self.policy.migrate else "migration is off",
            resume=item.resume,
            quiet_since=item.quiet_since,
            prefill=prefill,
        )
        self._dispatched[model] = self._dispatched.get(model, 0) + 1
        self._stopped_on.get(w.worker_id, {}).pop(rid, None)  # its newer attempt runs there
        return Assign(
            worker_id=w.worker_id,
            request=item.request,
            attempt=item.attempt,
            served_model="" if target == model else target,
            migratable=not self.inflight[rid].unmovable,
            resume=item.resume,
            cause=item.cause,
            lease_s=self._lease(self.inflight[rid]),
            lane=lane,
            queued_s=max(0.0, now - item.since),
            prefix_blocks=len(item.blocks or ()),
            cached_blocks=item.cached_blocks,
            cached_tokens=item.cached_blocks * item.block_tokens,
        )

    def _prefills_more(self, w: Worker, prompt: int) -> bool:
        """Whether ``w`` may start prefilling another long prompt of ``prompt`` tokens."""
        p = self.policy
        if not w.prefilling_long:
            return True
        if p.long_prefill_tokens > 0:
            return sum(w.prefilling_long.values()) + prompt <= p.long_prefill_tokens
        return len(w.prefilling_long) < p.long_per_worker

    def _route(self, model: str, item: Queued, pool: Pool, fits: Fits) -> Worker | None:
        """The worker of ``pool`` the routing strategy picks for ``item`` among those
        that ``fit``; None when none does."""
        if not self.router.uses_prefix:
            chosen = self.router.choose(model, [], pool, fits)
            return chosen[0] if chosen else None
        if item.blocks is None:
            p = self.policy
            size = self.kv.block_size(w.worker_id for w in pool.workers)
            item.blocks, item.exact_blocks = prefix_blocks(
                item.request, p.kv_block_chars, size, p.kv_hash_seed
            )
            hashed_here = item.exact_blocks and not item.request.prefix_hashes
            item.block_tokens = size if hashed_here else p.block_tokens
        chosen = self.router.choose(model, item.blocks, pool, fits)
        if chosen is None:
            return None
        w, hits = chosen
        self._note_route(w, item, hits)
        return w

    def _note_route(self, w: Worker, item: Queued, hits: int) -> None:
        blocks = item.blocks or []
        item.cached_blocks = hits
        self.routed_blocks += len(blocks)
        self.routed_hits += hits
        if item.exact_blocks:
            self.routed_exact += len(blocks)
        if not item.request.prefix_hashes:
            # until the engine's events say so (text blocks: never), remember them here
            self.kv.on_routed(w.worker_id, blocks)


_Extra = TypeVar("_Extra")


def latest_attempts(
    work: Iterable[tuple[WorkAssigned, _Extra]], mine: Callable[[str], bool]
) -> list[tuple[WorkAssigned, _Extra]]:
    """What a scheduler takes back of ``work`` (assignments as stored, each with what
    the caller keeps beside it): each request's latest attempt, and only where its
    worker is ``mine``. The latest is chosen over every worker first: a stream moved to
    another partition's worker is that partition's, and its older attempt here is
    never taken back (it would be booked twice, and run twice if its worker is lost)."""
    latest: dict[str, tuple[WorkAssigned, _Extra]] = {}
    for w, extra in work:
        held = latest.get(w.request.request_id)
        if held is None or w.attempt >= held[0].attempt:
            latest[w.request.request_id] = (w, extra)
    return [(w, extra) for w, extra in latest.values() if mine(w.worker_id)]


def _identity(request: RequestSubmitted) -> tuple[str, float]:
    return request.reply_to, request.created_at
