"""The scheduling tier's capacity, one scheduler against a partitioned tier, on a
simulated fleet.

    python bench/partitions.py [--fleets 64,4096] [--instances 4] [--rate 200]

For each fleet size, twice on a fresh nats-server: one unpartitioned scheduler (as
before partitions), then ``--instances`` scheduler processes on as many partitions.
The fleet is simulated at the bus: ``--fleets`` workers' heartbeats (one a second
each, as workers send them), and for every assignment a worker's answer as a worker
gives it (the start, after ``--service-s`` the end through JetStream, and a batch of
``--kv-events`` KV events through IB_KV). Requests are accepted at ``--rate`` a second
a second for each scheduler instance (so each instance works at the same rate either
way: an idle process pays more per message, each wake-up serving fewer), straight onto
the scheduler's subjects (the partition chosen as the sanitizer does,
shared/partitions.py).

Each scheduler process's CPU seconds come from /proc, in two windows: the fleet's
heartbeats alone (its fixed cost), then with the requests (the fixed cost plus each
request's). Per instance: the CPU share of a core at rest, the CPU per request above
it, and the requests a second it could take at 70% of its core
(``(0.7 - rest) / per request``); the tier's is their sum (the choice of partition
follows room). The ratio of the tier's to the single scheduler's is the figure the
issue asks for (>= 3x at 4 instances; >= 5,000/s at 4,096 workers). The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import nats
import testkit_path  # noqa: F401  (before testkit)
from testkit.procs import ServiceProcess, start_all

from inferbus.contracts import (
    SCHEDULER_LOAD,
    KvBlocksStored,
    KvEventBatch,
    RequestAccepted,
    RequestFinished,
    RequestStarted,
    RequestSubmitted,
    SamplingParams,
    SchedulerLoad,
    Usage,
    WorkAssigned,
    WorkerHeartbeat,
    accepted_subject,
    ended_subject,
    heartbeat_subject,
    kv_subject,
    started_subject,
    worker_partition,
)
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.partitions import PartitionView
from inferbus.shared.streams import ensure_streams

MODEL = "bench-model"
TARGET = 0.7


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fleet:
    """Workers as the bus sees them: heartbeats, and answers to assignments."""

    def __init__(self, nc, workers: int, service_s: float, kv_events: int) -> None:
        self.nc, self.js = nc, nc.jetstream()
        self.ids = [f"fw-{i}.bench" for i in range(workers)]
        self.service_s, self.kv_events = service_s, kv_events
        self.assigned: dict[str, int] = {}
        """Assignments per worker."""
        self.ended = 0
        self.seq: dict[str, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    async def beat(self, stop: asyncio.Event) -> None:
        slices = 20  # spread over the second, as workers' own clocks do
        while not stop.is_set():
            began = time.monotonic()
            for s in range(slices):
                for wid in self.ids[s::slices]:
                    hb = WorkerHeartbeat(
                        worker_id=wid,
                        models=[MODEL],
                        engine="sim",
                        max_num_seqs=64,
                        interval_s=1.0,
                        sent_at=time.time(),
                    )
                    await self.nc.publish(heartbeat_subject(wid), encode(hb))
                await asyncio.sleep(max(0.0, began + (s + 1) / slices - time.monotonic()))

    async def on_work(self, msg) -> None:
        if self.closed:
            return
        w = decode(msg.data, WorkAssigned)
        self.assigned[w.worker_id] = self.assigned.get(w.worker_id, 0) + 1
        task = asyncio.create_task(self._serve(w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, w: WorkAssigned) -> None:
        rid, wid = w.request.request_id, w.worker_id
        started = RequestStarted(request_id=rid, worker_id=wid, attempt=w.attempt)
        await self.nc.publish(started_subject(w.partition), encode(started))
        await asyncio.sleep(self.service_s)
        seq = self.seq.get(wid, 0)
        events = [
            KvBlocksStored(
                worker_id=wid,
                block_hashes=[hash((rid, i)) & ((1 << 63) - 1)],
                seq=seq + i + 1,
            )
            for i in range(self.kv_events)
        ]
        self.seq[wid] = seq + self.kv_events
        if events:
            batch = KvEventBatch(worker_id=wid, events=events)
            await self.js.publish(kv_subject(wid), encode(batch))
        end = RequestFinished(
            request_id=rid,
            finish_reason="length",
            usage=Usage(prompt_tokens=64, completion_tokens=16),
            chunks=16,
            worker_id=wid,
            attempt=w.attempt,
        )
        await self.js.publish(ended_subject(w.partition), encode(end))
        self.ended += 1


async def measure(fleet_size: int, instances: int, args) -> dict:
    partitions = instances if instances > 1 else 1
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        server = NatsServer(logs / "nats").start()
        procs: list[ServiceProcess] = []
        nc = await nats.connect(server.url)
        stop = asyncio.Event()
        try:
            await ensure_streams(nc.jetstream())
            fleet = Fleet(nc, fleet_size, args.service_s, args.kv_events)
            beating = asyncio.create_task(fleet.beat(stop))
            await nc.subscribe("ib.work.>", cb=fleet.on_work)
            view = PartitionView(partitions)
            reports: dict[str, SchedulerLoad] = {}

            async def on_load(msg) -> None:
                load = decode(msg.data, SchedulerLoad)
                reports[load.scheduler_id] = load
                view.on_load(load, time.monotonic())

            await nc.subscribe(SCHEDULER_LOAD, cb=on_load)
            procs = [
                ServiceProcess(
                    "scheduler",
                    server.url,
                    logs,
                    "--scheduler-partitions",
                    str(partitions),
                    "--worker-timeout-s",
                    "10",
                    "--admit-by-slo",
                    "false",
                    "--kv-snapshot-interval-s",
                    "0",
                    "--log-level",
                    "warning",
                    name=f"bench-scheduler-{i}",
                )
                for i in range(instances)
            ]
            start_all(procs, timeout=60)
            # every worker booked by some instance
            deadline = time.monotonic() + 60
            while (
                sum(
                    r.models.get(MODEL).ready_workers if MODEL in r.models else 0
                    for r in reports.values()
                )
                < fleet_size
                or len(reports) < instances
            ):
                assert time.monotonic() < deadline, "the fleet was never booked"
                await asyncio.sleep(0.2)
            owned = {r.scheduler_id: set(r.partitions) for r in reports.values()}

            def cpus() -> dict[str, float]:
                return {p.name: cpu_s(p.proc.pid) for p in procs if p.proc}

            await asyncio.sleep(2.0)
            c0, t0 = cpus(), time.monotonic()
            await asyncio.sleep(args.window_s)
            c1, t1 = cpus(), time.monotonic()
            rest = {k: (c1[k] - c0[k]) / (t1 - t0) for k in c0}

            # requests: accepted at the rate, each to its partition; a warm-up first
            rate = args.rate * instances  # each instance's share at the same rate
            sent = 0

            async def load(seconds: float) -> None:
                nonlocal sent
                began, base = time.monotonic(), sent
                while time.monotonic() - began < seconds:
                    due = base + int((time.monotonic() - began) * rate)
                    while sent < due:
                        req = RequestSubmitted(
                            request_id=f"b{instances}-{fleet_size}-{sent}",
                            model=MODEL,
                            reply_to="ib.reply.bench.x",
                            prompt="p",
                            prompt_tokens=64,
                            prefix_hashes=[sent % 97, sent],
                            sampling=SamplingParams(max_tokens=16),
                            created_at=time.time(),
                        )
                        p = view.choose(req, time.monotonic())
                        accepted = RequestAccepted(request=req, accepted_at=time.time())
                        await nc.jetstream().publish(accepted_subject(p), encode(accepted))
                        sent += 1
                    await asyncio.sleep(0.005)

            await load(args.warmup_s)
            assigned0 = dict(fleet.assigned)
            c2, t2 = cpus(), time.monotonic()
            await load(args.window_s)
            c3, t3 = cpus(), time.monotonic()
            busy = {k: (c3[k] - c2[k]) / (t3 - t2) for k in c2}
            per_instance = {}
            for p in procs:
                mine = owned.get(p.name) or None  # unpartitioned: every worker
                served = sum(
                    n - assigned0.get(w, 0)
                    for w, n in fleet.assigned.items()
                    if mine is None or worker_partition(w, partitions) in mine
                )
                rate = served / (t3 - t2)
                per_req = (busy[p.name] - rest[p.name]) / rate if rate else float("inf")
                per_instance[p.name] = {
                    "rest_core": round(rest[p.name], 4),
                    "busy_core": round(busy[p.name], 4),
                    "requests_per_s": round(rate, 1),
                    "cpu_us_per_request": round(per_req * 1e6, 1),
                    "cpu_us_per_heartbeat_heard": round(rest[p.name] / fleet_size * 1e6, 2),
                    "capacity_per_s": round(max(0.0, TARGET - rest[p.name]) / per_req, 0)
                    if per_req > 0
                    else 0.0,
                }
            stop.set()
            await beating
            fleet.closed = True
            for task in list(fleet._tasks):  # answers still due: not part of the figures
                task.cancel()
            return {
                "fleet": fleet_size,
                "instances": instances,
                "sent": sent,
                "ended": fleet.ended,
                "capacity_per_s": sum(v["capacity_per_s"] for v in per_instance.values()),
                "per_instance": per_instance,
            }
        finally:
            stop.set()
            for p in procs:
                p.stop()
            await nc.close()
            server.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default="64,4096")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--service-s", type=float, default=0.5)
    ap.add_argument("--kv-events", type=int, default=8)
    args = ap.parse_args()
    out = []
    for n in (int(x) for x in args.fleets.split(",")):
        ratios = []
        for _ in range(args.repeat):  # alternated: the machine's drift touches both
            single = await measure(n, 1, args)
            tier = await measure(n, args.instances, args)
            ratio = tier["capacity_per_s"] / max(1.0, single["capacity_per_s"])
            ratios.append(ratio)
            for r in (single, tier):
                print(
                    f"fleet {n:5d}  instances {r['instances']}  capacity "
                    f"{r['capacity_per_s']:8.0f} req/s at {TARGET:.0%} of each core  "
                    f"(sent {r['sent']}, ended {r['ended']})"
                )
                for name, v in r["per_instance"].items():
                    print(
                        f"    {name}: rest {v['rest_core']:.3f} core "
                        f"({v['cpu_us_per_heartbeat_heard']:.1f} us a heartbeat heard), "
                        f"{v['requests_per_s']:.0f} req/s, {v['cpu_us_per_request']:.0f} us a "
                        f"request (with its {args.kv_events} KV events), "
                        f"capacity {v['capacity_per_s']:.0f}/s"
                    )
            print(f"fleet {n}: tier / single = {ratio:.2f}x")
            out.append({"fleet": n, "single": single, "tier": tier, "ratio": round(ratio, 2)})
        print(f"fleet {n}: median tier / single = {statistics.median(ratios):.2f}x")
    print(json.dumps({"bench": "partitions", "results": out}))


if __name__ == "__main__":
    asyncio.run(main())
