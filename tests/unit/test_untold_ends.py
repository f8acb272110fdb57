"""A worker stopped (SIGSTOP, a hung host) after it recorded a request's end on
``ib.req.ended`` and before it sent the end to the reader: the scheduler took the
request for over and moved nothing, and only the stopped worker could send the end,
so the client waited out its timeout (CI's test_faults[worker-0-hang] once hung one
HTTP client after all 20 of its chunks). The scheduler keeps each recorded end with its
worker until a heartbeat says it was sent (gone from ``inflight`` and ``telling``), and
sends it itself when the worker is lost first."""

from __future__ import annotations

import msgspec

from inferbus.contracts import RequestFinished, RequestSubmitted, Usage, WorkerHeartbeat
from inferbus.services.scheduler.core import (
    RecordedEnd,
    Retell,
    SchedulerCore,
    SchedulerPolicy,
)

POLICY = SchedulerPolicy(worker_timeout_s=3.0, queue_timeout_s=10.0, max_attempts=3)


def req(rid: str) -> RequestSubmitted:
    return RequestSubmitted(request_id=rid, model="m", reply_to=f"ib.filter.t.{rid}", prompt="hi")


def hb(wid: str, inflight: tuple[str, ...] = (), telling: tuple[str, ...] = ()) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=wid, models=["m"], engine="sim", inflight=list(inflight), telling=list(telling)
    )


def finished(rid: str) -> RequestFinished:
    return RequestFinished(
        request_id=rid,
        finish_reason="length",
        usage=Usage(prompt_tokens=1, completion_tokens=20),
        chunks=20,
        worker_id="w1",
        attempt=1,
    )


def ended_on(worker: str, *later: tuple[float, WorkerHeartbeat]) -> SchedulerCore:
    """r1 served by ``worker`` (heartbeats every 1 s) and its end read at t=1, then the
    ``later`` heartbeats, each with when it is read."""
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb(worker), 0.0)
    core.on_accepted(req("r1"), 0.1)
    core.on_heartbeat(hb(worker, inflight=("r1",)), 0.5)
    core.on_ended("r1", 1.0, 1, finished("r1"))
    for t, beat in later:
        core.on_heartbeat(beat, t)
    return core


def retold(effects) -> list[Retell]:
    return [e for e in effects if isinstance(e, Retell)]


def test_a_worker_lost_before_it_said_the_end_was_sent_has_it_sent_for_it():
    core = ended_on("w1", (2.1, hb("w1", telling=("r1",))))  # recorded, not yet sent
    (again,) = retold(core.tick(10.0))  # w1 silent past its timeout
    assert again.request == req("r1")  # to the reader the worker was to tell
    assert again.end == finished("r1")
    assert not again.restored  # read live: counted as `retold`


def test_a_worker_lost_with_no_heartbeat_since_the_end_has_it_sent_for_it():
    core = ended_on("w1")  # its last word listed the request running
    assert [e.end.request_id for e in retold(core.tick(10.0))] == ["r1"]


def test_an_end_the_worker_said_it_sent_is_not_sent_again():
    core = ended_on("w1", (2.1, hb("w1")))  # neither running nor telling: sent
    assert retold(core.tick(10.0)) == []


def test_a_heartbeat_read_just_after_the_end_does_not_vouch_for_it():
    # sent before the request reached the worker (an engine error ends it at once),
    # read after its end: it lists the request nowhere, and says nothing of its end
    core = ended_on("w1", (1.05, hb("w1")))
    assert [e.end.request_id for e in retold(core.tick(10.0))] == ["r1"]


def test_a_worker_that_stops_in_order_with_the_end_still_to_send_has_it_sent():
    core = ended_on("w1")
    stopping = WorkerHeartbeat(
        worker_id="w1", models=["m"], engine="sim", state="stopped", telling=["r1"]
    )
    assert [e.end.request_id for e in retold(core.on_heartbeat(stopping, 2.0))] == ["r1"]


def test_another_workers_loss_sends_nothing():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w2"), 0.0)
    core.on_accepted(req("r1"), 0.1)
    (served_by,) = {f.worker_id for f in core.inflight.values()}
    other = "w2" if served_by == "w1" else "w1"
    core.on_ended("r1", 1.0, 1, finished("r1"))
    core.on_heartbeat(hb(served_by, telling=("r1",)), 9.0)  # the server alive and sending
    assert retold(core.tick(10.0)) == []  # only the other one was lost
    assert other not in core.workers


# A scheduler that read an end and kept it untold is gone (killed, or its partition
# handed to another instance) while the worker is frozen: its successor knew only
# "ended" from the record, so the frozen worker's loss told no one and the client
# waited out its timeout. The successor keeps each worker's latest recorded ends
# untold, as if read at its restore.


def recorded(rid: str, at: float, attempt: int = 1, worker: str = "w1") -> RecordedEnd:
    end = finished(rid)
    return RecordedEnd(msgspec.structs.replace(end, attempt=attempt, worker_id=worker), at)


def restored(
    ended: dict[str, RecordedEnd | list[RecordedEnd]], *assigned: tuple[str, str, int]
) -> SchedulerCore:
    core = SchedulerCore(POLICY)  # worker timeout 3 s
    on_record = {rid: e if isinstance(e, list) else [e] for rid, e in ended.items()}
    core.restore([(req(rid), wid, attempt) for rid, wid, attempt in assigned], on_record, 0.0)
    return core


def test_a_restored_scheduler_tells_a_silent_workers_latest_recorded_ends():
    ended = {
        "old": recorded("old", 1000.0),  # long before its last: told when it was recorded
        "r1": recorded("r1", 1995.0),
        "r2": recorded("r2", 2000.0),
    }
    core = restored(ended, ("old", "w1", 1), ("r1", "w1", 1), ("r2", "w1", 1))
    assert core.inflight == {}  # all ended: nothing is taken back to run
    again = retold(core.tick(3.5))
    assert sorted(e.end.request_id for e in again) == ["r1", "r2"]
    assert all(e.restored for e in again)  # counted apart: most were told long ago


def test_a_heartbeat_after_the_restore_vouches_for_the_ends_it_does_not_list():
    core = restored({"r1": recorded("r1", 2000.0)}, ("r1", "w1", 1))
    core.on_heartbeat(hb("w1"), 1.5)  # alive, and r1 neither running nor being told
    assert retold(core.tick(10.0)) == []  # lost later: r1 was sent


def test_a_heartbeat_still_telling_keeps_the_end_to_send():
    core = restored({"r1": recorded("r1", 2000.0)}, ("r1", "w1", 1))
    core.on_heartbeat(hb("w1", telling=("r1",)), 1.5)
    assert [e.end.request_id for e in retold(core.tick(10.0))] == ["r1"]


def test_the_end_of_the_latest_attempt_is_its_workers_to_tell():
    own = restored({"r1": recorded("r1", 2000.0, attempt=2, worker="w2")}, ("r1", "w2", 2))
    assert [e.end.request_id for e in retold(own.tick(10.0))] == ["r1"]


def test_the_scheduler_s_own_end_is_not_a_workers_to_tell():
    # attempt 0: a failure the scheduler recorded (and told, or it retells its own)
    core = restored({"r1": recorded("r1", 2000.0, attempt=0)}, ("r1", "w1", 1))
    assert retold(core.tick(10.0)) == []


def test_a_moved_streams_end_is_told_though_its_lost_attempts_was_recorded_first():
    # w1 was taken for lost and r1 moved to w2 (attempt 2); w1 woke and recorded its
    # attempt's end under its own id, first; w2 recorded its own and froze
    ends = [
        recorded("r1", 1990.0, attempt=1),
        recorded("r1", 2000.0, attempt=2, worker="w2"),
    ]
    core = restored({"r1": ends}, ("r1", "w1", 1), ("r1", "w2", 2))
    assert core.inflight == {}
    (again,) = retold(core.tick(10.0))
    assert again.end.attempt == 2 and again.end.worker_id == "w2"


def test_a_lost_attempts_late_end_alone_leaves_the_moved_stream_running():
    core = restored({"r1": recorded("r1", 2000.0, attempt=1)}, ("r1", "w1", 1), ("r1", "w2", 2))
    assert core.inflight["r1"].worker_id == "w2" and core.inflight["r1"].attempt == 2
    assert retold(core.tick(10.0)) == []  # w2's loss ends r1 (worker_lost), told
