"""What a restarted scheduler pays to load the workers' KV events: one message an
event against one message an engine step.

    python bench/kv_replay.py [--events 200000] [--batch 32] [--workers 100]

On a real nats-server, IB_KV is filled with ``--events`` KV events (each storing 16
new blocks, numbered per worker, ``--workers`` of them) published one message each,
as workers did before ``KvEventBatch``; a real scheduler process is started and
timed until its status counts every block (``routing.kv_blocks``), with its CPU
seconds from /proc. The stream is purged and filled again with the same events in
batches of ``--batch`` (one engine step's events in one message), and timed the same
way. Then a third start with the index that scheduler stored when it stopped
(``ib-kv-index``): loaded, and IB_KV read on from the position it is as of. A start
with IB_KV empty is the baseline all are measured against. Printed: seconds and CPU
seconds per million events each way, the stream's bytes per event, and the ratios;
the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import nats
import testkit_path  # noqa: F401  (before testkit)
from nats.js.api import StreamInfo
from testkit.procs import ServiceProcess, start_all

from inferbus.contracts import (
    KV_INDEX,
    KvBlocksStored,
    KvEventBatch,
    kv_subject,
    status_subject,
)
from inferbus.shared.codec import encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import ensure_streams

BLOCKS = 16


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def events(n: int, workers: int) -> list[KvBlocksStored]:
    out = []
    for i in range(n):
        w = i % workers
        out.append(
            KvBlocksStored(
                worker_id=f"worker-{w}.bench",
                block_hashes=list(range(i * BLOCKS + 2**40, (i + 1) * BLOCKS + 2**40)),
                block_size=16,
                seq=i // workers + 1,
            )
        )
    return out


async def fill(nc: nats.NATS, evs: list[KvBlocksStored], batch: int) -> StreamInfo:
    js = nc.jetstream()
    await js.purge_stream("IB_KV")
    by_worker: dict[str, list[KvBlocksStored]] = {}
    for e in evs:
        by_worker.setdefault(e.worker_id, []).append(e)
    sent = 0
    for w, mine in by_worker.items():
        for i in range(0, len(mine), batch):
            part = mine[i : i + batch]
            data = encode(part[0]) if batch == 1 else encode(KvEventBatch(worker_id=w, events=part))
            await nc.publish(kv_subject(w), data)
            sent += 1
            if sent % 5000 == 0:
                await nc.flush()
    await nc.flush()
    while True:
        info = await js.stream_info("IB_KV")
        if info.state.messages >= sent:
            return info
        await asyncio.sleep(0.2)


async def clear_stored_index(nc: nats.NATS) -> None:
    """No index stored by an earlier start: this one reads IB_KV."""
    try:
        await nc.jetstream().purge_stream(f"KV_{KV_INDEX}")
    except nats.js.errors.NotFoundError:
        pass


async def load_time(url: str, logs: Path, nc: nats.NATS, blocks: int) -> tuple[float, float]:
    """Seconds from a scheduler's start to its index holding ``blocks`` blocks, and
    the CPU seconds it spent by then."""
    # no heartbeats here: the events' workers must not be dropped as gone meanwhile
    proc = ServiceProcess("scheduler", url, logs, "--worker-timeout-s", "600", name="kvr-scheduler")
    began = time.monotonic()
    start_all([proc])
    assert proc.proc is not None
    try:
        while True:
            try:
                reply = await nc.request(status_subject("scheduler"), b"", timeout=5)
                if json.loads(reply.data)["routing"]["kv_blocks"] >= blocks:
                    return time.monotonic() - began, cpu_s(proc.proc.pid)
            except TimeoutError:
                pass
            await asyncio.sleep(0.05)
    finally:
        proc.stop()


async def run(a: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats", log_file=Path(tmp) / "nats.log").start()
        nc = await nats.connect(server.url)
        try:
            await ensure_streams(nc.jetstream())
            base_s, base_cpu = await load_time(server.url, Path(tmp), nc, 0)
            evs = events(a.events, a.workers)
            out: dict[str, float] = {"baseline_s": base_s, "baseline_cpu_s": base_cpu}
            for name, batch in (("singles", 1), ("batched", a.batch), ("stored", 0)):
                if batch:
                    info = await fill(nc, evs, batch)
                    await clear_stored_index(nc)
                # "stored": the batched scheduler's stop stored its index: loaded, and
                # IB_KV read on from where it was
                wall, cpu = await load_time(server.url, Path(tmp), nc, a.events * BLOCKS)
                per_m = 1e6 / a.events
                out[f"{name}_s_per_million"] = (wall - base_s) * per_m
                out[f"{name}_cpu_s_per_million"] = (cpu - base_cpu) * per_m
                out[f"{name}_bytes_per_event"] = info.state.bytes / a.events
                out[f"{name}_messages"] = info.state.messages
        finally:
            await nc.close()
            server.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=32, help="events an engine step publishes")
    p.add_argument("--workers", type=int, default=100)
    a = p.parse_args()
    out = asyncio.run(run(a))
    for name in ("singles", "batched", "stored"):
        print(
            f"{name:8} {out[f'{name}_s_per_million']:7.2f} s and "
            f"{out[f'{name}_cpu_s_per_million']:7.2f} CPU s per million events; "
            f"{out[f'{name}_bytes_per_event']:6.0f} stream bytes an event "
            f"({out[f'{name}_messages']:.0f} messages)"
        )
    base = out["singles_s_per_million"]
    print(
        f"load time against singles: batched {out['batched_s_per_million'] / base:.3f}x, "
        f"stored {out['stored_s_per_million'] / base:.3f}x "
        f"(baseline start {out['baseline_s']:.2f} s)"
    )
    print(json.dumps({k: round(v, 3) for k, v in out.items()}))


if __name__ == "__main__":
    main()
