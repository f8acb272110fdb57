"""Delivery adapter: rollout commands, swaps, heartbeats and request ends in; the core
ticked; deliveries, canary weights, the registry's current version and every
decision out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nats.aio.msg import Msg

from inferbus.contracts import (
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
from inferbus.shared.bus import publish_durable
from inferbus.shared.codec import decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.kvwrite import put_until_stored
from inferbus.shared.runtime import Context, Service

from .core import DeliveryCore, DeliveryPolicy, Effects, Rollout
from .wiring import WIRING

log = logs.get("inferbus.delivery")

_ROLLOUT_KEY = "rollout.{model}"


class DeliverySettings(ServiceSettings, kw_only=True):
    """inferbus delivery: rolls model versions out to workers, canary first, and back."""

    policy: DeliveryPolicy = DeliveryPolicy()
    """Rules every rollout follows (``--window-s``, ``--breach-min-samples``...)."""
    tick_s: float = 1.0
    """How often rollouts are judged and stepped."""


class DeliveryService(Service[DeliverySettings]):
    name = "delivery"
    wiring = WIRING

    def __init__(self, settings: DeliverySettings, ctx: Context[DeliverySettings]) -> None:
        super().__init__(settings, ctx)
        self.core = DeliveryCore(settings.policy)
        self._tick_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        """One change at a time: a command, a swap answer or a tick."""

    async def start(self) -> None:
        ctx = self.ctx
        await modelstore.registry(ctx.js, create=True)
        await modelstore.artifacts(ctx.js, create=True)
        await self._restore()

    async def serving(self) -> None:
        self._tick_task = asyncio.create_task(self._ticks(), name="ticks")

    async def drain(self) -> None:
        if self._tick_task:
            self._tick_task.cancel()

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
        kv = await modelstore.registry(self.ctx.js)
        for key in await modelstore.keys(self.ctx.js, "rollout."):
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

    async def _on_heartbeat(self, hb: WorkerHeartbeat, msg: Msg) -> None:
        self.core.on_heartbeat(hb, time.time())

    async def _on_ended(self, ev: Terminal, msg: Msg) -> None:
        if isinstance(ev, RequestFinished | RequestFailed):
            self.core.on_ended(ev, time.time())

    async def _on_command(self, cmd: DeployRequest | RollbackRequest, msg: Msg) -> None:
        js, now = self.ctx.js, time.time()
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
        if not version:
            return None
        return await modelstore.get_version(self.ctx.js, name, version)

    async def _on_swapped(self, ev: ModelSwapped, msg: Msg) -> None:
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
        js = self.ctx.js
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
                await put_until_stored(kv, _ROLLOUT_KEY.format(model=model), encode(rollout))
                metrics.ROLLOUT_WEIGHT.labels(model, rollout.candidate.version).set(rollout.weight)

    async def _record(self, decision: RolloutDecision) -> None:
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
            self.ctx.js,
            rollout_subject(decision.model),
            decision,
            request_id=f"rollout-{decision.model}",
        )
