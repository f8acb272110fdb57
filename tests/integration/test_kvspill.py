"""The kvspill service on a real nats-server: it bounds the shared KV tier's folder
(the blocks workers restore stay, the others go), writes what the tier holds per
namespace to its KV bucket, and sweeps what dead writers left."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request

import pytest
from testkit.procs import ServiceProcess

from inferbus.contracts import KV_SPILL_INDEX, KvSpillNamespace
from inferbus.shared.codec import decode
from inferbus.shared.kvblocks import block_path, encode_block, scan_blocks

pytestmark = [pytest.mark.integration]

BLOCK = 64 << 10  # 64 KiB: 16 fit the 1 MiB bound


def write(root, name: str, mtime: float) -> str:
    key = f"ns0:{name * 64}"[:68]
    path = block_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_block(key, os.urandom(BLOCK)))
    os.utime(path, (mtime, mtime))
    return key


def status(proc: ServiceProcess) -> dict[str, float]:
    """Its gauges, from /metrics."""
    with urllib.request.urlopen(f"{proc.base}/metrics") as r:
        text = r.read().decode()
    out = {}
    for name in ("used_bytes", "blocks", "capacity_bytes"):
        line = next(x for x in text.splitlines() if x.startswith(f"inferbus_kv_shared_{name} "))
        out[name] = float(line.split()[-1])
    return out


async def until(check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


async def test_it_bounds_the_tier_keeps_restored_blocks_and_indexes_it(
    nats_url, log_dir, tmp_path, client
):
    root = tmp_path / "shared"
    hot = write(root, "a", mtime=1000)
    old = [write(root, c, mtime=1001 + i) for i, c in enumerate("bcdefghij")]
    stale_tmp = block_path(root, hot).with_suffix(".999.1.tmp")
    stale_tmp.write_bytes(b"half a block")
    os.utime(stale_tmp, (1, 1))
    proc = ServiceProcess(
        "kvspill",
        nats_url,
        log_dir,
        "--shared-dir",
        str(root),
        "--capacity-mb",
        "1",
        "--scan-interval-s",
        "0.2",
        name="kvspill-bound",
    )
    proc.start().wait_ready(timeout=30)
    try:
        assert status(proc)["blocks"] == 10
        assert not stale_tmp.exists()  # a dead writer's half block, swept
        # a worker restores the hot block (marks its access time), then writes more
        os.utime(block_path(root, hot), (time.time(), 1000))
        await asyncio.sleep(0.6)
        for i, c in enumerate("klmnopqrstuv"):
            write(root, c, mtime=2000 + i)
        await until(lambda: status(proc)["blocks"] == 16)
        await asyncio.sleep(0.5)  # a scan more: its deletes are done
        held = {b.key for b in scan_blocks(root)}
        assert sum(b.size for b in scan_blocks(root)) <= 1 << 20
        assert hot in held  # restored, so kept over blocks only ever written
        assert len(held) == 16 and not set(old) <= held
        kv = await client.js.key_value(KV_SPILL_INDEX)
        entry = decode((await kv.get("ns.ns0")).value, KvSpillNamespace)
        assert entry.blocks == 16 and entry.bytes == 16 * BLOCK
        with urllib.request.urlopen(f"{proc.base}/metrics") as r:
            text = r.read().decode()
        assert 'inferbus_kv_shared_block_events_total{kind="evicted"}' in text
        assert status(proc)["capacity_bytes"] == 1 << 20
    finally:
        assert proc.stop() == 0, proc.logs()
