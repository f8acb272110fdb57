"""Scheduler adapter: JetStream and heartbeats in, assignments and terminal events out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError

from inferbus.contracts import (
    CANCEL,
    ENDED,
    ENDED_PARTITIONS,
    HEADER_MSG_ID,
    KV_INDEX,
    SCHEDULER_LOAD,
    CanaryWeights,
    CancelRequest,
    KvEvent,
    KvEventBatch,
    KvIndexPart,
    KvResync,
    LLMServiceSettings,
    Progress,
    ProgressBatch,
    RequestAccepted,
    RequestCancelled,
    RequestFailed,
    RequestStarted,
    ScalingStatus,
    SchedulerLoad,
    Terminal,
    WorkAssigned,
    WorkerHeartbeat,
    accepted_subject,
    kv_resync_subject,
    tenant_of_subject,
    tenant_request_id,
    work_subject,
    worker_partition,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import (
    Background,
    publish_durable,
    record_end,
    replay,
    request_headers,
    trace_headers,
)
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.partitions import PartitionView
from inferbus.shared.runtime import Context, Service
from inferbus.shared.streams import ensure_consumers
from inferbus.shared.subscriptions import Consume
from inferbus.shared.tracing import attributes as t
from inferbus.shared.tracing import valid_context

from . import kvsnapshot
from .core import (
    Assign,
    Cancel,
    Effect,
    Fail,
    HandOff,
    RecordedEnd,
    Refuse,
    Retell,
    SchedulerCore,
    SchedulerPolicy,
    Supersede,
    latest_attempts,
)
from .holder import LeaseHolder
from .leases import Leases
from .wiring import ACCEPTED_CONSUMER, WIRING, accepted_consumer, partition_subscriptions

log = logs.get("inferbus.scheduler")

_PUBLISH_ATTEMPTS = 5


def _decision(e: Effect) -> str:
    """``inferbus_scheduler_decisions_total``'s label for an effect."""
    match e:
        case Assign():
            return "assigned"
        case Cancel():
            return "cancelled"
        case Supersede():
            return "superseded"
        case HandOff():
            return "handed_off"
        case Retell():
            return "retold_restored" if e.restored else "retold"
    return e.code


class SchedulerSettings(ServiceSettings, kw_only=True):
    """inferbus scheduler: assigns accepted requests to live workers."""

    policy: SchedulerPolicy = SchedulerPolicy()
    """The core's decisions (routing, lanes, timeouts, queue limits): each of its fields
    is a flag of the same name (``--routing``, ``--max-queue-per-model``...)."""
    tick_interval_s: float = 0.1
    """How often the core looks at time: queue timeouts, deadlines, lost workers."""
    load_interval_s: float = 0.25
    """How often the queue state goes to the gateways (``ib.sched.load``)."""
    restore_window_s: float = 900.0
    """On start, assignments this recent that never ended are taken back (their slots
    count, and a lost worker fails them): a restart strands no request."""
    kv_snapshot_interval_s: float = 60.0
    """How often the KV index is stored (``ib-kv-index``, and once more when it stops)
    for the next start to load instead of reading all of IB_KV. 0: never."""
    scheduler_partitions: int = 1
    """Partitions of the fleet and its requests (docs/architecture.md): each instance
    books the workers and serves the requests of the partitions whose leases it holds.
    The sanitizer's setting of the same name (one ``INFERBUS_SCHEDULER_PARTITIONS``)
    must match. 1: unpartitioned, every instance books every worker (as before)."""
    lease_ttl_s: float = 3.0
    """A partition whose owner has not renewed its lease this long is taken over."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scheduler_partitions < 1:
            raise ValueError("scheduler_partitions must be at least 1")

    @property
    def partitioned(self) -> bool:
        return self.scheduler_partitions > 1

    @property
    def unpartitioned(self) -> bool:
        return self.scheduler_partitions == 1


SNAPSHOT_HISTORY_S = 86400.0
"""A stored KV index older than this is dropped (its scheduler gone a day)."""

HAND_OFF_AFTER_S = 1.0
"""Partitioned: a request queued this long for a model no worker here serves goes to a
partition whose workers do (a worker here may only have been slow to be heard)."""

_RECONNECT_GRACE_S = 1.0
"""After its own connection comes back, how long before workers not heard from yet
count as silent: they reconnect on their own retries (every 0.5 s)."""


class SchedulerService(Service[SchedulerSettings]):
    name = "scheduler"
    wiring = WIRING

    def __init__(self, settings: SchedulerSettings, ctx: Context[SchedulerSettings]) -> None:
        super().__init__(settings, ctx)
        self.core = SchedulerCore(settings.policy)
        # accepted messages are acked only when their request leaves the queue, so a
        # scheduler crash leaves queued requests in JetStream for redelivery
        self._unacked: dict[str, Msg] = {}
        self._tick_task: asyncio.Task[None] | None = None
        self._progress_task: asyncio.Task[None] | None = None
        self._work = Background()
        self._hits_seen = self._blocks_seen = 0
        self._traces: dict[str, dict[str, str]] = {}
        """Each live request's W3C context from its accepted message, carried onward."""
        self._aged: set[str] = set()
        self._live_seen: set[str] = set()
        self._deaf = False
        """Its own bus connection is down: it hears no one, so it judges no silence."""
        self.kv_resume_seq = 0
        """The IB_KV position the stored index loaded at start is as of (0: none)."""
        self._kv_applied = 0
        """The last IB_KV message the index holds."""
        self._kv_keys: set[str] = set()
        self._snapshot_task: asyncio.Task[None] | None = None
        self.leases = (
            Leases(settings.instance_id, settings.scheduler_partitions, settings.lease_ttl_s)
            if settings.partitioned
            else None
        )
        """Partitioned: the partitions it holds (services/scheduler/leases.py)."""
        self.holder = (
            LeaseHolder(self.ctx.js, self.leases, self._gain, self._fence, self._let_go)
            if self.leases is not None
            else None
        )
        self._partition_subs: dict[int, list[Any]] = {}
        self._gained: set[int] = set()
        """Partitions taken over while running: a worker of theirs first heard is asked
        for its whole KV state."""
        self.ended_resume_seq = 0
        """Partitioned: the IB_REQUESTS position its restore began at; ends are read on
        from there."""
        self._fenced = ""
        self.peers = PartitionView(settings.scheduler_partitions)
        """The other instances' reports: where a request for a model this one has no
        worker for goes on to."""
        """Why it must restart: a lease it held was taken while it stalled."""

    async def start(self) -> None:
        self.ctx.connection.disconnected.append(self._on_bus_lost)
        self.ctx.connection.reconnected.append(self._on_bus_back)
        if self.holder is not None:
            await self.holder.join()
            stream = await self.ctx.js.stream_info("IB_REQUESTS")
            self.ended_resume_seq = stream.state.last_seq
        # partitioned: what it held when it joined (what it claims later is restored
        # as it is gained, before it is read)
        await self._restore(self.ctx, self.holder.initial if self.holder is not None else None)
        await self._load_kv_index()

    # -- partitions ------------------------------------------------------------------

    def books(self, worker_id: str) -> bool:
        """Whether this instance books the worker (unpartitioned: every worker)."""
        if self.leases is None:
            return True
        return worker_partition(worker_id, self.leases.partitions) in self.leases.owned

    def books_subject(self, subject: str) -> bool:
        """``ib.hb.<worker>``, ``ib.kv.<worker>``, ``ib.progress.<worker>``: its own?"""
        return self.leases is None or self.books(subject.split(".", 2)[2])

    def _fence(self, why: str) -> None:
        """A lease of its own was lost: its books of that partition are stale, and only
        a restart makes them right (``alive`` says so, and the process exits 1)."""
        self._fenced = why
        if self.ctx.stop is not None:
            self.ctx.stop.set()

    async def _gain(self, partitions: set[int]) -> None:
        """Partitions taken over while running: what their last owners had placed and
        not seen end (one replay for the batch), then their requests. Their workers'
        KV state is asked of each worker: what their events said went unread here."""
        await self._restore(self.ctx, partitions)
        for wid in list(self.core.workers):
            if worker_partition(wid, self.settings.scheduler_partitions) in partitions:
                self.core.kv.resyncs.add(wid)
        self._gained |= partitions
        for p in sorted(partitions):
            await self._open_partition(p)

    async def _let_go(self, partition: int) -> None:
        """A partition given to an instance holding fewer (``leases.py``): it books
        none of its workers any more (``books``: already), reads its subjects no more,
        forgets its workers and their requests without ending them, and lets its
        assignments in flight reach IB_WORK, where the new owner's restore reads them.
        What it queued from the partition stays its own, placed or handed off."""
        for sub in reversed(self._partition_subs.pop(partition, [])):
            try:
                await sub.drain()
            except Exception:  # gone with the connection
                pass
        partitions = self.settings.scheduler_partitions
        workers = [w for w in self.core.workers if worker_partition(w, partitions) == partition]
        gone = self.core.let_go(workers)
        for rid in gone:
            self._traces.pop(rid, None)
        self._gained.discard(partition)
        await self._work.wait(2.0)
        log.info("partition let go", partition=partition, workers=len(workers), requests=len(gone))

    async def _open_partition(self, partition: int) -> None:
        if partition in self._partition_subs:
            return
        subs = self._partition_subs[partition] = []
        for spec in partition_subscriptions(partition):
            if isinstance(spec.source, Consume):
                await ensure_consumers(self.ctx.js, [spec.source.consumer])
            subs.append(await self.ctx.subscriptions.open_one(self, spec))

    def alive(self) -> tuple[bool, str]:
        return (False, self._fenced) if self._fenced else (True, "alive")

    async def _on_bus_lost(self) -> None:
        self._deaf = True

    async def _on_bus_back(self) -> None:
        # a NATS restart had it move every stream of workers it could not hear, whose
        # own ends then reached the clients beside the continuations' (CI, the nats
        # fault); the workers reconnect about when it does, give or take a retry
        self.core.heard_nothing(time.monotonic() + _RECONNECT_GRACE_S)
        self._deaf = False

    async def serving(self) -> None:
        self._tick_task = asyncio.create_task(self._ticks(), name="ticks")
        self._progress_task = asyncio.create_task(self._keep_unacked(), name="in-progress")
        if self.settings.kv_snapshot_interval_s > 0:
            self._snapshot_task = asyncio.create_task(self._store_kv_index(), name="kv-index")
        if self.holder is not None:
            for p in sorted(self.holder.initial):  # what the start restored
                await self._open_partition(p)
            self.holder.serve()

    def status(self) -> dict[str, Any]:
        status = self.core.status()
        if self.leases is not None:
            status["partitions"] = sorted(self.leases.owned)
        return status

    async def _restore(
        self, ctx: Context[SchedulerSettings], partitions: set[int] | None = None
    ) -> None:
        """Take back the assignments of the workers it books (``partitions``: of those
        partitions' only) that never ended: each request's latest attempt, wherever
        its earlier ones ran (a stream moved across partitions is its new worker's),
        and those workers' latest recorded ends, which may not have been told."""
        window = self.settings.restore_window_s
        if window <= 0:
            return
        work = await replay(ctx.js, "IB_WORK", "ib.work.>", window)
        ended_raw = await replay(ctx.js, "IB_REQUESTS", ENDED, window)
        if self.leases is not None:  # and where the partitions' workers record theirs
            ended_raw += await replay(ctx.js, "IB_REQUESTS", ENDED_PARTITIONS, window)
        stored = []
        for data, headers, _ in work:
            try:
                stored.append((decode(data, WorkAssigned), headers))
            except DecodeError:
                continue

        def mine(worker_id: str) -> bool:
            return self.books(worker_id) and (
                partitions is None
                or worker_partition(worker_id, self.settings.scheduler_partitions) in partitions
            )

        assignments = []
        for w, headers in latest_attempts(stored, mine):
            assignments.append((w.request, w.worker_id, w.attempt))
            trace = valid_context(headers)
            if trace:  # a reassignment or failure of it stays in its trace
                self._traces[w.request.request_id] = trace
        ended: dict[str, list[RecordedEnd]] = {}
        for data, _, at in ended_raw:
            try:
                end = decode(data, Terminal)
            except DecodeError:
                continue
            ended.setdefault(end.request_id, []).append(RecordedEnd(end, at))
        self.core.restore(assignments, ended, time.monotonic())
        for rid in ended:
            if rid not in self.core.inflight:  # an abandoned attempt's end: it runs on
                self._traces.pop(rid, None)
        log.info(
            "restored",
            assignments=len(assignments),
            ended=len(ended),
            inflight=len(self.core.inflight),
        )

    async def _load_kv_index(self) -> None:
        """The index as last stored, and where in IB_KV it is as of (read on from
        there by the KV subscription, ``start_after``). Whatever goes wrong here, IB_KV
        is read from its start, as without a stored index."""
        try:
            stored = await replay(
                self.ctx.js, f"KV_{KV_INDEX}", f"$KV.{KV_INDEX}.>", SNAPSHOT_HISTORY_S
            )
        except NotFoundError:
            return  # never stored
        except Exception:
            log.exception("could not read the stored KV index; reading IB_KV")
            return
        parts = []
        for data, _, _ in stored:
            if data:  # an empty value is a deleted key
                try:
                    part = decode(data, KvIndexPart)
                except DecodeError:
                    continue
                if self.books(part.worker_id):
                    parts.append(part)
        began = time.monotonic()
        try:
            resume = kvsnapshot.load(self.core.kv, parts)
            last = (await self.ctx.js.stream_info("IB_KV")).state.last_seq if resume else 0
        except Exception:
            log.exception("could not load the stored KV index; reading IB_KV")
            resume = last = 0
        if resume > last:
            # IB_KV was made again since (its numbers start over): the position means
            # nothing there, and its events would be skipped until it passed it
            log.warning("stored KV index ignored: IB_KV is newer", position=resume, last=last)
            resume = 0
        if not resume:
            for worker in {p.worker_id for p in parts}:
                self.core.kv.drop_worker(worker)
        self.kv_resume_seq = self._kv_applied = resume
        self._kv_keys = {kvsnapshot.key_of(p) for p in parts}
        log.info(
            "kv index loaded",
            parts=len(parts),
            blocks=self.core.kv.blocks(),
            after_stream_seq=self.kv_resume_seq,
            seconds=round(time.monotonic() - began, 3),
        )

    async def _store_kv_index(self) -> None:
        while True:
            await asyncio.sleep(self.settings.kv_snapshot_interval_s)
            try:
                await self._write_kv_index()
            except Exception:
                log.exception("could not store the KV index")

    async def _write_kv_index(self) -> None:
        """Store the index as it stands, a worker at a time (each at the IB_KV position
        when its parts were taken; the loop goes on between workers), and drop the keys
        of workers it no longer holds."""
        try:
            bucket = await self.ctx.js.key_value(KV_INDEX)
        except BucketNotFoundError:
            kv_stream = await self.ctx.js.stream_info("IB_KV")
            size = max(8 << 20, (kv_stream.config.max_bytes or 0) // 4)
            bucket = await self.ctx.js.create_key_value(
                KeyValueConfig(
                    bucket=KV_INDEX,
                    history=1,
                    max_bytes=size,
                    ttl=SNAPSHOT_HISTORY_S,
                    storage=StorageType.FILE,
                )
            )
        written: set[str] = set()
        for worker in self.core.kv.reporters():
            parts = kvsnapshot.worker_parts(self.core.kv, worker, self._kv_applied)
            for key, part in parts.items():
                await bucket.put(key, encode(part))
                written.add(key)
                self._kv_keys.add(key)  # a round cut short leaves no key unknown
            await asyncio.sleep(0)
        for gone in self._kv_keys - written:
            await bucket.delete(gone)
            self._kv_keys.discard(gone)

    async def drain(self) -> None:
        if self.holder is not None:  # renews what it holds until the end, takes no more
            self.holder.stop_gaining()
        await self.ctx.subscriptions.close(drain=True)
        for subs in list(self._partition_subs.values()):
            for sub in reversed(subs):  # accepted requests first
                try:
                    await sub.drain()
                except Exception:
                    pass
        for task in (self._tick_task, self._progress_task, self._snapshot_task):
            if task:
                task.cancel()
        await self._work.wait()
        # unacked accepted requests go back to JetStream for the next scheduler
        for msg in self._unacked.values():
            await msg.nak()
        # with the bus down nothing below is heard, each waited out its timeout (15 s
        # at four partitions): leases lapse, and the next start reads IB_KV instead
        reachable = self.ctx.nc.is_connected
        if self.holder is not None:
            await self.holder.release(reachable)
        if reachable and self.settings.kv_snapshot_interval_s > 0:
            try:  # the next start loads what this one knew at its end
                await asyncio.wait_for(self._write_kv_index(), 5.0)
            except Exception:
                log.exception("could not store the KV index")

    # -- inputs ----------------------------------------------------------------------

    async def _on_service(self, record: LLMServiceSettings, msg: Msg) -> None:
        try:
            slo = self.core.on_service(record)
        except ValueError as exc:
            log.warning("llmservice record refused", model=record.model, error=str(exc))
            return
        log.info("llmservice record", model=record.model, service=record.service, ttft_slo_s=slo)

    async def _on_scaling(self, status: ScalingStatus, msg: Msg) -> None:
        self.core.on_scaling(status.targets, time.monotonic(), 3 * status.interval_s)

    async def _on_accepted(self, event: RequestAccepted, msg: Msg) -> None:
        rid = event.request.request_id
        redelivered = msg.metadata.num_delivered > 1
        copy = (msg.headers or {}).get(HEADER_MSG_ID, "")
        if self.core.knows(rid):  # a redelivery or resend (nothing) or a reused id (refused)
            effects = self.core.on_accepted(
                event.request, time.monotonic(), time.time(), redelivered, copy
            )
            if rid in self._unacked and not effects:
                self._unacked[rid] = msg  # still queued: keep the newest handle
            else:
                await msg.ack()
            await self._apply(effects)
            return
        # acked once its assignment (or failure) is published, so a crash loses nothing
        self._unacked[rid] = msg
        trace = trace_headers(msg)
        if trace:
            self._traces[rid] = trace
        await self._apply(
            self.core.on_accepted(event.request, time.monotonic(), time.time(), redelivered, copy)
        )

    async def _on_peer_load(self, load: SchedulerLoad, msg: Msg) -> None:
        if load.scheduler_id != self.settings.instance_id:
            self.peers.on_load(load, time.monotonic())

    async def _on_heartbeat(self, hb: WorkerHeartbeat, msg: Msg) -> None:
        if self.leases is not None and hb.worker_id not in self.core.workers:
            taken_over = worker_partition(hb.worker_id, self.leases.partitions) in self._gained
            if taken_over:  # its KV events went unread here: whatever was read since
                self.core.kv.resyncs.add(hb.worker_id)
            else:  # at start: unless the stored index or IB_KV said something of it
                self.core.kv.ask_whole_state(hb.worker_id)
        await self._apply(self.core.on_heartbeat(hb, time.monotonic(), time.time()))

    async def _on_kv(self, event: KvEvent | KvEventBatch, msg: Msg) -> None:
        self._kv_applied = msg.metadata.sequence.stream
        if not isinstance(event, KvEventBatch):
            self.core.on_kv_event(event)  # one event: a worker from before batches
            return
        other = next((e.worker_id for e in event.events if e.worker_id != event.worker_id), None)
        if other is not None:  # its subject vouches for the batch's worker, not for this
            await self.ctx.dead_letters.send(
                msg, f"a KV event of {other!r} in a batch of {event.worker_id!r}"
            )
            return
        for e in event.events:
            self.core.on_kv_event(e)

    async def _on_canary(self, ev: CanaryWeights, msg: Msg) -> None:
        try:
            self.core.set_canary(ev.model, ev.weights)
        except ValueError as exc:
            await self.ctx.dead_letters.send(msg, f"canary weights refused: {exc}")
            return
        log.info("canary weights", model=ev.model, weights=ev.weights)
        await self._apply(self.core.tick(time.monotonic()))

    async def _on_started(self, ev: RequestStarted, msg: Msg) -> None:
        gap = self.core.on_started(
            ev.request_id, ev.attempt, ev.worker_id, ev.migratable, time.monotonic()
        )
        if gap is not None:
            f = self.core.inflight.get(ev.request_id)
            model = f.request.model if f is not None else ""
            metrics.MIGRATION_GAP.labels(model).observe(gap)

    async def _on_progress(self, ev: Progress, msg: Msg) -> None:
        now = time.monotonic()
        for copy in ev.progress if isinstance(ev, ProgressBatch) else (ev,):
            if copy.worker_id == ev.worker_id:  # a worker copies its own requests only
                self.core.on_progress(copy.worker_id, copy.chunk, now, copy.finish_reason)

    async def _on_ended(self, ev: Terminal, msg: Msg) -> None:
        await self._ended(ev)
        if self.leases is None:
            await msg.ack()  # partitioned, every instance follows these unacked

    async def _on_partition_ended(self, ev: Terminal, msg: Msg) -> None:
        await self._ended(ev)
        await msg.ack()

    async def _ended(self, ev: Terminal) -> None:
        attempt = getattr(ev, "attempt", 0)  # a rejection names none
        await self._apply(self.core.on_ended(ev.request_id, time.monotonic(), attempt, ev))
        self._traces.pop(ev.request_id, None)

    async def _on_cancel(self, ev: CancelRequest, msg: Msg) -> None:
        if ev.attempt:
            return  # one attempt's: for the worker that runs it (this scheduler's own)
        tenant = tenant_of_subject(msg.subject, CANCEL)
        rid = tenant_request_id(tenant, ev.request_id) if tenant else ev.request_id
        await self._apply(self.core.on_cancel(rid, ev.reason, tenant))

    async def _ticks(self) -> None:
        next_load = 0.0
        while True:
            await asyncio.sleep(self.settings.tick_interval_s)
            if self._deaf:
                continue  # time-based decisions wait for the bus (it reconnects in seconds)
            try:
                now = time.monotonic()
                await self._apply(self.core.tick(now))
                if self.leases is not None:
                    me = self.settings.instance_id
                    serving = self.peers.serving(now, but=me)
                    await self._apply(self.core.hand_off(serving, now, HAND_OFF_AFTER_S))
                await self._ask_resyncs(now)
                if now >= next_load:
                    next_load = now + self.settings.load_interval_s
                    load = SchedulerLoad(
                        scheduler_id=self.settings.instance_id,
                        models=self.core.load(now),
                        sent_at=time.time(),
                        interval_s=self.settings.load_interval_s,
                        partitions=sorted(self.leases.owned) if self.leases else [],
                    )
                    await self.ctx.nc.publish(SCHEDULER_LOAD, encode(load))
                for model, q in self.core.queues.items():
                    for lane, n in q.depths().items():
                        metrics.QUEUE_DEPTH.labels(model, lane).set(n)
                        metrics.QUEUE_OLDEST.labels(model, lane).set(q.oldest_wait(lane, now))
                hits, blocks = self.core.routed_hits, self.core.routed_blocks
                metrics.ROUTED_PREFIX_BLOCKS.labels("true").inc(hits - self._hits_seen)
                metrics.ROUTED_PREFIX_BLOCKS.labels("false").inc(
                    blocks - hits - (self._blocks_seen - self._hits_seen)
                )
                self._hits_seen, self._blocks_seen = hits, blocks
                live = self.core.live_models()
                for model, n in live.items():
                    metrics.LIVE_WORKERS.labels(model).set(n)
                for model in self._live_seen - live.keys():
                    metrics.LIVE_WORKERS.labels(model).set(0)  # its last worker is gone
                self._live_seen |= live.keys()
                self._heartbeat_ages(now)
            except Exception:
                log.exception("tick failed")

    async def _ask_resyncs(self, now: float) -> None:
        """Ask the workers whose KV events came with one missing for their whole state."""
        for worker, seen in self.core.kv.take_resyncs(now).items():
            log.info("kv events missed: asking for the whole state", worker=worker, seen_seq=seen)
            await self.ctx.nc.publish(
                kv_resync_subject(worker), encode(KvResync(worker_id=worker, seen_seq=seen))
            )

    def _heartbeat_ages(self, now: float) -> None:
        workers = self.core.workers
        for wid, w in workers.items():
            metrics.HEARTBEAT_AGE.labels(wid).set(max(0.0, now - w.last_seen))
        for gone in self._aged - workers.keys():
            metrics.HEARTBEAT_AGE.remove(gone)  # lost: the live-worker count says so
        self._aged = set(workers)

    async def _keep_unacked(self) -> None:
        """Tell JetStream that queued requests are still being handled (no redelivery)."""
        while True:
            # the shortest ack wait of the consumers it reads accepted requests through
            wait = ACCEPTED_CONSUMER.ack_wait_s
            if self.leases is not None:
                wait = min(wait, accepted_consumer(0).ack_wait_s)
            await asyncio.sleep(wait / 3)
            for msg in list(self._unacked.values()):
                try:
                    await msg.in_progress()
                except Exception:
                    log.exception("in_progress failed")

    # -- effects ---------------------------------------------------------------------

    async def _apply(self, effects: list[Effect]) -> None:
        """The core has already moved on; the publishes run beside the next events."""
        for e in effects:
            await self._work.spawn(self._carry_out(e))

    async def _carry_out(self, e: Effect) -> None:
        """Publish with bounded retries (a JetStream leader change, a slow ack), then
        release the held message either way: an accepted message kept in progress
        forever would pin its request and a consumer slot."""
        rid = e.request.request_id
        metrics.SCHEDULER_DECISIONS.labels(_decision(e)).inc()
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                await self._publish(e)
                break
            except Exception:
                if attempt == _PUBLISH_ATTEMPTS:
                    log.exception(
                        "could not publish an effect; its request may not end",
                        request_id=rid,
                        effect=type(e).__name__,
                    )
                else:
                    await asyncio.sleep(0.25 * 2**attempt)
        if isinstance(e, Refuse | Supersede | Retell):
            return  # the held message, if any, is the first request's (or long acked)
        held = self._unacked.pop(rid, None)
        if held is not None:
            try:
                await held.ack()
            except Exception:
                log.exception("ack failed", request_id=rid)

    async def _publish(self, e: Effect) -> None:
        js, nc = self.ctx.js, self.ctx.nc
        rid = e.request.request_id
        if isinstance(e, Refuse):  # only this sender hears it; the id's owner is untouched
            refusal = RequestFailed(request_id=rid, code=e.code, reason=e.reason)
            await nc.publish(e.request.reply_to, encode(refusal), headers=request_headers(rid))
            log.warning("request refused", request_id=rid, code=e.code)
            return
        if isinstance(e, Supersede):  # for the presumed-lost worker, should it wake
            stop = CancelRequest(
                request_id=rid,
                reason=f"moved off worker {e.worker_id}, presumed lost",
                attempt=e.attempt,
            )
            await nc.publish(CANCEL, encode(stop), headers=request_headers(rid))
            return
        if isinstance(e, HandOff):
            await self._hand_off(e)
            return
        if isinstance(e, Retell):  # recorded by its silent worker, which may never send it
            await nc.publish(e.request.reply_to, encode(e.end), headers=request_headers(rid))
            log.warning("request's end sent for its silent worker", request_id=rid)
            return
        trace = self._traces.get(rid)
        if isinstance(e, Assign):
            began = time.time()
            work = WorkAssigned(
                request=e.request,
                worker_id=e.worker_id,
                attempt=e.attempt,
                assigned_at=began,
                served_model=e.served_model,
                expected_cached_tokens=e.cached_tokens,
                migratable=e.migratable,
                resume=e.resume,
                lease_s=e.lease_s,
                partition=(
                    worker_partition(e.worker_id, self.settings.scheduler_partitions)
                    if self.leases is not None
                    else None
                ),
            )
            # recorded first: a fast request may have ended (and been decided) by the
            # time the publish is acknowledged
            self._trace_assignment(e, trace, began)
            await publish_durable(
                js,
                work_subject(e.worker_id),
                work,
                request_id=rid,
                msg_id=f"{rid}:{e.attempt}",
                trace=trace,
            )
            kind = "first" if e.attempt == 1 else "retry" if e.resume is None else "migration"
            metrics.ASSIGNMENTS.labels(e.request.model, kind).inc()
            if e.resume is not None:
                metrics.MIGRATIONS.labels(e.request.model, e.cause).inc()
                metrics.MIGRATED_TOKENS.labels(e.request.model).inc(len(e.resume.output_ids))
                log.info(
                    "stream moved",
                    request_id=rid,
                    worker=e.worker_id,
                    attempt=e.attempt,
                    cause=e.cause,
                    tokens=len(e.resume.output_ids),
                    next_seq=e.resume.next_seq,
                )
            metrics.QUEUE_TIME.labels(e.request.model, e.lane).observe(e.queued_s)
            # debug: the request's one info line is written where it ends
            log.debug("assigned", request_id=rid, worker=e.worker_id, attempt=e.attempt)
        else:
            terminal: Any
            if isinstance(e, Fail):
                terminal = RequestFailed(
                    request_id=rid,
                    code=e.code,
                    reason=e.reason,
                    retryable=e.retryable,
                    served_model=e.served_model,
                    retry_after_s=e.retry_after_s,
                )
                log.warning("request failed", request_id=rid, code=e.code, reason=e.reason)
            else:
                assert isinstance(e, Cancel)
                terminal = RequestCancelled(request_id=rid, reason=e.reason)
            # recorded first: told only if no one else ended it (record_end)
            if await record_end(js, ENDED, terminal, request_id=rid, msg_id=f"{rid}:end"):
                await nc.publish(e.request.reply_to, encode(terminal), headers=request_headers(rid))
            outcome = terminal.__struct_config__.tag
            metrics.REQUESTS.labels(self.name, e.request.model, outcome).inc()
            self._trace_end(e, self._traces.pop(rid, None), outcome)

    async def _hand_off(self, e: HandOff) -> None:
        rid = e.request.request_id
        now = time.monotonic()
        me = self.settings.instance_id
        partition = self.peers.choose(e.request, now, but=me)
        held = self._unacked.get(rid)
        if partition is None:  # the other gone quiet since: it comes back here, anew
            if held is not None:
                self._unacked.pop(rid)
                await held.nak()
            return
        accepted = RequestAccepted(request=e.request, accepted_at=time.time())
        # the accepted message's own position makes the id: a request handed back and
        # forth is a new message each time, never deduplicated away
        via = held.metadata.sequence.stream if held is not None else int(now * 1000)
        await publish_durable(
            self.ctx.js,
            accepted_subject(partition),
            accepted,
            request_id=rid,
            msg_id=f"{rid}:to:{partition}:{via}",
            trace=self._traces.pop(rid, None),
        )
        log.info("request handed off", request_id=rid, model=e.request.model, partition=partition)

    def _trace_assignment(self, e: Assign, trace: dict[str, str] | None, began: float) -> None:
        """The request's wait in the queue and its placement, as two stage spans."""
        tracing = self.ctx.tracing
        parent = tracing.parent(trace)
        if parent is None:
            return
        ns = 1_000_000_000
        attrs = {
            t.REQUEST_ID: e.request.request_id,
            t.GEN_AI_REQUEST_MODEL: e.request.model,
            t.ATTEMPT: e.attempt,
            t.LANE: e.lane,
            t.TENANT: e.request.tenant,
        }
        waited = {**attrs, "inferbus.priority": e.request.priority}
        if e.resume is not None:  # a stream moved off its worker: the move's own span
            waited |= {
                "inferbus.migration.cause": e.cause,
                "inferbus.migration.tokens": len(e.resume.output_ids),
                "inferbus.migration.from_attempt": e.resume.from_attempt,
            }
        tracing.record(
            "migration" if e.resume is not None else "queue wait",
            parent,
            int((began - e.queued_s) * ns),
            int(began * ns),
            waited,
        )
        # the placement: from the core's choice to the assignment handed to JetStream
        tracing.record(
            "schedule",
            parent,
            int(began * ns),
            time.time_ns(),
            {
                **attrs,
                t.WORKER: e.worker_id,
                "inferbus.routing": self.settings.policy.routing,
                "inferbus.prefix_blocks": e.prefix_blocks,
                "inferbus.cached_prefix_blocks": e.cached_blocks,
                t.GEN_AI_RESPONSE_MODEL: e.served_model or e.request.model,
            },
        )

    def _trace_end(self, e: Fail | Cancel, trace: dict[str, str] | None, outcome: str) -> None:
        """A request this scheduler ended (in its queue, or its worker lost): the trace's
        decision is made here, and the request's one log line written."""
        tracing = self.ctx.tracing
        parent = tracing.parent(trace)
        req = e.request
        e2e = time.time() - req.created_at if req.created_at else 0.0
        code = e.code if isinstance(e, Fail) else ""
        if parent is not None:  # the point where it ended, with why
            now = time.time_ns()
            tracing.record(
                "schedule",
                parent,
                now,
                now,
                {
                    t.REQUEST_ID: req.request_id,
                    t.GEN_AI_REQUEST_MODEL: req.model,
                    "inferbus.outcome": outcome,
                },
                error=f"{code}: {e.reason}" if code else "",
            )
        decision = tracing.end_request(
            parent, request_id=req.request_id, failed=isinstance(e, Fail), e2e_s=e2e
        )
        log.info(
            "request ended",
            request_id=req.request_id,
            model=req.model,
            tenant=req.tenant,
            outcome=outcome,
            code=code,
            e2e_s=round(e2e, 6),
            **tracing.log_fields(parent, decision),
        )
