"""The scheduler's KV index stored as parts and loaded back by a new one."""

from __future__ import annotations

from inferbus.contracts import KvBlocksRemoved, KvBlocksStored
from inferbus.services.scheduler import kvsnapshot
from inferbus.services.scheduler.kvindex import KvIndex


def _index() -> KvIndex:
    kv = KvIndex()
    kv.on_event(
        KvBlocksStored(worker_id="a.1", block_hashes=list(range(1, 12)), block_size=16, seq=1)
    )
    kv.on_event(KvBlocksRemoved(worker_id="a.1", block_hashes=[11], seq=2))
    kv.on_event(KvBlocksStored(worker_id="b.2", block_hashes=[1, 2, 2**64 - 1], seq=1))
    kv.on_event(KvBlocksStored(worker_id="b.2", block_hashes=[3], medium="CPU", seq=2))
    return kv


def test_a_stored_index_loads_as_it_was_and_its_counts_go_on():
    before = _index()
    parts = kvsnapshot.snapshot(before, stream_seq=40, part_blocks=4)
    assert len([k for k in parts if k.startswith("a.1.cache.")]) == 3  # 10 blocks, 4 a part
    after = KvIndex()
    assert kvsnapshot.load(after, parts.values()) == 40
    blocks = [1, 2, 3, 4, 5]
    assert after.overlaps(blocks, ["a.1", "b.2"]) == before.overlaps(blocks, ["a.1", "b.2"])
    assert after.restorable(blocks, {"b.2": 2}) == {"b.2": 1}  # its spilled block
    assert after.blocks() == before.blocks() and after.block_size(["a.1"]) == 16
    # IB_KV read on from the position: an event the part covers is passed over, the
    # next is applied, a skipped one is a gap
    after.on_event(KvBlocksStored(worker_id="a.1", block_hashes=[99], seq=2))
    assert after.holder_count(99) == 0
    after.on_event(KvBlocksStored(worker_id="a.1", block_hashes=[99], seq=3))
    assert after.holder_count(99) == 1 and after.gaps == 0
    after.on_event(KvBlocksStored(worker_id="b.2", block_hashes=[98], seq=9))
    assert after.gaps == 1


def test_parts_of_two_rounds_read_on_from_the_earlier_and_a_torn_worker_is_left_out():
    old = kvsnapshot.snapshot(_index(), stream_seq=10, part_blocks=4)
    new_index = _index()
    new_index.on_event(KvBlocksStored(worker_id="b.2", block_hashes=[1000], seq=3))
    new = kvsnapshot.snapshot(new_index, stream_seq=20, part_blocks=4)
    mixed = {**old, **{k: v for k, v in new.items() if k.startswith("b.2.")}}
    kv = KvIndex()
    assert kvsnapshot.load(kv, mixed.values()) == 10
    assert kv.holder_count(1000) == 1
    # a.1's parts from two rounds: it is left out, b.2 loads
    torn = {**old, "a.1.cache.0": new["a.1.cache.0"]}
    kv = KvIndex()
    kvsnapshot.load(kv, torn.values())
    assert kv.overlaps([1, 2], ["a.1", "b.2"]) == {"a.1": 0, "b.2": 2}
    del old["a.1.cache.1"]  # a part missing: left out too
    kv = KvIndex()
    kvsnapshot.load(kv, old.values())
    assert kv.overlaps([1], ["a.1"]) == {"a.1": 0}
    assert kvsnapshot.load(KvIndex(), []) == 0


def test_a_worker_id_a_key_may_not_hold_is_kept_whole_in_its_part():
    kv = KvIndex()
    kv.on_event(KvBlocksStored(worker_id="w 1*", block_hashes=[5], seq=1))
    [(key, part)] = kvsnapshot.snapshot(kv, stream_seq=1).items()
    assert key == "w_1_.cache.0" and part.worker_id == "w 1*"


def test_a_hash_out_of_range_is_left_out_not_the_whole_snapshot():
    kv = KvIndex()
    kv.on_event(KvBlocksStored(worker_id="w", block_hashes=[5, -1, 2**64], seq=1))
    [part] = kvsnapshot.snapshot(kv, stream_seq=1).values()
    loaded = KvIndex()
    kvsnapshot.load(loaded, [part])
    assert loaded.blocks() == 1 and loaded.holder_count(5) == 1
