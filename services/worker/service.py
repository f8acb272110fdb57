"""Worker adapter: takes assignments from JetStream, streams engine output over core NATS."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from nats.aio.msg import Msg

from inferbus.contracts import (
    CANCEL,
    CancelRequest,
    FailureCode,
    KvEvent,
    KvResync,
    RequestFinished,
    RequestProgress,
    Terminal,
    WorkAssigned,
    WorkerState,
    ended_subject,
    heartbeat_subject,
    kv_subject,
    progress_subject,
    started_subject,
    subject_token,
    tenant_of_subject,
    tenant_request_id,
)
from inferbus.shared import logs, metrics, modelstore
from inferbus.shared.bus import ask_until_answered, record_end, request_headers, round_trip
from inferbus.shared.chunksender import ChunkSender
from inferbus.shared.codec import encode
from inferbus.shared.config import ServiceSettings, group
from inferbus.shared.cpus import parse_cpus, pin_threads
from inferbus.shared.runtime import Context, Service

from .capability import quantization_refusal
from .core import (
    CostMeter,
    RequestStream,
    ServedAssignments,
    StallWatch,
    Voice,
    carried_ids,
    engine_request,
    expires_in,
    heartbeat,
    nothing_left,
    served_name,
)
from .delivery import Deliveries, trusted_keys
from .engine import Engine, EngineError, EngineOptions, EngineOutput
from .kvbatch import KvMirror, kv_batches
from .report import report_end, report_spill, report_stats
from .sim import SimEngine, SimTiming
from .swap import Held, Holding
from .wiring import WIRING

log = logs.get("inferbus.worker")

HANDOVER_ANSWER_S = 2.0
"""How long handed-over streams are held for the scheduler's stops; it acts only on a
handover asked within ``HANDOVER_FRESH_S`` (contracts), so one it did not stop by then
it kept."""


class WorkerSettings(ServiceSettings, kw_only=True):
    """inferbus worker: serves assignments with an LLM engine (sim or vllm)."""

    engine: Literal["sim", "vllm"] = "sim"
    """sim (the timing model, for scale tests) or vllm (the real engine)."""
    engine_options: EngineOptions = EngineOptions()
    """What the engine serves (``--model``, ``--max-num-seqs``, ``--dtype``...)."""
    sim: Annotated[SimTiming, group("sim_")] = SimTiming()
    """The sim engine's timing model (``--sim-decode-s-per-step``...)."""
    sim_kv_capacity_tokens: int = 0
    """sim: the KV cache size its heartbeats report, in tokens (0: none reported)."""
    heartbeat_interval_s: float = 1.0
    """How often it says what it serves and how busy it is (``ib.hb.<id>``)."""
    engine_stall_s: float = 30.0
    """An engine that produces nothing for this long while requests stream on it is
    hung: the worker says it failed (its streams move to other workers), /healthz
    answers 503, and it exits 1 to be restarted. 0: never."""
    drain_handover_s: float = 5.0
    """Draining (a scale-down, a rollout, SIGTERM), the streams still running this long
    after it began are handed to other workers where they can move; the rest run to
    the end of the drain. 0: hold every one to its end."""
    chunk_window_s: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    """How long token chunks wait to share a message with others for the same reader,
    from the first one waiting (a stream's first chunk never waits). 0: the chunks of
    one engine step share one. Worth a few milliseconds where steps come faster than
    that (a small model, a CPU): a message carries several steps' chunks and the bus,
    the sanitizer and the gateway each handle fewer; each chunk is late by at most the
    window."""
    filter_backup_s: float = 5.0
    """A filtered stream's end goes to the sanitizer as a request: unanswered this long
    (the sanitizer restarted and lost the stream), the client is told
    ``stream_interrupted`` directly."""
    state_dir: str = ""
    """Where engine caches go (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR)."""
    engine_cpus: str = ""
    """vllm on a CPU: the cores its engine's threads run on (``0-2``); empty: vLLM's own
    choice. ``inferbus up`` sets it (shared/cpus.py)."""
    service_cpus: str = ""
    """With ``engine_cpus``: the cores this process's own threads move to once the engine
    runs, beside the other services, off the engine's."""
    follow_registry: bool = True
    """Start on the registry's current version of the model (when there is one) and
    take delivery events; off: serve ``--model`` and nothing else."""
    trusted_keys: str = ""
    """Public keys (PEM files, or folders of ``*.pub``/``*.pem``; comma-separated) a
    delivered version's signature must verify against. None: every delivery is
    refused. Configuration only: a delivery event cannot add one."""
    model_cache_dir: str = ""
    """Where delivered versions are fetched to (default: ``<state_dir>/model-cache/``, or
    the temporary folder's ``inferbus-model-cache/``, then the instance's name)."""
    cold_swap: Literal["auto", "overlap", "replace"] = "auto"
    """A cold swap (another architecture): ``overlap`` starts the new engine beside
    the old, which serves until the new one is ready (twice the memory meanwhile);
    ``replace`` drains and stops the old first (requests wait); ``auto``: overlap on
    CPUs and the sim, replace on GPUs."""


def build_engine(
    s: WorkerSettings,
    worker_id: str = "",
    on_kv_events: Any = None,
    options: EngineOptions | None = None,
) -> Engine:
    o = options or s.engine_options
    if s.engine == "sim":
        return SimEngine(
            o.model, s.sim, o.max_num_seqs, o.max_model_len or 8192, s.sim_kv_capacity_tokens
        )
    from .vllm_engine import VllmEngine, prepare_environment

    prepare_environment(s.state_dir or None, s.instance_id, s.log_level, s.engine_cpus)
    if o.kv_spill and not o.kv_spill_disk_dir and s.state_dir:
        folder = re.sub(r"[^A-Za-z0-9_.-]", "-", s.instance_id or "worker")
        o = msgspec.structs.replace(
            o, kv_spill_disk_dir=str(Path(s.state_dir) / "kv-spill" / folder)
        )
    return VllmEngine(
        o,
        worker_id=worker_id,
        on_kv_events=on_kv_events,
        on_spill_stats=lambda data: report_spill(worker_id, data),
    )


def initial_holding(o: EngineOptions) -> Holding:
    """What a worker serves before any delivery: ``--model`` (no registry version) and
    its ``--lora-modules``."""
    shape = modelstore.shape_of(o.model) if Path(o.model).is_dir() else None
    return Holding(
        model=Held(
            name=o.served_name,
            path=o.model,
            shape=shape.shape if shape else "",
            quantization=shape.quantization if shape else "",
        ),
        adapters=tuple(Held(name=n, path=p) for n, p in o.lora_modules.items()),
    )


class WorkerService(Service[WorkerSettings]):
    name = "worker"
    wiring = WIRING

    def __init__(
        self, settings: WorkerSettings, ctx: Context[WorkerSettings], engine: Engine | None = None
    ) -> None:
        super().__init__(settings, ctx)
        # a fresh id per process: a restarted worker never inherits a dead one's assignments
        # ``<instance>.<nonce>``: its credentials allow the subjects of its instance only
        self.worker_id = f"{subject_token(settings.instance_id)}.{secrets.token_hex(3)}"
        self.engine = engine or build_engine(settings, self.worker_id, self._publish_kv_events)
        self.holding = initial_holding(settings.engine_options)
        """What it serves, by name and version (swap.py decides how deliveries change it)."""
        self.costs = CostMeter()
        """What a prompt token costs to compute and to restore here (for heartbeats)."""
        self.origin = self.holding
        """What it was started with: a rollback to version "" returns to it."""
        self.loading = ""
        self._serving = asyncio.Event()
        """Clear while a cold swap with ``replace`` has no engine up: requests wait."""
        self._serving.set()
        self.deliveries: Deliveries | None = None
        self._retiring: asyncio.Task[None] | None = None
        """A replaced engine finishing its requests and stopping (after a cold swap)."""
        self.failure = ""
        self.state: WorkerState = "starting"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_reasons: dict[str, str] = {}
        self._served = ServedAssignments()
        self._tenants: dict[str, str] = {}
        """Each running request's tenant, for tenants' cancels."""
        self._attempts: dict[str, int] = {}
        """The attempt of each request running here (an attempt-scoped cancel names one)."""
        self._superseded: set[str] = set()
        """Running attempts the scheduler gave up on: they stop without a word (their
        end is not the request's; its successor's reader would take it for one)."""
        self._telling: Counter[str] = Counter()
        """Requests whose end is being recorded or sent (the heartbeat's ``telling``), by
        how many of their attempts here are at it."""
        self._kv_seq = 0
        """The number of its last KV event (from 1; its id is new at each start)."""
        self._kv_mirror = KvMirror()
        self._voice = Voice(time.monotonic())
        self._stall = StallWatch(time.monotonic())
        self._streaming: dict[str, bool] = {}
        """Requests streaming here (first token out), and whether each can move."""
        self._handover: list[str] = []
        """Draining: the streams it asks the scheduler to move (in one heartbeat)."""
        self._frozen: dict[str, asyncio.Event] = {}
        """Streams held still while the scheduler decides whether to move them: nothing
        the scheduler's copy lacks reaches their readers."""
        self._dead = ""
        """Why only a restart helps (a hung engine); empty while it is fit."""
        self._lease = 0.0
        """The scheduler's lease on this worker's streams, as its assignments say."""
        self._expired: set[str] = set()
        """Requests cancelled because their deadline passed."""
        self._hb_task: asyncio.Task[None] | None = None
        self._notes: set[asyncio.Future[None]] = set()
        """Backup ends on their way to clients."""
        self._chunks = ChunkSender(
            ctx.nc, batching=settings.chunk_batching, window_s=settings.chunk_window_s
        )
        self._stats_seen = (0, 0)

    def subject_fields(self) -> dict[str, str]:
        return {**super().subject_fields(), "worker_id": self.worker_id}

    async def start(self) -> None:
        ctx = self.ctx
        logs.bind(worker=self.worker_id)
        # heartbeats say "starting" while the engine loads (tens of seconds for vLLM)
        self._hb_task = asyncio.create_task(self._heartbeats(), name="heartbeats")
        await self.send_heartbeat()
        if self.settings.follow_registry:
            keys = trusted_keys(self.settings.trusted_keys)
            self.deliveries = Deliveries(self, ctx, self._cache_dir(), keys)
            current = await self.deliveries.current_version(self.holding.model.name)
            if current is not None:  # the registry's version, not the folder it was given
                mv, verified = current
                self.loading = f"{mv.ref} start"
                self.holding = Holding(
                    model=Held(
                        name=mv.name,
                        version=mv.version,
                        shape=mv.shape,
                        quantization=mv.quantization,
                        path=verified.folder,
                    )
                )
                self.engine = self._build(self.holding.model)
        try:
            if why := self.cannot_serve(self.holding.model.quantization):
                raise RuntimeError(why)  # refused before an engine dies of it
            await self.engine.start()
        except BaseException as exc:
            self.state, self.failure = "failed", f"engine failed to start: {exc}"
            log.error("engine failed to start", error=str(exc))
            self._hb_task.cancel()
            await self.send_heartbeat()
            await round_trip(ctx.nc)
            raise
        self.loading = ""
        if self.settings.engine_cpus and self.settings.service_cpus:
            # the engine's threads bound themselves to their cores; this process's
            # (event loop, output handling) go beside the other services
            pin_threads(parse_cpus(self.settings.service_cpus))
        if self.deliveries is not None:
            await self.deliveries.load_current_adapters()
            await self.deliveries.start()

    def cannot_serve(self, quantization: str) -> str:
        return quantization_refusal(self.settings.engine, quantization)

    async def serving(self) -> None:
        self.state = "ready"  # its work subscription is open: nothing assigned is missed
        await self.send_heartbeat()

    def _cache_dir(self) -> Path:
        s = self.settings
        if s.model_cache_dir:
            return Path(s.model_cache_dir)
        root = (
            Path(s.state_dir) / "model-cache"
            if s.state_dir
            else Path(tempfile.gettempdir()) / "inferbus-model-cache"
        )
        return root / subject_token(s.instance_id)

    def _build(self, held: Held) -> Engine:
        """An engine for a delivered model (its folder, served under its name)."""
        o = msgspec.structs.replace(
            self.settings.engine_options,
            model=held.path,
            served_model_name=held.name,
            lora_modules={},
        )
        return build_engine(self.settings, self.worker_id, self._publish_kv_events, o)

    @contextlib.asynccontextmanager
    async def held_back(self) -> AsyncGenerator[None, None]:
        """New requests wait (they are not refused) while the requests in flight finish;
        the body runs with the engine idle."""
        running = [t for t in self._tasks.values() if not t.done()]
        self._serving.clear()
        try:
            await self._finish(running, hand_over=True)
            yield
        finally:
            self._serving.set()

    async def replace_engine(self, after: Holding) -> None:
        """A cold swap: a new engine for ``after.model``; the old one's requests finish on
        it. If the new engine fails to start, the old one serves on (restarted, with
        ``replace``) and the error goes up to the delivery's report."""
        if self._retiring is not None:  # the engine before last is gone first
            await self._retiring
        old = self.engine
        new = self._build(after.model)
        if self._overlap():
            old.yield_cpu(True)
            try:
                await new.start()  # the old engine serves meanwhile
            except BaseException:
                old.yield_cpu(False)
                await new.stop()
                raise
            running = [t for t in self._tasks.values() if not t.done()]
            self.engine, self.holding = new, after
            # serving the new version from here; the old engine finishes its requests
            # and stops in the background (seconds: not part of the swap)
            self._retiring = asyncio.create_task(self._retire(old, running), name="retire")
            return
        async with self.held_back():
            await old.stop()
            try:
                await new.start()
            except BaseException:
                await new.stop()
                await old.start()
                raise
            self.engine, self.holding = new, after

    async def _retire(self, engine: Engine, running: list[asyncio.Task[None]]) -> None:
        try:
            await self._finish(running)
            await engine.stop()
        except Exception:
            log.exception("the replaced engine did not stop cleanly")
        finally:
            self._retiring = None

    def _overlap(self) -> bool:
        mode = self.settings.cold_swap
        if mode != "auto":
            return mode == "overlap"
        if self.settings.engine == "sim":
            return True
        from .vllm_engine import on_gpu

        return not on_gpu()

    async def _finish(self, tasks: list[asyncio.Task[None]], hand_over: bool = False) -> None:
        """Wait for ``tasks`` (up to the drain timeout); ``hand_over``: those still
        streaming after ``drain_handover_s`` go to other workers where they can."""
        if not tasks:
            return
        budget = self.settings.drain_timeout_s
        grace = self.settings.drain_handover_s
        if hand_over and grace and grace < budget:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                await self._hand_over()
            budget -= grace
        await asyncio.wait(tasks, timeout=budget)

    def fail(self, reason: str) -> None:
        self.state, self.failure = "failed", reason

    def ready(self) -> tuple[bool, str]:
        return self.state == "ready", self.failure or self.state

    def alive(self) -> tuple[bool, str]:
        return not self._dead, self._dead or "alive"

    def render_metrics(self, body: bytes) -> bytes:
        return metrics.add_label(body, b"vllm:", "worker", self.worker_id)

    async def publish_kv_events(self, events: list[KvEvent]) -> None:
        await self._publish_kv_events(events)

    async def _publish_kv_events(self, events: list[Any]) -> None:
        """One engine step's events as one message (``KvEventBatch``, split past
        ``KV_BATCH_BYTES``), core-NATS into the IB_KV stream: no ack wait on the
        engine's hot path; numbered, so a reader knows when one was lost (of 200,000 in
        a burst, up to 1,010 were never stored) and asks for the whole state again."""
        self._kv_mirror.apply(events)
        await self._publish_numbered(events)

    async def _publish_numbered(self, events: list[Any]) -> None:
        subject = kv_subject(self.worker_id)
        for ev in events:
            self._kv_seq += 1
            ev.seq = self._kv_seq
        for data in kv_batches(self.worker_id, events):
            await self.ctx.nc.publish(subject, data)

    async def _on_kv_resync(self, ask: KvResync, msg: Msg) -> None:
        """A scheduler missed some of this worker's KV events: its whole state, numbered
        on past what that reader has seen."""
        if ask.worker_id != self.worker_id:
            return
        self._kv_seq = max(self._kv_seq, ask.seen_seq)
        events = self._kv_mirror.resync(self.worker_id)
        log.info("kv state sent again", seen_seq=ask.seen_seq, events=len(events))
        await self._publish_numbered(events)

    def status(self) -> dict[str, Any]:
        stats = self.engine.stats()
        return {
            "worker_id": self.worker_id,
            "engine": self.engine.name,
            "models": list(self.holding.served()),
            "versions": self.holding.versions(),
            "loading": self.loading,
            "state": self.state,
            "inflight": len(self._tasks),
            **self._chunks.stats(),
            "running": stats.running,
            "waiting": stats.waiting,
            "kv_cache_usage": stats.kv_cache_usage,
            "reason": self.failure,
        }

    # -- assignments -----------------------------------------------------------------

    async def _on_work(self, assignment: WorkAssigned, msg: Msg) -> None:
        await msg.ack()
        rid = assignment.request.request_id
        if self._attempts.get(rid, assignment.attempt) < assignment.attempt:
            await self._supersede(rid)  # it came back here: the newer attempt runs
        if rid not in self._tasks:
            self._superseded.discard(rid)  # a stop for a run that is over
        if not self._served.take(assignment, running=rid in self._tasks):
            return  # delivered again: it runs here, or ran
        parent = self.ctx.tracing.parent(msg.headers)
        self._tenants[rid] = assignment.request.tenant
        self._attempts[rid] = assignment.attempt
        self._lease = assignment.lease_s or self._lease
        task = asyncio.create_task(self._serve(assignment, parent), name=f"req-{rid}")
        self._tasks[rid] = task
        task.add_done_callback(functools.partial(self._forget, rid))
        metrics.INFLIGHT.labels(self.name).set(len(self._tasks))

    def _forget(self, rid: str, task: asyncio.Task[Any] | None) -> None:
        """``rid``'s task is over (or ending): its state goes, unless a newer attempt's
        task holds it already. Also run when the task ends, in case it never ran."""
        if task is not None and self._tasks.get(rid) is not task:
            return
        self._tasks.pop(rid, None)
        self._tenants.pop(rid, None)
        self._attempts.pop(rid, None)
        self._streaming.pop(rid, None)
        self._frozen.pop(rid, None)
        metrics.INFLIGHT.labels(self.name).set(len(self._tasks))

    async def _supersede(self, rid: str) -> None:
        """Stop the older attempt of ``rid`` running here, without a word: the scheduler
        took this worker for lost, then gave the request back to it as a newer attempt
        (the older one's stop may still be on its way)."""
        task = self._tasks.get(rid)
        if task is None:
            return
        self._superseded.add(rid)
        if not task.cancelling():
            task.cancel()
        await asyncio.wait([task], timeout=5.0)

    async def _serve(self, assignment: WorkAssigned, parent: Any = None) -> None:
        nc = self.ctx.nc
        req = assignment.request
        rid, model = req.request_id, req.model
        reply = req.reply_to
        received = time.time()
        stream = RequestStream(assignment, self.worker_id, time.monotonic())
        stream.migratable = assignment.migratable and self.engine.resumes(
            engine_request(assignment)
        )
        progress = progress_subject(self.worker_id) if stream.migratable else ""
        # every stream, moved or not when its worker falls silent, checks for a stop
        # after a silence: a worker stopped (SIGSTOP) past the scheduler's timeout must
        # not end a request the scheduler already ended or moved (issue 42 item 7)
        lease, seen, synced_at = assignment.lease_s, self._voice.silences, 0.0
        itl = metrics.ITL.tally()
        last_chunk_at = 0.0
        outputs = self._generate(assignment, stream)
        terminal: Any = None
        expiry = None
        left = expires_in(assignment, time.time())
        if left is not None:
            expiry = asyncio.get_running_loop().call_later(left, self._expire, rid)
        try:
            async for out in outputs:
                self._stall.progressed(time.monotonic())
                if self._voice.must_sync(time.monotonic(), lease, seen, synced_at):
                    await self._sync()  # a stop for this attempt lands here
                    seen, synced_at = self._voice.silences, time.monotonic()
                started = stream.started(time.monotonic())
                if started is not None:
                    self._streaming[rid] = stream.migratable
                    await nc.publish(started_subject(assignment.partition), encode(started))
                    metrics.TTFT.labels(self.name, model).observe(
                        time.monotonic() - stream.started_at
                    )
                    replayed = stream.replay()
                    if replayed is not None:
                        await self._chunks.send(reply, replayed, at_once=True)
                chunk = stream.chunk(out)
                if chunk is not None:
                    first = started is not None  # not held for the window: the TTFT
                    gate = self._frozen.get(rid)
                    if gate is not None:  # being handed over: a stop, or the go-ahead
                        await gate.wait()
                    if progress:  # before the reader's copy: the scheduler never knows less
                        copy = RequestProgress(
                            worker_id=self.worker_id,
                            chunk=chunk,
                            finish_reason=out.choice_finish_reason or "",
                        )
                        self._chunks.copy_ahead(progress, copy, at_once=first)
                        self._voice.spoke(time.monotonic(), lease)
                    await self._chunks.send(reply, chunk, at_once=first)
                    now = time.monotonic()
                    if last_chunk_at:  # each token of the chunk waited its share
                        n = max(1, chunk.tokens)
                        itl.observe((now - last_chunk_at) / n, n)
                    last_chunk_at = now
                if out.finish_reason is not None:
                    stream.restored = out.restored
                    stream.prompt_ids_given = out.prompt_ids_given
                    terminal = stream.finished(out, time.monotonic())
                    break  # finished: a deadline or cancel from here on changes nothing
        except asyncio.CancelledError:
            terminal = stream.stopped(
                expired=rid in self._expired, cancel_reason=self._cancel_reasons.pop(rid, None)
            )
            if rid in self._superseded:
                terminal = None  # moved on: its successor ends the request
        except EngineError as exc:
            terminal = stream.failed(exc.code, str(exc))
        except Exception as exc:
            log.exception("engine failed", request_id=rid)
            terminal = stream.failed(FailureCode.ENGINE_ERROR, f"engine error: {exc}")
        finally:
            if expiry is not None:
                expiry.cancel()
            self._expired.discard(rid)
            self._telling[rid] += 1  # before it leaves the heartbeat's inflight
            self._forget(rid, asyncio.current_task())
            try:  # a second cancel (a stop landing now) must not skip the end below
                await asyncio.shield(outputs.aclose())
            except asyncio.CancelledError:
                pass
            except Exception:  # the end is still the client's
                log.exception("the engine's outputs did not close", request_id=rid)
        filtered = False
        try:
            filtered = await self._end(assignment, stream, terminal, parent, received, itl)
        finally:
            if not filtered:  # a filtered end is sent by its own task
                self._told(rid)

    def _told(self, rid: str) -> None:
        self._telling[rid] -= 1
        if self._telling[rid] <= 0:
            del self._telling[rid]

    async def _end(
        self,
        assignment: WorkAssigned,
        stream: RequestStream,
        terminal: Any,
        parent: Any,
        received: float,
        itl: Any,
    ) -> bool:
        """Record the request's end, then send it: whether it went to the output filter
        (sent by a task of its own)."""
        nc, js = self.ctx.nc, self.ctx.js
        req = assignment.request
        rid, model, reply = req.request_id, req.model, req.reply_to
        if rid in self._superseded:
            self._superseded.discard(rid)
            log.info("attempt superseded", request_id=rid, attempt=assignment.attempt)
            return False
        if terminal is None:
            terminal = stream.unfinished()
        if isinstance(terminal, RequestFinished) and not stream.resumed:
            usage = terminal.usage  # a continuation's prefill covered tokens it did not count
            self.costs.observe(
                terminal.timings.prefill_s,
                usage.prompt_tokens,
                usage.cached_prompt_tokens,
                stream.restored,
            )
        metrics.ITL.add((self.name, model), itl)
        ended = time.monotonic()
        try:  # recorded first: told only if no one else ended it (record_end)
            ended_on = ended_subject(assignment.partition)
            await self._chunks.flush()  # the end follows the stream's last chunks
            if await record_end(
                js, ended_on, terminal, request_id=rid, msg_id=stream.end_record_id
            ):
                if req.client_reply_to and req.client_reply_to != reply:
                    self._end_through_filter(reply, req.client_reply_to, rid, terminal, stream)
                    return True
                await nc.publish(reply, encode(terminal), headers=request_headers(rid))
            return False
        finally:  # counted and logged even when the record of its end could not be made
            try:
                report_end(self.ctx.tracing, self.name, stream, terminal, parent, received, ended)
            except Exception:  # a metric or a span must not cut the end short
                log.exception("the request's end could not be reported", request_id=rid)

    async def _generate(
        self, assignment: WorkAssigned, stream: RequestStream
    ) -> AsyncGenerator[EngineOutput, None]:
        """The engine's outputs for the version that serves the request now (named on
        ``stream`` for its end). Waits while a swap holds new requests back."""
        await self._serving.wait()
        name = served_name(assignment)
        held = self.holding.resolve(name)
        if held is not None:  # the end names the version even when it is all there is
            stream.served_model = held.ref
        ended = nothing_left(assignment)
        if ended:  # the earlier attempt sent its last token: only the end is left
            req = assignment.request
            yield EngineOutput(
                text="",
                token_ids=[],
                prompt_tokens=req.prompt_tokens + len(carried_ids(assignment)),
                completion_tokens=0,
                finish_reason=ended,
                choice_finish_reason=ended,
            )
            return
        if held is None:
            raise EngineError(FailureCode.MODEL_NOT_FOUND, f"this worker does not serve {name!r}")
        adapter = "" if held is self.holding.model else held.ref
        model = self.holding.model
        request = engine_request(
            assignment,
            adapter,
            # what the spilled KV is keyed by: registry versions, else folders
            weights=model.ref if model.version else "",
            adapter_weights=(held.ref if held.version else held.path) if adapter else "",
        )
        async with contextlib.aclosing(self.engine.generate(request)) as outputs:
            async for out in outputs:
                yield out

    def _end_through_filter(
        self, via: str, client: str, rid: str, terminal: Terminal, stream: RequestStream
    ) -> None:
        """The end of a filtered stream goes to the sanitizer as a request: it answers
        once it has passed the end on to ``client``. No answer within
        ``filter_backup_s`` (that sanitizer restarted and lost the stream), or no
        sanitizer listening: the client is told ``stream_interrupted`` directly, or it
        would wait for its timeout (asked again meanwhile: an answer can be lost, and a
        slow one still counts). Only then: a backup sent after every end reached
        clients as a second terminal event (issue 42 item 6)."""
        nc = self.ctx.nc
        headers = request_headers(rid)

        async def end() -> None:
            try:
                await tell()
            finally:
                self._told(rid)

        async def tell() -> None:
            # asked again while it waits: the sanitizer takes a repeat as a repeat
            answered = await ask_until_answered(
                nc, via, encode(terminal), window_s=self.settings.filter_backup_s, headers=headers
            )
            if answered is not False:  # answered, or the connection is closing
                return
            log.warning("the output filter did not pass the end on", request_id=rid)
            try:
                await nc.publish(client, encode(stream.backup_end()), headers=headers)
            except Exception:
                log.warning("could not tell the client its stream's end", request_id=rid)

        task = asyncio.ensure_future(end())
        self._notes.add(task)  # held until sent: the loop keeps only weak references
        task.add_done_callback(self._notes.discard)

    def _expire(self, rid: str) -> None:
        task = self._tasks.get(rid)
        if task is not None and not task.cancelling():
            self._expired.add(rid)
            task.cancel()

    async def _on_cancel(self, cancel: CancelRequest, msg: Msg) -> None:
        tenant = tenant_of_subject(msg.subject, CANCEL)
        if tenant is not None:  # its request, by the platform's id for it
            cancel.request_id = tenant_request_id(tenant, cancel.request_id)
            if self._tenants.get(cancel.request_id) != tenant:
                return  # a tenant cancels its own requests only
        task = self._tasks.get(cancel.request_id)
        if cancel.attempt:  # one attempt, given up on: not a newer one running here
            self._served.refuse(cancel.request_id, cancel.attempt)
            if self._attempts.get(cancel.request_id) != cancel.attempt:
                return
            self._superseded.add(cancel.request_id)
        # one cancel only: a second would land in the cleanup and lose the terminal event
        if task is not None and not task.cancelling():
            self._cancel_reasons[cancel.request_id] = cancel.reason
            task.cancel()

    # -- heartbeats and drain ----------------------------------------------------------

    async def send_heartbeat(self) -> None:
        stalled = self._stall.stalled_s(time.monotonic(), len(self._streaming))
        limit = self.settings.engine_stall_s
        if limit and stalled > limit and not self._dead:
            self._dead = (
                f"the engine produced nothing for {stalled:.0f}s while "
                f"{len(self._streaming)} requests streamed on it"
            )
            log.error("engine stalled; exiting to be restarted", reason=self._dead)
            self.fail(self._dead)  # this heartbeat says so: its streams move elsewhere
            if self.ctx.stop is not None:
                self.ctx.stop.set()
        hb = heartbeat(
            worker_id=self.worker_id,
            engine_name=self.engine.name,
            models=list(self.holding.served()),
            max_num_seqs=self.engine.max_num_seqs,
            state=self.state,
            stats=self.engine.stats(),
            inflight=list(self._tasks),
            telling=list(self._telling),  # its keys: the request ids
            interval_s=self.settings.heartbeat_interval_s,
            now=time.time(),
            reason=self.failure,
            adapters=self.holding.adapter_names(),
            versions=self.holding.versions(),
            loading=self.loading,
            costs=self.costs,
            max_model_len=self.engine.max_model_len,
            kv_capacity_tokens=self.engine.kv_capacity_tokens,
            kv_block_size=self.engine.kv_block_size,
            stalled_s=stalled,
            handover=[rid for rid in self._handover if rid in self._tasks],
        )
        await self.ctx.nc.publish(heartbeat_subject(self.worker_id), encode(hb))
        self._voice.spoke(time.monotonic(), self._lease)
        self._stats_seen = report_stats(self.worker_id, hb, self._stats_seen)

    async def _sync(self) -> None:
        """After a silence past the lease: a round trip to the server, so a stop the
        scheduler sent meanwhile is read (and its cancel delivered) before streaming on."""
        try:
            await round_trip(self.ctx.nc, 2.0)
        except Exception:
            return  # the bus is away: the scheduler heard nothing either
        await asyncio.sleep(0.01)  # the stop's handler runs

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self.send_heartbeat()
            except Exception:
                log.exception("heartbeat failed")

    async def drain(self) -> None:
        if self._dead:  # a hung engine: its requests were moved or ended by the scheduler
            await self._abandon()
            return
        self.state = "draining"
        await self.send_heartbeat()
        if self.deliveries is not None:
            await self.deliveries.stop()
        await self.ctx.subscriptions.close(keep=("_on_cancel",))  # stops still come
        if self._tasks:
            budget = max(0.0, self.settings.drain_timeout_s - 2.0)
            began = time.monotonic()
            grace = self.settings.drain_handover_s
            if grace and grace < budget:
                _, pending = await asyncio.wait(list(self._tasks.values()), timeout=grace)
                if pending:
                    await self._hand_over()
            left = max(0.0, budget - (time.monotonic() - began))
            pending = set()
            if self._tasks:
                _, pending = await asyncio.wait(list(self._tasks.values()), timeout=left)
            # the "stopped" heartbeat has the scheduler move what can move: those stop
            # without a word (a worker_shutdown would end their readers first)
            self._superseded.update(rid for rid, can in self._streaming.items() if can)
            for task in pending:
                if not task.cancelling():
                    task.cancel()  # the others end as worker_shutdown, retryable
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        await self.ctx.subscriptions.close()
        if self._hb_task:
            self._hb_task.cancel()
        self.state = "stopped"
        await self._chunks.flush()
        await self.send_heartbeat()
        await round_trip(self.ctx.nc)
        if self._retiring is not None:
            await self._retiring
        await self.engine.stop()

    async def _hand_over(self) -> None:
        """Ask the scheduler to move the streams still running here that can move; it
        stops each it moves (an attempt-scoped cancel), and the rest run on."""
        movable = [rid for rid, can in self._streaming.items() if can]
        if not movable:
            return
        log.info("handing streams over", requests=len(movable))
        for rid in movable:  # held still: the scheduler's copy is all their readers have
            self._frozen[rid] = asyncio.Event()
        self._handover = movable
        try:
            await self.send_heartbeat()
        finally:
            self._handover = []
        moving = [self._tasks[r] for r in movable if r in self._tasks]
        if moving:  # the stops come within a round trip; the scheduler acts on a fresh ask
            await asyncio.wait(moving, timeout=HANDOVER_ANSWER_S)
        for rid in movable:  # kept here (no room elsewhere): they stream on
            gate = self._frozen.pop(rid, None)
            if gate is not None:
                gate.set()

    async def _abandon(self) -> None:
        """Stop everything at once without a word: the failed heartbeat had the scheduler
        move each request or end it; the engine is stopped as far as it lets itself."""
        if self._hb_task:
            self._hb_task.cancel()
        await self.ctx.subscriptions.close()
        self._superseded.update(self._tasks)
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=2.0)
        await self._chunks.flush()
        await self.send_heartbeat()  # still "failed"
        await round_trip(self.ctx.nc)
        try:
            await asyncio.wait_for(self.engine.stop(), 10.0)
        except Exception:
            log.exception("the hung engine did not stop; the process exit ends it")
