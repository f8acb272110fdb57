"""bench/scheduler.py under overload: requests the scheduler refuses are counted (and
count as never served), instead of the run ending in a KeyError (issue 15: Azure at
--speedup 6, Mooncake at --speedup 4)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from scheduler import Req, compare


def test_refused_requests_are_counted_not_a_crash() -> None:
    # 1,500 requests at once on one worker: past the queue limit (1000) some are refused
    reqs = [Req(f"r{i}", 0.0, 100 if i % 2 else 4000, 4, []) for i in range(1500)]
    a = argparse.Namespace(
        short_tokens=2048, queue_timeout_s=1e9, slots=8, cache_blocks=100, policy={}
    )
    summary = compare(reqs, 1, a)
    refused = summary["failed"]
    assert refused["fcfs"].get("queue_full", 0) > 0 and refused["lanes"].get("queue_full", 0) > 0
    # over 5% never served: the all-request p95 is infinite, and no ratio is claimed
    assert math.isinf(summary["all_ttft_p95_s"]["fcfs"]) and summary["all_ttft_ratio"] is None


def test_queued_requests_time_out_as_the_service_would() -> None:
    """The simulator ticks the core as the service does: with a queue timeout, requests
    that wait past it end ``queue_timeout`` (counted, never served); before, no tick
    ran and ``--queue-timeout-s`` changed nothing."""
    reqs = [Req(f"r{i}", 0.0, 100, 50, []) for i in range(40)]  # 8 slots: most queue
    patient = argparse.Namespace(
        short_tokens=2048, queue_timeout_s=1e9, slots=8, cache_blocks=100, policy={}
    )
    assert compare(reqs, 1, patient)["failed"]["fcfs"] == {}
    hasty = argparse.Namespace(**{**vars(patient), "queue_timeout_s": 0.05})
    timed_out = compare(reqs, 1, hasty)["failed"]
    assert timed_out["fcfs"].get("queue_timeout", 0) > 0
    assert timed_out["lanes"].get("queue_timeout", 0) > 0
