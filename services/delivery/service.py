"""Delivery adapter: rollout commands, swaps, heartbeats and request ends in; the core
ticked; deliveries, canary weights, the registry's current version and every
decision out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from inferbus.contracts import (
    DELIVERY_COMMANDS,
    ENDED,
    HEARTBEATS,
    SWAPPED,
    DeployRequest,
    ModelSwapped,
    RequestFailed,
    RequestFinished,
    RollbackRequest,
    RolloutDecision,
    Terminal,
    WorkerHeartbeat,
    canary_subject,
    delivery_load_subject,
    rollout_subject,
)
from inferbus.shared import logs, metrics, modelstore
from inferbus.shared.bus import consume, publish_durable
from inferbus.shared.codec import decode, decode_or_none, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service
from inferbus.shared.streams import ConsumerSpec

from .core import DeliveryCore, DeliveryPolicy, Effects, Rollout

log = logs.get("inferbus.delivery")

COMMANDS = ConsumerSpec(
    durable="delivery-commands",
    stream="IB_DELIVERY",
    filter_subject=DELIVERY_COMMANDS,
    deliver_subject="ib.deliver.delivery-commands",
)
SWAPS = ConsumerSpec(
    durable="delivery-swapped",
    stream="IB_DELIVERY",
    filter_subject=SWAPPED,
    deliver_subject="ib.deliver.delivery-swapped",
)

_ROLLOUT_KEY = "rollout.{model}"


class DeliverySettings(ServiceSettings, kw_only=True):
    """inferbus delivery: rolls model versions out to workers, canary first, and back."""

    policy: DeliveryPolicy = DeliveryPolicy()
    """Rules every rollout follows (``--window-s``, ``--breach-min-samples``...)."""
    tick_s: float = 1.0
    """How often rollouts are judged and stepped."""


class DeliveryService(Service[DeliverySettings]):
    name = "delivery"

    def __init__(self, settings: DeliverySettings) -> None:
        super().__init__(settings)
        self.core = DeliveryCore(settings.policy)
        self._ctx: Context[DeliverySettings] | None = None
        self._subs: list[Any] = []
        self._tick_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        """One change at a time: a command, a swap answer or a tick."""

    def consumers(self) -> list[ConsumerSpec]:
        return [COMMANDS, SWAPS]

    async def start(self, ctx: Context[DeliverySettings]) -> None:
        self._ctx = ctx
        await modelstore.registry(ctx.js, create=True)
        await modelstore.artifacts(ctx.js, create=True)
        await self._restore()
        nc, js = ctx.nc, ctx.js
        self._subs = [
            await nc.subscribe(HEARTBEATS, cb=self._on_heartbeat),
            # request ends from now on (each names the version that served it)
            await js.subscribe(
                ENDED,
                stream="IB_REQUESTS",
                cb=self._on_ended,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            ),
            await consume(nc, COMMANDS, self._on_command),
            await consume(nc, SWAPS, self._on_swapped),
        ]
        self._tick_task = asyncio.create_task(self._ticks(), name="ticks")

    async def drain(self) -> None:
        if self._tick_task:
            self._tick_task.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # gone with the connection
                pass

    def status(self) -> dict[str, Any]:
        return {
            "rollouts": {
                m: {
                    "version": r.candidate.version,
                    "phase": r.phase,
                    "step": r.step,
                    "weight": r.weight,
                    "workers": r.workers,
                }
                for m, r in self.core.rollouts.items()
            },
            "workers": len(self.core.fleet),
        }

    async def _restore(self) -> None:
        """Rollouts in flight when the last delivery process stopped resume here."""
        assert self._ctx
        kv = await modelstore.registry(self._ctx.js)
        for key in await modelstore.keys(self._ctx.js, "rollout."):
            value = await modelstore.value_of(kv, key)
            if value is None:
                continue
            try:
                rollout = decode(value, Rollout)
            except Exception as exc:
                log.error("a saved rollout does not decode; ignored", key=key, error=str(exc))
                continue
            if rollout.active:
                self.core.restore(rollout)
                log.info(
                    "rollout resumed",
                    model=rollout.model,
                    version=rollout.candidate.version,
                    phase=rollout.phase,
                )

    # -- inputs ----------------------------------------------------------------------------

    async def _on_heartbeat(self, msg: Msg) -> None:
        hb = decode_or_none(msg.data, WorkerHeartbeat)
        if hb is not None:
            self.core.on_heartbeat(hb, time.time())

    async def _on_ended(self, msg: Msg) -> None:
        ev = decode_or_none(msg.data, Terminal)
        if isinstance(ev, RequestFinished | RequestFailed):
            self.core.on_ended(ev, time.time())

    async def _on_command(self, msg: Msg) -> None:
        assert self._ctx
        cmd = await self._ctx.dead_letters.decode(msg, DeployRequest | RollbackRequest, ack=True)
        if cmd is None:
            return
        js, now = self._ctx.js, time.time()
        metrics.EVENTS_HANDLED.labels(self.name, cmd.__struct_config__.tag).inc()
        async with self._lock:
            current = await modelstore.get_current(js, cmd.model)
            if isinstance(cmd, DeployRequest):
                candidate = await modelstore.get_version(js, cmd.model, cmd.version)
                base = await self._version(cmd.model, current.version if current else "")
                effects = self.core.deploy(cmd, candidate, current, base, now)
            else:
                effects = self.core.rollback(
                    cmd,
                    current,
                    await self._version(cmd.model, current.version if current else ""),
                    await self._version(cmd.model, current.previous if current else ""),
                    now,
                )
            await self._carry_out(effects)
        await msg.ack()

    async def _version(self, name: str, version: str) -> Any:
        if not version or self._ctx is None:
            return None
        return await modelstore.get_version(self._ctx.js, name, version)

    async def _on_swapped(self, msg: Msg) -> None:
        assert self._ctx
        ev = await self._ctx.dead_letters.decode(msg, ModelSwapped, ack=True)
        if ev is None:
            return
        log.info(
            "swap answered",
            worker=ev.worker_id,
            model=ev.model,
            ok=ev.ok,
            mode=ev.mode,
            code=ev.code,
            reason=ev.reason,
            total_s=round(ev.total_s, 4),
        )
        async with self._lock:
            await self._carry_out(self.core.on_swapped(ev, time.time()))
        await msg.ack()

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                async with self._lock:
                    await self._carry_out(self.core.tick(time.time()))
            except Exception:
                log.exception("tick failed")

    # -- effects ---------------------------------------------------------------------------

    async def _carry_out(self, effects: Effects) -> None:
        """Traffic first (canary weights: a rollback's point), then the registry, the
        deliveries, and the record of each decision."""
        assert self._ctx
        js = self._ctx.js
        if effects.canary is not None:
            c = effects.canary
            await publish_durable(js, canary_subject(c.model), c, request_id=f"canary-{c.model}")
        if effects.current is not None:
            await modelstore.set_current(js, effects.current)
        for d in effects.deliveries:
            await publish_durable(
                js,
                delivery_load_subject(d.model.name),
                d,
                request_id=f"delivery-{d.delivery_id}",
                msg_id=f"delivery-{d.delivery_id}",
            )
        for decision in effects.decisions:
            await self._record(decision)
        kv = await modelstore.registry(js)
        for model in effects.changed:
            rollout = self.core.rollouts.get(model)
            if rollout is not None:
                await kv.put(_ROLLOUT_KEY.format(model=model), encode(rollout))
                metrics.ROLLOUT_WEIGHT.labels(model, rollout.candidate.version).set(rollout.weight)

    async def _record(self, decision: RolloutDecision) -> None:
        assert self._ctx
        metrics.ROLLOUT_DECISIONS.labels(decision.model, decision.action).inc()
        log.info(
            "rollout",
            model=decision.model,
            version=decision.version,
            action=decision.action,
            weight=decision.weight,
            reason=decision.reason,
        )
        await publish_durable(
            self._ctx.js,
            rollout_subject(decision.model),
            decision,
            request_id=f"rollout-{decision.model}",
        )
