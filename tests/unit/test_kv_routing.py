"""The KV index and KV-aware routing in the scheduler core."""

from __future__ import annotations

from inferbus.contracts import (
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    RequestSubmitted,
    WorkerHeartbeat,
)
from inferbus.services.scheduler.core import Assign, SchedulerCore, SchedulerPolicy
from inferbus.services.scheduler.kvindex import KvIndex, text_blocks


def test_overlap_counts_leading_blocks_only():
    idx = KvIndex()
    idx.on_event(KvBlocksStored(worker_id="a", block_hashes=[1, 2, 3]))
    idx.on_event(KvBlocksStored(worker_id="b", block_hashes=[1, 9]))
    idx.on_event(KvBlocksStored(worker_id="c", block_hashes=[2, 3]))  # no first block
    assert idx.overlaps([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}
    idx.on_event(KvBlocksRemoved(worker_id="a", block_hashes=[2]))
    assert idx.overlaps([1, 2, 3], ["a"]) == {"a": 1}
    idx.on_event(KvAllCleared(worker_id="a"))
    assert idx.overlaps([1], ["a", "b"]) == {"a": 0, "b": 1}


def test_what_was_routed_is_tracked_in_a_bounded_lru_beside_the_events():
    idx = KvIndex(approx_capacity_blocks=3)
    idx.on_routed("w", [1, 2])
    idx.on_routed("w", [5, 6])  # 1 falls out
    assert idx.overlaps([1, 2], ["w"]) == {"w": 0}
    assert idx.overlaps([5, 6], ["w"]) == {"w": 2}
    # events (the engine's own hashes) and routed text blocks answer side by side
    idx.on_event(KvBlocksStored(worker_id="w", block_hashes=[7, 8]))
    assert idx.exact("w")
    assert idx.overlaps([5, 6], ["w"]) == {"w": 2} and idx.overlaps([7, 8], ["w"]) == {"w": 2}
    idx.on_event(KvAllCleared(worker_id="w"))  # the engine's cache is gone: both views
    assert idx.overlaps([5], ["w"]) == {"w": 0} and idx.overlaps([7], ["w"]) == {"w": 0}


def test_text_blocks_chain():
    a = text_blocks("x" * 600, 256)
    b = text_blocks("x" * 512 + "y" * 88, 256)
    assert len(a) == 2 and a == b
    assert text_blocks("z" + "x" * 599, 256)[1] != a[1]  # a different first block


def hb(wid: str, seqs: int = 4) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=wid, models=["m"], engine="sim", max_num_seqs=seqs)


def req(rid: str, blocks: list[int]) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=rid, model="m", reply_to=f"r.{rid}", prompt="p", prefix_hashes=blocks
    )


def test_requests_go_where_their_prefix_is_cached_within_the_load_bound():
    core = SchedulerCore(SchedulerPolicy(max_load_skew=0.5))
    for w in ("a", "b"):
        core.on_heartbeat(hb(w, seqs=4), 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="b", block_hashes=[1, 2, 3]))
    [first] = core.on_accepted(req("r1", [1, 2, 3, 4]), 0.0)
    assert isinstance(first, Assign) and first.worker_id == "b"
    [second] = core.on_accepted(req("r2", [1, 2, 3, 5]), 0.0)
    assert second.worker_id == "b"  # still within the bound
    [third] = core.on_accepted(req("r3", [1, 2, 3, 6]), 0.0)
    assert third.worker_id == "b"
    [fourth] = core.on_accepted(req("r4", [1, 2, 3, 7]), 0.0)
    assert fourth.worker_id == "a"  # b's load (3 of 4) now outweighs the cached prefix
    status = core.status()["routing"]
    assert status["prefix_blocks_routed"] == 16 and status["prefix_hit_rate"] == 9 / 16


def test_the_load_bound_wins_over_the_cache():
    core = SchedulerCore(SchedulerPolicy(max_load_skew=0.0, overlap_weight=100.0))
    for w in ("a", "b", "c"):
        core.on_heartbeat(hb(w, seqs=10), 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="a", block_hashes=[1]))
    workers = [e.worker_id for i in range(6) for e in core.on_accepted(req(f"r{i}", [1]), 0.0)]
    assert max(workers.count(w) for w in "abc") <= 3  # never more than mean + 1 request


def test_round_robin_ignores_caches():
    core = SchedulerCore(SchedulerPolicy(routing="round_robin"))
    for w in ("a", "b"):
        core.on_heartbeat(hb(w), 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="b", block_hashes=[1]))
    workers = [e.worker_id for i in range(4) for e in core.on_accepted(req(f"r{i}", [1]), 0.0)]
    assert workers == ["a", "b", "a", "b"]


# -- canary weights ------------------------------------------------------------------------

import pytest  # noqa: E402


def test_a_canary_takes_its_share_stably_and_falls_back_when_absent():
    core = SchedulerCore(SchedulerPolicy())
    core.on_heartbeat(
        WorkerHeartbeat(worker_id="old", models=["m"], engine="sim", max_num_seqs=5000), 0.0
    )
    core.set_canary("m", {"m-v2": 0.2})
    first = [e for i in range(500) for e in core.on_accepted(req(f"a{i}", []), 0.0)]
    assert all(e.worker_id == "old" and e.served_model == "" for e in first)  # no v2 yet
    core.on_heartbeat(
        WorkerHeartbeat(worker_id="new", models=["m-v2"], engine="sim", max_num_seqs=5000), 0.0
    )
    effects = [e for i in range(2000) for e in core.on_accepted(req(f"r{i}", []), 0.0)]
    to_v2 = [e for e in effects if e.worker_id == "new"]
    assert all(e.served_model == "m-v2" for e in to_v2)
    assert 0.17 < len(to_v2) / len(effects) < 0.23
    core.set_canary("m", {})
    assert all(
        e.worker_id == "old" for i in range(50) for e in core.on_accepted(req(f"z{i}", []), 0.0)
    )
    with pytest.raises(ValueError):
        core.set_canary("m", {"a": 0.7, "b": 0.6})


def test_canary_requests_fall_back_when_the_new_version_is_full_or_gone():
    core = SchedulerCore(SchedulerPolicy())
    core.on_heartbeat(
        WorkerHeartbeat(worker_id="A", models=["m"], engine="sim", max_num_seqs=4), 0.0
    )
    core.on_heartbeat(
        WorkerHeartbeat(worker_id="B", models=["m2"], engine="sim", max_num_seqs=1), 0.0
    )
    core.set_canary("m", {"m2": 1.0})
    placed = [e.worker_id for i in range(3) for e in core.on_accepted(req(f"c{i}", []), 0.0)]
    assert placed == ["B", "A", "A"]  # B full: the rest run on the current version
    core.set_canary("m", {})
    assert [e.worker_id for e in core.on_accepted(req("after", []), 0.1)] == ["A"]
