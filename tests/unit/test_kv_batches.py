"""A worker's KV events as few messages, in order, each under the size limit."""

from __future__ import annotations

from inferbus.contracts import KvAllCleared, KvBlocksRemoved, KvBlocksStored, KvEventBatch
from inferbus.services.scheduler.kvindex import KvIndex
from inferbus.services.worker.kvbatch import KvMirror, kv_batches
from inferbus.shared.codec import decode


def _events(n: int) -> list:
    out: list = []
    for i in range(n):
        cls = KvBlocksStored if i % 3 else KvBlocksRemoved
        out.append(cls(worker_id="w", block_hashes=list(range(i * 50, i * 50 + 50)), seq=i + 1))
    return out


def test_one_step_s_events_are_one_message():
    events = [*_events(20), KvAllCleared(worker_id="w", seq=21)]
    [data] = list(kv_batches("w", events))
    batch = decode(data, KvEventBatch)
    assert batch.worker_id == "w" and batch.events == events


def test_a_batch_past_the_limit_is_split_in_order():
    events = _events(64)
    whole = len(next(kv_batches("w", events)))
    parts = [decode(d, KvEventBatch) for d in kv_batches("w", events, limit=whole // 5)]
    assert len(parts) > 5
    assert all(len(d) <= whole // 5 for d in kv_batches("w", events, limit=whole // 5))
    assert [e.seq for p in parts for e in p.events] == list(range(1, 65))


def test_an_event_bigger_than_the_limit_goes_alone():
    big = KvBlocksStored(worker_id="w", block_hashes=list(range(10_000)), seq=1)
    small = KvBlocksRemoved(worker_id="w", block_hashes=[1], seq=2)
    parts = [decode(d, KvEventBatch).events for d in kv_batches("w", [big, small], limit=1000)]
    assert parts == [[big], [small]]
    assert list(kv_batches("w", [])) == []


def test_a_scheduler_that_missed_events_gets_the_worker_s_whole_state_again():
    """The worker's mirror of its own events, sent as a resync after a gap, leaves the
    scheduler's index with what the worker holds: its cache and its spill tier."""
    mirror, index, seq = KvMirror(), KvIndex(), 0

    def publish(events, lost=False):
        nonlocal seq
        mirror.apply(events)
        for e in events:
            seq += 1
            e.seq = seq
            if not lost:
                index.on_event(e)

    publish([KvBlocksStored(worker_id="w", block_hashes=[1, 2, 3], block_size=16)])
    publish([KvBlocksStored(worker_id="w", block_hashes=[7], medium="CPU")])
    publish([KvBlocksRemoved(worker_id="w", block_hashes=[3])], lost=True)  # never stored
    publish([KvBlocksStored(worker_id="w", block_hashes=[4], block_size=16)])
    assert index.gaps == 1 and index.take_resyncs(0.0) == {"w": 4}
    assert index.take_resyncs(0.0) == {}
    # the index forgot what it believed; the worker answers with all it holds
    for e in mirror.resync("w"):
        seq += 1
        e.seq = seq
        index.on_event(e)
    assert index.overlaps([1, 2, 3], ["w"]) == {"w": 2}  # 3 was removed
    assert index.holders(4) == {"w"} and index.restorable([7], {"w": 0}) == {"w": 1}
    assert index.gaps == 1


def test_the_mirror_keeps_spill_tiers_through_a_cleared_cache_and_splits_big_sets():
    mirror = KvMirror()
    mirror.apply(
        [
            KvBlocksStored(worker_id="w", block_hashes=list(range(25_000)), block_size=16),
            KvBlocksStored(worker_id="w", block_hashes=[1], medium="STORAGE"),
        ]
    )
    events = mirror.resync("w")
    assert isinstance(events[0], KvAllCleared)
    assert [len(e.block_hashes) for e in events[1:]] == [10_000, 10_000, 5_000, 1]
    mirror.apply([KvAllCleared(worker_id="w")])
    assert [e.medium for e in mirror.resync("w")[1:]] == ["STORAGE"]


def test_a_worker_is_asked_again_at_most_every_five_seconds():
    index = KvIndex()
    for seq in (1, 3):  # 2 missed
        index.on_event(KvBlocksStored(worker_id="w", block_hashes=[seq], seq=seq))
    assert index.take_resyncs(10.0) == {"w": 3}
    index.on_event(KvBlocksStored(worker_id="w", block_hashes=[9], seq=9))  # 4 to 8 missed
    assert index.take_resyncs(12.0) == {}  # asked 2 s ago: its answer may be on the way
    assert index.take_resyncs(15.0) == {"w": 9}
    index.on_event(KvBlocksStored(worker_id="w", block_hashes=[11], seq=11))
    index.drop_worker("w")
    assert index.take_resyncs(30.0) == {}  # gone: not asked
