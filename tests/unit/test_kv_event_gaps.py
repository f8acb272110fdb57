"""KV events are published without waiting for JetStream's ack, so some can be lost
(issue 40: up to 1,010 of 200,000 in a burst). Numbered per worker, a gap tells the
scheduler's index to drop what that worker's events had said: a lost removal would
otherwise leave blocks believed cached that are not."""

from __future__ import annotations

from inferbus.contracts import KvBlocksRemoved, KvBlocksStored
from inferbus.services.scheduler.kvindex import KvIndex


def stored(seq: int, *hashes: int, worker: str = "w1") -> KvBlocksStored:
    return KvBlocksStored(worker_id=worker, seq=seq, block_hashes=list(hashes))


def test_a_lost_kv_event_drops_what_the_worker_had_reported():
    kv = KvIndex()
    kv.on_event(stored(1, 10, 11))
    kv.on_event(stored(1, 10, 11, worker="w2"))
    kv.on_event(stored(2, 12))
    assert kv.overlaps([10, 11, 12], ["w1", "w2"]) == {"w1": 3, "w2": 2}
    # seq 3 (a removal of 10) was lost: 10 would stay believed
    kv.on_event(stored(4, 20))
    assert kv.gaps == 1
    assert kv.overlaps([10, 11], ["w1", "w2"]) == {"w1": 0, "w2": 2}  # w2 untouched
    assert kv.overlaps([20], ["w1"]) == {"w1": 1}  # the event after the gap counts


def test_a_redelivered_or_unnumbered_event_is_no_gap():
    kv = KvIndex()
    kv.on_event(stored(1, 10))
    kv.on_event(stored(2, 11))
    kv.on_event(stored(1, 10))  # delivered again
    kv.on_event(KvBlocksRemoved(worker_id="w1", seq=3, block_hashes=[11]))
    assert kv.gaps == 0 and kv.overlaps([10], ["w1"]) == {"w1": 1}
    kv.on_event(KvBlocksStored(worker_id="old", block_hashes=[5]))  # from an older worker
    kv.on_event(KvBlocksStored(worker_id="old", block_hashes=[6]))
    assert kv.gaps == 0 and kv.overlaps([5, 6], ["old"]) == {"old": 2}
