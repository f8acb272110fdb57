"""SchedulerCore as a pure state machine: time is passed in, effects come out."""

from __future__ import annotations

import itertools
from collections import Counter

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inferbus.contracts import (
    RequestFinished,
    RequestSubmitted,
    SamplingParams,
    Usage,
    WorkerHeartbeat,
)
from inferbus.services.scheduler.core import (
    Assign,
    Cancel,
    Fail,
    RecordedEnd,
    Refuse,
    SchedulerCore,
    SchedulerPolicy,
    Supersede,
)

POLICY = SchedulerPolicy(worker_timeout_s=3.0, queue_timeout_s=10.0, max_attempts=3)


def req(rid: str, model: str = "m") -> RequestSubmitted:
    return RequestSubmitted(
        request_id=rid, model=model, reply_to=f"ib.reply.t.{rid}", prompt="hello"
    )


def hb(
    wid: str, models: tuple[str, ...] = ("m",), *, state: str = "ready", max_num_seqs: int = 8
) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=wid, models=list(models), engine="sim", state=state, max_num_seqs=max_num_seqs
    )


def assigns(effects) -> list[tuple[str, str, int]]:
    return [
        (e.request.request_id, e.worker_id, e.attempt) for e in effects if isinstance(e, Assign)
    ]


def decisions(effects) -> list:
    """What becomes of requests, without the stops sent to presumed-lost workers."""
    return [e for e in effects if not isinstance(e, Supersede)]


def only(effects, kind):
    assert all(isinstance(e, kind) for e in effects), effects
    return effects


# -- placement ----------------------------------------------------------------------------


def test_single_request_goes_to_the_only_ready_worker():
    core = SchedulerCore(POLICY)
    assert core.on_heartbeat(hb("w1"), 0.0) == []
    effects = core.on_accepted(req("r1"), 0.1)
    assert [(e.worker_id, e.request, e.attempt, e.lane) for e in effects] == [
        ("w1", req("r1"), 1, "short")
    ]
    assert isinstance(effects[0], Assign) and effects[0].queued_s == 0.0
    assert not core.is_queued("r1")


def test_round_robin_across_two_workers_of_the_same_model():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w2"), 0.0)
    placed = []
    for i in range(6):
        placed += assigns(core.on_accepted(req(f"r{i}"), 1.0 + i))
    workers = [w for _, w, _ in placed]
    assert len(placed) == 6
    # strictly alternating, and both used equally
    assert all(a != b for a, b in itertools.pairwise(workers)), workers
    assert Counter(workers) == {"w1": 3, "w2": 3}


def test_round_robin_within_one_dispatch_of_a_backlog():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    for i in range(4):
        core.on_accepted(req(f"r{i}"), 0.0)
    assert {f.worker_id for f in core.inflight.values()} == {"w1"}
    core.on_heartbeat(hb("w2"), 2.0)
    core.on_heartbeat(hb("w3"), 2.0)
    effects = core.tick(3.5)  # w1 lost: its four requests are placed in one dispatch
    placed = assigns(effects)
    assert sorted(r for r, _, _ in placed) == ["r0", "r1", "r2", "r3"]
    workers = [w for _, w, _ in placed]
    assert all(a != b for a, b in itertools.pairwise(workers)), workers
    assert Counter(workers) == {"w2": 2, "w3": 2}
    assert all(attempt == 2 for _, _, attempt in placed)


def test_round_robin_skips_a_full_worker():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.0)
    core.on_heartbeat(hb("w2", max_num_seqs=8), 0.0)
    placed = []
    for i in range(5):
        placed += assigns(core.on_accepted(req(f"r{i}"), 0.0))
    assert Counter(w for _, w, _ in placed) == {"w1": 1, "w2": 4}


def test_worker_of_another_model_gets_nothing():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", models=("other",)), 0.0)
    assert core.on_accepted(req("r1", model="m"), 0.0) == []
    assert core.is_queued("r1")
    effects = core.on_heartbeat(hb("w2", models=("m",)), 1.0)
    assert [(e.worker_id, e.request, e.attempt) for e in effects] == [("w2", req("r1"), 1)]
    assert effects[0].queued_s == 1.0  # waited from 0 to 1 s for a worker of its model


def test_full_worker_gets_no_more_and_queued_work_runs_when_a_request_ends():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=2), 0.0)
    assert assigns(core.on_accepted(req("r1"), 0.0)) == [("r1", "w1", 1)]
    assert assigns(core.on_accepted(req("r2"), 0.0)) == [("r2", "w1", 1)]
    assert core.on_accepted(req("r3"), 0.0) == []
    assert core.on_accepted(req("r4"), 0.0) == []
    assert core.is_queued("r3") and core.is_queued("r4")
    # a heartbeat or tick does not overfill it
    assert core.on_heartbeat(hb("w1", max_num_seqs=2), 1.0) == []
    assert core.tick(1.5) == []
    # one ends: exactly one queued request, the oldest, takes its slot
    assert assigns(core.on_ended("r1", 2.0)) == [("r3", "w1", 1)]
    assert core.is_queued("r4")
    assert assigns(core.on_ended("r2", 2.5)) == [("r4", "w1", 1)]
    assert core.status()["workers"]["w1"]["assigned"] == 2


def test_draining_worker_gets_nothing():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w2"), 0.0)
    core.on_heartbeat(hb("w1", state="draining"), 0.5)
    placed = []
    for i in range(5):
        placed += assigns(core.on_accepted(req(f"r{i}"), 1.0))
    assert {w for _, w, _ in placed} == {"w2"}
    assert len(placed) == 5
    # with the only other worker draining too, new work waits
    core.on_heartbeat(hb("w2", state="draining"), 1.5)
    assert core.on_accepted(req("late"), 2.0) == []
    assert core.is_queued("late")
    assert core.tick(2.5) == []
    # it counts as no live worker for the model
    assert core.live_models() == {"m": 0}


def test_starting_worker_gets_nothing_until_ready():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", state="starting"), 0.0)
    assert core.on_accepted(req("r1"), 0.0) == []
    assert assigns(core.on_heartbeat(hb("w1"), 1.0)) == [("r1", "w1", 1)]


# -- lost workers --------------------------------------------------------------------------


def test_silent_worker_not_started_work_is_requeued_at_front_and_reassigned():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=2), 0.0)
    assert assigns(core.on_accepted(req("a"), 0.0)) == [("a", "w1", 1)]
    assert assigns(core.on_accepted(req("b"), 0.1)) == [("b", "w1", 1)]
    assert core.on_accepted(req("c"), 0.2) == []  # queued behind, w1 full
    # w1 stops beating; w2 keeps going
    core.on_heartbeat(hb("w2", max_num_seqs=1), 1.0)  # w2 takes c
    assert core.inflight["c"].worker_id == "w2"
    core.on_accepted(req("d"), 1.1)  # queued: both full
    core.on_heartbeat(hb("w2", max_num_seqs=1), 2.5)
    # not yet timed out: 3.0 - 0.0 == worker_timeout_s is not "more than"
    assert core.tick(3.0) == []
    core.on_heartbeat(hb("w2", max_num_seqs=1), 3.05)
    effects = core.tick(3.1)
    assert not any(isinstance(e, Fail) for e in effects)
    assert "w1" not in core.status()["workers"]
    # a and b went back to the front, ahead of d, with attempt 2; oldest first
    order = [item.request.request_id for item in core.queues["m"]]
    assert order == ["a", "b", "d"]
    assert [i.attempt for i in core.queues["m"]] == [2, 2, 1]
    # when w2 frees a slot, a (attempt 2) goes first
    assert assigns(core.on_ended("c", 3.2)) == [("a", "w2", 2)]
    assert assigns(core.on_ended("a", 3.3)) == [("b", "w2", 2)]
    assert assigns(core.on_ended("b", 3.4)) == [("d", "w2", 1)]


def test_a_superseded_attempts_end_frees_nothing_of_the_newer_one():
    # attempt 1's worker was presumed lost but finished after all: its end must not free
    # attempt 2's slot while attempt 2 streams (its readers follow the newest attempt)
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.0)
    assert assigns(core.on_accepted(req("a"), 0.0)) == [("a", "w1", 1)]
    core.on_heartbeat(hb("w2", max_num_seqs=1), 3.05)
    assert assigns(core.tick(3.1)) == [("a", "w2", 2)]
    core.on_accepted(req("b"), 3.2)  # queued: w2 is full
    assert core.on_ended("a", 3.3, attempt=1) == []
    assert core.inflight["a"].attempt == 2
    assert assigns(core.on_ended("a", 3.4, attempt=2)) == [("b", "w2", 1)]
    # an end naming no attempt (the scheduler's own, a rejection) still ends it
    core.on_heartbeat(hb("w2", max_num_seqs=1), 3.5)
    assert core.on_ended("b", 3.6, attempt=0) == [] and "b" not in core.inflight


def test_requeued_work_keeps_fifo_order_when_assigned_in_one_dispatch():
    # regression: re-queued work was ordered by assigned_at, equal for everything placed
    # in one dispatch, so the order came from iterating a set (varied with PYTHONHASHSEED)
    core = SchedulerCore(POLICY)
    ids = [f"r{i}" for i in range(8)]
    for rid in ids:  # queued while no worker is there
        core.on_accepted(req(rid), 0.0)
    core.on_heartbeat(hb("w1"), 1.0)  # takes all eight in one dispatch, same assigned_at
    assert sorted(core.inflight) == ids
    effects = core.tick(4.5)  # w1 lost, nobody else: all go back to the queue
    assert decisions(effects) == []
    # and each attempt given up on is stopped, should w1 only have stalled
    assert {(e.request.request_id, e.worker_id, e.attempt) for e in effects} == {
        (rid, "w1", 1) for rid in ids
    }
    assert [i.request.request_id for i in core.queues["m"]] == ids


def test_silent_worker_work_is_reassigned_at_once_when_another_has_room():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req("a"), 0.0)
    assert core.inflight["a"].worker_id == "w1"
    core.on_heartbeat(hb("w2"), 2.0)
    effects = decisions(core.tick(3.5))
    assert [(e.worker_id, e.request, e.attempt) for e in effects] == [("w2", req("a"), 2)]


def test_silent_worker_started_work_fails_worker_lost_retryable():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req("started"), 0.0)
    core.on_accepted(req("idle"), 0.0)
    core.on_started("started", 1)
    core.on_heartbeat(hb("w2"), 3.0)
    effects = core.tick(3.5)
    fails = [e for e in effects if isinstance(e, Fail)]
    assert len(fails) == 1
    assert fails[0].request.request_id == "started"
    assert fails[0].code == "worker_lost"
    assert fails[0].retryable is True
    # the not-started one is reassigned, the started one is not
    assert assigns(effects) == [("idle", "w2", 2)]
    assert fails[0].served_model == "m"  # the name it ran under


def test_a_lost_canary_workers_failures_name_the_canary_version():
    # a rollout judges the new version on its errors: losing its worker is one
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", ("m@v2",)), 0.0)
    core.set_canary("m", {"m@v2": 1.0})
    core.on_accepted(req("r"), 0.0)
    core.on_started("r", 1)
    core.on_heartbeat(hb("w2"), 3.0)
    (fail,) = [e for e in core.tick(3.5) if isinstance(e, Fail)]
    assert fail.code == "worker_lost" and fail.served_model == "m@v2"
    assert "started" not in core.inflight and not core.is_queued("started")


def test_started_with_a_stale_attempt_is_ignored():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req("a"), 0.0)
    core.tick(3.5)  # w1 lost, a re-queued (attempt 2), no worker
    core.on_heartbeat(hb("w2"), 4.0)
    assert core.inflight["a"].attempt == 2
    core.on_started("a", 1)  # a late message from the lost worker's attempt
    effects = core.tick(7.5)  # w2 lost too
    assert not any(isinstance(e, Fail) for e in effects)
    assert core.is_queued("a")
    assert next(iter(core.queues["m"])).attempt == 3


def test_max_attempts_exhausted_fails():
    core = SchedulerCore(POLICY)  # max_attempts=3
    now = 0.0
    core.on_accepted(req("a"), now)
    for attempt, wid in enumerate(("w1", "w2", "w3"), start=1):
        effects = core.on_heartbeat(hb(wid), now)
        assert assigns(effects) == [("a", wid, attempt)]
        now += 3.5
        effects = decisions(core.tick(now))  # the worker went silent
        if attempt < 3:
            assert effects == []
            assert core.is_queued("a")
    fails = only(effects, Fail)
    assert len(fails) == 1
    assert fails[0].request.request_id == "a"
    assert fails[0].code == "worker_lost"
    assert fails[0].retryable is True
    assert not core.is_queued("a") and "a" not in core.inflight
    # and it is not assigned to a worker that appears later
    assert core.on_heartbeat(hb("w4"), now + 0.1) == []


def test_stopped_heartbeat_removes_worker_immediately():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w2", max_num_seqs=1), 0.0)
    core.on_accepted(req("x"), 0.0)
    core.on_accepted(req("y"), 0.0)
    core.on_accepted(req("z"), 0.0)
    on_w1 = sorted(r for r, f in core.inflight.items() if f.worker_id == "w1")
    assert on_w1  # w1 holds something
    core.on_started(on_w1[0], 1)
    effects = core.on_heartbeat(hb("w1", state="stopped"), 0.1)  # well within the timeout
    assert "w1" not in core.status()["workers"]
    fails = [e for e in effects if isinstance(e, Fail)]
    assert [f.request.request_id for f in fails] == [on_w1[0]]
    assert fails[0].code == "worker_lost"
    # w1 never gets anything new
    for i in range(3):
        for e in core.on_accepted(req(f"n{i}"), 0.2):
            assert e.worker_id != "w1"


def test_failed_heartbeat_removes_worker_too():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w1", state="failed"), 0.1)
    assert core.status()["workers"] == {}
    assert core.on_accepted(req("a"), 0.2) == []


def test_stopped_heartbeat_of_unknown_worker_is_harmless():
    core = SchedulerCore(POLICY)
    assert core.on_heartbeat(hb("ghost", state="stopped"), 0.0) == []
    assert core.status()["workers"] == {}


# -- queue timeout -------------------------------------------------------------------------


def test_queue_timeout_no_worker_serves_the_model():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", models=("other",)), 0.0)
    core.on_accepted(req("a"), 0.0)
    assert core.tick(9.0) == []
    core.on_heartbeat(hb("w1", models=("other",)), 9.0)
    assert core.tick(10.0) == []  # exactly queue_timeout_s is not more than it
    core.on_heartbeat(hb("w1", models=("other",)), 10.0)
    effects = core.tick(10.5)
    assert len(effects) == 1
    (fail,) = only(effects, Fail)
    assert fail.request.request_id == "a"
    assert fail.code == "no_worker"
    assert fail.retryable is True
    assert not core.is_queued("a")
    assert core.tick(30.0) == []  # failed once only


def test_queue_timeout_when_workers_serve_the_model_but_are_busy():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.0)
    core.on_accepted(req("busy"), 0.0)
    core.on_accepted(req("a"), 1.0)
    core.on_accepted(req("b"), 5.0)
    for t in (2.0, 4.0, 6.0, 8.0, 10.0):
        core.on_heartbeat(hb("w1", max_num_seqs=1), t)
        assert core.tick(t) == []
    core.on_heartbeat(hb("w1", max_num_seqs=1), 11.5)
    effects = core.tick(11.5)
    (fail,) = only(effects, Fail)
    assert fail.request.request_id == "a"
    assert fail.code == "queue_timeout"
    assert core.is_queued("b")  # not waited long enough yet
    # "busy" is running, untouched
    assert "busy" in core.inflight


def test_draining_workers_count_as_no_worker_for_the_timeout():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", state="draining"), 0.0)
    core.on_accepted(req("a"), 0.0)
    core.on_heartbeat(hb("w1", state="draining"), 10.0)
    (fail,) = only(core.tick(10.5), Fail)
    assert fail.code == "no_worker"


def test_queue_timeout_is_not_blocked_by_a_requeued_request_at_the_front():
    # regression: tick() once looked at the head of each queue only, and work re-queued
    # at the front after a worker loss (since=now) hid older requests behind it
    core = SchedulerCore(POLICY)  # queue_timeout_s=10, worker_timeout_s=3
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.0)
    core.on_accepted(req("running"), 0.0)  # on w1
    core.on_accepted(req("old"), 0.0)  # queued, w1 is full
    effects = core.tick(5.0)  # w1 silent: "running" re-queued in front
    assert decisions(effects) == []
    assert [i.request.request_id for i in core.queues["m"]] == ["running", "old"]
    # "old" has now waited 11 s > queue_timeout_s and must fail
    effects = core.tick(11.0)
    assert [e.request.request_id for e in effects if isinstance(e, Fail)] == ["old"]


# -- idempotency and cancellation ---------------------------------------------------------


def test_duplicate_accepted_while_queued_inflight_or_ended_yields_nothing():
    core = SchedulerCore(POLICY)
    assert core.on_accepted(req("q"), 0.0) == []
    assert core.on_accepted(req("q"), 0.1) == []  # queued duplicate
    assert len(core.queues["m"]) == 1
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.2)
    assert core.inflight["q"].worker_id == "w1"
    assert core.on_accepted(req("q"), 0.3) == []  # in-flight duplicate
    core.on_heartbeat(hb("w2"), 0.3)  # room elsewhere: still nothing
    assert core.on_accepted(req("q"), 0.4) == []
    assert core.status()["workers"]["w2"]["assigned"] == 0
    core.on_ended("q", 0.5)
    assert core.on_accepted(req("q"), 0.6) == []  # after it ended
    assert "q" not in core.inflight and not core.is_queued("q")
    assert core.tick(0.7) == []


def test_ended_request_that_never_was_seen_is_not_run():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    assert core.on_ended("early", 0.0) == []  # the ended record overtook the accepted one
    # never run; its sender (who already has a terminal event) hears duplicate_request
    assert [type(e) for e in core.on_accepted(req("early"), 0.1)] == [Refuse]
    assert core.on_accepted(req("early"), 0.1, redelivered=True) == []
    assert not core.is_queued("early") and "early" not in core.inflight


def test_ended_while_queued_removes_it():
    core = SchedulerCore(POLICY)
    core.on_accepted(req("a"), 0.0)
    assert core.on_ended("a", 0.1) == []
    assert not core.is_queued("a")
    assert core.on_heartbeat(hb("w1"), 0.2) == []


def test_cancel_of_queued_request_cancels_and_never_assigns():
    core = SchedulerCore(POLICY)
    core.on_accepted(req("a"), 0.0)
    core.on_accepted(req("b"), 0.0)
    effects = core.on_cancel("a", "client went away")
    assert effects == [Cancel(request=req("a"), reason="client went away")]
    assert not core.is_queued("a")
    effects = core.on_heartbeat(hb("w1"), 0.5)
    assert assigns(effects) == [("b", "w1", 1)]
    assert decisions(core.tick(100.0)) == []
    # cancelling again does nothing
    assert core.on_cancel("a", "again") == []


def test_cancel_of_running_or_unknown_request_is_left_to_the_worker():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req("a"), 0.0)
    assert core.on_cancel("a", "x") == []
    assert core.inflight["a"].worker_id == "w1"
    assert core.on_cancel("nope", "x") == []


def test_remember_ended_is_bounded():
    core = SchedulerCore(SchedulerPolicy(remember_ended=3))
    for i in range(5):
        core.on_ended(f"r{i}", 0.0)
    assert list(core._ended) == ["r2", "r3", "r4"]


# -- property: no double assignment, nothing silently dropped --------------------------

WORKERS = {"w0": ("m0",), "w1": ("m0", "m1"), "w2": ("m1",)}
MODELS = ("m0", "m1", "mX")  # nobody serves mX
STATES = ("ready", "ready", "ready", "draining", "starting", "stopped", "failed")

op = st.one_of(
    st.tuples(st.just("accept"), st.sampled_from(MODELS)),
    st.tuples(st.just("dup"), st.integers(0, 1_000)),
    st.tuples(
        st.just("hb"), st.sampled_from(sorted(WORKERS)), st.sampled_from(STATES), st.integers(1, 3)
    ),
    st.tuples(st.just("hb_all")),
    st.tuples(st.just("silence"), st.sampled_from(sorted(WORKERS))),
    st.tuples(st.just("start"), st.integers(0, 1_000), st.booleans()),
    st.tuples(st.just("end"), st.integers(0, 1_000)),
    st.tuples(st.just("zombie_end"), st.integers(0, 1_000)),
    st.tuples(st.just("cancel"), st.integers(0, 1_000)),
    st.tuples(st.just("echo")),
    st.tuples(st.just("tick"), st.sampled_from((0.1, 0.5, 1.0, 2.0, 3.5, 5.0, 8.0))),
)


class Model:
    """An independent book of what the scheduler must have done, checked per effect."""

    def __init__(self) -> None:
        self.policy = SchedulerPolicy(worker_timeout_s=3.0, queue_timeout_s=10.0, max_attempts=3)
        self.core = SchedulerCore(self.policy)
        self.now = 0.0
        self.n = 0
        self.accepted: dict[str, RequestSubmitted] = {}
        self.registered: dict[str, dict] = {}  # as the core should see its workers
        self.silent: set[str] = set()
        self.held: dict[str, tuple[str, int]] = {}  # rid -> (worker, attempt)
        self.started: dict[str, int] = {}  # rid -> attempt that started
        self.queued_since: dict[str, float] = {}
        self.attempt: dict[str, int] = {}  # next attempt for a queued rid
        self.ever_assigned: set[str] = set()
        self.terminal: dict[str, str] = {}  # rid -> how it ended
        self.pending_echo: list[str] = []  # Fail/Cancel not yet back on ENDED
        self.to_stop: set[tuple[str, str, int]] = set()  # (rid, lost worker, attempt)

    # -- helpers
    def _ready_for(self, model: str) -> list[str]:
        return [
            w
            for w, info in self.registered.items()
            if info["state"] == "ready" and model in WORKERS[w]
        ]

    def _load(self, wid: str) -> int:
        return sum(1 for w, _ in self.held.values() if w == wid)

    def _lose(self, wid: str) -> tuple[set[str], set[str]]:
        """Release the worker's holds; return (must fail, must re-queue)."""
        self.registered.pop(wid, None)
        fail, requeue = set(), set()
        for rid, (w, attempt) in list(self.held.items()):
            if w != wid:
                continue
            del self.held[rid]
            self.to_stop.add((rid, wid, attempt))
            if self.started.get(rid) == attempt or attempt >= self.policy.max_attempts:
                fail.add(rid)
            else:
                requeue.add(rid)
                self.attempt[rid] = attempt + 1
                self.queued_since[rid] = self.now
        return fail, requeue

    def _apply(self, effects, must_fail: set[str] = frozenset()) -> None:
        failed_now = set()
        for e in effects:
            rid = e.request.request_id
            assert rid in self.accepted, e
            assert rid not in self.terminal, (e, self.terminal.get(rid))
            if isinstance(e, Supersede):  # a lost worker's attempt, stopped once
                self.to_stop.remove((rid, e.worker_id, e.attempt))
            elif isinstance(e, Assign):
                assert rid not in self.held, f"{rid} assigned twice: {self.held[rid]} and {e}"
                assert rid in self.queued_since, f"{rid} assigned while not queued"
                info = self.registered.get(e.worker_id)
                assert info is not None, f"assigned to unknown/lost worker {e.worker_id}"
                assert info["state"] == "ready"
                assert e.request.model in WORKERS[e.worker_id]
                assert self._load(e.worker_id) < info["max_num_seqs"], "worker overfilled"
                assert e.attempt == self.attempt[rid] <= self.policy.max_attempts
                self.held[rid] = (e.worker_id, e.attempt)
                self.ever_assigned.add(rid)
                del self.queued_since[rid]
            elif isinstance(e, Fail):
                assert e.retryable
                if e.code == "worker_lost":
                    assert rid in must_fail, f"unexpected worker_lost for {rid}"
                else:
                    assert e.code in ("no_worker", "queue_timeout"), e
                    assert rid in self.queued_since, f"{rid} timed out while not queued"
                    assert self.now - self.queued_since[rid] > self.policy.queue_timeout_s
                    expect = "queue_timeout" if self._ready_for(e.request.model) else "no_worker"
                    assert e.code == expect
                    del self.queued_since[rid]
                failed_now.add(rid)
                self.terminal[rid] = f"failed:{e.code}"
                self.pending_echo.append(rid)
            else:
                assert isinstance(e, Cancel)
                assert rid in self.queued_since, f"cancelled {rid} that was not queued"
                del self.queued_since[rid]
                self.terminal[rid] = "cancelled"
                self.pending_echo.append(rid)
        missing = set(must_fail) - failed_now
        assert not missing, f"lost started/exhausted requests not failed: {missing}"
        assert not self.to_stop, f"lost attempts not stopped: {self.to_stop}"
        self._check_work_conserving()

    def _check_work_conserving(self) -> None:
        for rid in self.queued_since:
            model = self.accepted[rid].model
            for w in self._ready_for(model):
                assert self._load(w) >= self.registered[w]["max_num_seqs"], (
                    f"{rid} queued while {w} has room"
                )

    def _pick(self, pool, k):
        pool = sorted(pool)
        return pool[k % len(pool)] if pool else None

    # -- operations
    def accept(self, model: str) -> None:
        rid = f"r{self.n}"
        self.n += 1
        self.accepted[rid] = req(rid, model)
        self.queued_since[rid] = self.now
        self.attempt[rid] = 1
        self._apply(self.core.on_accepted(self.accepted[rid], self.now))

    def dup(self, k: int) -> None:
        # JetStream redelivery or a client retry; not of a request whose failure is
        # still on its way back through the ENDED stream (the adapter acks on Fail)
        rid = self._pick(set(self.accepted) - set(self.pending_echo), k)
        if rid is not None:
            assert self.core.on_accepted(self.accepted[rid], self.now) == []

    def heartbeat(self, wid: str, state: str, max_num_seqs: int) -> None:
        if state in ("stopped", "failed"):
            fail, _ = self._lose(wid)
            self._apply(
                self.core.on_heartbeat(
                    hb(wid, WORKERS[wid], state=state, max_num_seqs=max_num_seqs), self.now
                ),
                fail,
            )
            return
        self.silent.discard(wid)
        self.registered[wid] = {"state": state, "max_num_seqs": max_num_seqs, "last": self.now}
        self._apply(
            self.core.on_heartbeat(
                hb(wid, WORKERS[wid], state=state, max_num_seqs=max_num_seqs), self.now
            )
        )

    def hb_all(self) -> None:
        for wid, info in list(self.registered.items()):
            if wid not in self.silent:
                self.heartbeat(wid, info["state"], info["max_num_seqs"])

    def start(self, k: int, stale: bool) -> None:
        rid = self._pick(self.held, k)
        if rid is None:
            return
        attempt = self.held[rid][1]
        if stale and attempt > 1:
            self.core.on_started(rid, attempt - 1)
        else:
            self.core.on_started(rid, attempt)
            self.started[rid] = attempt

    def end(self, k: int) -> None:
        rid = self._pick([r for r, (w, _) in self.held.items() if w not in self.silent], k)
        if rid is not None:
            self._end(rid, "finished")

    def _end(self, rid: str, how: str) -> None:
        self.held.pop(rid, None)
        self.queued_since.pop(rid, None)
        self.terminal[rid] = how
        self._apply(self.core.on_ended(rid, self.now))

    def zombie_end(self, k: int) -> None:
        # a worker declared lost was alive after all and finishes its old attempt
        rid = self._pick([r for r in self.ever_assigned if r not in self.terminal], k)
        if rid is not None:
            self._end(rid, "finished-by-zombie")

    def cancel(self, k: int) -> None:
        rid = self._pick(self.accepted, k)
        if rid is None:
            return
        was_queued = rid in self.queued_since
        effects = self.core.on_cancel(rid, "bye")
        assert len(effects) == (1 if was_queued else 0), (rid, effects)
        self._apply(effects)

    def echo(self) -> None:
        """The adapter records each Fail/Cancel on ENDED; it comes back as on_ended."""
        if self.pending_echo:
            rid = self.pending_echo.pop(0)
            self._apply(self.core.on_ended(rid, self.now))

    def tick(self, dt: float) -> None:
        self.now += dt
        lost = [
            w
            for w, info in self.registered.items()
            if self.now - info["last"] > self.policy.worker_timeout_s
        ]
        must_fail: set[str] = set()
        for w in lost:
            fail, _ = self._lose(w)
            must_fail |= fail
        self._apply(self.core.tick(self.now), must_fail)
        overdue = {
            r
            for r, since in self.queued_since.items()
            if self.now - since > self.policy.queue_timeout_s
        }
        assert not overdue, f"queued past queue_timeout_s and not failed: {overdue}"

    def run(self, ops) -> None:
        for o in ops:
            name, *args = o
            if name == "hb":
                self.heartbeat(*args)
            elif name == "silence":
                self.silent.add(args[0])
            else:
                getattr(self, name)(*args)

    def settle(self) -> None:
        """Every worker comes back and stays live; time runs well past every timeout."""
        for wid in WORKERS:
            self.heartbeat(wid, "ready", 2)
        for _ in range(int(self.policy.queue_timeout_s) * 3):
            while self.pending_echo:
                self.echo()
            for rid in [r for r in self.held]:
                self._end(rid, "finished")
            self.hb_all()
            self.tick(1.0)


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(op, max_size=60))
# known tricky cases, always run: an old request queued behind one re-queued after a loss
@example(
    [
        ("hb", "w0", "ready", 1),
        ("accept", "m0"),
        ("accept", "m0"),
        ("silence", "w0"),
        ("tick", 5.0),
        ("tick", 5.0),
        ("tick", 0.5),
    ]
)
# a late RequestStarted of an earlier attempt must not turn a retry into a failure
@example(
    [
        ("hb", "w0", "ready", 1),
        ("accept", "m0"),
        ("silence", "w0"),
        ("tick", 3.5),
        ("hb", "w1", "ready", 1),
        ("start", 0, True),
        ("silence", "w1"),
        ("tick", 3.5),
    ]
)
def test_property_no_double_assignment_and_nothing_dropped(ops):
    m = Model()
    m.run(ops)
    m.settle()
    # every accepted request reached an end the client hears about
    unresolved = {rid for rid in m.accepted if rid not in m.terminal}
    assert not unresolved, unresolved
    assert m.core.inflight == {}
    assert all(not q for q in m.core.queues.values())
    for rid, how in m.terminal.items():
        if how.startswith("finished"):
            assert rid in m.ever_assigned


# -- backpressure and deadlines ----------------------------------------------------------


def test_a_full_queue_refuses_new_requests_as_retryable():
    core = SchedulerCore(SchedulerPolicy(max_queue_per_model=2))
    assert core.on_accepted(req("a"), 0.0) == []
    assert core.on_accepted(req("b"), 0.0) == []
    [fail] = only(core.on_accepted(req("c"), 0.0), Fail)
    assert (fail.code, fail.retryable) == ("queue_full", True)
    assert core.knows("c")  # a redelivery of c changes nothing
    assert core.on_accepted(req("c"), 0.1) == []
    # the queue drains: there is room again
    core.on_heartbeat(hb("w1", max_num_seqs=2), 1.0)
    assert core.on_accepted(req("d"), 1.0) == []


def test_load_reports_queue_depth_limit_and_dispatch_rate():
    core = SchedulerCore(SchedulerPolicy(max_queue_per_model=50))
    for i in range(5):
        core.on_accepted(req(f"r{i}"), 0.0)
    load = core.load(1.0)["m"]
    assert (load.queued, load.queue_limit, load.ready_workers) == (5, 50, 0)
    assert load.oldest_wait_s == 1.0
    core.on_heartbeat(hb("w1", max_num_seqs=3), 1.0)  # takes three of them
    load = core.load(2.0)["m"]
    assert (load.queued, load.ready_workers, load.free_slots) == (2, 1, 0)
    assert load.dispatch_per_s == 3.0  # three dispatched in the second since the last report


def test_a_request_past_its_deadline_is_not_queued():
    core = SchedulerCore(POLICY)
    r = RequestSubmitted(request_id="late", model="m", reply_to="x", prompt="p", deadline=99.0)
    [fail] = only(core.on_accepted(r, now=5.0, wall=100.0), Fail)
    assert fail.code == "deadline_exceeded" and not fail.retryable


def test_a_queued_request_ends_at_its_deadline_before_the_queue_timeout():
    core = SchedulerCore(POLICY)  # queue timeout 10 s
    r = RequestSubmitted(request_id="d", model="m", reply_to="x", prompt="p", deadline=1002.0)
    assert core.on_accepted(r, now=0.0, wall=1000.0) == []  # deadline 2 s from now
    assert core.tick(1.9) == []
    [fail] = only(core.tick(2.0), Fail)
    assert fail.code == "deadline_exceeded"
    assert not core.is_queued("d") and core.knows("d")


def test_requeued_work_keeps_its_deadline():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    r = RequestSubmitted(request_id="d", model="m", reply_to="x", prompt="p", deadline=1005.0)
    assert assigns(core.on_accepted(r, now=0.0, wall=1000.0)) == [("d", "w1", 1)]
    assert decisions(core.tick(3.5)) == []  # w1 lost, d back in the queue with no worker
    assert core.is_queued("d")
    [fail] = only(core.tick(5.0), Fail)
    assert fail.code == "deadline_exceeded"


def test_a_reused_id_is_refused_to_its_new_sender_only():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    first = req("dup")
    assert assigns(core.on_accepted(first, 0.0)) == [("dup", "w1", 1)]
    # the same request again (redelivered, or resent to the same reply subject): nothing
    assert core.on_accepted(first, 0.1, redelivered=True) == []
    assert core.on_accepted(first, 0.1) == []
    # another sender with the same id, while the first runs: refused, the first untouched
    other = RequestSubmitted(request_id="dup", model="m", reply_to="ib.reply.other.dup", prompt="x")
    [refuse] = core.on_accepted(other, 0.2)
    assert isinstance(refuse, Refuse) and refuse.code == "duplicate_request"
    assert refuse.request.reply_to == "ib.reply.other.dup"
    assert "dup" in core.inflight
    # and after the first ended (past JetStream's duplicate window), still refused
    core.on_ended("dup", 1.0)
    [refuse] = core.on_accepted(other, 200.0)
    assert isinstance(refuse, Refuse)
    assert core.on_accepted(first, 200.0) == []  # the very same request: a resend
    # the same gateway reuses its reply subject for a reused id: told apart by creation time
    again = RequestSubmitted(
        request_id="dup",
        model="m",
        reply_to=first.reply_to,
        prompt="hello",
        created_at=first.created_at + 150,
    )
    assert [type(e) for e in core.on_accepted(again, 200.0)] == [Refuse]


def test_a_resend_of_an_ended_request_is_told_a_redelivery_is_not():
    """Tenants' submits dedupe for 0.1 s only (issue 42 item 11), so a client's resend
    of a request is a new stored copy (a new accepted Nats-Msg-Id). While the request
    runs, its sender hears its events on the same reply subject; once it ended, a
    resend was never answered. A redelivery of the copy it was taken from (a NATS
    restart forgets delivery counts) must stay silent: its client has its end."""
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    first = req("once")
    assert assigns(core.on_accepted(first, 0.0, copy="once:S:1:accepted")) == [("once", "w1", 1)]
    assert core.on_accepted(first, 0.1, copy="once:S:2:accepted") == []  # running: it hears
    core.on_ended("once", 1.0)
    assert core.on_accepted(first, 2.0, copy="once:S:1:accepted") == []  # the same copy
    [refuse] = core.on_accepted(first, 2.0, copy="once:S:3:accepted")  # a resend
    assert isinstance(refuse, Refuse) and refuse.code == "duplicate_request"


def test_a_cancel_that_overtakes_its_request_still_cancels_it():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    assert core.on_cancel("early", "client disconnected") == []
    [cancel] = core.on_accepted(req("early"), 0.1)
    assert isinstance(cancel, Cancel) and cancel.reason == "client disconnected"
    assert "early" not in core.inflight and core.knows("early")
    assert core.on_accepted(req("early"), 0.2, redelivered=True) == []


def test_work_a_previous_scheduler_placed_takes_slots_until_it_ends():
    core = SchedulerCore(POLICY)  # restarted: knows nothing of what runs
    busy = WorkerHeartbeat(
        worker_id="w1", models=["m"], engine="sim", max_num_seqs=2, inflight=["old1", "old2"]
    )
    core.on_heartbeat(busy, 0.0)
    assert core.on_accepted(req("new"), 0.1) == []  # both slots are taken
    core.on_ended("old1", 0.5)
    later = WorkerHeartbeat(
        worker_id="w1", models=["m"], engine="sim", max_num_seqs=2, inflight=["old2"]
    )
    assert assigns(core.on_heartbeat(later, 1.0)) == [("new", "w1", 1)]


def test_a_restarted_scheduler_takes_back_open_assignments():
    core = SchedulerCore(POLICY)  # worker timeout 3 s
    done, running, again = req("done"), req("running"), req("again")
    done_end = RequestFinished(
        request_id="done",
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1),
        chunks=1,
        worker_id="w1",
        attempt=1,
    )
    core.restore(
        [(done, "w1", 1), (running, "w1", 1), (again, "w1", 1), (again, "w2", 2)],
        ended={"done": [RecordedEnd(done_end, 100.0)]},
        now=0.0,
    )
    assert set(core.inflight) == {"running", "again"}
    assert core.inflight["again"].worker_id == "w2"  # the latest attempt
    assert core.on_accepted(running, 0.1) == []  # a redelivery of it changes nothing
    core.on_heartbeat(hb("w1", max_num_seqs=1), 0.5)  # w1 is full with "running"
    assert core.on_accepted(req("new"), 0.6) == []
    # w2 never heartbeats: it is lost, and its request ends instead of hanging
    [fail] = only(decisions(core.tick(3.5)), Fail)
    assert (fail.request.request_id, fail.code) == ("again", "worker_lost")


def test_a_start_from_the_worker_holding_the_request_counts_whatever_the_attempt():
    core = SchedulerCore(POLICY)  # worker timeout 3 s
    core.on_heartbeat(hb("w1", max_num_seqs=2), 0.0)
    core.on_accepted(req("r"), 0.0)
    core.tick(3.5)  # w1 briefly unreachable: r back in the queue
    back = WorkerHeartbeat(
        worker_id="w1", models=["m"], engine="sim", max_num_seqs=2, inflight=["r"]
    )
    assert assigns(core.on_heartbeat(back, 3.6)) == [("r", "w1", 2)]
    core.on_started("r", 1, "w1")  # it was still streaming attempt 1
    core.on_heartbeat(hb("w2"), 7.0)
    [fail] = only(decisions(core.tick(7.0)), Fail)  # w1 lost again: r fails, never twice
    assert fail.code == "worker_lost"


def test_a_request_for_n_choices_takes_n_of_the_engine_s_sequences():
    """The engine runs n sequences for it; counted as one, a worker took max_num_seqs
    requests of n=4 and its engine queued three quarters of them."""
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1", max_num_seqs=4), 0.0)

    def wide(rid: str, n: int) -> RequestSubmitted:
        return msgspec.structs.replace(req(rid), sampling=SamplingParams(n=n))

    assert assigns(core.on_accepted(wide("a", 3), 0.1)) == [("a", "w1", 1)]
    assert assigns(core.on_accepted(wide("b", 2), 0.2)) == []  # 3 + 2 > 4: it waits
    assert assigns(core.on_accepted(wide("c", 1), 0.3)) == []  # behind b, in order
    placed = assigns(core.on_ended("a", 0.4))
    assert [rid for rid, _, _ in placed] == ["b", "c"]  # 2 + 1 fit once a ended
    core2 = SchedulerCore(POLICY)
    core2.on_heartbeat(hb("w1", max_num_seqs=2), 0.0)
    # wider than the engine: an idle worker takes it all the same (the engine queues)
    assert assigns(core2.on_accepted(wide("big", 5), 0.1)) == [("big", "w1", 1)]
