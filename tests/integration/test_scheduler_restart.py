"""Kill the scheduler under load: every accepted request still ends, exactly once, and
none is placed twice. A platform of its own (its NATS too), so the kill harms no one."""

from __future__ import annotations

import asyncio
import collections
import time
import urllib.request
import uuid

import pytest
from testkit.frozen import asked_and_recorded, frozen_worker
from testkit.procs import ServiceProcess, start_all

from inferbus.client import Client, RequestError
from inferbus.contracts import ENDED, Terminal, WorkAssigned
from inferbus.shared.codec import decode
from inferbus.shared.natsserver import NatsServer

pytestmark = [pytest.mark.integration]

MODEL = "restart-model"
FROZEN_MODEL = "frozen-model"


@pytest.fixture
def fleet(tmp_path):
    """NATS, sanitizer, scheduler and one worker with 4 slots (20 ms a token)."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    url = server.url
    scheduler = ServiceProcess(
        "scheduler", url, tmp_path, "--worker-timeout-s", "3", name="rs-scheduler"
    )
    procs = [
        ServiceProcess("sanitizer", url, tmp_path, name="rs-sanitizer"),
        scheduler,
        ServiceProcess(
            "worker",
            url,
            tmp_path,
            "--model",
            MODEL,
            "--max-num-seqs",
            "4",
            "--sim-decode-s-per-step",
            "0.02",
            "--heartbeat-interval-s",
            "0.3",
            name="rs-worker",
        ),
    ]
    start_all(procs)
    yield url, tmp_path, scheduler, procs[2]
    for p in reversed(procs):
        p.stop()
    server.stop()


async def test_killing_the_scheduler_under_load_loses_and_duplicates_nothing(fleet):
    url, logs, scheduler, _ = fleet
    c = await Client.connect(url)
    ended: collections.Counter[str] = collections.Counter()
    placed: collections.Counter[str] = collections.Counter()

    async def on_ended(msg):
        ended[decode(msg.data, Terminal).request_id] += 1

    async def on_work(msg):
        placed[decode(msg.data, WorkAssigned).request.request_id] += 1

    await c.nc.subscribe(ENDED, cb=on_ended)
    await c.nc.subscribe("ib.work.>", cb=on_work)
    await c.nc.flush()
    try:
        # 16 requests of ~0.8 s each on 4 slots: some run, most wait, when the kill comes
        jobs = [
            asyncio.create_task(
                c.generate(MODEL, f"job {i}", max_tokens=40, request_id=f"rs-{i}", timeout=60)
            )
            for i in range(16)
        ]
        await asyncio.sleep(1.0)
        scheduler.kill()  # SIGKILL: no drain, nothing acked on the way out
        await asyncio.sleep(1.0)
        replacement = ServiceProcess(
            "scheduler", url, logs, "--worker-timeout-s", "3", name="rs-scheduler-2"
        )
        start_all([replacement])
        try:
            results = await asyncio.wait_for(asyncio.gather(*jobs), 60)
        finally:
            await asyncio.sleep(0.5)
            replacement.stop()
        assert [r.outcome.finish_reason for r in results] == ["length"] * 16
        assert all(r.outcome.usage.completion_tokens == 40 for r in results)
        ids = {f"rs-{i}" for i in range(16)}
        assert {k for k, n in ended.items() if k in ids} == ids
        assert all(ended[k] == 1 for k in ids), ended  # one terminal event each
        assert all(placed[k] == 1 for k in ids), placed  # never run twice
    finally:
        await c.close()


async def test_work_placed_before_a_restart_still_ends_when_its_worker_dies(fleet):
    url, logs, scheduler, worker = fleet
    c = await Client.connect(url)
    try:
        streams = [
            c.stream(MODEL, f"long {i}", max_tokens=2000, request_id=f"rw-{i}", timeout=60)
            for i in range(3)
        ]
        for s in streams:
            await s.__anext__()  # all three are generating
        scheduler.kill()
        replacement = ServiceProcess(
            "scheduler", url, logs, "--worker-timeout-s", "3", name="rw-scheduler-2"
        )
        start_all([replacement])
        try:
            await asyncio.sleep(1.0)  # it has taken the three back from the streams
            worker.kill()  # and now their worker dies: no heartbeat will say so
            t0 = time.monotonic()
            for s in streams:
                with pytest.raises(RequestError) as err:
                    async for _ in s:
                        pass
                assert (err.value.code, err.value.retryable) == ("worker_lost", True)
            assert time.monotonic() - t0 < 10  # the worker timeout, not the client's
        finally:
            replacement.stop()
    finally:
        await c.close()


async def test_an_end_a_frozen_worker_recorded_is_told_by_the_next_scheduler(fleet):
    # the worker records a request's end and freezes before sending it; the scheduler
    # that kept the end to tell is killed before it takes the worker for lost: its
    # successor knew the request only as ended, and the client waited out its timeout
    url, logs, scheduler, _ = fleet
    c = await Client.connect(url)
    worker_id = f"frozen.{uuid.uuid4().hex[:6]}"
    try:
        async with frozen_worker(c, worker_id, FROZEN_MODEL) as recorded:
            await asyncio.sleep(1.0)  # the scheduler hears of the worker
            stream, reading, end = await asked_and_recorded(c, FROZEN_MODEL, recorded)
            scheduler.kill()  # within its 3 s worker timeout: it told no one
            began = time.monotonic()
            replacement = ServiceProcess(
                "scheduler", url, logs, "--worker-timeout-s", "3", name="rf-scheduler-2"
            )
            start_all([replacement])
            try:
                await asyncio.wait_for(reading, 25)
                told_in = time.monotonic() - began
                with urllib.request.urlopen(f"{replacement.base}/metrics", timeout=5) as r:
                    metrics = r.read().decode()
            finally:
                replacement.stop()
        assert stream.outcome is not None and stream.outcome.request_id == end.request_id
        assert stream.outcome.finish_reason == "stop" and stream.outcome.worker_id == worker_id
        assert told_in < 20, told_in  # a start and the worker timeout, not the client's
        assert 'inferbus_scheduler_decisions_total{decision="retold_restored"} 1.0' in metrics
    finally:
        await c.close()
