"""Worker adapter: takes assignments from JetStream, streams engine output over core NATS."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from inferbus.contracts import (
    CANCEL,
    ENDED,
    STARTED,
    CancelRequest,
    RequestCancelled,
    RequestFailed,
    WorkAssigned,
    WorkerState,
    heartbeat_subject,
    subject_token,
    work_subject,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import publish_durable, request_headers
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service

from .core import RequestStream, engine_request, heartbeat
from .engine import Engine
from .sim import SimEngine, SimTiming

log = logs.get("inferbus.worker")


class WorkerSettings(ServiceSettings, kw_only=True):
    """inferbus worker: serves assignments with an LLM engine."""

    engine: str = "sim"
    model: str = "sim-model"
    max_num_seqs: int = 256
    heartbeat_interval_s: float = 1.0
    sim_prefill_s_per_token: float = 0.0
    sim_decode_s_per_step: float = 0.0
    sim_decode_s_per_seq: float = 0.0


def build_engine(s: WorkerSettings) -> Engine:
    if s.engine == "sim":
        timing = SimTiming(
            prefill_s_per_token=s.sim_prefill_s_per_token,
            decode_s_per_step=s.sim_decode_s_per_step,
            decode_s_per_seq=s.sim_decode_s_per_seq,
        )
        return SimEngine(s.model, timing, s.max_num_seqs)
    raise SystemExit(f"unknown engine {s.engine!r}: choose sim")


class WorkerService(Service[WorkerSettings]):
    name = "worker"

    def __init__(self, settings: WorkerSettings, engine: Engine | None = None) -> None:
        super().__init__(settings)
        self.engine = engine or build_engine(settings)
        # a fresh id per process: a restarted worker never inherits a dead one's assignments
        self.worker_id = subject_token(f"{settings.instance_id}-{secrets.token_hex(3)}")
        self.state: WorkerState = "starting"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_reasons: dict[str, str] = {}
        self._hb_task: asyncio.Task[None] | None = None
        self._ctx: Context[WorkerSettings] | None = None
        self._subs: list[Any] = []

    async def start(self, ctx: Context[WorkerSettings]) -> None:
        self._ctx = ctx
        logs.bind(worker=self.worker_id)
        await self.engine.start()
        self._subs.append(await ctx.nc.subscribe(CANCEL, cb=self._on_cancel))
        self._subs.append(
            await ctx.js.subscribe(
                work_subject(self.worker_id),
                stream="IB_WORK",
                cb=self._on_work,
                manual_ack=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, inactive_threshold=60.0),
            )
        )
        self.state = "ready"
        self._hb_task = asyncio.create_task(self._heartbeats(), name="heartbeats")
        await self._send_heartbeat()

    def ready(self) -> tuple[bool, str]:
        return self.state == "ready", self.state

    def status(self) -> dict[str, Any]:
        stats = self.engine.stats()
        return {
            "worker_id": self.worker_id,
            "engine": self.engine.name,
            "models": self.engine.models,
            "state": self.state,
            "inflight": len(self._tasks),
            "running": stats.running,
            "waiting": stats.waiting,
        }

    # -- assignments -----------------------------------------------------------------

    async def _on_work(self, msg: Msg) -> None:
        assert self._ctx
        try:
            assignment = decode(msg.data, WorkAssigned)
        except DecodeError as exc:
            await self._ctx.dead_letters.send(msg, f"undecodable WorkAssigned: {exc}")
            await msg.ack()
            return
        await msg.ack()
        rid = assignment.request.request_id
        metrics.EVENTS_HANDLED.labels(self.name, "work.assigned").inc()
        if rid in self._tasks:
            return  # a redelivery of what we already serve
        self._tasks[rid] = asyncio.create_task(self._serve(assignment), name=f"req-{rid}")
        metrics.INFLIGHT.labels(self.name).set(len(self._tasks))

    async def _serve(self, assignment: WorkAssigned) -> None:
        assert self._ctx
        nc, js = self._ctx.nc, self._ctx.js
        req = assignment.request
        rid, model = req.request_id, req.model
        reply = req.reply_to
        stream = RequestStream(assignment, self.worker_id, time.monotonic())
        outputs = self.engine.generate(engine_request(assignment))
        terminal: Any = None
        try:
            async for out in outputs:
                started = stream.started(time.monotonic())
                if started is not None:
                    await nc.publish(STARTED, encode(started))
                    metrics.TTFT.labels(self.name, model).observe(
                        time.monotonic() - stream.started_at
                    )
                chunk = stream.chunk(out)
                if chunk is not None:
                    await nc.publish(reply, encode(chunk))
                if out.finish_reason is not None:
                    terminal = stream.finished(out)
                    metrics.TOKENS.labels(self.name, model, "prefill").inc(out.prompt_tokens)
                    metrics.TOKENS.labels(self.name, model, "decode").inc(out.completion_tokens)
        except asyncio.CancelledError:
            reason = self._cancel_reasons.pop(rid, None)
            if reason is None:
                terminal = RequestFailed(
                    request_id=rid, code="worker_shutdown",
                    reason="the worker shut down before the request finished; retry it",
                    retryable=True,
                )
            else:
                terminal = RequestCancelled(request_id=rid, reason=reason)
        except Exception as exc:
            log.exception("engine failed", request_id=rid)
            terminal = RequestFailed(
                request_id=rid, code="engine_error", reason=f"engine error: {exc}"
            )
        finally:
            await outputs.aclose()
            self._tasks.pop(rid, None)
            metrics.INFLIGHT.labels(self.name).set(len(self._tasks))
        if terminal is None:
            terminal = RequestFailed(
                request_id=rid, code="engine_error", reason="engine ended without a finish reason"
            )
        outcome = terminal.__struct_config__.tag
        metrics.REQUESTS.labels(self.name, model, outcome).inc()
        metrics.E2E.labels(self.name, model).observe(time.monotonic() - stream.started_at)
        data = encode(terminal)
        await nc.publish(reply, data, headers=request_headers(rid))
        await publish_durable(js, ENDED, terminal, request_id=rid, msg_id=f"{rid}:end")
        log.info("request ended", request_id=rid, outcome=outcome, chunks=stream.seq)

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            cancel = decode(msg.data, CancelRequest)
        except DecodeError:
            return  # the scheduler dead-letters bad cancels; the worker just ignores them
        task = self._tasks.get(cancel.request_id)
        if task is not None:
            self._cancel_reasons[cancel.request_id] = cancel.reason
            task.cancel()

    # -- heartbeats and drain ----------------------------------------------------------

    async def _send_heartbeat(self) -> None:
        assert self._ctx
        hb = heartbeat(
            worker_id=self.worker_id,
            engine_name=self.engine.name,
            models=self.engine.models,
            max_num_seqs=self.engine.max_num_seqs,
            state=self.state,
            stats=self.engine.stats(),
            inflight=list(self._tasks),
            interval_s=self.settings.heartbeat_interval_s,
            now=time.time(),
        )
        await self._ctx.nc.publish(heartbeat_subject(self.worker_id), encode(hb))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._send_heartbeat()
            except Exception:
                log.exception("heartbeat failed")

    async def drain(self) -> None:
        assert self._ctx
        self.state = "draining"
        await self._send_heartbeat()
        for sub in self._subs:
            await sub.unsubscribe()
        if self._tasks:
            budget = max(0.0, self.settings.drain_timeout_s - 2.0)
            _, pending = await asyncio.wait(list(self._tasks.values()), timeout=budget)
            for task in pending:
                task.cancel()  # ends as worker_shutdown, retryable
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        if self._hb_task:
            self._hb_task.cancel()
        self.state = "stopped"
        await self._send_heartbeat()
        await self._ctx.nc.flush()
        await self.engine.stop()
