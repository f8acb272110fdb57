"""bench/autoscaler.py with ``--admission``: its fleet runs requests through the
scheduler's own core, whose refusals count as missed, and the inferbus policy sees
them (issue 39)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from autoscaler import Fleet, Static, score
from scheduler import Req

from inferbus.services.scheduler.core import SchedulerPolicy

POLICY = SchedulerPolicy(ttft_slo_s=2.0, slo_prefill_tokens_per_s=0.0, worker_timeout_s=1e9)


def test_a_burst_past_one_worker_is_refused_and_counted_missed() -> None:
    # 1.6M prompt tokens in 4 s on one worker that prefills about 20k a second
    reqs = [Req(f"r{i}", i * 0.01, 4000, 10, []) for i in range(400)]
    fleet = Fleet(reqs, (1.0, 1.0), 0, POLICY)
    fleet.run(Static(1))
    refused = fleet.failures["overloaded"]
    assert refused > 100
    assert len(fleet.ttft) + sum(fleet.failures.values()) == len(reqs)  # each ends once
    assert score(fleet, 2.0)["within_slo"] <= 1 - refused / len(reqs)


def test_without_overload_the_core_s_fleet_serves_as_the_plain_queue() -> None:
    reqs = [Req(f"r{i}", i * 0.5, 500, 10, []) for i in range(60)]
    plain, core = Fleet(reqs, (1.0, 1.0), 0), Fleet(reqs, (1.0, 1.0), 0, POLICY)
    plain.run(Static(1))
    core.run(Static(1))
    assert not core.failures
    assert score(core, 2.0)["within_slo"] == score(plain, 2.0)["within_slo"] == 1.0
