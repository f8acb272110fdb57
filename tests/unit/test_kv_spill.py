"""KV spill without an engine: LRU-K on access patterns with scans, the host and disk
tiers with their faults (full, failing, damaged blocks, a restart), and the
connector's scheduler-side planning of restores and saves."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit.tmpfs import tmpfs

from inferbus.services.worker.spill.plan import (
    Restore,
    SpillPlanner,
    block_key,
    hash_of,
    namespace_of,
)
from inferbus.services.worker.spill.store import DISK, HOST, SHARED, StoreConfig, TieredStore
from inferbus.shared.kvblocks import CorruptBlock, block_path, decode_block, encode_block
from inferbus.shared.lruk import AdaptiveLruK, LruK

CORPORA = Path(__file__).resolve().parents[2] / "bench" / "corpora"

# -- LRU-K -----------------------------------------------------------------------------


def hit_rate(policy: LruK, trace: list[int]) -> float:
    hits = 0
    for key in trace:
        if policy.access(key):
            hits += 1
        else:
            policy.admit(key, 1)
    return hits / len(trace)


def test_lru_k_keeps_the_hot_set_through_a_scan():
    cache = LruK(capacity_bytes=10, k=2)
    for _ in range(3):  # ten hot keys, each used three times
        for key in range(10):
            if not cache.access(key):
                cache.admit(key, 1)
    for key in range(1000, 1100):  # a scan: a hundred keys read once
        assert not cache.access(key)
        cache.admit(key, 1)
    # the scan churned through one slot; nine of ten hot keys are still there
    assert sum(key in cache for key in range(10)) == 9
    assert len(cache) == 10 and cache.used == 10


def test_lru_k_beats_lru_on_a_loop_with_scans():
    rng = random.Random(3)
    trace: list[int] = []
    for _ in range(200):
        trace += rng.sample(range(50), 10)  # a hot set of 50
        trace += [rng.randrange(10**6, 10**7) for _ in range(20)]  # one-time scans
    lru_k = hit_rate(LruK(60, k=2), trace)
    lru = hit_rate(LruK(60, k=1), trace)  # K=1 is plain LRU
    assert lru_k > 2 * lru, (lru_k, lru)


def test_lru_k_remembers_an_evicted_keys_history():
    cache = LruK(capacity_bytes=2, k=2)
    cache.admit("a", 1)
    cache.access("a")  # a: two references
    cache.admit("b", 1)
    assert cache.admit("c", 1) == ["b"]  # b has one reference: it goes first
    assert cache.admit("d", 1) == ["c"]
    cache.access("b")  # a miss, but the history counts it
    cache.admit("b", 1)  # b now has two references: d (one) goes
    assert "d" not in cache and {"a", "b"} <= set(cache)


def conversations(rng: random.Random, turns: int = 400) -> list[int]:
    """Each turn re-reads its conversation's blocks and adds two: most blocks are read
    again soon, once or twice (recency wins: LRU-K evicts the fresh blocks first)."""
    live: list[list[int]] = []
    trace: list[int] = []
    fresh = iter(range(10**6, 10**9))
    for _ in range(turns):
        if not live or rng.random() < 0.3:
            live.append([])
            live = live[-8:]
        chat = rng.choice(live)
        chat += [next(fresh), next(fresh)]
        trace += chat
    return trace


def loop_with_scans(rng: random.Random) -> list[int]:
    trace: list[int] = []
    for _ in range(200):
        trace += rng.sample(range(50), 10)  # a hot set of 50
        trace += [rng.randrange(10**6, 10**7) for _ in range(20)]  # one-time scans
    return trace


def test_the_adaptive_policy_follows_the_better_expert():
    rng = random.Random(5)
    chats = conversations(rng)
    lru, lru_k = hit_rate(LruK(40, k=1), chats), hit_rate(LruK(40, k=2), chats)
    adaptive = AdaptiveLruK(40, k=2)
    assert lru > lru_k and hit_rate(adaptive, chats) >= 0.99 * lru
    assert adaptive.leader() == "lru"
    scans = loop_with_scans(rng)
    adaptive = AdaptiveLruK(60, k=2)
    assert hit_rate(adaptive, scans) >= 0.97 * hit_rate(LruK(60, k=2), scans)
    assert adaptive.leader() == "lru-k"


def test_the_adaptive_policy_holds_what_its_leader_would_after_a_change_of_workload():
    rng = random.Random(7)
    cache = AdaptiveLruK(60, k=2)
    switches, last = 0, cache.leader()
    for key in conversations(rng) + loop_with_scans(rng):
        if not cache.access(key):
            cache.admit(key, 1)
        switches += cache.leader() != last
        last = cache.leader()
    assert cache.leader() == "lru-k" and switches <= 3  # it follows, without flapping
    follower = LruK(60, k=2)
    for key in loop_with_scans(random.Random(8)):
        if not follower.access(key):
            follower.admit(key, 1)
    hot = set(range(50))
    # the hot set survives the scans as it does under LRU-K alone
    assert len(hot & set(cache)) >= len(hot & set(follower)) - 2


def test_the_adaptive_policy_is_never_below_both_experts_on_the_synthetic_trace():
    """Mooncake's synthetic trace at 2% capacity: LeCaR's mix of the two experts'
    victims (the policy before this one) hit 0.074 of the reads, below LRU (0.076)
    and LRU-2 (0.080)."""
    trace = gzip.decompress((CORPORA / "mooncake_synthetic_trace.jsonl.gz").read_bytes())
    reads = [b for line in trace.decode().splitlines() for b in json.loads(line)["hash_ids"]]
    capacity = len(set(reads)) // 50
    adaptive = hit_rate(AdaptiveLruK(capacity, k=2), reads)
    experts = hit_rate(LruK(capacity, k=1), reads), hit_rate(LruK(capacity, k=2), reads)
    assert adaptive >= max(experts), (adaptive, experts)


def test_room_made_for_a_key_is_made_where_the_leader_would_make_it():
    cache = AdaptiveLruK(3, k=2)
    for key in "abc":
        cache.admit(key, 1)
    for _ in range(2):
        cache.access("a")  # LRU-K and LRU both keep a; b is oldest to both
    assert cache.victims(1, "d") == ["b"] and cache.used == 2
    assert cache.admit("d", 1) == [] and set(cache) == {"a", "c", "d"}
    assert cache.victims(4, "huge") == [] and len(cache) == 3  # never fits: nothing goes


def test_the_adaptive_policy_keeps_its_bound_and_api():
    cache = AdaptiveLruK(capacity_bytes=100, k=2)
    assert cache.admit("big", 101) == ["big"]
    for i in range(10):
        cache.admit(i, 30)
        assert cache.used <= 100
    assert len(cache) == 3 and set(cache) == {7, 8, 9}
    assert len(cache.victims(40)) == 1 and cache.used == 60
    gone = next(iter(cache))
    assert cache.remove(gone) and gone not in cache and not cache.remove(gone)
    left = set(cache)
    assert left and set(cache.clear()) == left
    assert len(cache) == 0 and cache.used == 0


def test_lru_k_sizes_and_oversized_items():
    cache = LruK(capacity_bytes=100, k=2)
    assert cache.admit("big", 101) == ["big"] and "big" not in cache
    cache.admit("x", 60)
    evicted = cache.admit("y", 60)
    assert evicted == ["x"] and cache.used == 60
    assert cache.remove("y") and cache.used == 0 and not cache.remove("y")
    with pytest.raises(ValueError):
        LruK(10, k=0)


# -- the tiers ---------------------------------------------------------------------------


def store(tmp_path: Path, host: int = 1000, disk: int = 10_000, **kw: object) -> TieredStore:
    return TieredStore(
        StoreConfig(host_bytes=host, disk_dir=str(tmp_path / "disk"), disk_bytes=disk, **kw)  # type: ignore[arg-type]
    )


def key(i: int) -> str:
    return block_key("ns", i.to_bytes(32, "little"))  # its folder: the first byte


def test_the_block_codec_refuses_damaged_and_misplaced_blocks():
    data = encode_block(key(1), b"x" * 100)
    assert decode_block(key(1), data, 100) == b"x" * 100
    with pytest.raises(CorruptBlock, match="checksum"):
        decode_block(key(1), data[:-1] + b"y")
    with pytest.raises(CorruptBlock, match="another block"):
        decode_block(key(2), data)
    with pytest.raises(CorruptBlock, match="payload bytes"):
        decode_block(key(1), data[:-10])
    with pytest.raises(CorruptBlock, match="payload bytes"):
        decode_block(key(1), data, expected_len=99)
    with pytest.raises(CorruptBlock, match="shorter"):
        decode_block(key(1), b"IBKV")


def test_a_block_is_written_through_and_read_back_from_either_tier(tmp_path):
    s = store(tmp_path, host=250)
    for i in range(3):
        s.put(key(i), bytes([i]) * 100)
    s.flush()
    # host memory holds two (250 bytes); disk all three
    assert s.usage()[HOST][0] == 200 and s.usage()[DISK][0] == 300
    assert s.get(key(2), 100) == (b"\x02" * 100, HOST)
    assert s.get(key(0), 100) == (b"\x00" * 100, DISK)  # evicted from host, read from disk
    assert s.get(key(0), 100) == (b"\x00" * 100, HOST)  # and promoted
    assert s.get(key(9)) is None
    events = {(e.key, e.tier, e.stored) for e in s.drain_events()}
    assert (key(0), HOST, False) in events and (key(2), DISK, True) in events
    assert s.stats[DISK].restores == 1 and s.stats[HOST].restores == 2
    s.close()


def test_a_restarted_worker_finds_its_disk_tier(tmp_path):
    s = store(tmp_path)
    s.put(key(1), b"a" * 100)
    s.close()
    again = store(tmp_path, host=0)
    assert (key(1), DISK, True) in {(e.key, e.tier, e.stored) for e in again.drain_events()}
    assert again.get(key(1), 100) == (b"a" * 100, DISK)
    again.close()


def test_a_damaged_block_on_disk_is_a_miss_and_is_deleted(tmp_path):
    s = store(tmp_path, host=0)
    s.put(key(1), b"a" * 100)
    s.flush()
    path = block_path(tmp_path / "disk", key(1))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert s.get(key(1), 100) is None
    assert not path.exists() and not s.holds(key(1))
    assert s.stats[DISK].corrupt == 1
    assert (key(1), DISK, False) in {(e.key, e.tier, e.stored) for e in s.drain_events()}
    s.close()


def test_the_disk_tier_evicts_within_its_bound(tmp_path):
    s = store(tmp_path, host=0, disk=350)
    for i in range(5):
        s.put(key(i), b"z" * 100)
        s.flush()
    assert s.usage()[DISK][0] == 300
    files = list((tmp_path / "disk").glob("*/*/*.kv"))
    assert len(files) == 3
    s.close()


def test_a_failing_disk_degrades_to_host_memory_only(tmp_path):
    now = [0.0]
    s = TieredStore(
        StoreConfig(
            host_bytes=1000, disk_dir=str(tmp_path / "disk"), disk_bytes=10_000, failing_after=2
        ),
        clock=lambda: now[0],
    )
    s.put(key(0), b"a" * 100)
    s.flush()
    # every new write fails from here (a file where the folders go: fails as root too)
    for i in range(1, 4):
        (tmp_path / "disk" / "ns" / f"{i:02x}").write_text("not a folder")
    for i in range(1, 4):
        s.put(key(i), b"b" * 100)
        s.flush()
    assert s.disk_failing()
    assert s.stats[DISK].errors == 2 and s.stats[DISK].dropped >= 2
    # the disk's blocks stopped being restorable; host memory still serves
    assert (key(0), DISK, False) in {(e.key, e.tier, e.stored) for e in s.drain_events()}
    assert s.get(key(3), 100) == (b"b" * 100, HOST)
    now[0] = 31.0  # after the retry period the disk is tried again
    assert not s.disk_failing()
    s.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a disk that really fills (ENOSPC); mounting needs root."""
    with tmpfs(tmp_path / "small", "64k") as where:
        yield where


def test_a_full_disk_degrades_to_host_memory_only(small_disk):
    """The tier's bound (1 MiB) is above what the filesystem holds (64 KiB): writes
    fail with ENOSPC part-way through a block, and nothing but whole blocks stays."""
    now = [0.0]
    s = TieredStore(
        StoreConfig(
            host_bytes=1 << 20, disk_dir=str(small_disk), disk_bytes=1 << 20, failing_after=2
        ),
        clock=lambda: now[0],
    )
    for i in range(12):
        s.put(key(i), bytes([i]) * 10_000)
        s.flush()
    assert s.disk_failing() and s.stats[DISK].errors == 2 and s.stats[DISK].dropped >= 2
    assert not list(small_disk.rglob("*.tmp"))  # no half-written block left behind
    assert all(s.get(key(i), 10_000) == (bytes([i]) * 10_000, HOST) for i in range(12))
    gone = {e.key for e in s.drain_events() if e.tier == DISK and not e.stored}
    assert gone  # what it held on disk stopped being offered
    s.close()


def test_a_full_write_queue_drops_saves_and_never_blocks(tmp_path):
    s = store(tmp_path, write_queue=1)
    s._queue.put(("blocker", b""))  # the writer is busy
    for i in range(5):
        s.put(key(i), b"q" * 10)
    assert s.stats[DISK].dropped >= 3
    assert all(s.get(key(i), 10) is not None for i in range(5))  # host memory has them
    s.close()


def test_another_worker_restores_from_the_shared_tier(tmp_path):
    shared = tmp_path / "shared"
    a = TieredStore(
        StoreConfig(host_bytes=1000, disk_dir=str(tmp_path / "a"), shared_dir=str(shared))
    )
    b = TieredStore(
        StoreConfig(host_bytes=1000, disk_dir=str(tmp_path / "b"), shared_dir=str(shared))
    )
    a.put(key(1), b"s" * 100)
    a.flush()
    assert b.shared_holds(key(1)) and not b.holds(key(1))
    path = block_path(shared, key(1))
    os.utime(path, (0, path.stat().st_mtime))
    assert b.get(key(1), 100) == (b"s" * 100, SHARED)
    assert path.stat().st_atime > 0  # marked: a reference, for the kvspill service
    assert b.get(key(1), 100) == (b"s" * 100, HOST)  # promoted to b's host memory
    assert b.stats[SHARED].restores == 1 and a.stats[SHARED].saves == 1
    # a damaged shared block is a miss, and is deleted for all
    a.put(key(2), b"t" * 100)
    a.flush()
    block_path(shared, key(2)).write_bytes(b"IBKV garbage")
    assert b.get(key(2), 100) is None and not block_path(shared, key(2)).exists()
    assert b.stats[SHARED].corrupt == 1
    # the owner evicted one: a plain miss, no fault
    a.put(key(3), b"u" * 100)
    a.flush()
    block_path(shared, key(3)).unlink()
    assert b.get(key(3), 100) is None and b.stats[SHARED].errors == 0
    a.close()
    b.close()


def test_an_unwritable_shared_tier_drops_saves_and_serves_on(tmp_path):
    (tmp_path / "shared").write_text("a file where the folder goes")
    s = TieredStore(StoreConfig(host_bytes=1000, shared_dir=str(tmp_path / "shared")))
    for i in range(4):
        s.put(key(i), b"v" * 10)
    s.flush()
    assert s.stats[SHARED].dropped == 4 and s.stats[SHARED].errors == 3
    assert s.disk_failing(SHARED)
    assert s.get(key(0), 10) == (b"v" * 10, HOST)
    s.close()


# -- the scheduler side's plan ----------------------------------------------------------


def hashes(n: int, salt: int = 0) -> list[bytes]:
    return [(salt * 1000 + i).to_bytes(32, "big") for i in range(n)]


def test_the_planner_saves_each_block_once_it_is_full():
    p = SpillPlanner(block_size=4)
    h = hashes(3)
    assert p.match("r", "ns", h, num_tokens=10, num_computed=0) == 0
    # 6 of 10 prompt tokens this step: block 0 is full
    plan = p.step([("r", h, [7, 8, 9], 6)])
    assert [(s.block_id, s.key) for s in plan.saves] == [(7, block_key("ns", h[0]))]
    plan = p.step([("r", h, [7, 8, 9], 10)])
    assert [s.block_id for s in plan.saves] == [8]
    # the block being saved is not planned twice by another request
    p.match("r2", "ns", h, num_tokens=10, num_computed=0)
    assert p.step([("r2", h, [1, 2, 3], 10)]).saves == []


def test_the_planner_restores_whole_blocks_in_a_row_and_leaves_one_token():
    p = SpillPlanner(block_size=4)
    h = hashes(3)
    p.reported([(block_key("ns", x), HOST, True) for x in h], {})
    # 12 tokens: the last block must be computed (one token to sample from)
    assert p.match("r", "ns", h, num_tokens=12, num_computed=0) == 8
    assert p.match("r", "ns", h, num_tokens=13, num_computed=0) == 12
    # the engine's own cache had the first block: only the rest is restored
    assert p.match("r", "ns", h, num_tokens=13, num_computed=4) == 8
    p.allocated("r", h, [5, 6, 7], external_tokens=8)
    plan = p.step([("r", h, [5, 6, 7], 13)])
    assert [(t.block_id, t.key) for t in plan.loads] == [
        (6, block_key("ns", h[1])),
        (7, block_key("ns", h[2])),
    ]
    assert plan.saves == []  # restored blocks are not saved again
    # a gap stops the run; another namespace (other weights) matches nothing
    p.reported([(block_key("ns", h[1]), HOST, False)], {})
    assert p.match("x", "ns", h, num_tokens=13, num_computed=0) == 4
    assert p.match("y", "other", h, num_tokens=13, num_computed=0) == 0


def test_the_planner_tracks_tiers_and_reports_changes_once():
    p = SpillPlanner(block_size=4)
    k = block_key("ns", hashes(1)[0])
    assert p.reported([(k, HOST, True), (k, DISK, True), (k, HOST, True)], {}) == [
        (k, HOST, True),
        (k, DISK, True),
    ]
    assert p.reported([(k, HOST, False)], {}) == [(k, HOST, False)]
    assert p.restorable(k)  # still on disk
    p.reported([(k, DISK, False)], {})
    assert not p.restorable(k) and len(p) == 0
    p.reported([(k, DISK, True)], {})
    assert p.forget_all() == [(k, DISK, False)] and not p.restorable(k)


def test_a_finished_request_says_what_it_restored():
    p = SpillPlanner(block_size=4)
    p.match("r", "ns", hashes(2), num_tokens=9, num_computed=0)
    p.reported([], {"r": Restore(blocks=2, bytes=64, seconds=0.5, tiers={DISK: 2})})
    p.reported([], {"r": Restore(failed=1)})
    done = p.finished("r")
    assert done is not None and done.as_dict() == {
        "blocks": 2,
        "bytes": 64,
        "seconds": 0.5,
        "tiers": {DISK: 2},
        "failed": 1,
        "timed": True,
    }
    assert p.finished("r") is None


def test_a_request_that_ends_in_its_restore_step_still_says_what_was_planned():
    p = SpillPlanner(block_size=4)
    h = hashes(2)
    p.reported([(block_key("ns", x), HOST, True) for x in h], {})
    assert p.match("r", "ns", h, num_tokens=9, num_computed=0) == 8
    p.allocated("r", h, [1, 2], external_tokens=8)
    p.step([("r", h, [1, 2], 9)])
    done = p.finished("r")  # before the worker side's report of this step
    assert done is not None and (done.blocks, done.timed) == (2, False)


def test_a_save_the_worker_never_confirmed_is_planned_again_later():
    p = SpillPlanner(block_size=4, pending_steps=2)
    h = hashes(1)
    p.match("r", "ns", h, num_tokens=5, num_computed=0)
    assert len(p.step([("r", h, [1], 4)]).saves) == 1
    p.match("r2", "ns", h, num_tokens=5, num_computed=0)
    assert p.step([("r2", h, [2], 4)]).saves == []  # pending
    p.step([])
    p.step([])
    p.match("r3", "ns", h, num_tokens=5, num_computed=0)
    assert len(p.step([("r3", h, [3], 4)]).saves) == 1  # dropped save: planned again


def test_a_block_that_failed_to_load_is_saved_once_computed():
    p = SpillPlanner(block_size=4)
    h = hashes(3)
    p.reported([(block_key("ns", x), DISK, True) for x in h], {})
    assert p.match("r", "ns", h, num_tokens=13, num_computed=0) == 12
    p.allocated("r", h, [1, 2, 3], external_tokens=12)
    assert len(p.step([("r", h, [1, 2, 3], 13)]).loads) == 3
    # block 1 was damaged: the worker dropped it and reports the failure
    p.reported([(block_key("ns", h[1]), DISK, False)], {"r": Restore(blocks=2, failed=1)})
    # the engine computes from block 1 on; once it has, block 1 is saved again
    plan = p.step([("r", h, [1, 2, 3], 13)])
    assert [(s.block_id, s.key) for s in plan.saves] == [(2, block_key("ns", h[1]))]


def test_the_planner_restores_from_the_shared_tier_it_can_see(tmp_path):
    h = hashes(2)
    on_shared = {block_key("ns", h[0]), block_key("ns", h[1])}
    p = SpillPlanner(block_size=4, shared=on_shared.__contains__)
    assert p.match("r", "ns", h, num_tokens=9, num_computed=0) == 8
    on_shared.discard(block_key("ns", h[1]))  # the kvspill service evicted it
    assert p.match("r", "ns", h, num_tokens=9, num_computed=0) == 4


def test_keys_name_weights_and_hash():
    ns = namespace_of("model", "v2")
    assert ns != namespace_of("model", "v3") and len(ns) == 16
    assert hash_of(block_key(ns, b"\x01" * 32)) == b"\x01" * 32
