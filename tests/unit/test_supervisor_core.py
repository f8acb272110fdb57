"""inferbus up's supervisor core: restarts with a backoff that resets, scaling, ordered stop."""

from __future__ import annotations

from inferbus.supervisor.core import (
    Kill,
    Note,
    ProcessSpec,
    RestartPolicy,
    Start,
    SupervisorCore,
    Terminate,
)

POLICY = RestartPolicy(first_delay_s=0.5, max_delay_s=30.0, healthy_after_s=30.0, stop_grace_s=35)


def spec(name: str, service: str = "", index: int = 0, stop_order: int = 1) -> ProcessSpec:
    return ProcessSpec(name=name, service=service or name, index=index, stop_order=stop_order)


def started(core: SupervisorCore, *specs: ProcessSpec, now: float = 0.0) -> SupervisorCore:
    for s in specs:
        assert core.add(s, now) == [Start(s)]
        core.on_started(s.name, now)
    return core


def kinds(effects: list) -> list:
    return [e for e in effects if not isinstance(e, Note)]


def test_a_crash_is_restarted_after_a_delay_that_doubles():
    core = started(SupervisorCore(POLICY), spec("sanitizer"))
    now, delays = 1.0, []
    for _ in range(8):
        notes = core.on_exit("sanitizer", 1, now)
        delay = core.processes["sanitizer"].next_start - now
        delays.append(delay)
        assert core.processes["sanitizer"].state == "backoff"
        assert any("restarting in" in n.text for n in notes)
        assert kinds(core.tick(now + delay - 0.01)) == []  # not before its time
        assert kinds(core.tick(now + delay)) == [Start(spec("sanitizer"))]
        now += delay + 1.0  # dies again a second after it started
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_the_backoff_resets_after_a_healthy_run():
    """Four quick crashes used to mean 8 s of outage on the next one, however long the
    process had run well in between."""
    core = started(SupervisorCore(POLICY), spec("scheduler"))
    now = 0.0
    for _ in range(4):
        core.on_exit("scheduler", 1, now + 1)
        now = core.processes["scheduler"].next_start
        core.tick(now)
    assert core.processes["scheduler"].restarts == 4
    core.on_exit("scheduler", 1, now + 31)  # ran 31 s: healthy
    p = core.processes["scheduler"]
    assert p.restarts == 1 and p.next_start - (now + 31) == 0.5


def test_scale_up_starts_named_instances_and_scale_down_stops_the_newest():
    core = started(SupervisorCore(POLICY), *(spec(f"worker-{i}", "worker", i) for i in range(2)))
    make = [spec("worker-2", "worker", 2), spec("worker-3", "worker", 3)]
    assert core.scale("worker", make, 4, [], 1.0) == [Start(s) for s in make]
    assert len(core.of("worker")) == 4
    effects = core.scale("worker", [], 2, [], 2.0)
    assert effects == [Terminate("worker-3"), Terminate("worker-2")]
    assert [p.spec.name for p in core.of("worker")] == ["worker-0", "worker-1"]
    # an instance scaled away that exits is gone for good, not restarted
    assert core.on_exit("worker-3", 0, 3.0) == []
    assert "worker-3" not in core.processes
    assert kinds(core.tick(10.0)) == []


def test_scale_down_stops_the_named_instances_first():
    core = started(SupervisorCore(POLICY), *(spec(f"worker-{i}", "worker", i) for i in range(3)))
    assert core.scale("worker", [], 1, ["worker-0"], 1.0) == [
        Terminate("worker-0"),
        Terminate("worker-2"),
    ]


def test_scaling_away_a_process_waiting_to_restart_needs_no_signal():
    core = started(SupervisorCore(POLICY), *(spec(f"worker-{i}", "worker", i) for i in range(2)))
    core.on_exit("worker-1", 1, 1.0)
    assert core.scale("worker", [], 1, [], 1.1) == []
    assert "worker-1" not in core.processes
    assert kinds(core.tick(10.0)) == []  # and it is not restarted later


def test_a_stopped_instance_that_ignores_sigterm_is_killed_after_the_grace():
    core = started(SupervisorCore(POLICY), *(spec(f"worker-{i}", "worker", i) for i in range(2)))
    core.scale("worker", [], 1, [], 0.0)
    assert kinds(core.tick(34.9)) == []
    assert kinds(core.tick(35.0)) == [Kill("worker-1")]
    assert kinds(core.tick(40.0)) == []  # once


def test_shutdown_stops_group_by_group_in_stop_order():
    gateway = spec("gateway", stop_order=1)
    workers = [spec(f"worker-{i}", "worker", i, stop_order=3) for i in range(2)]
    scheduler = spec("scheduler", stop_order=4)
    nats = spec("nats", stop_order=9)
    core = started(SupervisorCore(POLICY), nats, scheduler, *workers, gateway)
    assert core.begin_shutdown(0.0) == [Terminate("gateway")]
    assert core.on_exit("gateway", 0, 1.0) == [Terminate("worker-0"), Terminate("worker-1")]
    assert core.on_exit("worker-0", 0, 2.0) == []  # the group is not done yet
    assert core.on_exit("worker-1", 0, 3.0) == [Terminate("scheduler")]
    assert core.on_exit("scheduler", 0, 4.0) == [Terminate("nats")]
    assert not core.done
    assert core.on_exit("nats", 0, 5.0) == []
    assert core.done


def test_shutdown_kills_a_group_past_its_grace_then_goes_on():
    core = started(
        SupervisorCore(POLICY), spec("gateway", stop_order=1), spec("scheduler", stop_order=2)
    )
    core.begin_shutdown(0.0)
    assert kinds(core.tick(35.0)) == [Kill("gateway")]
    assert core.on_exit("gateway", -9, 35.1) == [Terminate("scheduler")]


def test_shutdown_skips_processes_waiting_to_restart_and_takes_no_new_ones():
    core = started(
        SupervisorCore(POLICY), spec("gateway", stop_order=1), spec("sanitizer", stop_order=2)
    )
    core.on_exit("gateway", 1, 1.0)  # crashed: in backoff
    assert core.begin_shutdown(1.1) == [Terminate("sanitizer")]
    assert core.add(spec("worker-5", "worker", 5), 1.2) == []
    assert kinds(core.tick(10.0)) == []  # the crashed gateway is not restarted
    core.on_exit("sanitizer", 0, 2.0)
    assert core.done


def test_a_crash_during_shutdown_does_not_restart_and_does_not_skip_the_group():
    core = started(
        SupervisorCore(POLICY), spec("gateway", stop_order=1), spec("scheduler", stop_order=2)
    )
    core.begin_shutdown(0.0)
    assert core.on_exit("scheduler", 1, 0.5) == []  # a later group's crash: nothing yet
    assert core.on_exit("gateway", 0, 1.0) == []  # nothing left to stop
    assert core.done
