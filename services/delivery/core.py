"""Progressive delivery, free of I/O: place a new version on canary workers, raise its
share of traffic step by step while its own outcomes meet the SLO, promote it, or
roll back the moment they do not.

The adapter feeds it the registry's records, workers' heartbeats and swap answers,
and every request's end (``served_model`` names the version that answered); time
is passed in. Each call returns the effects to carry out (deliveries, canary
weights, the registry's current version) and the decisions to record, each with
its reason and figures: the audit trail.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Iterable

import msgspec

from inferbus.contracts import (
    CanaryWeights,
    DeployRequest,
    ModelCurrent,
    ModelDelivery,
    ModelSwapped,
    ModelVersion,
    RequestFailed,
    RequestFinished,
    RollbackRequest,
    RolloutDecision,
    VersionOutcomes,
    WorkerHeartbeat,
    http_status,
    split_versioned,
    versioned_name,
)
from inferbus.shared.fleet import FleetView, busy

SLO_KEYS = ("ttft_p95", "itl_p95", "error_rate")
RATIO_KEYS = tuple(f"{k}_ratio" for k in SLO_KEYS)


class DeliveryPolicy(msgspec.Struct, kw_only=True, frozen=True):
    """Defaults for rollouts and the rules every rollout follows."""

    window_s: float = 10.0
    """Outcomes judged for a breach: the last this many seconds, every tick."""
    breach_min_samples: int = 5
    """A breach needs at least this many of the new version's requests in the window
    (fewer say nothing either way)."""
    place_timeout_s: float = 600.0
    """Canary workers that have not answered a delivery by then fail the rollout
    (a cold swap starts an engine: minutes on a large model)."""
    promote_timeout_s: float = 600.0
    """After promotion, the canary's weights stay until every worker serves the new
    version or this passes."""
    worker_timeout_s: float = 10.0
    """A worker silent this long is gone."""


class Outcome(msgspec.Struct, array_like=True, frozen=True):
    at: float
    ttft: float
    itl: float
    error: bool


def p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def summarize(outcomes: Iterable[Outcome]) -> VersionOutcomes:
    rows = list(outcomes)
    errors = sum(1 for o in rows if o.error)
    ok = [o for o in rows if not o.error]
    return VersionOutcomes(
        samples=len(rows),
        errors=errors,
        ttft_p95=p95([o.ttft for o in ok]),
        itl_p95=p95([o.itl for o in ok if o.itl > 0]),
    )


def breaches(
    candidate: VersionOutcomes, baseline: VersionOutcomes, slo: dict[str, float]
) -> list[str]:
    """The SLO gates the candidate fails, in words. An absolute gate the baseline fails
    as badly over the same window is not the new version's fault (the platform is
    overloaded): it is left out."""
    out = []
    for key in SLO_KEYS:
        limit = slo.get(key)
        value = _metric(candidate, key)
        if limit is not None and value > limit:
            if baseline.samples and _metric(baseline, key) > limit:
                continue
            out.append(f"{key} {value:.4g} > {limit:.4g}")
        ratio = slo.get(f"{key}_ratio")
        base = _metric(baseline, key)
        if ratio is not None and baseline.samples and base > 0 and value > ratio * base:
            out.append(f"{key} {value:.4g} > {ratio:g}x the current version's {base:.4g}")
    return out


def _metric(v: VersionOutcomes, key: str) -> float:
    return {"ttft_p95": v.ttft_p95, "itl_p95": v.itl_p95, "error_rate": v.error_rate}[key]


def check_slo(slo: dict[str, float]) -> None:
    for key, value in slo.items():
        if key not in SLO_KEYS + RATIO_KEYS:
            raise ValueError(f"SLO key {key!r}: use {', '.join(SLO_KEYS + RATIO_KEYS)}")
        if value < 0:
            raise ValueError(f"SLO {key}={value}: must be 0 or more")


class Rollout(msgspec.Struct, kw_only=True):
    """One rollout's state (the adapter keeps a copy in the registry, to resume)."""

    model: str
    candidate: ModelVersion
    baseline: str
    """The version it replaces ("": the workers' own ``--model``)."""
    baseline_model: ModelVersion | None = None
    steps: list[float]
    interval_s: float
    slo: dict[str, float]
    min_samples: int
    canary_workers: int
    phase: str = "placing"
    """``placing``, ``stepping``, ``promoting``, then ended: ``done``, ``rolled_back``,
    ``failed``."""
    step: int = 0
    step_started_at: float = 0.0
    held_reported: bool = False
    delivery_id: str = ""
    workers: list[str] = []
    """The canary workers (full models); empty for an adapter (every worker of its base)."""
    answered: list[str] = []
    started_at: float = 0.0
    phase_since: float = 0.0

    @property
    def ref(self) -> str:
        return versioned_name(self.model, self.candidate.version)

    @property
    def active(self) -> bool:
        return self.phase in ("placing", "stepping", "promoting")

    @property
    def weight(self) -> float:
        return self.steps[self.step] / 100.0 if self.phase in ("stepping", "promoting") else 0.0


class Effects(msgspec.Struct, kw_only=True):
    deliveries: list[ModelDelivery] = []
    canary: CanaryWeights | None = None
    current: ModelCurrent | None = None
    decisions: list[RolloutDecision] = []
    changed: list[str] = []
    """Models whose rollout state changed (the adapter saves them)."""

    def extend(self, other: Effects) -> Effects:
        self.deliveries += other.deliveries
        self.canary = other.canary or self.canary
        self.current = other.current or self.current
        self.decisions += other.decisions
        self.changed += [m for m in other.changed if m not in self.changed]
        return self


class DeployRefused(ValueError):
    pass


class DeliveryCore:
    def __init__(self, policy: DeliveryPolicy | None = None) -> None:
        self.policy = policy or DeliveryPolicy()
        self.rollouts: dict[str, Rollout] = {}
        self.fleet = FleetView(self.policy.worker_timeout_s)
        self.outcomes: dict[str, deque[Outcome]] = {}
        """Served name (``name@version`` or ``name``) → its recent requests' outcomes."""

    # -- inputs ----------------------------------------------------------------------------

    def on_heartbeat(self, hb: WorkerHeartbeat, now: float) -> None:
        self.fleet.on_heartbeat(hb, now)

    def on_ended(self, ev: RequestFinished | RequestFailed, now: float) -> None:
        if not ev.served_model:
            return
        if isinstance(ev, RequestFinished):
            t = ev.timings
            n = ev.usage.completion_tokens
            outcome = Outcome(
                at=now,
                ttft=t.first_token_s,
                itl=t.decode_s / (n - 1) if n > 1 else 0.0,
                error=False,
            )
        elif http_status(ev.code) >= 500:  # the platform's fault, not the client's
            outcome = Outcome(at=now, ttft=0.0, itl=0.0, error=True)
        else:
            return
        self.outcomes.setdefault(ev.served_model, deque(maxlen=50_000)).append(outcome)

    def restore(self, rollout: Rollout) -> None:
        """A rollout saved before this process started: it resumes where it was."""
        self.rollouts[rollout.model] = rollout

    # -- commands --------------------------------------------------------------------------

    def deploy(
        self,
        req: DeployRequest,
        candidate: ModelVersion | None,
        current: ModelCurrent | None,
        baseline_model: ModelVersion | None,
        now: float,
    ) -> Effects:
        """Start a rollout, or refuse it with a ``failed`` decision that says why."""
        try:
            rollout = self._new_rollout(req, candidate, current, baseline_model, now)
        except DeployRefused as exc:
            return Effects(
                decisions=[
                    RolloutDecision(
                        model=req.model,
                        version=req.version,
                        action="failed",
                        reason=str(exc),
                        previous=current.version if current else "",
                        decided_at=now,
                    )
                ]
            )
        self.rollouts[req.model] = rollout
        effects = Effects(changed=[req.model])
        if not self._serving(req.model) or not req.canary:  # straight in
            why = (
                f"first version of {req.model}: no worker serves it yet, so no canary"
                if req.canary
                else "no canary, as asked"
            )
            rollout.step = len(rollout.steps) - 1  # all of it, at once
            start = self._decision(rollout, "start", now, f"{why}: every worker loads it now")
            effects.decisions.append(start)
            return effects.extend(self._promote(rollout, now, VersionOutcomes(), VersionOutcomes()))
        steps = ", ".join(f"{s:g}%" for s in rollout.steps)
        reason = (
            f"{rollout.ref} replaces {rollout.model}@{rollout.baseline or '(--model)'}: "
            f"steps {steps}, {rollout.interval_s:g} s each, at least {rollout.min_samples} "
            f"requests a step, SLO {rollout.slo or 'none'}"
        )
        effects.decisions.append(self._decision(rollout, "start", now, reason))
        return effects.extend(self._place(rollout, now))

    def _new_rollout(
        self,
        req: DeployRequest,
        candidate: ModelVersion | None,
        current: ModelCurrent | None,
        baseline_model: ModelVersion | None,
        now: float,
    ) -> Rollout:
        if candidate is None:
            raise DeployRefused(f"{req.model}@{req.version} is not in the registry (push it)")
        running = self.rollouts.get(req.model)
        if running is not None and running.active:
            raise DeployRefused(f"{running.ref} is being rolled out (roll it back first)")
        if current is not None and current.version == req.version:
            raise DeployRefused(f"{req.model} serves {req.version} already")
        steps = [float(s) for s in req.steps]
        if not steps or any(not 0 < s <= 100 for s in steps) or steps != sorted(steps):
            raise DeployRefused(f"steps {req.steps}: rising percentages in (0, 100]")
        if steps[-1] != 100.0:
            steps.append(100.0)
        try:
            check_slo(req.slo)
        except ValueError as exc:
            raise DeployRefused(str(exc)) from None
        if candidate.kind == "adapter" and not self._serving(candidate.base_model):
            raise DeployRefused(
                f"no worker serves {candidate.base_model}, the base of {candidate.ref}"
            )
        if candidate.kind == "model":
            serving = self._serving(req.model)
            if not serving:
                raise DeployRefused(
                    f"no worker serves {req.model}: a new model needs workers "
                    "of its own (start them with --model)"
                )
            if len(serving) < 2 and req.canary:
                raise DeployRefused(
                    f"a canary of a full model needs two workers serving {req.model} or more "
                    f"(one keeps the current version), found {len(serving)}: scale up first"
                )
        return Rollout(
            model=req.model,
            candidate=candidate,
            baseline=current.version if current else "",
            baseline_model=baseline_model,
            steps=steps,
            interval_s=max(0.0, req.interval_s),
            slo=dict(req.slo),
            min_samples=max(1, req.min_samples),
            canary_workers=max(1, req.canary_workers),
            started_at=now,
            phase_since=now,
        )

    def rollback(
        self,
        req: RollbackRequest,
        current: ModelCurrent | None,
        current_model: ModelVersion | None,
        previous_model: ModelVersion | None,
        now: float,
    ) -> Effects:
        """By hand: end a rollout on the old version, or, with none running, go back to
        the version before the current one."""
        rollout = self.rollouts.get(req.model)
        if rollout is not None and rollout.active:
            return self._roll_back(rollout, now, f"by hand: {req.reason}")
        if current is None:
            return Effects(
                decisions=[
                    RolloutDecision(
                        model=req.model,
                        version="",
                        action="failed",
                        decided_at=now,
                        reason=f"{req.model} has no registry version to roll back from",
                    )
                ]
            )
        back = ModelDelivery(
            delivery_id=_delivery_id(),
            model=_target(
                current.previous,
                previous_model,
                like=current_model or ModelVersion(name=req.model, version=""),
            ),
            role="current",
            reason=f"rollback by hand: {req.reason}",
            issued_at=now,
        )
        return Effects(
            deliveries=[back],
            current=ModelCurrent(
                name=req.model,
                version=current.previous,
                previous=current.version,
                reason=f"rollback: {req.reason}",
                set_at=now,
            ),
            decisions=[
                RolloutDecision(
                    model=req.model,
                    version=current.previous,
                    previous=current.version,
                    action="rollback",
                    decided_at=now,
                    reason=f"by hand ({req.reason}): {req.model}@{current.version} → "
                    f"{req.model}@{current.previous or '(--model)'}",
                )
            ],
        )

    # -- answers and time ------------------------------------------------------------------

    def on_swapped(self, ev: ModelSwapped, now: float) -> Effects:
        name, _ = split_versioned(ev.model)
        rollout = self.rollouts.get(name)
        if rollout is None or not rollout.active or ev.delivery_id != rollout.delivery_id:
            return Effects()
        if not ev.ok and rollout.phase == "promoting":
            return self._fail(
                rollout,
                now,
                f"worker {ev.worker_id} refused the promoted {ev.model}: {ev.code}: {ev.reason}",
            )
        if rollout.phase != "placing":
            return Effects()
        if not ev.ok:
            return self._fail(
                rollout, now, f"worker {ev.worker_id} refused {ev.model}: {ev.code}: {ev.reason}"
            )
        if ev.worker_id not in rollout.answered:
            rollout.answered.append(ev.worker_id)
        return self._maybe_start_steps(rollout, now)

    def tick(self, now: float) -> Effects:
        effects = Effects()
        self.fleet.expire(now)
        horizon = now - max(
            self.policy.window_s, *(r.interval_s for r in self.rollouts.values() if r.active), 0.0
        )
        for q in self.outcomes.values():
            while q and q[0].at < horizon - 1.0:
                q.popleft()
        for rollout in list(self.rollouts.values()):
            if rollout.phase == "placing":
                effects.extend(self._check_placing(rollout, now))
            elif rollout.phase == "stepping":
                effects.extend(self._judge(rollout, now))
            elif rollout.phase == "promoting":
                effects.extend(self._check_promoted(rollout, now))
        return effects

    # -- the rollout's phases --------------------------------------------------------------

    def _serving(self, model: str) -> list[str]:
        """Ready workers serving ``model`` under its plain name (the current version)."""
        return [hb.worker_id for hb in self.fleet.ready(model)]

    def _place(self, rollout: Rollout, now: float) -> Effects:
        rollout.delivery_id = _delivery_id()
        rollout.answered = []
        if rollout.candidate.kind == "adapter":
            rollout.workers = []  # every worker of the base loads it beside the current one
        else:
            by_load = sorted(
                self.fleet.ready(rollout.model), key=lambda hb: (busy(hb), hb.worker_id)
            )
            serving = [hb.worker_id for hb in by_load]
            n = min(rollout.canary_workers, len(serving) - 1)
            rollout.workers = serving[:n]
        delivery = ModelDelivery(
            delivery_id=rollout.delivery_id,
            model=rollout.candidate,
            role="candidate",
            workers=list(rollout.workers),
            reason=f"canary of {rollout.ref}",
            issued_at=now,
        )
        rollout.phase, rollout.phase_since = "placing", now
        where = ", ".join(rollout.workers) or f"every worker of {rollout.candidate.base_model}"
        return Effects(
            deliveries=[delivery],
            changed=[rollout.model],
            decisions=[self._decision(rollout, "place", now, f"loading {rollout.ref} on {where}")],
        )

    def _check_placing(self, rollout: Rollout, now: float) -> Effects:
        effects = self._maybe_start_steps(rollout, now)
        if rollout.phase == "placing" and now - rollout.phase_since > self.policy.place_timeout_s:
            return effects.extend(
                self._fail(
                    rollout,
                    now,
                    f"the canary workers did not load {rollout.ref} within "
                    f"{self.policy.place_timeout_s:g} s",
                )
            )
        return effects

    def _canary_ready(self, rollout: Rollout) -> list[str]:
        """Workers that serve the candidate now (by heartbeat)."""
        return [hb.worker_id for hb in self.fleet.ready(rollout.ref)]

    def _maybe_start_steps(self, rollout: Rollout, now: float) -> Effects:
        if rollout.phase != "placing":
            return Effects()
        ready = set(self._canary_ready(rollout)) | set(rollout.answered)
        expected = set(rollout.workers)
        if (expected and not expected <= ready) or not ready:
            return Effects()
        rollout.phase, rollout.step, rollout.step_started_at = "stepping", 0, now
        rollout.phase_since, rollout.held_reported = now, False
        return self._set_step(rollout, now, f"{rollout.ref} loaded on {', '.join(sorted(ready))}")

    def _set_step(self, rollout: Rollout, now: float, reason: str) -> Effects:
        w = rollout.weight
        return Effects(
            canary=CanaryWeights(model=rollout.model, weights={rollout.ref: w}, set_at=now),
            decisions=[
                self._decision(
                    rollout,
                    "step",
                    now,
                    f"{reason}; {w:.0%} of {rollout.model}'s requests on {rollout.ref}",
                )
            ],
            changed=[rollout.model],
        )

    def window(self, name: str, since: float) -> VersionOutcomes:
        return summarize(o for o in self.outcomes.get(name, ()) if o.at >= since)

    def _baseline_name(self, rollout: Rollout) -> str:
        return (
            versioned_name(rollout.model, rollout.baseline) if rollout.baseline else rollout.model
        )

    def _judge(self, rollout: Rollout, now: float) -> Effects:
        since = max(rollout.step_started_at, now - self.policy.window_s)
        cand = self.window(rollout.ref, since)
        base = self.window(self._baseline_name(rollout), since)
        if cand.samples >= min(self.policy.breach_min_samples, rollout.min_samples):
            failed = breaches(cand, base, rollout.slo)
            if failed:
                return self._roll_back(
                    rollout,
                    now,
                    f"SLO breached over the last {now - since:.0f} s: " + "; ".join(failed),
                    cand,
                    base,
                )
        if now - rollout.step_started_at < rollout.interval_s:
            return Effects()
        step_cand = self.window(rollout.ref, rollout.step_started_at)
        step_base = self.window(self._baseline_name(rollout), rollout.step_started_at)
        if step_cand.samples < rollout.min_samples:
            if rollout.held_reported:
                return Effects()
            rollout.held_reported = True
            return Effects(
                changed=[rollout.model],
                decisions=[
                    self._decision(
                        rollout,
                        "hold",
                        now,
                        f"{step_cand.samples} of {rollout.min_samples} requests "
                        f"on {rollout.ref} at {rollout.weight:.0%}: waiting for more",
                        step_cand,
                        step_base,
                    )
                ],
            )
        failed = breaches(step_cand, step_base, rollout.slo)
        if failed:
            return self._roll_back(
                rollout,
                now,
                f"SLO breached over step {rollout.step + 1}: " + "; ".join(failed),
                step_cand,
                step_base,
            )
        if rollout.step + 1 < len(rollout.steps):
            rollout.step += 1
            rollout.step_started_at, rollout.held_reported = now, False
            effects = self._set_step(
                rollout,
                now,
                f"step {rollout.step} passed ({step_cand.samples} requests within the SLO)",
            )
            effects.decisions[-1].candidate, effects.decisions[-1].baseline = step_cand, step_base
            return effects
        return self._promote(rollout, now, step_cand, step_base)

    def _promote(
        self, rollout: Rollout, now: float, cand: VersionOutcomes, base: VersionOutcomes
    ) -> Effects:
        rollout.phase, rollout.phase_since = "promoting", now
        rollout.delivery_id = _delivery_id()
        everyone = ModelDelivery(
            delivery_id=rollout.delivery_id,
            model=rollout.candidate,
            role="current",
            reason=f"promote {rollout.ref}",
            issued_at=now,
        )
        return Effects(
            deliveries=[everyone],
            current=ModelCurrent(
                name=rollout.model,
                version=rollout.candidate.version,
                previous=rollout.baseline,
                reason="promoted",
                set_at=now,
            ),
            decisions=[
                self._decision(
                    rollout,
                    "promote",
                    now,
                    f"every step passed: {rollout.ref} becomes {rollout.model}",
                    cand,
                    base,
                )
            ],
            changed=[rollout.model],
        )

    def _check_promoted(self, rollout: Rollout, now: float) -> Effects:
        # an adapter's first version is served by no worker until each loads it: the
        # workers that count are those of its base model
        serving = self.fleet.ready(rollout.candidate.base_model or rollout.model)
        done = serving and all(
            hb.versions.get(rollout.model) == rollout.candidate.version for hb in serving
        )
        late = now - rollout.phase_since > self.policy.promote_timeout_s
        if not (done or late):
            return Effects()
        rollout.phase, rollout.phase_since = "done", now
        reason = (
            f"every worker serving {rollout.model} is on {rollout.candidate.version}"
            if done
            else f"{self.policy.promote_timeout_s:g} s after promotion, "
            "some workers are not on the new version (see their swaps)"
        )
        return Effects(
            canary=CanaryWeights(model=rollout.model, weights={}, set_at=now),
            decisions=[self._decision(rollout, "done", now, reason)],
            changed=[rollout.model],
        )

    def _roll_back(
        self,
        rollout: Rollout,
        now: float,
        reason: str,
        cand: VersionOutcomes | None = None,
        base: VersionOutcomes | None = None,
    ) -> Effects:
        """Traffic back on the old version at once; the canary workers reload it."""
        promoted = rollout.phase == "promoting"
        rollout.phase, rollout.phase_since = "rolled_back", now
        back = ModelDelivery(
            delivery_id=_delivery_id(),
            model=_target(rollout.baseline, rollout.baseline_model, rollout.candidate),
            role="current",
            workers=[] if promoted else list(rollout.workers),
            reason=f"roll back {rollout.ref}: {reason}",
            issued_at=now,
        )
        effects = Effects(
            deliveries=[back],
            canary=CanaryWeights(model=rollout.model, weights={}, set_at=now),
            decisions=[self._decision(rollout, "rollback", now, reason, cand, base)],
            changed=[rollout.model],
        )
        if rollout.candidate.kind == "adapter":
            back.workers = []  # every worker of the base drops the candidate adapter
        if promoted:
            effects.current = ModelCurrent(
                name=rollout.model,
                version=rollout.baseline,
                previous=rollout.candidate.version,
                reason=f"rolled back: {reason}",
                set_at=now,
            )
        return effects

    def _fail(self, rollout: Rollout, now: float, reason: str) -> Effects:
        effects = self._roll_back(rollout, now, reason)
        rollout.phase = "failed"
        effects.decisions[-1].action = "failed"
        return effects

    def _decision(
        self,
        rollout: Rollout,
        action: str,
        now: float,
        reason: str,
        cand: VersionOutcomes | None = None,
        base: VersionOutcomes | None = None,
    ) -> RolloutDecision:
        return RolloutDecision(
            model=rollout.model,
            version=rollout.candidate.version,
            previous=rollout.baseline,
            action=action,
            step=rollout.step if rollout.phase == "stepping" else 0,
            weight=rollout.weight,
            reason=reason,
            candidate=cand or VersionOutcomes(),
            baseline=base or VersionOutcomes(),
            workers=list(rollout.workers),
            decided_at=now,
        )


def _target(version: str, model: ModelVersion | None, like: ModelVersion) -> ModelVersion:
    """The version to go back to. Version "" is what each worker was started with (its
    ``--model``, or an adapter of its ``--lora-modules``), of ``like``'s name and kind."""
    if version and model is not None:
        return model
    return ModelVersion(name=like.name, version="", kind=like.kind, base_model=like.base_model)


def _delivery_id() -> str:
    return secrets.token_hex(6)
