"""The KV index and KV-aware routing in the scheduler core."""

from __future__ import annotations

from typing import get_args, get_type_hints

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferbus.contracts import (
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    RequestSubmitted,
    WorkerHeartbeat,
)
from inferbus.services.scheduler.core import Assign, SchedulerCore, SchedulerPolicy, Worker
from inferbus.services.scheduler.kvindex import KvIndex, text_blocks
from inferbus.services.scheduler.pool import Pool
from inferbus.services.scheduler.routing import (
    ROUTERS,
    DynamoRouter,
    KvRouter,
    RoundRobinRouter,
    make_router,
)


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


def test_spilled_blocks_are_restorable_and_never_taken_for_cached_ones():
    idx = KvIndex()
    idx.on_event(KvBlocksStored(worker_id="a", block_hashes=[1]))
    idx.on_event(KvBlocksStored(worker_id="a", block_hashes=[1, 2], medium="CPU"))
    idx.on_event(KvBlocksStored(worker_id="a", block_hashes=[3], medium="STORAGE"))
    idx.on_event(KvBlocksStored(worker_id="b", block_hashes=[1, 2, 3], medium="STORAGE"))
    cached = idx.overlaps([1, 2, 3, 4], ["a", "b"])
    assert cached == {"a": 1, "b": 0}  # the engine's cache only
    assert idx.restorable([1, 2, 3, 4], cached) == {"a": 2, "b": 3}
    # a host-memory eviction is not an engine eviction, nor a disk one
    idx.on_event(KvBlocksRemoved(worker_id="a", block_hashes=[1, 2], medium="CPU"))
    assert idx.overlaps([1], ["a"]) == {"a": 1}
    assert idx.restorable([1, 2, 3], {"a": 1}) == {"a": 0}  # block 2 is gone everywhere
    # the engine clearing its cache leaves the tiers; a lost worker takes both
    idx.on_event(KvAllCleared(worker_id="b"))
    assert idx.restorable([1, 2, 3], {"b": 0}) == {"b": 3}
    idx.drop_worker("b")
    assert idx.restorable([1, 2, 3], {"b": 0}) == {"b": 0}


def test_a_worker_that_can_restore_the_prefix_is_preferred_over_recomputing():
    core = SchedulerCore(SchedulerPolicy(max_load_skew=1.0))
    for w in ("a", "b", "c"):
        core.on_heartbeat(hb(w, seqs=4), 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="b", block_hashes=[1, 2, 3], medium="STORAGE"))
    core.on_kv_event(KvBlocksStored(worker_id="c", block_hashes=[1, 2], medium="CPU"))
    core.on_kv_event(KvBlocksStored(worker_id="c", block_hashes=[1, 2]))
    [first] = core.on_accepted(req("r1", [1, 2, 3, 4]), 0.0)
    # c has two blocks in its engine's cache (2 x 1), b three on disk (3 x 0.5)
    assert isinstance(first, Assign) and first.worker_id == "c"
    core.on_kv_event(KvBlocksStored(worker_id="b", block_hashes=[4, 5, 6, 7], medium="CPU"))
    [second] = core.on_accepted(req("r2", [1, 2, 3, 4, 5, 6, 7]), 0.0)
    assert second.worker_id == "b"  # seven restorable (3.5) beat two cached (2)
    assert second.cached_blocks == 7  # the engine reports restored tokens as cached


def test_a_restorable_block_is_worth_what_the_worker_measured():
    from inferbus.services.scheduler.core import restore_worth

    assert restore_worth(0.0, 0.001) is None and restore_worth(0.01, 0.0) is None
    assert restore_worth(0.010, 0.001) == pytest.approx(0.9)
    assert restore_worth(0.010, 0.020) == 0.05  # dearer than computing: barely worth it
    assert restore_worth(0.010, 0.0) is None
    core = SchedulerCore(SchedulerPolicy(max_load_skew=1.0))
    for w in ("a", "b"):
        core.on_heartbeat(hb(w, seqs=4), 0.0)
    # a: two blocks cached; b: four on disk. At the default worth (0.5) b's 2.0 ties a's
    # 2.0 and the id decides (a); b measured restores at a tenth of its prefill: 3.6
    core.on_kv_event(KvBlocksStored(worker_id="a", block_hashes=[1, 2]))
    core.on_kv_event(KvBlocksStored(worker_id="b", block_hashes=[1, 2, 3, 4], medium="STORAGE"))
    [first] = core.on_accepted(req("r1", [1, 2, 3, 4, 5]), 0.0)
    assert isinstance(first, Assign) and first.worker_id == "a"
    measured = WorkerHeartbeat(
        worker_id="b",
        models=["m"],
        engine="vllm",
        max_num_seqs=4,
        prefill_s_per_token=0.010,
        kv_restore_s_per_token=0.001,
    )
    core.on_heartbeat(measured, 0.0)
    assert core.workers["b"].spill_weight == pytest.approx(0.9)
    [second] = core.on_accepted(req("r2", [1, 2, 3, 4, 6]), 0.0)
    assert second.worker_id == "b"


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


# -- routing strategies ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cls", [("kv", KvRouter), ("round_robin", RoundRobinRouter), ("dynamo", DynamoRouter)]
)
def test_each_routing_name_builds_its_strategy(name, cls):
    assert isinstance(make_router(SchedulerPolicy(routing=name), KvIndex()), cls)
    assert isinstance(SchedulerCore(SchedulerPolicy(routing=name)).router, cls)


def test_the_policy_names_exactly_the_registered_strategies():
    assert set(get_args(get_type_hints(SchedulerPolicy)["routing"])) == set(ROUTERS)


def test_an_unknown_routing_name_fails_clearly():
    policy = SchedulerPolicy(routing="fastest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown routing policy 'fastest'.*dynamo, kv"):
        make_router(policy, KvIndex())
    with pytest.raises(ValueError, match="fastest"):
        SchedulerCore(policy)


_worker = st.tuples(
    st.integers(1, 4),  # max_num_seqs
    st.integers(0, 4),  # assigned
    st.integers(0, 4),  # foreign
    st.sampled_from(["ready", "draining"]),
    st.sampled_from([0, 300, 3000]),  # kv_capacity_tokens
    st.integers(0, 400),  # assigned tokens per request
    st.lists(st.integers(1, 4), max_size=4),  # KV blocks it reported
)


@pytest.mark.parametrize("name", sorted(ROUTERS))
@settings(max_examples=150, deadline=None, database=None)
@given(
    workers=st.lists(_worker, min_size=1, max_size=6),
    blocks=st.lists(st.integers(1, 4), max_size=5),
    tokens=st.lists(st.integers(1, 800), min_size=1, max_size=6),
)
def test_every_strategy_chooses_a_worker_that_can_take_the_request(name, workers, blocks, tokens):
    """The same contract for all: one of the free workers (never one without room),
    and the number of leading blocks it holds by the index."""
    kv = KvIndex()
    policy = SchedulerPolicy(routing=name)
    router = make_router(policy, kv)
    candidates = []
    for i, (seqs, n, foreign, state, cap, per, held) in enumerate(workers):
        wid = f"w{i}"
        candidates.append(
            Worker(
                worker_id=wid,
                models=["m"],
                max_num_seqs=seqs,
                state=state,
                last_seen=0.0,
                kv_capacity_tokens=cap,
                assigned={f"{wid}.{j}" for j in range(n)},
                assigned_tokens=n * per,
                assigned_seqs=n,
                foreign={f"{wid}.f{j}" for j in range(foreign)},
            )
        )
        if held:
            kv.on_event(KvBlocksStored(worker_id=wid, block_hashes=held))
    pool = Pool(candidates)
    for t in tokens:  # several decisions: round robin's rotation moves between them
        free = [w for w in candidates if w.can_take(t)]
        found = router.choose("m", blocks, pool, lambda w, t=t: w.can_take(t))
        if not free:
            assert found is None
            continue
        assert found is not None
        chosen, hits = found
        assert any(chosen is w for w in free)
        assert chosen.can_take(t)
        if router.uses_prefix:
            assert hits == kv.overlaps(blocks, [chosen.worker_id])[chosen.worker_id]
        else:
            assert hits == 0


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_every_strategy_leaves_full_workers_alone_in_the_core(name):
    core = SchedulerCore(SchedulerPolicy(routing=name, max_load_skew=10.0))
    for w, seqs in (("a", 1), ("b", 2), ("c", 3)):
        core.on_heartbeat(hb(w, seqs=seqs), 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="a", block_hashes=[1, 2]))  # a is small
    placed = [e.worker_id for i in range(8) for e in core.on_accepted(req(f"r{i}", [1, 2]), 0.0)]
    assert sorted(placed) == ["a", "b", "b", "c", "c", "c"]  # six slots, two left queued
    assert all(core.is_queued(f"r{i}") for i in (6, 7))
