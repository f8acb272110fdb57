"""Admission, free of I/O: which models live workers serve (from heartbeats), the
schedulers' backpressure, and the gate list every request passes in order."""

from __future__ import annotations

from typing import Any

import msgspec

from inferbus.contracts import (
    FailureCode,
    ModelLoad,
    ScalingStatus,
    SchedulerLoad,
    WorkerHeartbeat,
)
from inferbus.shared.fleet import FleetView

from .auth import AccessControl, Admission, ApiKey
from .errors import failure_error

# -- models served right now ----------------------------------------------------------


class ModelRegistry:
    """Which models live workers serve, from their heartbeats."""

    def __init__(
        self, stale_after_s: float = 3.0, started_at: float = 0.0, remember_s: float = 600.0
    ) -> None:
        self.stale_after_s = stale_after_s
        self.started_at = started_at
        """Until ``stale_after_s`` past this, no model can be said not to exist: the
        heartbeats have not all come yet."""
        self.remember_s = remember_s
        """A model served this recently is known: without a live worker (all lost, or
        their heartbeats held up by a NATS outage) it is 503, retryable, not 404."""
        self.fleet = FleetView(stale_after_s)
        self._known: dict[str, float] = {}
        self._scaled: dict[str, float] = {}
        """Models the autoscaler sizes → until when its word holds."""

    def on_scaling(self, status: ScalingStatus, now: float) -> None:
        for model in status.targets:
            self._scaled[model] = now + 3 * status.interval_s

    def scaled(self, model: str, now: float) -> bool:
        """The autoscaler sizes it: with no worker ready, one is being started."""
        return now < self._scaled.get(model, 0.0)

    def on_heartbeat(self, hb: WorkerHeartbeat, now: float) -> None:
        for m in hb.models:
            self._known[m] = now
        self.fleet.on_heartbeat(hb, now)

    def known(self, model: str, now: float) -> bool:
        """Whether ``model`` may exist: served lately, or too early to tell."""
        seen = self._known.get(model)
        if seen is not None and now - seen <= self.remember_s:
            return True
        return now - self.started_at < self.stale_after_s

    def admit(self, model: str, now: float, max_tokens: int = 0) -> None:
        """Raise the HTTP error for a model no live worker can serve right now."""
        ready = self.models(now).get(model)
        if not ready and self.scaled(model, now):
            return  # it waits in the scheduler's queue while a worker starts (bounded)
        if ready is None and self.known(model, now):
            ready = 0
        if ready is None:
            raise failure_error(
                FailureCode.MODEL_NOT_FOUND,
                f"the model {model!r} does not exist or no worker serves it",
                param="model",
            )
        if ready == 0:
            raise failure_error(
                FailureCode.NO_WORKER, f"no worker for {model!r} is ready", retry_after=1.0
            )
        limit = self.max_model_len(model)
        if limit and max_tokens >= limit:
            raise failure_error(
                FailureCode.CONTEXT_LENGTH_EXCEEDED,
                f"max_tokens ({max_tokens}) leaves no room for the prompt in "
                f"{model!r}'s {limit}-token context",
                param="max_tokens",
            )

    def max_model_len(self, model: str) -> int:
        """The smallest context of the workers serving ``model`` (0 when unknown)."""
        return self.fleet.max_model_len(model)

    def card(self, model: str, created: int) -> dict[str, Any]:
        """``model``'s entry in /v1/models, with vLLM's fields."""
        root, parent = self.fleet.lineage(model)
        return {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "inferbus",
            "root": root,
            "parent": parent,
            "max_model_len": self.max_model_len(model) or None,
        }

    def listed(self, model: str, now: float) -> bool:
        """Whether /v1/models shows it: a ready worker serves it, or the autoscaler
        holds it at zero (served on request)."""
        return bool(self.models(now).get(model)) or self.scaled(model, now)

    def models(self, now: float) -> dict[str, int]:
        """Model → number of ready workers (0 when all are draining or starting, or
        when the autoscaler has it at zero: it is served on request)."""
        self.fleet.expire(now)
        out: dict[str, int] = {m: 0 for m in self._scaled if self.scaled(m, now)}
        for m, ready in self.fleet.counts().items():
            out[m] = out.get(m, 0) + ready
        return out


# -- backpressure from the scheduler's queues ---------------------------------------------


class LoadView:
    """The schedulers' last word on their queues; requests for a model whose queue is
    full get 429 here instead of waiting in a queue without bound."""

    def __init__(self, min_stale_s: float = 2.0) -> None:
        self.min_stale_s = min_stale_s
        self._reports: dict[str, tuple[SchedulerLoad, float]] = {}

    def on_load(self, load: SchedulerLoad, now: float) -> None:
        self._reports[load.scheduler_id] = (load, now)

    def model(self, model: str, now: float) -> ModelLoad | None:
        """The model's load summed over the schedulers heard from recently (replicas
        share the accepted requests, each with a queue and limit of its own)."""
        total: ModelLoad | None = None
        for sid, (load, seen) in list(self._reports.items()):
            if now - seen > max(self.min_stale_s, 4 * load.interval_s):
                del self._reports[sid]  # gone quiet: the scheduler enforces its own limit
                continue
            m = load.models.get(model)
            if m is None:
                continue
            if total is None:
                total = ModelLoad(**msgspec.structs.asdict(m))
                continue
            total.queued += m.queued
            total.queue_limit += m.queue_limit
            total.free_slots += m.free_slots
            total.dispatch_per_s += m.dispatch_per_s
            total.oldest_wait_s = max(total.oldest_wait_s, m.oldest_wait_s)
            total.wait_s = max(total.wait_s, m.wait_s)
            total.ready_workers = max(total.ready_workers, m.ready_workers)
        return total

    def admit(self, model: str, now: float) -> None:
        m = self.model(model, now)
        if m is None or not m.queue_limit or m.queued < m.queue_limit:
            return
        if not m.ready_workers:
            raise failure_error(
                FailureCode.NO_WORKER,
                f"{m.queued} requests for {model!r} are waiting and no worker "
                "serves it now; retry later",
                retry_after=5.0,
            )
        raise failure_error(
            FailureCode.QUEUE_FULL,
            f"{m.queued} requests for {model!r} are waiting, the most this "
            "platform queues; retry later",
            retry_after=retry_after(m),
        )


def retry_after(m: ModelLoad) -> float:
    """When a slot in the queue should be free: the requests over the limit at the
    recent dispatch rate, kept within 1..60 s."""
    over = m.queued - m.queue_limit + 1
    if m.dispatch_per_s <= 0:
        return 5.0
    return min(60.0, max(1.0, over / m.dispatch_per_s))


# -- the gate list ------------------------------------------------------------------------


class Gates:
    """The gates a parsed request passes, in this order; the first that refuses
    answers with its HTTP error (an ``ApiError``), and nothing after it runs."""

    def __init__(self, access: AccessControl, registry: ModelRegistry, load: LoadView) -> None:
        self.access = access
        self.registry = registry
        self.load = load

    def admit(
        self,
        key: ApiKey,
        *,
        request_id: str,
        model: str,
        max_tokens: int,
        prompt_chars: int,
        in_flight: bool,
        now: float,
        choices: int = 1,
    ) -> Admission:
        """``in_flight``: a request with this id is being served here already.
        ``max_tokens`` is each choice's; the key is charged for all ``choices``."""
        self.access.authorize_model(key, model)  # first: no probing for other models
        self.registry.admit(model, now, max_tokens)
        if in_flight:
            raise failure_error(
                FailureCode.DUPLICATE_REQUEST, f"request {request_id} is already in flight"
            )
        self.load.admit(model, now)  # before charging the key: a full queue costs nothing
        return self.access.admit(
            key, model=model, max_tokens=max_tokens * choices, prompt_chars=prompt_chars, now=now
        )
