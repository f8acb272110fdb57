"""The scheduler core's CPU per decision as the fleet grows, against an earlier one.

    python bench/fleet.py [--fleets 64,256,1024,2048,4096] [--requests 3000] \
        [--reference REV]

Drives the real ``SchedulerCore`` in-process (no broker), one fleet size at a time,
and the core of git revision REV (default fd6102b, the single scheduler before its
pools) in the same run, on the same inputs: every worker serves one model with 64
slots and reports its prefix cache by KV events (4 prompt prefixes of 16 blocks each;
as many distinct prefixes as workers, so a prefix is held by about 4 of them, as
KV-aware routing keeps it). Printed per fleet size, CPU µs (process time) for:

- ``request``: a request accepted, routed by the ``kv`` strategy (a prefix held by
  a few workers) and ended, 100 in flight;
- ``shared``: the same with one block every worker holds in front of each prompt (a
  system prompt on the whole fleet): the holders of the first block are all of them;
- ``kv_event``: a stored or removed event of 16 blocks;
- ``heartbeat``: a heartbeat of an idle fleet, and ``hb_queued`` one while every
  slot is busy (8 a worker) and requests stand queued (no room anywhere).

Then the ratios ours / reference per column, and ours at the largest fleet over
ours at the smallest (the issue's goal: per-decision cost at 2,048 workers within
2x of 64). Then the KV index with a million blocks held (``--index-blocks``): MB it
takes (tracemalloc) and ms of a full garbage collection while it lives. The last line
is one JSON object: {fleet or "index": {column: {ours, reference}}}.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import ModuleType
from typing import Any

from inferbus.contracts import (
    KvBlocksRemoved,
    KvBlocksStored,
    RequestSubmitted,
    SamplingParams,
    WorkerHeartbeat,
)

ROOT = Path(__file__).resolve().parents[1]
SLOTS = 64
QUEUED_SLOTS = 8
"""Slots per worker for ``hb_queued`` (filling 64 on 4,096 workers through the
reference would take a quarter of an hour)."""
BLOCKS = 16


def load_reference(rev: str, into: Path) -> ModuleType:
    """The scheduler core of ``rev``, imported as its own package beside ours."""
    pkg = into / "reference_scheduler"
    pkg.mkdir()
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "services/scheduler/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in names:
        if name.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (pkg / Path(name).name).write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("reference_scheduler.core")


def prefix(k: int, shared: bool) -> list[int]:
    head = [7] if shared else []
    return head + [k * 1000 + i for i in range(BLOCKS)]


def heartbeat(i: int, slots: int = SLOTS, inflight: list[str] | None = None) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=f"w{i:05d}",
        models=["m"],
        engine="vllm",
        max_num_seqs=slots,
        kv_block_size=16,
        inflight=inflight or [],
        running=len(inflight or []),
    )


def fleet_core(module: ModuleType, workers: int, shared: bool, slots: int = SLOTS) -> Any:
    core = module.SchedulerCore(module.SchedulerPolicy())
    for i in range(workers):
        core.on_heartbeat(heartbeat(i, slots), 0.0)
    seq: dict[int, int] = {}
    for i in range(workers):
        for k in range(4):
            seq[i] = seq.get(i, 0) + 1
            core.on_kv_event(
                KvBlocksStored(
                    worker_id=f"w{i:05d}",
                    block_hashes=prefix((i + k * 997) % workers, shared),
                    block_size=16,
                    seq=seq[i],
                )
            )
    return core


def per_request(module: ModuleType, workers: int, n: int, shared: bool) -> float:
    core = fleet_core(module, workers, shared)
    rnd = random.Random(1)
    reqs = [
        RequestSubmitted(
            request_id=f"r{j}",
            model="m",
            prompt="p",
            prefix_hashes=prefix(rnd.randrange(workers), shared),
            sampling=SamplingParams(max_tokens=16),
            reply_to=f"ib.reply.r{j}",
        )
        for j in range(n)
    ]
    t0 = time.process_time()
    for j, r in enumerate(reqs):
        core.on_accepted(r, 1.0)
        if j >= 100:
            core.on_ended(f"r{j - 100}", 1.0)
    return (time.process_time() - t0) / n * 1e6


def per_kv_event(module: ModuleType, workers: int, n: int) -> float:
    core = fleet_core(module, workers, False)
    events = []
    for j in range(n):
        wid = f"w{j % workers:05d}"
        cls = KvBlocksStored if j % 2 == 0 else KvBlocksRemoved
        events.append(cls(worker_id=wid, block_hashes=prefix(10**6 + j // 2, False)))
    t0 = time.process_time()
    for e in events:
        core.on_kv_event(e)
    return (time.process_time() - t0) / n * 1e6


def per_heartbeat(module: ModuleType, workers: int, n: int, queued: bool) -> float:
    slots = QUEUED_SLOTS if queued else SLOTS
    core = fleet_core(module, workers, False, slots)
    if queued:  # every slot busy, and more waiting
        for j in range(workers * slots + 50):
            r = RequestSubmitted(
                request_id=f"q{j}",
                model="m",
                prompt="p",
                prefix_hashes=prefix(j % workers, False),
                sampling=SamplingParams(max_tokens=16),
                reply_to=f"ib.reply.q{j}",
            )
            core.on_accepted(r, 1.0)
    inflight: dict[str, list[str]] = {f"w{i:05d}": [] for i in range(workers)}
    for rid, f in core.inflight.items():
        inflight[f.worker_id].append(rid)
    beats = [heartbeat(j % workers, slots, inflight[f"w{j % workers:05d}"]) for j in range(n)]
    t0 = time.process_time()
    for j, hb in enumerate(beats):
        core.on_heartbeat(hb, 1.0 + j * 1e-6)
    return (time.process_time() - t0) / n * 1e6


def index_cost(module: ModuleType, blocks: int, workers: int = 1000) -> dict[str, float]:
    """The KV index holding ``blocks`` blocks (each on one worker, 100 to an event):
    MB it takes, and ms of a full garbage collection with it alive."""
    kvindex = importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".kvindex")
    events = [
        KvBlocksStored(
            worker_id=f"w{j % workers:05d}",
            block_hashes=list(range(j * 100 + 2**40, (j + 1) * 100 + 2**40)),
        )
        for j in range(blocks // 100)
    ]
    gc.collect()
    tracemalloc.start()
    index = kvindex.KvIndex()
    for e in events:
        index.on_event(e)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del events
    t0 = time.perf_counter()
    gc.collect()
    pause = time.perf_counter() - t0
    del index
    gc.collect()
    return {
        "mb_per_million": size / blocks * 1e6 / 2**20,
        "gc_ms_per_million": pause * 1e9 / blocks,
    }


def measure(module: ModuleType, workers: int, n: int) -> dict[str, float]:
    """CPU µs per event of each column."""
    return {
        "request": per_request(module, workers, n, False),
        "shared": per_request(module, workers, n, True),
        "kv_event": per_kv_event(module, workers, n),
        "heartbeat": per_heartbeat(module, workers, n, False),
        "hb_queued": per_heartbeat(module, workers, max(200, n // 10), True),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--fleets", default="64,256,1024,2048,4096")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--reference", default="fd6102b", help="git revision of the reference")
    p.add_argument("--index-blocks", type=int, default=1_000_000, help="0: no index row")
    a = p.parse_args()
    fleets = [int(x) for x in a.fleets.split(",")]
    ours = importlib.import_module("inferbus.services.scheduler.core")
    out: dict[int, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ref = load_reference(a.reference, Path(tmp))
        cols = ("request", "shared", "kv_event", "heartbeat", "hb_queued")
        print(f"CPU µs per event, ours / reference ({a.reference}), {a.requests} requests")
        print(f"{'workers':>8} " + " ".join(f"{c:>22}" for c in cols))
        for w in fleets:
            mine, theirs = measure(ours, w, a.requests), measure(ref, w, a.requests)
            out[w] = {
                c: {"ours": round(mine[c], 1), "reference": round(theirs[c], 1)} for c in cols
            }
            cells = [f"{mine[c]:8.1f} /{theirs[c]:8.1f} {mine[c] / theirs[c]:4.2f}x" for c in cols]
            print(f"{w:>8} " + " ".join(f"{x:>22}" for x in cells))
        if a.index_blocks:
            mine_i, theirs_i = index_cost(ours, a.index_blocks), index_cost(ref, a.index_blocks)
            for k in mine_i:
                print(f"index {k}: ours {mine_i[k]:.1f}, reference {theirs_i[k]:.1f}")
            out[0] = {
                k: {"ours": round(mine_i[k], 1), "reference": round(theirs_i[k], 1)} for k in mine_i
            }
    fleets_only = {k: v for k, v in out.items() if k}
    lo, hi = min(fleets), max(fleets)
    growth = {c: round(fleets_only[hi][c]["ours"] / fleets_only[lo][c]["ours"], 2) for c in out[lo]}
    ref_growth = {
        c: round(fleets_only[hi][c]["reference"] / fleets_only[lo][c]["reference"], 2)
        for c in out[lo]
    }
    print(f"growth {lo} -> {hi} workers: ours {growth}; reference {ref_growth}")
    print(json.dumps({str(k) if k else "index": v for k, v in out.items()}))


if __name__ == "__main__":
    main()
