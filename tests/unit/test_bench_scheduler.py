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


def args(**kw) -> argparse.Namespace:
    base = dict(
        short_tokens=2048,
        queue_timeout_s=1e9,
        slots=8,
        cache_blocks=100,
        policy={},
        slo_ttft_s=2.0,
        slo_prefill_tokens_per_s=10_000.0,
        retries=0,
        no_admit=False,
        no_slack=False,
    )
    return argparse.Namespace(**{**base, **kw})


def test_refused_requests_are_counted_not_a_crash() -> None:
    # 1,500 requests at once on one worker: past the queue limit (1000) some are refused
    reqs = [Req(f"r{i}", 0.0, 100 if i % 2 else 4000, 4, []) for i in range(1500)]
    summary = compare(reqs, 1, args())
    refused = summary["failed"]
    assert refused["fcfs"].get("queue_full", 0) > 0 and refused["lanes"].get("queue_full", 0) > 0
    # and count as missed in the goodput
    out = summary["outcomes"]["fcfs"]
    assert out["refused"] > 0 and math.isclose(
        out["goodput"] + out["late"] + out["refused"] + out["timed_out"], 1.0, abs_tol=1e-3
    )


def test_queued_requests_time_out_as_the_service_would() -> None:
    """The simulator ticks the core as the service does: with a queue timeout, requests
    that wait past it end ``queue_timeout`` (counted, never served); before, no tick
    ran and ``--queue-timeout-s`` changed nothing."""
    reqs = [Req(f"r{i}", 0.0, 100, 50, []) for i in range(40)]  # 8 slots: most queue
    patient = args(no_admit=True)
    assert compare(reqs, 1, patient)["failed"]["fcfs"] == {}
    hasty = args(no_admit=True, queue_timeout_s=0.05)
    timed_out = compare(reqs, 1, hasty)["failed"]
    assert timed_out["fcfs"].get("queue_timeout", 0) > 0
    assert timed_out["lanes"].get("queue_timeout", 0) > 0


def test_a_refused_request_is_sent_again_as_a_client_would() -> None:
    """With ``--retries``, a retryable failure comes back after its Retry-After: every
    request of a burst is served in the end, the retried ones late."""
    reqs = [Req(f"r{i}", 0.0, 100, 50, []) for i in range(40)]
    hasty = compare(reqs, 1, args(no_admit=True, queue_timeout_s=0.05))
    assert hasty["failed"]["fcfs"]
    patient = compare(reqs, 1, args(no_admit=True, queue_timeout_s=0.05, retries=50))
    assert patient["failed"]["fcfs"] == {}
    assert patient["outcomes"]["fcfs"]["late"] > 0
