"""A partitioned scheduler on a real bus: two instances share four partitions of the
fleet and its requests, every request is placed by exactly one of them, and when one is
killed the other takes its partitions over: nothing lost, nothing run twice."""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid

import pytest
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NoKeysError
from testkit.frozen import asked_and_recorded, frozen_worker
from testkit.procs import ServiceProcess, start_all

from inferbus.client import Client
from inferbus.contracts import (
    ENDED,
    ENDED_PARTITIONS,
    HEARTBEATS,
    SCHEDULER_LEASES,
    RequestAccepted,
    RequestSubmitted,
    SamplingParams,
    Terminal,
    WorkAssigned,
    WorkerHeartbeat,
    accepted_subject,
    worker_partition,
)
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import NatsServer

pytestmark = [pytest.mark.integration]

PARTITIONS = "4"
BIG, SMALL = "part-big", "part-small"
FROZEN = "part-frozen"


def scheduler(url: str, logs, name: str) -> ServiceProcess:
    return ServiceProcess(
        "scheduler",
        url,
        logs,
        "--scheduler-partitions",
        PARTITIONS,
        "--lease-ttl-s",
        "1.5",
        "--worker-timeout-s",
        "3",
        # the sim engine's queue is what the test loads, not what admission judges
        "--admit-by-slo",
        "false",
        name=name,
    )


def worker(url: str, logs, name: str, model: str) -> ServiceProcess:
    return ServiceProcess(
        "worker",
        url,
        logs,
        "--model",
        model,
        "--max-num-seqs",
        "4",
        "--sim-decode-s-per-step",
        "0.02",
        "--heartbeat-interval-s",
        "0.3",
        name=name,
    )


@pytest.fixture
def platform(tmp_path):
    """NATS, a sanitizer and two scheduler instances on four partitions, three workers
    of one model and one of another (each worker's partition: from its id)."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    url = server.url
    schedulers = [scheduler(url, tmp_path, f"sp-scheduler-{i}") for i in range(2)]
    procs = [
        ServiceProcess(
            "sanitizer", url, tmp_path, "--scheduler-partitions", PARTITIONS, name="sp-sanitizer"
        ),
        *schedulers,
        *(worker(url, tmp_path, f"sp-big-{i}", BIG) for i in range(3)),
        worker(url, tmp_path, "sp-small", SMALL),
    ]
    start_all(procs)
    yield url, tmp_path, schedulers
    for p in reversed(procs):
        p.stop()
    server.stop()


async def owners(c: Client) -> dict[int, str]:
    """Who holds each partition now (a key may be deleted as it is read: a release)."""
    kv = await c.nc.jetstream().key_value(SCHEDULER_LEASES)
    out: dict[int, str] = {}
    try:
        keys = await kv.keys()
    except NoKeysError:  # nats-py's watch may come back empty for a moment
        return out
    for key in keys:
        if key.startswith("part."):
            try:
                entry = await kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):  # deleted since keys(): a release
                continue
            if entry.value:
                out[int(key.split(".")[1])] = entry.value.decode()
    return out


async def shared_out(c: Client, timeout: float = 30.0) -> dict[int, str]:
    """The partitions once the two instances hold two each. An instance ready more than
    a lease's TTL after the other finds all four taken and is handed its share one at a
    time (a claim that lost a race is made again a moment later): on a loaded machine
    the first look may see four to none."""
    deadline = time.monotonic() + timeout
    while True:
        held = await owners(c)
        if sorted(collections.Counter(held.values()).values()) == [2, 2]:
            return held
        assert time.monotonic() < deadline, f"the partitions were not shared out: {held}"
        await asyncio.sleep(0.1)


async def watch(c: Client) -> tuple[collections.Counter[str], dict[str, list[str]]]:
    ended: collections.Counter[str] = collections.Counter()
    placed: dict[str, list[str]] = collections.defaultdict(list)

    async def on_ended(msg):
        ended[decode(msg.data, Terminal).request_id] += 1

    async def on_work(msg):
        w = decode(msg.data, WorkAssigned)
        placed[w.request.request_id].append(w.worker_id)

    await c.nc.subscribe(ENDED, cb=on_ended)
    await c.nc.subscribe(ENDED_PARTITIONS, cb=on_ended)  # the workers' own
    await c.nc.subscribe("ib.work.>", cb=on_work)
    await c.nc.flush()
    return ended, placed


async def until(check, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_two_instances_share_the_partitions_and_place_each_request_once(platform):
    url, _, _ = platform
    c = await Client.connect(url)
    try:
        held = await shared_out(c)
        assert sorted(held) == [0, 1, 2, 3]
        ended, placed = await watch(c)
        jobs = [
            c.generate(
                BIG if i % 4 else SMALL, f"job {i}", max_tokens=10, request_id=f"sp-{i}", timeout=60
            )
            for i in range(40)
        ]
        results = await asyncio.wait_for(asyncio.gather(*jobs), 90)
        assert [r.outcome.finish_reason for r in results] == ["length"] * 40
        ids = {f"sp-{i}" for i in range(40)}
        await until(lambda: ids <= set(ended))
        assert all(ended[k] == 1 for k in ids), ended
        assert all(len(placed[k]) == 1 for k in ids), placed
        # both models' requests ran on workers of their own model
        assert all(("small" in placed[f"sp-{i}"][0]) == (i % 4 == 0) for i in range(40))
    finally:
        await c.close()


async def test_killing_an_instance_hands_its_partitions_over(platform):
    url, _, schedulers = platform
    c = await Client.connect(url)
    try:
        ended, placed = await watch(c)
        before = await shared_out(c)
        # 24 requests of ~1 s on 16 slots: some run, some wait, when the kill comes
        jobs = [
            asyncio.create_task(
                c.generate(
                    BIG if i % 4 else SMALL,
                    f"job {i}",
                    max_tokens=50,
                    request_id=f"sk-{i}",
                    timeout=60,
                )
            )
            for i in range(24)
        ]
        await asyncio.sleep(0.8)
        victim = schedulers[0]
        victim.kill()  # SIGKILL: its leases lapse, nothing was handed back
        killed_at = time.monotonic()
        orphaned = {p for p, owner in before.items() if owner == victim.name}
        assert orphaned  # it held its share

        async def taken_over() -> float:
            while set((await owners(c)).values()) != {schedulers[1].name}:
                await asyncio.sleep(0.05)
            return time.monotonic() - killed_at

        takeover = asyncio.create_task(taken_over())
        # new requests keep coming, and are served
        later = []
        for i in range(10):
            later.append(
                asyncio.create_task(
                    c.generate(BIG, f"later {i}", max_tokens=5, request_id=f"sl-{i}", timeout=60)
                )
            )
            await asyncio.sleep(0.2)
        assert await asyncio.wait_for(takeover, 10) < 5.0  # the bound
        results = await asyncio.wait_for(asyncio.gather(*jobs, *later), 90)
        assert all(r.outcome.finish_reason == "length" for r in results)
        assert set(await owners(c)) == {0, 1, 2, 3}
        log = schedulers[1].log_path.read_text()
        taken = {p for p in orphaned if f'"partition": {p}, "event": "partition taken"' in log}
        assert taken == orphaned
        ids = {f"sk-{i}" for i in range(24)} | {f"sl-{i}" for i in range(10)}
        await until(lambda: ids <= set(ended))
        assert all(ended[k] == 1 for k in ids), ended  # one terminal event each
        assert all(len(placed[k]) == 1 for k in ids), placed  # never run twice
    finally:
        await c.close()


def test_worker_partitions_come_from_the_id_alone():
    ids = [f"w-{i}.n{i * 7}" for i in range(400)]
    parts = [worker_partition(w, 4) for w in ids]
    assert parts == [worker_partition(w, 4) for w in ids]
    assert set(parts) == {0, 1, 2, 3}
    assert all(worker_partition(w, 1) == 0 for w in ids)


async def test_a_request_in_a_partition_without_its_model_is_handed_to_one_with_it(platform):
    """A request accepted onto a partition that has no worker for its model (a stale
    report, a sanitizer's fallback) is handed after a second to a partition whose
    workers serve it, and runs there once."""
    url, _, _ = platform
    c = await Client.connect(url)
    try:
        ended, placed = await watch(c)
        js = c.nc.jetstream()
        small = [
            w
            for w in (await heartbeats(c))
            if w.startswith("sp-small")  # the one worker of SMALL
        ]
        assert len(small) == 1
        home = worker_partition(small[0], int(PARTITIONS))
        stray = (home + 1) % int(PARTITIONS)
        inbox = c.nc.new_inbox()
        replies = await c.nc.subscribe(inbox)
        request = RequestSubmitted(
            request_id="sp-handoff",
            model=SMALL,
            reply_to=inbox,
            prompt="hand me on",
            sampling=SamplingParams(max_tokens=5),
            created_at=time.time(),
        )
        await js.publish(
            accepted_subject(stray),
            encode(RequestAccepted(request=request, accepted_at=time.time())),
        )
        await until(lambda: ended["sp-handoff"] >= 1, timeout=20)
        assert ended["sp-handoff"] == 1
        assert placed["sp-handoff"] == [small[0]]  # run once, on SMALL's worker
        await replies.unsubscribe()
    finally:
        await c.close()


async def heartbeats(c: Client) -> set[str]:
    """The workers heard from in a second and a half."""
    seen: set[str] = set()

    async def on_hb(msg):
        seen.add(decode(msg.data, WorkerHeartbeat).worker_id)

    sub = await c.nc.subscribe(HEARTBEATS, cb=on_hb)
    await asyncio.sleep(1.5)
    await sub.unsubscribe()
    return seen


async def test_an_instance_with_another_partition_count_is_refused(platform):
    """Its count would map workers to partitions otherwise: it exits with the reason,
    and the running instances keep their partitions and serve."""
    url, logs, schedulers = platform
    odd = ServiceProcess(
        "scheduler",
        url,
        logs,
        "--scheduler-partitions",
        "8",
        "--lease-ttl-s",
        "1.5",
        name="sp-scheduler-odd",
    ).start()
    c = await Client.connect(url)
    try:
        held = await shared_out(c)
        deadline = time.monotonic() + 20
        while odd.proc is not None and odd.proc.poll() is None:
            assert time.monotonic() < deadline, "the odd instance was not refused"
            await asyncio.sleep(0.2)
        assert odd.proc is not None and odd.proc.returncode != 0
        assert "scheduler_partitions is 8 here" in odd.logs()
        assert await owners(c) == held
        assert set(held.values()) == {s.name for s in schedulers}
        result = await c.generate(BIG, "still served", max_tokens=5, timeout=30)
        assert result.outcome.finish_reason == "length"
    finally:
        await c.close()
        odd.stop()


async def test_an_instance_added_under_load_is_given_partitions(platform):
    """A third instance joins two that hold all four partitions while requests run: it
    is given a partition within seconds (released by one of the two, its requests let
    go of there and taken back by the newcomer), and every request ends once, placed
    once."""
    url, logs, schedulers = platform
    c = await Client.connect(url)
    added = scheduler(url, logs, "sp-scheduler-2")
    try:
        await shared_out(c)  # two that hold all four
        ended, placed = await watch(c)
        jobs = [
            asyncio.create_task(
                c.generate(
                    BIG if i % 4 else SMALL,
                    f"job {i}",
                    max_tokens=150,  # 3 s: running still when the partition moves
                    request_id=f"sa-{i}",
                    timeout=60,
                )
            )
            for i in range(24)
        ]
        await asyncio.sleep(0.5)
        joined_at = time.monotonic()
        added.start()
        while added.name not in (await owners(c)).values():
            assert time.monotonic() - joined_at < 15, "the added instance got no partition"
            assert added.proc is not None and added.proc.poll() is None, added.logs()
            await asyncio.sleep(0.1)
        given_s = time.monotonic() - joined_at
        later = [
            asyncio.create_task(
                c.generate(BIG, f"later {i}", max_tokens=5, request_id=f"sb-{i}", timeout=60)
            )
            for i in range(10)
        ]
        results = await asyncio.wait_for(asyncio.gather(*jobs, *later), 90)
        assert all(r.outcome.finish_reason == "length" for r in results)
        held = await owners(c)
        assert sorted(held) == [0, 1, 2, 3]
        assert sorted(collections.Counter(held.values()).values()) == [1, 1, 2]
        ids = {f"sa-{i}" for i in range(24)} | {f"sb-{i}" for i in range(10)}
        await until(lambda: ids <= set(ended))
        assert all(ended[k] == 1 for k in ids), ended  # one terminal event each
        assert all(len(placed[k]) == 1 for k in ids), placed  # never run twice
        released = "".join(s.log_path.read_text() for s in schedulers)
        assert '"event": "partition released"' in released
        # what ran on the partition's workers when it moved (none when the partition
        # has no worker: four workers hash into four partitions unevenly)
        let_go = [
            json.loads(line)
            for s in schedulers
            for line in s.log_path.read_text().splitlines()
            if '"event": "partition let go"' in line
        ]
        print(f"let go: {[(x['partition'], x['workers'], x['requests']) for x in let_go]}")
        print(f"given a partition {given_s:.1f} s after its start")
    finally:
        await c.close()
        added.stop()


async def test_a_frozen_workers_recorded_end_is_told_after_its_partition_is_handed_over(
    platform,
):
    # the worker records a request's end and freezes before sending it; the instance
    # booking it, which kept the end to tell, is killed before it takes the worker for
    # lost: the instance taking its partition over restores the end as untold
    url, _, schedulers = platform
    c = await Client.connect(url)
    try:
        held = await shared_out(c)
        victim = schedulers[0]
        theirs = {p for p, owner in held.items() if owner == victim.name}
        worker_id = next(
            wid
            for wid in (f"sp-frozen-{uuid.uuid4().hex[:6]}" for _ in range(1000))
            if worker_partition(wid, int(PARTITIONS)) in theirs
        )
        async with frozen_worker(c, worker_id, FROZEN) as recorded:
            await asyncio.sleep(1.0)  # its instance hears of the worker
            stream, reading, end = await asked_and_recorded(c, FROZEN, recorded)
            victim.kill()  # within its 3 s worker timeout: it told no one
            began = time.monotonic()
            await asyncio.wait_for(reading, 25)
            told_in = time.monotonic() - began
        assert stream.outcome is not None and stream.outcome.request_id == end.request_id
        assert stream.outcome.finish_reason == "stop" and stream.outcome.worker_id == worker_id
        assert told_in < 15, told_in  # a lease, a restore and the worker timeout
        log = schedulers[1].log_path.read_text()
        assert '"event": "partition taken"' in log
    finally:
        await c.close()
