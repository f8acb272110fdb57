"""KV events in batches on a real nats-server and scheduler: applied live, replayed
after a restart, and a batch that names another worker inside dead-lettered."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from testkit.deadletters import letter_about
from testkit.procs import ServiceProcess, start_all

from inferbus.contracts import (
    KvBlocksRemoved,
    KvBlocksStored,
    KvEventBatch,
    WorkerHeartbeat,
    kv_subject,
    status_subject,
)
from inferbus.shared.bus import round_trip
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import ensure_streams


async def _routing(nc, want: int, timeout: float = 30.0) -> dict:
    """The scheduler's routing status once it holds ``want`` blocks."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await nc.request(status_subject("scheduler"), b"", timeout=2)
            routing = json.loads(reply.data)["routing"]
            if routing["kv_blocks"] == want or time.monotonic() > deadline:
                return routing
        except (TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


@pytest.fixture
async def bus(tmp_path):
    """A nats-server, a connection to it, and the platform processes a test starts
    there (stopped after it, the last started first)."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    nc = await nats.connect(server.url)
    procs: list[ServiceProcess] = []
    yield server, nc, procs
    await nc.close()
    for proc in reversed(procs):
        proc.stop()
    server.stop()


def _scheduler(server: NatsServer, tmp_path, name: str) -> ServiceProcess:
    # the tests' fake workers never heartbeat: not dropped as gone while a test runs
    return ServiceProcess("scheduler", server.url, tmp_path, "--worker-timeout-s", "600", name=name)


async def test_a_batch_of_kv_events_is_applied_replayed_and_checked(bus, tmp_path):
    server, nc, procs = bus
    scheduler = _scheduler(server, tmp_path, "kvb-scheduler")
    procs.append(scheduler)
    start_all(procs)
    w = "worker-0.kvb"
    batch = KvEventBatch(
        worker_id=w,
        events=[
            KvBlocksStored(worker_id=w, block_hashes=[1, 2, 3, 4], block_size=16, seq=1),
            KvBlocksRemoved(worker_id=w, block_hashes=[4], seq=2),
            KvBlocksStored(worker_id=w, block_hashes=[9], block_size=16, seq=3),
        ],
    )
    await nc.publish(kv_subject(w), encode(batch))
    routing = await _routing(nc, 4)
    assert (routing["kv_blocks"], routing["kv_event_gaps"]) == (4, 0)

    # a worker may publish on its own subject only: inside, another's events are
    # not taken on its word
    forged = KvEventBatch(
        worker_id=w,
        events=[KvBlocksStored(worker_id="worker-1.victim", block_hashes=[77], seq=1)],
    )
    await nc.publish(kv_subject(w), encode(forged))
    letter = await letter_about(nc, "scheduler", "worker-1.victim", timeout=30)
    assert "in a batch of" in letter.reason
    assert (await _routing(nc, 4))["kv_blocks"] == 4

    # a restarted scheduler replays IB_KV, batches and all (the forged one again
    # dead-lettered, not applied)
    scheduler.stop()
    start_all([scheduler])
    routing = await _routing(nc, 4)
    assert (routing["kv_blocks"], routing["kv_event_gaps"]) == (4, 0)


async def test_a_restart_loads_the_stored_index_and_reads_on_from_where_it_was(bus, tmp_path):
    """The index a stopping scheduler stored is what the next one starts from: with
    IB_KV emptied in between it still knows every block, and the worker's next event
    follows on without a gap."""
    server, nc, procs = bus
    scheduler = _scheduler(server, tmp_path, "kvs-scheduler")
    procs.append(scheduler)
    start_all(procs)
    w = "worker-0.kvs"
    first = KvEventBatch(
        worker_id=w,
        events=[
            KvBlocksStored(worker_id=w, block_hashes=[1, 2, 3], block_size=16, seq=1),
            KvBlocksStored(worker_id=w, block_hashes=[4], medium="CPU", seq=2),
        ],
    )
    await nc.publish(kv_subject(w), encode(first))
    assert (await _routing(nc, 3))["kv_blocks"] == 3
    scheduler.stop()  # its drain stores the index
    await nc.jetstream().purge_stream("IB_KV")
    start_all([scheduler])
    assert (await _routing(nc, 3))["kv_blocks"] == 3  # not from IB_KV: it is empty
    nxt = KvEventBatch(
        worker_id=w,
        events=[KvBlocksStored(worker_id=w, block_hashes=[5], block_size=16, seq=3)],
    )
    await nc.publish(kv_subject(w), encode(nxt))
    routing = await _routing(nc, 4)
    assert (routing["kv_blocks"], routing["kv_event_gaps"]) == (4, 0)
    log = (tmp_path / "kvs-scheduler.log").read_text()
    assert '"kv index loaded"' in log or "kv index loaded" in log


async def test_a_stored_index_older_than_a_remade_ib_kv_is_not_read_on_from(bus, tmp_path):
    """IB_KV deleted and made again numbers from 1: the stored position would skip its
    events; the index is read from IB_KV's start instead."""
    server, nc, procs = bus
    scheduler = _scheduler(server, tmp_path, "kvn-scheduler")
    procs.append(scheduler)
    start_all(procs)
    w = "worker-0.kvn"
    for seq in (1, 2, 3):
        ev = KvBlocksStored(worker_id=w, block_hashes=[seq], block_size=16, seq=seq)
        await nc.publish(kv_subject(w), encode(KvEventBatch(worker_id=w, events=[ev])))
    assert (await _routing(nc, 3))["kv_blocks"] == 3
    scheduler.stop()  # stored as of IB_KV's message 3
    js = nc.jetstream(timeout=30)
    await js.delete_stream("IB_KV")
    await ensure_streams(js)
    w2 = "worker-1.kvn"
    ev = KvBlocksStored(worker_id=w2, block_hashes=[50], block_size=16, seq=1)
    await nc.publish(kv_subject(w2), encode(KvEventBatch(worker_id=w2, events=[ev])))
    await round_trip(nc)
    start_all([scheduler])
    routing = await _routing(nc, 1)
    assert routing["kv_blocks"] == 1  # the new stream's event, not the old index
    log = (tmp_path / "kvn-scheduler.log").read_text()
    assert "stored KV index ignored" in log


async def test_a_worker_whose_events_were_missed_sends_its_whole_state_again(bus, tmp_path):
    """A skipped event number on a real worker's subject: the scheduler forgets what
    it believed of that worker, asks it, and the worker (sim engine: it holds nothing)
    answers with its state, numbered on past what the scheduler saw."""
    server, nc, procs = bus
    procs += [
        _scheduler(server, tmp_path, "kvr-scheduler"),
        ServiceProcess("worker", server.url, tmp_path, "--model", "kvr-model", name="kvr-worker"),
    ]
    start_all(procs)
    beats = await nc.subscribe("ib.hb.>")
    wid = decode((await beats.next_msg(timeout=30)).data, WorkerHeartbeat).worker_id
    await beats.unsubscribe()
    answer = await nc.subscribe(kv_subject(wid))
    # events in the worker's name (an open bus lets the test publish them), the
    # second numbered 3: event 2 was lost on the way
    for seq, blocks in ((1, [1, 2]), (3, [3])):
        ev = KvBlocksStored(worker_id=wid, block_hashes=blocks, block_size=16, seq=seq)
        await nc.publish(kv_subject(wid), encode(KvEventBatch(worker_id=wid, events=[ev])))
    for _ in range(3):  # the two published here come back first
        reply = decode((await answer.next_msg(timeout=30)).data, KvEventBatch)
    assert [type(e).__name__ for e in reply.events] == ["KvAllCleared"]
    assert reply.events[0].seq == 4  # on past the 3 the scheduler saw
    routing = await _routing(nc, 0)
    assert (routing["kv_blocks"], routing["kv_event_gaps"]) == (0, 1)
