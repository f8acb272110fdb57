"""Autoscaler adapter: the bus's events in, the core ticked, decisions recorded and acted on."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import msgspec
from nats.aio.msg import Msg

from inferbus.contracts import (
    SCALING_STATUS,
    LLMServiceSettings,
    RequestAccepted,
    RequestFinished,
    RequestStarted,
    ScaleDecision,
    ScalingStatus,
    SchedulerLoad,
    Terminal,
    WorkerHeartbeat,
    scale_subject,
)
from inferbus.contracts.control import DEFAULT_SUPERVISOR
from inferbus.shared import logs, metrics
from inferbus.shared.bus import publish_durable
from inferbus.shared.codec import encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service

from .actuators import (
    ActuationError,
    Actuator,
    KubernetesActuator,
    LocalActuator,
    NoActuator,
)
from .core import AutoscalerCore, AutoscalerPolicy, Diagnostics, ModelScaling, scaling_for
from .wiring import WIRING

log = logs.get("inferbus.autoscaler")


class AutoscalerSettings(ServiceSettings, kw_only=True):
    """inferbus autoscaler: sizes each model's workers ahead of its load."""

    scaling: ModelScaling = ModelScaling()
    """Every model's sizing (``--min-replicas``, ``--ttft-slo-s``, ``--forecaster``...);
    ``model_overrides`` changes it per model."""
    models: dict[str, str] = {}
    """Model → what runs its workers: under ``inferbus up`` the scalable service
    (``tiny-llama=worker``); on Kubernetes ``namespace/deployment``."""
    model_overrides: str = ""
    """JSON: ``{"model": {"max_replicas": 4, "ttft_slo_s": 1.0}}``."""
    actuator: Literal["local", "kubernetes", "none"] = "local"
    """What carries decisions out: local (``inferbus up``'s processes), kubernetes (a
    Deployment's scale) or none (decisions only)."""
    supervisor: str = DEFAULT_SUPERVISOR
    """local: the ``inferbus up`` whose workers it scales (``ib.sup.<name>.control``)."""
    kubeconfig: str = ""
    """kubernetes: empty uses the pod's service account."""
    budget_replicas: int = 0
    """Workers of all models together, at most (0: each model's max only)."""
    tick_s: float = 1.0
    """How often the core decides."""
    status_interval_s: float = 2.0
    """How often the models and targets go out on ``ib.scaling.status``."""

    def policy(self) -> AutoscalerPolicy:
        try:
            overrides = msgspec.json.decode(
                self.model_overrides or "{}", type=dict[str, dict[str, Any]]
            )
        except msgspec.DecodeError as exc:
            raise ValueError(f"model_overrides is not a JSON object of objects: {exc}") from exc
        unknown = set(overrides) - set(self.models)
        if unknown:
            raise ValueError(f"model_overrides names models not in models: {sorted(unknown)}")
        base = msgspec.structs.asdict(self.scaling)
        models = {
            name: msgspec.convert({**base, **overrides.get(name, {})}, ModelScaling)
            for name in self.models
        }
        return AutoscalerPolicy(
            models=models, budget_replicas=self.budget_replicas, tick_s=self.tick_s
        )


class AutoscalerService(Service[AutoscalerSettings]):
    name = "autoscaler"
    wiring = WIRING

    def __init__(self, settings: AutoscalerSettings, ctx: Context[AutoscalerSettings]) -> None:
        super().__init__(settings, ctx)
        self.policy = settings.policy()
        self.core = AutoscalerCore(self.policy, now=time.time())
        self.actuator = self._make_actuator(ctx)
        self._tick_task: asyncio.Task[None] | None = None
        self._unapplied: dict[str, ScaleDecision] = {}
        """The latest decision per model its actuator has not carried out yet."""
        self._diags: dict[str, Diagnostics] = {}
        self._services: dict[str, LLMServiceSettings] = {}
        self._started = False
        """The latest LLMService record per model (IB_CONFIG ``ib.cfg.llmservice.*``)."""

    def _make_actuator(self, ctx: Context[AutoscalerSettings]) -> Actuator:
        s = self.settings
        if s.actuator == "local":
            return LocalActuator(ctx.nc, dict(s.models), s.supervisor)
        if s.actuator == "kubernetes":
            return KubernetesActuator(dict(s.models), s.kubeconfig)
        return NoActuator()

    async def start(self) -> None:
        now = time.time()
        self._started = True  # models new from now on are taken on as they come
        for model in list(self.core.models):
            await self._manage(model, now)
        if not self.core.models:
            log.info("no model to size yet: --models, or an LLMService's record")

    async def serving(self) -> None:
        self._tick_task = asyncio.create_task(self._ticks(), name="ticks")
        log.info("autoscaling", models=sorted(self.core.models), actuator=self.settings.actuator)

    async def _manage(self, model: str, now: float) -> None:
        """Take ``model`` on from the size it runs at now."""
        try:
            current = await self.actuator.current(model)
        except ActuationError as exc:
            log.warning("current size unknown", model=model, error=str(exc))
            current = None
        previous = self.core.models[model].target
        if current is not None:
            self.core.set_target(model, current)
        # a record that the model is managed: the gateway and scheduler let its
        # requests wait for a worker instead of refusing them
        await self._record(
            ScaleDecision(
                model=model,
                desired=self.core.models[model].target,
                previous=previous,
                reason="autoscaler started: managing this model from its current size",
                decided_at=now,
            )
        )
        for direction in ("up", "down"):  # every series from zero, not from its first event
            metrics.AUTOSCALER_DECISIONS.labels(model, direction)
        metrics.AUTOSCALER_ACTUATION_ERRORS.labels(model)

    def _follow(self, record: LLMServiceSettings, now: float) -> bool:
        """An LLMService's record: size its model by it, or, removed or without
        scaling, as the flags say (or not at all). True when a model is new to the core."""
        model = record.model
        if self._services.get(model) == record:
            return False
        self._services[model] = record
        if record.removed or record.scaling is None or not record.scale_target:
            if model in self.policy.models:
                self.core.configure(model, self.policy.models[model], now)
                self.actuator.set_target(model, self.settings.models[model])
            else:
                self.core.forget(model)
                self.actuator.forget(model)
                self._unapplied.pop(model, None)
                self._diags.pop(model, None)
            log.info("llmservice record", model=model, service=record.service, sizing="flags")
            return False
        new = model not in self.core.models
        base = self.policy.models.get(model, self.settings.scaling)
        try:
            self.core.configure(model, scaling_for(base, record.scaling), now)
        except ValueError as exc:
            log.warning("llmservice record refused", model=model, error=str(exc))
            return False
        try:
            self.actuator.set_target(model, record.scale_target)
        except ValueError as exc:  # decided and recorded; carrying out fails, said each tick
            log.warning("llmservice scale target refused", model=model, error=str(exc))
        log.info(
            "llmservice record",
            model=model,
            service=record.service,
            target=record.scale_target,
            min=record.scaling.min_replicas,
            max=record.scaling.max_replicas,
        )
        return new

    async def _on_service(self, record: LLMServiceSettings, msg: Msg) -> None:
        now = time.time()
        if self._follow(record, now) and self._started:
            await self._manage(record.model, now)

    async def drain(self) -> None:
        if self._tick_task:
            self._tick_task.cancel()
        await self.ctx.subscriptions.close()
        await self.actuator.close()

    def status(self) -> dict[str, Any]:
        return {
            "models": {
                m: {
                    "target": d.target,
                    "ready": d.ready,
                    "observed": round(d.observed, 1),
                    "forecast": round(d.forecast, 1),
                    "capacity": round(d.capacity, 1),
                    "lead_time_s": round(d.lead_time_s, 1),
                    "panic": d.panic,
                    "unapplied": m in self._unapplied,
                }
                for m, d in self._diags.items()
            }
        }

    # -- inputs ----------------------------------------------------------------------------

    async def _on_heartbeat(self, hb: WorkerHeartbeat, msg: Msg) -> None:
        self.core.on_heartbeat(hb, time.time())

    async def _on_started(self, ev: RequestStarted, msg: Msg) -> None:
        self.core.on_started(ev.request_id, time.time())

    async def _on_load(self, load: SchedulerLoad, msg: Msg) -> None:
        now = time.time()
        for model, m in load.models.items():
            self.core.on_load(model, m, now, load.scheduler_id)

    async def _on_accepted(self, ev: RequestAccepted, msg: Msg) -> None:
        self.core.on_accepted(ev, time.time())

    async def _on_ended(self, ev: Terminal, msg: Msg) -> None:
        finished = ev if isinstance(ev, RequestFinished) else None
        self.core.on_ended(ev.request_id, finished, time.time(), getattr(ev, "code", ""))

    # -- decisions -------------------------------------------------------------------------

    async def _ticks(self) -> None:
        last_status = 0.0
        while True:
            now = time.time()
            if now - last_status >= self.settings.status_interval_s:
                last_status = now
                await self._announce(now)
            await asyncio.sleep(self.settings.tick_s)
            try:
                await self._tick(time.time())
            except Exception:
                log.exception("tick failed")

    async def _announce(self, now: float) -> None:
        status = ScalingStatus(
            autoscaler_id=self.settings.instance_id,
            targets={m: st.target for m, st in self.core.models.items()},
            sent_at=now,
            interval_s=self.settings.status_interval_s,
        )
        try:
            await self.ctx.nc.publish(SCALING_STATUS, encode(status))
        except Exception as exc:  # reconnecting: the next one goes out
            log.warning("status not sent", error=str(exc))

    async def _tick(self, now: float) -> None:
        decisions, diags = self.core.tick(now)
        for d in diags:
            self._diags[d.model] = d
            metrics.AUTOSCALER_DESIRED.labels(d.model).set(d.target)
            metrics.AUTOSCALER_READY.labels(d.model).set(d.ready)
            metrics.AUTOSCALER_LOAD.labels(d.model, "observed").set(d.observed)
            metrics.AUTOSCALER_LOAD.labels(d.model, "short").set(d.short)
            metrics.AUTOSCALER_LOAD.labels(d.model, "forecast").set(d.forecast)
            metrics.AUTOSCALER_CAPACITY.labels(d.model).set(d.capacity)
            metrics.AUTOSCALER_LEAD_TIME.labels(d.model).set(d.lead_time_s)
            metrics.AUTOSCALER_PANIC.labels(d.model).set(1 if d.panic else 0)
        for decision in decisions:
            direction = "up" if decision.desired > decision.previous else "down"
            metrics.AUTOSCALER_DECISIONS.labels(decision.model, direction).inc()
            log.info(
                "scale",
                model=decision.model,
                previous=decision.previous,
                desired=decision.desired,
                ready=decision.ready,
                reason=decision.reason,
            )
            self._unapplied[decision.model] = decision
            await self._record(decision)
        await self._apply()

    async def _record(self, decision: ScaleDecision) -> None:
        try:
            await publish_durable(
                self.ctx.js,
                scale_subject(decision.model),
                decision,
                request_id=f"scale-{decision.model}",
                msg_id=f"{decision.model}:{decision.decided_at}:{decision.desired}",
            )
        except Exception as exc:  # the decision still stands; its record is what failed
            log.warning("decision not recorded", model=decision.model, error=str(exc))

    async def _apply(self) -> None:
        for model, decision in list(self._unapplied.items()):
            try:
                await self.actuator.apply(decision)
            except ActuationError as exc:
                metrics.AUTOSCALER_ACTUATION_ERRORS.labels(model).inc()
                log.warning("decision not carried out; retried", model=model, error=str(exc))
                continue
            # a newer decision may have replaced it while the actuator worked
            if self._unapplied.get(model) is decision:
                del self._unapplied[model]
