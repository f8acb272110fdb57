"""The autoscaler's decisions, with no I/O: events and the time go in, ``ScaleDecision``s
with their reasons come out (as Dynamo's planner and Knative's autoscaler decide).

Per model, every tick:

1. **Load**: the work that arrived in each second (prompt tokens times the prefill
   weight, plus the output tokens a request of this model is expected to produce,
   learned from its ended requests), kept for ``history_s``.
2. **Lead time**: how long a worker of this model takes from the decision to start it
   to its first ready heartbeat, measured on every scale-up (the 90th percentile of
   the last ten; ``cold_start_s`` until one is measured).
3. **Forecast** of the load one lead time (plus one tick) ahead, by the named
   forecaster; the target is sized on the highest of now, the stable window's mean
   and the forecast, so a fleet is ready when the load arrives.
4. **Capacity** per worker, learned online: a window whose requests met the TTFT SLO
   shows a worker sustains at least the work it did; a window saturated throughout
   that missed it shows at most that. (Learning upwards therefore needs load: a prior
   set too low is corrected only as far as the fleet is ever loaded.)
5. **Stability**: a panic window (Knative's): load over the short window at least
   ``panic_threshold`` times what the ready fleet sustains scales up at once and
   forbids scaling down until it has been calm a stable window. Scaling down waits
   ``scale_down_cooldown_s``, taking the highest target asked for in it (Kubernetes'
   stabilisation window), drains the least busy workers first, and never goes under
   ``min_replicas``, over ``max_replicas`` or over the shared budget.
6. **Zero**: requests (or queued ones) for a model with no worker start one at once;
   a model with ``min_replicas`` 0 idle for ``idle_to_zero_s`` goes to zero.
7. **Goodput**: requests the scheduler refused ``overloaded`` (it would not have
   started them within their objective) are goodput the fleet is losing: while more
   than ``max_refused_share`` of the stable window's arrivals were refused, the
   target is at least the ready fleet over the share served (one more at least), and
   it is never lowered, so a worker goes only when goodput holds without it. Before
   that, the scheduler's estimate of a new request's wait (``ModelLoad.wait_s``, from
   the rates it measures), averaged over the panic window, past ``wait_pressure`` of
   its objective adds a worker, so one is starting before the refusals begin; and no
   worker goes while it is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import msgspec

from inferbus.contracts import (
    FailureCode,
    ModelLoad,
    RequestAccepted,
    RequestFinished,
    ScaleDecision,
    ScalingSettings,
    WorkerHeartbeat,
)
from inferbus.shared.fleet import FleetView

from .forecast import Forecaster, ForecastSettings, make_forecaster


class ModelScaling(msgspec.Struct, kw_only=True, frozen=True):
    """How one model's workers are sized (the service's ``--models`` settings)."""

    min_replicas: int = 1
    """Workers kept at least (0: scaled to zero when idle, see ``idle_to_zero_s``)."""
    max_replicas: int = 8
    """Workers at most."""
    ttft_slo_s: float = 2.0
    """Time to first token the model's requests should meet (at the 95th percentile)."""
    target_utilization: float = 0.8
    """Share of a worker's measured capacity the sizing plans to use."""
    worker_capacity: float = 2000.0
    """Work tokens per second a worker is assumed to sustain until measured."""
    prefill_weight: float = 0.2
    """A prompt token's cost against an output token's (prefill runs many tokens in one
    pass): the unit of load is ``prefill_weight * prompt + output`` tokens."""
    cold_start_s: float = 30.0
    """A new worker's start-up time until one has been measured."""
    forecaster: str = "trend"
    """constant, holt, trend or statsforecast (services/autoscaler/forecast.py); trend by
    default: bench/autoscaler.py found it the best on the public traces, where Holt
    extrapolates bursts; Holt anticipates smooth ramps sooner."""
    forecast: ForecastSettings = ForecastSettings()
    stable_window_s: float = 60.0
    """The window a scale-down is judged over (and the constant forecast's)."""
    panic_window_s: float = 6.0
    """A short window: load over ``panic_threshold`` times what the ready fleet sustains in it
    scales up at once."""
    panic_threshold: float = 2.0
    """How far load in ``panic_window_s`` must exceed what the fleet sustains to scale up at
    once."""
    scale_down_cooldown_s: float = 60.0
    """A target is lowered only to the highest asked for in this long."""
    idle_to_zero_s: float = 300.0
    """With ``min_replicas`` 0: no request for this long scales the model to zero."""
    history_s: float = 300.0
    """Seconds of arrived work kept for the forecaster."""
    max_refused_share: float = 0.01
    """The share of arrivals refused ``overloaded`` over the stable window past which
    the fleet grows (goodput it is losing), and under which it may shrink."""
    wait_pressure: float = 0.5
    """A share of the TTFT objective: while the scheduler estimates a new request
    would wait longer than this before its prefill begins, one more worker is asked
    for (the scheduler refuses at the whole objective) and none is let go (0: off)."""
    burst_window_s: float = 300.0
    """Keep room for the bursts seen in this window (0: off): bursts from a quiet fleet
    outrun any forecast and any cold start, and what came lately may come again. A
    burst is sized by what the SLO allows: the work that arrived in any stretch of w
    seconds must be done within w plus the TTFT SLO, so a short burst may queue through
    and a long one may not."""


class AutoscalerPolicy(msgspec.Struct, kw_only=True, frozen=True):
    models: dict[str, ModelScaling] = {}
    """Models the autoscaler sizes (others are left alone)."""
    budget_replicas: int = 0
    """Workers of all models together, at most; 0: no budget beyond each model's max."""
    tick_s: float = 1.0


@dataclass
class Diagnostics:
    """What a tick saw for one model (metrics and the status query show it)."""

    model: str
    target: int
    ready: int
    observed: float
    forecast: float
    short: float
    capacity: float
    lead_time_s: float
    panic: bool
    need: int


@dataclass
class _Flight:
    accepted_at: float
    prompt_tokens: int
    started_at: float | None = None


@dataclass
class _ModelState:
    spec: ModelScaling
    forecaster: Forecaster
    target: int
    started: float
    arrivals: deque[float] = field(default_factory=deque)
    """Work arrived in each whole second, oldest first, ``history_s`` of them."""
    bucket_at: int = 0
    """The second ``arrivals[-1]`` counts."""
    last_arrival: float = -math.inf
    mean_output: float = 0.0
    outputs_seen: int = 0
    capacity: float = 0.0
    cap_window_start: float = 0.0
    window_work: float = 0.0
    window_ttfts: list[float] = field(default_factory=list)
    window_ready: list[int] = field(default_factory=list)
    saturated_now: bool = False
    """Something since the last tick showed the model saturated (a queue, full slots)."""
    window_saturated_ticks: int = 0
    lead_samples: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    pending_starts: deque[float] = field(default_factory=deque)
    """Times of scale-ups whose workers have not been seen ready yet, one per worker."""
    panic_until: float = -math.inf
    asked: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, need) of recent ticks, for the scale-down stabilisation window."""
    queued: int = 0
    """Queued in every scheduler instance heard from in the last few seconds."""
    queued_by: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Each scheduler instance's queue for the model and when it said so (a partitioned
    scheduler's instances each report their own partitions')."""
    waits: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, the scheduler's estimate of a new request's wait) over the panic window."""
    slo_s: float = 0.0
    """The objective the scheduler admits by, as last reported (0: not said)."""
    load_seen: float = -math.inf
    arrived_at: deque[float] = field(default_factory=deque)
    """Arrival times over the stable window (``refused_at``'s denominator)."""
    refused_at: deque[float] = field(default_factory=deque)
    """When its requests were refused ``overloaded``, over the stable window."""


def _new_state(name: str, spec: ModelScaling, now: float) -> _ModelState:
    if spec.min_replicas < 0 or spec.max_replicas < max(1, spec.min_replicas):
        raise ValueError(
            f"model {name!r}: need 0 <= min_replicas <= max_replicas and "
            f"max_replicas >= 1 (got {spec.min_replicas}, {spec.max_replicas})"
        )
    return _ModelState(
        spec=spec,
        forecaster=make_forecaster(
            spec.forecaster,
            spec.forecast
            if spec.forecast.constant_window_s
            else msgspec.structs.replace(spec.forecast, constant_window_s=spec.stable_window_s),
        ),
        target=spec.min_replicas,
        started=now,
        capacity=spec.worker_capacity,
        cap_window_start=now,
        bucket_at=int(now),
    )


def scaling_for(base: ModelScaling, settings: ScalingSettings) -> ModelScaling:
    """An LLMService's scaling over the autoscaler's own for the model: its bounds,
    goals and forecaster; its predictive window is the span the forecasters fit
    (trend's line, constant's average)."""
    return msgspec.structs.replace(
        base,
        min_replicas=settings.min_replicas,
        max_replicas=settings.max_replicas,
        target_utilization=settings.target_utilization,
        ttft_slo_s=settings.ttft_slo_s,
        forecaster=settings.forecaster or base.forecaster,
        forecast=msgspec.structs.replace(
            base.forecast,
            trend_window_s=settings.predictive_window_s,
            constant_window_s=settings.predictive_window_s,
        ),
    )


class AutoscalerCore:
    def __init__(self, policy: AutoscalerPolicy, now: float) -> None:
        self.policy = policy
        self.models: dict[str, _ModelState] = {}
        for name, spec in policy.models.items():
            self.models[name] = _new_state(name, spec, now)
        self._flights: dict[str, tuple[str, _Flight]] = {}
        self.fleet = FleetView(stale_after_s=3.0, interval_factor=3.0)
        """Lost past three of a worker's own heartbeat intervals (3 s at least)."""
        self._first_seen: dict[str, float] = {}
        self._ready_ids: dict[str, set[str]] = {m: set() for m in self.models}

    def configure(self, model: str, spec: ModelScaling, now: float) -> None:
        """Size ``model`` by ``spec`` from now on (an LLMService's record): a new model
        starts from ``min_replicas``; a known one keeps what was learned of it (its
        load, capacity and start-up times), and its next tick applies the new bounds."""
        m = self.models.get(model)
        if m is None:
            self.models[model] = _new_state(model, spec, now)
            self._ready_ids[model] = set()
            return
        fresh = _new_state(model, spec, now)  # checks the bounds before anything changes
        if (spec.forecaster, spec.forecast) != (m.spec.forecaster, m.spec.forecast):
            m.forecaster = fresh.forecaster
        m.spec = spec  # a lowered ceiling: tick holds it at once, past the scale-down window

    def forget(self, model: str) -> None:
        """Stop sizing ``model`` (its LLMService was removed); its workers stay as they are."""
        self.models.pop(model, None)
        self._ready_ids.pop(model, None)

    def set_target(self, model: str, replicas: int) -> None:
        """What the platform runs now, as the actuator reports it at start (not a
        decision: nothing changes)."""
        m = self.models[model]
        m.target = max(0, replicas)

    # -- what the bus carries ---------------------------------------------------------

    def on_accepted(self, accepted: RequestAccepted, now: float) -> None:
        req = accepted.request
        m = self.models.get(req.model)
        seen = self._flights.get(req.request_id)
        if m is None or (seen is not None and seen[0] == req.model):
            return  # a redelivery, or handed from one scheduler partition to another
        prompt = req.estimated_prompt_tokens
        expected_out = m.mean_output if m.outputs_seen else req.sampling.max_tokens
        expected_out = min(expected_out, req.sampling.max_tokens or expected_out)
        self._add_arrival(m, m.spec.prefill_weight * prompt + expected_out, now)
        m.last_arrival = now
        m.arrived_at.append(now)
        self._flights[req.request_id] = (req.model, _Flight(now, prompt))
        if len(self._flights) > 200_000:  # ends lost to a restart: forget the oldest
            self._flights.pop(next(iter(self._flights)))

    def on_started(self, request_id: str, now: float) -> None:
        flight = self._flights.get(request_id)
        if flight is not None and flight[1].started_at is None:
            flight[1].started_at = now
            m = self.models[flight[0]]
            m.window_ttfts.append(now - flight[1].accepted_at)

    def on_ended(
        self, request_id: str, finished: RequestFinished | None, now: float, code: str = ""
    ) -> None:
        """A request ended (``finished`` None: it failed, with ``code``, or was
        cancelled)."""
        flight = self._flights.pop(request_id, None)
        if flight is None:
            return
        m = self.models[flight[0]]
        if code == FailureCode.OVERLOADED:
            m.refused_at.append(now)
        if finished is None:
            return
        out = finished.usage.completion_tokens
        m.outputs_seen += 1
        # a running mean that forgets: the model's output length can drift
        weight = max(1 / m.outputs_seen, 0.02)
        m.mean_output += weight * (out - m.mean_output)
        prompt = finished.usage.prompt_tokens or flight[1].prompt_tokens
        m.window_work += m.spec.prefill_weight * prompt + out

    def on_load(self, model: str, load: ModelLoad, now: float, scheduler: str = "") -> None:
        m = self.models.get(model)
        if m is None:
            return
        m.queued_by[scheduler] = (load.queued, now)
        for sid, (_, seen) in list(m.queued_by.items()):
            if now - seen > LOAD_STALE_S:
                del m.queued_by[sid]
        m.queued = sum(q for q, _ in m.queued_by.values())
        m.waits.append((now, load.wait_s))
        m.slo_s = load.ttft_slo_s
        m.load_seen = now
        if load.queued > 0 or (load.ready_workers and load.free_slots == 0):
            m.saturated_now = True

    def on_heartbeat(self, hb: WorkerHeartbeat, now: float) -> None:
        first_seen = self._first_seen.setdefault(hb.worker_id, now)
        if len(self._first_seen) > 10_000:  # workers come and go for months
            self._first_seen.pop(next(iter(self._first_seen)))
        self.fleet.on_heartbeat(hb, now)
        for model in hb.models:
            m = self.models.get(model)
            if m is None:
                continue
            ready = self._ready_ids[model]
            if hb.state == "ready" and hb.worker_id not in ready:
                ready.add(hb.worker_id)
                # a worker first heard after a scale-up is one that scale-up started
                if m.pending_starts and first_seen >= m.pending_starts[0]:
                    m.lead_samples.append(now - m.pending_starts.popleft())
            elif hb.state != "ready":
                ready.discard(hb.worker_id)
            if hb.running >= hb.max_num_seqs > 0:
                m.saturated_now = True

    # -- decisions ----------------------------------------------------------------------

    def ready(self, model: str, now: float) -> list[WorkerHeartbeat]:
        """The ready workers serving ``model`` now (none for a model it does not size)."""
        for wid in self.fleet.expire(now):
            for ids in self._ready_ids.values():
                ids.discard(wid)
        return self.fleet.ready(model) if model in self._ready_ids else []

    def lead_time(self, model: str) -> float:
        m = self.models[model]
        if not m.lead_samples:
            return m.spec.cold_start_s
        xs = sorted(m.lead_samples)
        return xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)]

    def tick(self, now: float) -> tuple[list[ScaleDecision], list[Diagnostics]]:
        decisions: list[ScaleDecision] = []
        diags: list[Diagnostics] = []
        wanted: dict[str, tuple[int, str, Diagnostics]] = {}
        for name, m in self.models.items():
            self._add_arrival(m, 0.0, now)  # close the buckets of quiet seconds
            ready = self.ready(name, now)
            self._learn_capacity(m, len(ready), now)
            need, reason, diag = self._size(name, m, len(ready), now)
            wanted[name] = (need, reason, diag)
        granted = self._within_budget({n: w[0] for n, w in wanted.items()})
        for name, (need, reason, diag) in wanted.items():
            m = self.models[name]
            target = granted[name]
            if target < need:
                reason += f"; held to {target} by the budget of {self.policy.budget_replicas}"
            diag.target = target
            diags.append(diag)
            if target == m.target:
                continue
            previous, m.target = m.target, target
            if target > previous:
                m.pending_starts.extend([now] * (target - previous))
            else:
                del_count = min(len(m.pending_starts), previous - target)
                for _ in range(del_count):  # the newest asks are the ones withdrawn
                    m.pending_starts.pop()
            decisions.append(
                ScaleDecision(
                    model=name,
                    desired=target,
                    previous=previous,
                    ready=diag.ready,
                    reason=reason,
                    forecast=round(diag.forecast, 3),
                    observed=round(diag.observed, 3),
                    capacity=round(diag.capacity, 3),
                    lead_time_s=round(diag.lead_time_s, 3),
                    panic=diag.panic,
                    stop_first=self._drain_order(name, previous - target, now)
                    if target < previous
                    else [],
                    decided_at=now,
                )
            )
        return decisions, diags

    def _size(
        self, name: str, m: _ModelState, ready: int, now: float
    ) -> tuple[int, str, Diagnostics]:
        spec = m.spec
        series = list(m.arrivals)
        per_worker = max(1e-9, m.capacity * spec.target_utilization)
        lead = self.lead_time(name)
        short_n = max(1, round(spec.panic_window_s))
        short = sum(series[-short_n:]) / short_n if series else 0.0
        stable_n = max(1, round(spec.stable_window_s))
        observed = sum(series[-stable_n:]) / min(stable_n, max(1, len(series)))
        forecast = m.forecaster.predict(series, 1.0, lead + self.policy.tick_s) if series else 0.0
        burst, width = (
            _burst(series[-round(spec.burst_window_s) :], spec.ttft_slo_s)
            if spec.burst_window_s
            else (0.0, 0)
        )
        planned = max(observed, forecast, burst)
        need = math.ceil(planned / per_worker - 1e-9)
        reason = (
            f"forecast: {forecast:.0f} tok/s in {lead:.0f}s, {observed:.0f} over the last "
            f"{spec.stable_window_s:.0f}s, {per_worker:.0f} per worker"
        )
        if burst > max(observed, forecast):
            reason = (
                f"recent burst: {burst * (width + spec.ttft_slo_s):.0f} tokens of work in "
                f"{width}s within the last {spec.burst_window_s:.0f}s, to be done within "
                f"{width}s + the {spec.ttft_slo_s:g}s SLO, {per_worker:.0f} per worker"
            )
        # panic: the short window outruns what the ready fleet sustains
        sustain = ready * m.capacity
        if short > 0 and short >= spec.panic_threshold * max(sustain, 1e-9):
            m.panic_until = now + spec.stable_window_s
        panic = now < m.panic_until
        if panic:
            panic_need = math.ceil(short / per_worker - 1e-9)
            if panic_need > need:
                need = panic_need
                reason = (
                    f"panic: {short:.0f} tok/s over {spec.panic_window_s:.0f}s against "
                    f"{sustain:.0f} the fleet sustains"
                )
        # goodput lost: refused requests are demand the fleet's work did not show
        refused = self._refused_share(m, now)
        if refused > spec.max_refused_share and ready:
            # at most doubled a tick: a share of a few arrivals (or of clients' retries,
            # each an arrival and a refusal) says little of the load behind it
            lossless = max(ready + 1, math.ceil(ready / max(0.5, 1.0 - refused)))
            if lossless > need:
                need = lossless
                reason = (
                    f"goodput: {refused:.0%} of the requests over the last "
                    f"{spec.stable_window_s:.0f}s were refused overloaded on {ready} workers"
                )
        # goodput at risk: the scheduler's wait nears the objective it refuses at
        pressed = self._pressed(m, now)
        if pressed and ready and ready + 1 > need:
            need = ready + 1
            reason = (
                f"goodput at risk: a new request would wait {pressed:.1f}s, past "
                f"{spec.wait_pressure:.0%} of its {self._objective(m):g}s objective"
            )
        # zero: waiting requests start a worker; a long quiet lets the last one go
        idle = now - max(m.last_arrival, m.started) >= spec.idle_to_zero_s
        waiting = m.queued > 0 and now - m.load_seen < LOAD_STALE_S
        if need == 0 and (waiting or (m.target > 0 and not idle)):
            need = 1  # the last worker stays until the model has been idle long enough
        elif need == 0 and m.target > 0:
            reason = f"idle: no request for {spec.idle_to_zero_s:.0f}s"
        need = max(spec.min_replicas, min(spec.max_replicas, need))
        if m.target == 0 and need > 0:
            reason = f"scale from zero: {'requests are waiting' if waiting else reason}"
        # scale down only to the highest need of the whole cooldown window (Kubernetes'
        # stabilisation window), never while panicking
        m.asked.append((now, need))
        while m.asked and now - m.asked[0][0] > spec.scale_down_cooldown_s:
            m.asked.popleft()
        if need < m.target:
            held = max(n for _, n in m.asked)
            if panic:
                need, reason = m.target, "panic: no scale-down"
            elif refused > spec.max_refused_share:
                need, reason = m.target, "goodput: requests are being refused; no scale-down"
            elif pressed:
                need, reason = m.target, "goodput at risk: requests are waiting; no scale-down"
            elif now - m.started < spec.scale_down_cooldown_s or held >= m.target:
                need = m.target
            else:
                need = held
                reason = (
                    f"below target for {spec.scale_down_cooldown_s:.0f}s; {reason}"
                    if need
                    else reason
                )
        if need > spec.max_replicas:  # a ceiling lowered since (an LLMService): at once
            need, reason = spec.max_replicas, f"max_replicas is {spec.max_replicas}"
        diag = Diagnostics(
            model=name,
            target=m.target,
            ready=ready,
            observed=observed,
            forecast=forecast,
            short=short,
            capacity=m.capacity,
            lead_time_s=lead,
            panic=panic,
            need=need,
        )
        return need, reason, diag

    @staticmethod
    def _objective(m: _ModelState) -> float:
        """The objective the scheduler refuses by (it says it with its load), else the
        model's own TTFT SLO."""
        return m.slo_s or m.spec.ttft_slo_s

    def _pressed(self, m: _ModelState, now: float) -> float:
        """The scheduler's estimates over the panic window, on average, when that is
        past ``wait_pressure`` of the objective (a moment's spike is a burst the queue
        absorbs); else 0."""
        while m.waits and m.waits[0][0] < now - m.spec.panic_window_s:
            m.waits.popleft()
        if not m.spec.wait_pressure or not m.waits:
            return 0.0
        wait = sum(w for _, w in m.waits) / len(m.waits)
        return wait if wait > m.spec.wait_pressure * self._objective(m) else 0.0

    @staticmethod
    def _refused_share(m: _ModelState, now: float) -> float:
        """The share of the stable window's arrivals refused ``overloaded`` (0 under
        ``MIN_REFUSALS`` of them: one refusal in a handful of arrivals is noise)."""
        since = now - m.spec.stable_window_s
        for times in (m.arrived_at, m.refused_at):
            while times and times[0] < since:
                times.popleft()
        if len(m.refused_at) < MIN_REFUSALS or not m.arrived_at:
            return 0.0
        return min(1.0, len(m.refused_at) / len(m.arrived_at))

    def _within_budget(self, needs: dict[str, int]) -> dict[str, int]:
        budget = self.policy.budget_replicas
        if not budget or sum(needs.values()) <= budget:
            return dict(needs)
        # every model its minimum, then one worker at a time to the most short of its need
        granted = {n: min(self.models[n].spec.min_replicas, needs[n]) for n in needs}
        left = budget - sum(granted.values())
        while left > 0:
            short = [n for n in needs if granted[n] < needs[n]]
            if not short:
                break
            n = max(short, key=lambda k: (needs[k] - granted[k]) / needs[k])
            granted[n] += 1
            left -= 1
        return granted

    def _drain_order(self, model: str, count: int, now: float) -> list[str]:
        ready = sorted(
            self.ready(model, now), key=lambda hb: (hb.running + hb.waiting, hb.worker_id)
        )
        return [hb.worker_id for hb in ready[:count]]

    # -- learning -------------------------------------------------------------------------

    def _add_arrival(self, m: _ModelState, work: float, now: float) -> None:
        second = int(now)
        if not m.arrivals:
            m.arrivals.append(0.0)
            m.bucket_at = second
        while m.bucket_at < second:
            m.arrivals.append(0.0)
            m.bucket_at += 1
            if len(m.arrivals) > m.spec.history_s:
                m.arrivals.popleft()
        m.arrivals[-1] += work

    def _learn_capacity(self, m: _ModelState, ready: int, now: float) -> None:
        m.window_ready.append(ready)
        m.window_saturated_ticks += m.saturated_now
        m.saturated_now = False
        span = now - m.cap_window_start
        if span < m.spec.stable_window_s / 2:
            return
        workers = min(m.window_ready) if m.window_ready else 0
        if workers > 0 and m.window_ttfts and m.window_work > 0:
            per_worker = m.window_work / span / workers
            ttfts = sorted(m.window_ttfts)
            p95 = ttfts[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)) - 1)]
            if p95 <= m.spec.ttft_slo_s:
                m.capacity = max(m.capacity, per_worker)  # done within the SLO: at least this
            elif m.window_saturated_ticks >= 0.9 * len(m.window_ready):
                # saturated the whole window and late: a worker does at most this
                m.capacity = min(m.capacity, max(per_worker, 1.0) * 0.95)
        m.cap_window_start = now
        m.window_work = 0.0
        m.window_ttfts = []
        m.window_ready = []
        m.window_saturated_ticks = 0


LOAD_STALE_S = 5.0
"""A scheduler's queue report older than this no longer counts."""

MIN_REFUSALS = 5
"""Refusals in the stable window before their share counts."""

BURST_WIDTHS = (1, 2, 3, 5, 10, 20, 30, 60, 120)


def _burst(series: list[float], slo_s: float) -> tuple[float, int]:
    """The rate that serves every stretch of the series within its length plus the SLO:
    the highest (work in w seconds) / (w + slo_s) over the widths and positions, and its
    width. A steady rate r gives about r; a burst of W at once gives W / slo_s."""
    best, best_w = 0.0, 0
    for w in BURST_WIDTHS:
        if w > len(series):
            break
        run = sum(series[:w])
        top = run
        for i in range(w, len(series)):
            run += series[i] - series[i - w]
            top = max(top, run)
        rate = top / (w + slo_s)
        if rate > best:
            best, best_w = rate, w
    return best, best_w
