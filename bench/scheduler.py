"""The scheduler core on public traces, in simulated time, against its references.

    python bench/scheduler.py [--trace PATH ...] [--workers-azure 2] [--workers-mooncake 8]

Each trace (../shared/traces by default: the Azure code trace, CSV with TIMESTAMP,
ContextTokens, GeneratedTokens; the Mooncake conversation trace, JSON lines with
timestamp (ms), input_length, output_length, hash_ids) is replayed through the real
``SchedulerCore`` (no copy of it) with simulated workers that follow the sim
engine's timing model as vLLM schedules: continuous batching with chunked prefill
(a token budget per step, decodes first, prefills first-come first-served), a
bounded prefix cache per worker (LRU of 512-token blocks, publishing its stored and
evicted blocks as KV events to the scheduler), and a slot limit.

Printed side by side in one run:
- goodput (the share of all requests whose first token came within their objective,
  2 s plus the prompt at 10,000 tokens/s by default; refused, timed-out and late ones
  missed), and the late, refused and timed-out shares, for FCFS, lanes (short first,
  no admission) and ours (the scheduler's defaults: lanes, SLO admission); TTFT p95
  of the short requests (prompt under the lane threshold) and of all, served ones;
  throughput ours / FCFS. Retryable failures are sent again after their Retry-After
  (``--retries``, 2 as the OpenAI SDK);
- routing (traces with block hashes): prefix-cache hit rate and max/mean load, ours
  (``kv``: cached share against load, within a load bound) against round robin and a
  Dynamo-style cost (new prefill blocks weighted against active decode blocks);
- the routing decision time, p99 in µs, timed around the core's route call.
The last line is one JSON object (keys in bench/README.md).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import heapq
import json
import math
import statistics
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferbus.contracts import (
    KvBlocksRemoved,
    KvBlocksStored,
    RequestSubmitted,
    SamplingParams,
    WorkerHeartbeat,
)
from inferbus.services.scheduler.core import Assign, Fail, Refuse, SchedulerCore, SchedulerPolicy
from inferbus.services.scheduler.goodput import slo_s

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
BLOCK = 512
TICK_S = 0.1
"""The scheduler service's tick (``--tick-interval-s``' default)."""


@dataclass
class Req:
    rid: str
    arrival: float
    prompt: int
    output: int
    blocks: list[int]


@dataclass
class Timing:
    """An 8B-class model on one GPU, as the sim engine models it."""

    step_base_s: float = 0.008
    per_seq_s: float = 0.0001
    prefill_per_token_s: float = 0.00005
    budget_tokens: int = 2048
    """Tokens one engine step processes (vLLM's max_num_batched_tokens)."""


@dataclass
class Seq:
    req: Req
    prefill_left: int
    sid: str = ""
    """The id it was submitted under (the trace's, or a retry's)."""
    decoded: int = 0
    first_token: float | None = None


@dataclass
class SimWorker:
    wid: str
    slots: int
    cache_blocks: int
    timing: Timing
    seqs: list[Seq] = field(default_factory=list)
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
    busy: bool = False
    work_tokens: int = 0
    hits: int = 0
    blocks: int = 0

    def admit(self, req: Req, sid: str) -> list[Any]:
        """Take a request: its cached prefix is free, the rest is prefilled. Returns the
        KV events the engine would publish."""
        cached = 0
        for h in req.blocks:
            if h not in self.cache:
                break
            cached += 1
        self.hits += cached
        self.blocks += len(req.blocks)
        stored = []
        for h in req.blocks:
            if h in self.cache:
                self.cache.move_to_end(h)
            else:
                self.cache[h] = None
                stored.append(h)
        evicted = []
        while len(self.cache) > self.cache_blocks:
            evicted.append(self.cache.popitem(last=False)[0])
        uncached = max(1, req.prompt - cached * BLOCK)
        self.seqs.append(Seq(req, uncached, sid))
        events: list[Any] = []
        if stored:
            events.append(KvBlocksStored(worker_id=self.wid, block_hashes=stored, block_size=BLOCK))
        if evicted:
            events.append(KvBlocksRemoved(worker_id=self.wid, block_hashes=evicted))
        return events

    def step(self, now: float) -> tuple[float, list[Seq], list[Seq]]:
        """One engine step from ``now``: (its end, first tokens, finished)."""
        t = self.timing
        budget = t.budget_tokens
        decoding = [s for s in self.seqs if s.prefill_left == 0]
        budget -= len(decoding)
        prefill_tokens = 0
        started: list[Seq] = []
        for s in self.seqs:
            if s.prefill_left == 0 or budget <= 0:
                continue
            take = min(budget, s.prefill_left)
            s.prefill_left -= take
            budget -= take
            prefill_tokens += take
            if s.prefill_left == 0:
                started.append(s)
        end = (
            now
            + t.step_base_s
            + t.per_seq_s * len(decoding)
            + t.prefill_per_token_s * prefill_tokens
        )
        self.work_tokens += prefill_tokens + len(decoding)
        finished = []
        for s in decoding:
            s.decoded += 1
            if s.decoded >= s.req.output:
                finished.append(s)
        for s in started:
            s.first_token = end
            s.decoded = 1
            if s.decoded >= s.req.output:
                finished.append(s)
        self.seqs = [s for s in self.seqs if s not in finished]
        return end, started, finished


def simulate(
    reqs: list[Req],
    policy: SchedulerPolicy,
    workers: int,
    slots: int,
    cache_blocks: int,
    kv_tokens: int,
    timing: Timing,
    retries: int = 0,
) -> dict[str, Any]:
    """``retries``: a retryable failure is submitted again after its Retry-After (1 s
    when none is said) up to this many times, as the OpenAI SDK does (2 by default);
    its TTFT still counts from its first submission. Results are by the trace's ids."""
    core = SchedulerCore(policy)
    route_ns: list[int] = []
    route = core._route

    def timed_route(*a: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = route(*a)
        route_ns.append(time.perf_counter_ns() - t0)
        return out

    core._route = timed_route  # type: ignore[method-assign]
    sims = {f"w{i}": SimWorker(f"w{i}", slots, cache_blocks, timing) for i in range(workers)}
    for wid in sims:
        core.on_heartbeat(
            WorkerHeartbeat(
                worker_id=wid,
                models=["m"],
                engine="sim",
                max_num_seqs=slots,
                kv_capacity_tokens=kv_tokens,
            ),
            0.0,
        )
    events: list[tuple[float, int, str, Any]] = []
    seq = 0
    for r in reqs:
        events.append((r.arrival, seq, "arrive", (r.rid, r)))
        seq += 1
    heapq.heapify(events)
    by_id = {r.rid: r for r in reqs}
    ttft: dict[str, float] = {}
    done_at: dict[str, float] = {}
    failed: dict[str, str] = {}
    """Requests the scheduler refused or failed (queue full, timed out): by code."""
    sent: dict[str, float] = {}
    failed_after: list[tuple[str, float]] = []
    """Each refused or failed submission (retries too): its code, and how long it took
    to learn it."""

    ticking = False
    """A tick is pending: the core ticks as the service does (every ``TICK_S``) while
    anything is queued, so queue timeouts, deadlines and the time-based lane rules act
    between arrivals and ends too."""

    def apply(effects: list[Any], now: float) -> None:
        nonlocal seq, ticking
        for e in effects:
            if isinstance(e, Fail | Refuse):
                rid = e.request.request_id
                origin, _, tried = rid.partition("~")
                failed_after.append((e.code, now - sent[rid]))
                if isinstance(e, Fail) and e.retryable and int(tried or 0) < retries:
                    again = f"{origin}~{int(tried or 0) + 1}"
                    by_id[again] = by_id[rid]
                    wait = e.retry_after_s or 1.0
                    heapq.heappush(events, (now + wait, seq, "arrive", (again, by_id[rid])))
                    seq += 1
                else:
                    failed[origin] = e.code
            elif isinstance(e, Assign):
                w = sims[e.worker_id]
                for ev in w.admit(by_id[e.request.request_id], e.request.request_id):
                    core.on_kv_event(ev)
                if not w.busy:
                    w.busy = True
                    heapq.heappush(events, (now, seq, "step", w.wid))
                    seq += 1
        if not ticking and any(core.queues.values()):
            ticking = True
            heapq.heappush(events, (now + TICK_S, seq, "tick", None))
            seq += 1

    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == "tick":
            ticking = False
            apply(core.tick(now), now)
            continue
        if kind == "arrive":
            rid, r = what
            sent[rid] = now
            apply(
                core.on_accepted(
                    RequestSubmitted(
                        request_id=rid,
                        model="m",
                        reply_to="r." + rid,
                        prompt="",
                        prompt_tokens=r.prompt,
                        prefix_hashes=r.blocks,
                        sampling=SamplingParams(max_tokens=r.output),
                    ),
                    now,
                ),
                now,
            )
            continue
        w = sims[what]
        if not w.seqs:
            w.busy = False
            continue
        end, started, finished = w.step(now)
        for s in started:
            ttft[s.req.rid] = end - s.req.arrival
            core.on_started(s.sid, 1, w.wid, now=end)
        for s in finished:
            done_at[s.req.rid] = end
            apply(core.on_ended(s.sid, end), end)
        heapq.heappush(events, (end, seq, "step", w.wid))
        seq += 1
    makespan = max(done_at.values()) - min(r.arrival for r in reqs)
    work = [w.work_tokens for w in sims.values()]
    blocks = sum(w.blocks for w in sims.values())
    return {
        "ttft": ttft,
        "throughput": sum(by_id[r].output for r in done_at) / makespan,
        "completed": len(done_at),
        "failed": failed,
        "failed_after": failed_after,
        "hit_rate": sum(w.hits for w in sims.values()) / blocks if blocks else 0.0,
        "imbalance": max(work) / statistics.mean(work),
        "work_per_s": sum(work) / makespan,
        "route_p99_us": statistics.quantiles(route_ns, n=100)[98] / 1e3
        if len(route_ns) > 100
        else max(route_ns, default=0) / 1e3,
    }


# -- traces -------------------------------------------------------------------------------


def load_trace(path: Path, limit: int, speedup: float) -> list[Req]:
    reqs: list[Req] = []
    if path.suffix == ".csv":
        with open(path) as f:
            rows = list(csv.DictReader(f))[: limit or None]
        t0 = None
        for i, row in enumerate(rows):
            ts = datetime.datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            t0 = ts if t0 is None else t0
            reqs.append(
                Req(
                    f"r{i}",
                    (ts - t0) / speedup,
                    int(row["ContextTokens"]),
                    max(1, int(row["GeneratedTokens"])),
                    [],
                )
            )
    else:
        with open(path) as f:
            for i, line in enumerate(f):
                if limit and i >= limit:
                    break
                o = json.loads(line)
                reqs.append(
                    Req(
                        f"r{i}",
                        o["timestamp"] / 1000 / speedup,
                        o["input_length"],
                        max(1, o["output_length"]),
                        list(o.get("hash_ids", [])),
                    )
                )
    return reqs


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank); a request never served counts as infinite, so
    a policy cannot look fast by refusing."""
    xs = sorted(values)
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)] if xs else 0.0


def ttfts(res: dict[str, Any], ids: list[str]) -> list[float]:
    return [res["ttft"].get(r, math.inf) for r in ids]


def slo_of(r: Req, a: argparse.Namespace) -> float:
    """Its TTFT objective, as the scheduler computes it (``goodput.slo_s``)."""
    return slo_s(r.prompt, "standard", a.slo_ttft_s, a.slo_prefill_tokens_per_s)


def goodput(res: dict[str, Any], reqs: list[Req], a: argparse.Namespace) -> dict[str, Any]:
    """Shares of all requests: served within their objective (goodput), served late,
    refused at once (``overloaded``, ``queue_full``) and failed in the queue (timed
    out); and how long a refused request waited to learn it (p95)."""
    n = len(reqs)
    met = late = 0
    for r in reqs:
        t = res["ttft"].get(r.rid)
        if t is not None:
            met, late = (met + 1, late) if t <= slo_of(r, a) else (met, late + 1)
    codes = Counter(res["failed"].values())
    refused = codes["overloaded"] + codes["queue_full"]
    notice = [s for code, s in res["failed_after"] if code in ("overloaded", "queue_full")]
    return {
        "goodput": round(met / n, 4),
        "late": round(late / n, 4),
        "refused": round(refused / n, 4),
        "timed_out": round((sum(codes.values()) - refused) / n, 4),
        "refuse_notice_p95_s": round(p95(notice), 3) if notice else None,
    }


POLICIES = ("fcfs", "lanes", "ours")


def compare(reqs: list[Req], workers: int, a: argparse.Namespace) -> dict[str, Any]:
    """FCFS, lanes (short first, no admission) and ours (the scheduler's defaults:
    lanes ordered by slack, SLO admission) on one trace; with block hashes, the
    routings too."""
    hashed = any(r.blocks for r in reqs)
    base = dict(
        short_prompt_tokens=a.short_tokens,
        **{k: v for k, v in a.policy.items() if v is not None},
        queue_timeout_s=a.queue_timeout_s,
        worker_timeout_s=1e9,
        block_tokens=BLOCK,
        ttft_slo_s=a.slo_ttft_s,
        slo_prefill_tokens_per_s=a.slo_prefill_tokens_per_s,
    )
    plain = dict(admit_by_slo=False, order_by_slack=False)
    ours = dict(admit_by_slo=not a.no_admit, order_by_slack=not a.no_slack)
    runs = {
        "fcfs": SchedulerPolicy(lanes=False, **plain, **base),
        "lanes": SchedulerPolicy(lanes=True, **plain, **base),
        "ours": SchedulerPolicy(**ours, **base),
    }
    if hashed:
        runs |= {
            "round_robin": SchedulerPolicy(routing="round_robin", **ours, **base),
            "dynamo": SchedulerPolicy(routing="dynamo", **ours, **base),
        }
    kv_tokens = a.cache_blocks * BLOCK
    res = {
        k: simulate(reqs, pol, workers, a.slots, a.cache_blocks, kv_tokens, Timing(), a.retries)
        for k, pol in runs.items()
    }
    every = [r.rid for r in reqs]
    short = [r.rid for r in reqs if r.prompt < a.short_tokens]

    def served_p95(k: str, ids: list[str]) -> float:
        return p95([res[k]["ttft"][r] for r in ids if r in res[k]["ttft"]])

    def ratio(x: float | None, y: float | None) -> float | None:
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)) or y <= 0:
            return None
        return round(x / y, 3)

    good = {k: goodput(res[k], reqs, a) for k in POLICIES}
    s_p95 = {k: round(served_p95(k, short), 4) for k in POLICIES}
    all_p95 = {k: round(served_p95(k, every), 4) for k in POLICIES}
    summary: dict[str, Any] = {
        "requests": len(reqs),
        "workers": workers,
        "goodput": {k: good[k]["goodput"] for k in POLICIES},
        "goodput_ratio": ratio(good["ours"]["goodput"], good["fcfs"]["goodput"]),
        "outcomes": good,
        "short_ttft_p95_s": s_p95,
        "short_ttft_ratio": ratio(s_p95["ours"], s_p95["fcfs"]),
        "all_ttft_p95_s": all_p95,
        "all_ttft_ratio": ratio(all_p95["ours"], all_p95["fcfs"]),
        "throughput_ratio": round(res["ours"]["throughput"] / res["fcfs"]["throughput"], 3),
        "work_ratio": round(res["ours"]["work_per_s"] / res["fcfs"]["work_per_s"], 3),
        "failed": {k: dict(sorted(Counter(r["failed"].values()).items())) for k, r in res.items()},
        "route_p99_us": round(max(r["route_p99_us"] for r in res.values()), 2),
    }
    if hashed:
        summary["routing"] = {
            ("kv" if k == "ours" else k): {
                "hit_rate": round(res[k]["hit_rate"], 4),
                "imbalance": round(res[k]["imbalance"], 3),
                "route_p99_us": round(res[k]["route_p99_us"], 2),
            }
            for k in ("round_robin", "dynamo", "ours")
        }
    return summary


def show(name: str, summary: dict[str, Any], a: argparse.Namespace) -> None:
    print(
        f"\n{name}: {summary['requests']} requests, {summary['workers']} workers x "
        f"{a.slots} slots, TTFT objective {a.slo_ttft_s:g}s + prompt at "
        f"{a.slo_prefill_tokens_per_s:g} tokens/s, queue timeout {a.queue_timeout_s:g}s"
    )
    print(
        f"  {'policy':<8}{'goodput':>9}{'late':>8}{'refused':>9}{'timed out':>11}"
        f"{'short p95 s':>13}{'all p95 s':>11}{'notice p95 s':>14}"
    )
    for k in POLICIES:
        o = summary["outcomes"][k]
        notice = o["refuse_notice_p95_s"]
        print(
            f"  {k:<8}{o['goodput']:>9.3f}{o['late']:>8.3f}{o['refused']:>9.3f}"
            f"{o['timed_out']:>11.3f}{summary['short_ttft_p95_s'][k]:>13.2f}"
            f"{summary['all_ttft_p95_s'][k]:>11.2f}{'-' if notice is None else notice:>14}"
        )
    print(
        f"  goodput ours/FCFS {summary['goodput_ratio']}; served short p95 "
        f"{summary['short_ttft_ratio']}x; throughput {summary['throughput_ratio']:.3f}x"
    )
    if "routing" in summary:
        print(f"  {'routing':<12}{'hit rate':>10}{'max/mean load':>15}{'route p99 µs':>14}")
        for k, r in summary["routing"].items():
            label = "ours (kv)" if k == "kv" else k
            print(
                f"  {label:<12}{r['hit_rate']:>10.3f}{r['imbalance']:>15.2f}"
                f"{r['route_p99_us']:>14.1f}"
            )


SWEEP_HEAD = (
    "| speed-up | goodput FCFS / lanes / ours | ratio | ours: late / refused / timed out "
    "| short p95 FCFS / ours (s) | ratio | throughput | notice p95 (s) |"
)


def sweep_row(speedup: float, summary: dict[str, Any]) -> str:
    g, o = summary["goodput"], summary["outcomes"]["ours"]
    s = summary["short_ttft_p95_s"]
    notice = o["refuse_notice_p95_s"]
    row = (
        f"| {speedup:g} | {g['fcfs']:.3f} / {g['lanes']:.3f} / {g['ours']:.3f} "
        f"| {summary['goodput_ratio']} | {o['late']:.3f} / {o['refused']:.3f} / "
        f"{o['timed_out']:.3f} | {s['fcfs']:.2f} / {s['ours']:.2f} | {summary['short_ttft_ratio']} "
        f"| {summary['throughput_ratio']:.3f} | {'-' if notice is None else notice} |"
    )
    if "routing" in summary:
        r = summary["routing"]
        row += (
            f" {r['kv']['hit_rate']:.3f} / {r['dynamo']['hit_rate']:.3f} "
            f"| {r['kv']['imbalance']:.2f} |"
        )
    return row


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", action="append", type=Path, default=None)
    p.add_argument("--limit", type=int, default=0, help="first N requests of each trace")
    p.add_argument("--speedup", type=float, default=1.0, help="replay this much faster")
    p.add_argument(
        "--sweep", default="", help="speed-ups to run in turn, e.g. 1,2,3,4,5,6,7,8: a table each"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="workers (default: 2 for traces without block hashes, 8 with)",
    )
    p.add_argument("--slots", type=int, default=64)
    p.add_argument(
        "--cache-blocks",
        type=int,
        default=1200,
        help="prefix cache per worker, in 512-token blocks",
    )
    p.add_argument("--short-tokens", type=int, default=2048, help="lane threshold")
    p.add_argument(
        "--queue-timeout-s",
        type=float,
        default=SchedulerPolicy().queue_timeout_s,
        help="the scheduler's queue timeout (default: the service's)",
    )
    p.add_argument(
        "--slo-ttft-s",
        type=float,
        default=SchedulerPolicy().ttft_slo_s,
        help="TTFT objective: this plus the prompt at --slo-prefill-tokens-per-s",
    )
    p.add_argument(
        "--slo-prefill-tokens-per-s", type=float, default=SchedulerPolicy().slo_prefill_tokens_per_s
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="a retryable failure is sent again after its Retry-After, this many times "
        "(the OpenAI SDK's default: 2)",
    )
    p.add_argument("--no-admit", action="store_true", help="ours without SLO admission")
    p.add_argument("--no-slack", action="store_true", help="ours with short-first lanes")
    for name in (
        "short_reserve",
        "long_per_worker",
        "long_wait_bound_s",
        "reserve_above_tokens",
        "reserve_release_s",
        "long_prefill_tokens",
    ):
        p.add_argument(
            "--" + name.replace("_", "-"), type=float, default=None, help="the policy's (tests)"
        )
    a = p.parse_args()
    a.policy = {
        "short_reserve": a.short_reserve,
        "long_per_worker": None if a.long_per_worker is None else int(a.long_per_worker),
        "long_wait_bound_s": a.long_wait_bound_s,
        "reserve_release_s": a.reserve_release_s,
        "long_prefill_tokens": None
        if a.long_prefill_tokens is None
        else int(a.long_prefill_tokens),
        "reserve_above_tokens": None
        if a.reserve_above_tokens is None
        else int(a.reserve_above_tokens),
    }
    traces = a.trace or [
        TRACES / "AzureLLMInferenceTrace_code.csv",
        TRACES / "mooncake_conversation_trace.jsonl",
    ]
    speedups = [float(x) for x in a.sweep.split(",") if x.strip()] or [a.speedup]
    out: dict[str, Any] = {"bench": "scheduler"}
    for path in traces:
        rows = []
        for speedup in speedups:
            reqs = load_trace(path, a.limit, speedup)
            workers = a.workers or (8 if any(r.blocks for r in reqs) else 2)
            summary = compare(reqs, workers, a)
            summary["speedup"] = speedup
            if len(speedups) == 1:
                show(path.stem, summary, a)
                out[path.stem] = summary
            else:
                rows.append(sweep_row(speedup, summary))
                out.setdefault(path.stem, []).append(summary)
        if rows:
            hashed = "routing" in out[path.stem][0]
            print(f"\n{path.stem}, speed-ups {a.sweep}")
            print(SWEEP_HEAD + (" hit rate kv / dynamo | kv max/mean |" if hashed else ""))
            print("|---" * (10 if hashed else 8) + "|")
            print("\n".join(rows))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
