"""A worker's KV events as few messages, in order, each under the size limit."""

from __future__ import annotations

from inferbus.contracts import KvAllCleared, KvBlocksRemoved, KvBlocksStored, KvEventBatch
from inferbus.services.worker.kvbatch import kv_batches
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
