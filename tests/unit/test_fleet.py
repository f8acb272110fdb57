"""shared/fleet.py: the one heartbeat view the gateway, autoscaler and delivery share."""

from __future__ import annotations

from inferbus.contracts import WorkerHeartbeat, WorkerState
from inferbus.shared.fleet import FleetView, busy


def beat(wid: str, models: list[str], state: WorkerState = "ready", **kw) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=wid, models=models, engine="sim", state=state, **kw)


def test_ready_workers_and_counts_per_model():
    fleet = FleetView()
    assert fleet.on_heartbeat(beat("b", ["m"]), 0.0) is None  # new to the view
    fleet.on_heartbeat(beat("a", ["m", "m@v2"], running=2, waiting=1), 0.0)
    fleet.on_heartbeat(beat("c", ["m"], state="draining"), 0.0)
    fleet.on_heartbeat(beat("d", ["other"], state="starting"), 0.0)
    assert [hb.worker_id for hb in fleet.ready("m")] == ["a", "b"]
    assert [hb.worker_id for hb in fleet.ready()] == ["a", "b"]
    assert fleet.counts() == {"m": 2, "m@v2": 1, "other": 0}
    assert busy(fleet.get("a")) == 3 and "c" in fleet and len(fleet) == 4


def test_a_stopped_or_failed_worker_goes_at_once_and_a_silent_one_past_its_limit():
    fleet = FleetView(stale_after_s=3.0)
    previous = fleet.on_heartbeat(beat("a", ["m"]), 0.0)
    fleet.on_heartbeat(beat("b", ["m"]), 0.0)
    previous = fleet.on_heartbeat(beat("a", ["m"], state="stopped"), 1.0)
    assert previous is not None and previous.state == "ready" and "a" not in fleet
    assert fleet.expire(3.0) == []  # exactly at the limit: still there
    assert fleet.ready("m") and fleet.expire(3.01) == ["b"] and len(fleet) == 0


def test_a_worker_with_a_slow_heartbeat_gets_a_longer_limit():
    fleet = FleetView(stale_after_s=3.0, interval_factor=3.0)
    fleet.on_heartbeat(beat("slow", ["m"], interval_s=5.0), 0.0)
    fleet.on_heartbeat(beat("fast", ["m"], interval_s=0.5), 0.0)
    assert fleet.expire(4.0) == ["fast"]
    assert fleet.expire(15.5) == ["slow"]


def test_the_context_is_the_smallest_any_worker_of_the_model_reports():
    fleet = FleetView()
    fleet.on_heartbeat(beat("a", ["m"], max_model_len=4096), 0.0)
    fleet.on_heartbeat(beat("b", ["m"], state="draining", max_model_len=2048), 0.0)
    fleet.on_heartbeat(beat("c", ["m"]), 0.0)  # says nothing
    assert fleet.max_model_len("m") == 2048 and fleet.max_model_len("x") == 0
