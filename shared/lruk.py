"""LRU-K eviction (O'Neil, O'Neil and Weikum, 1993), bounded in bytes, free of I/O,
and ``AdaptiveLruK``, which the KV spill tiers use: LRU-K that hands eviction to LRU
where the workload rewards recency.

The victim is the entry whose K-th most recent reference is oldest. An entry
referenced fewer than K times has an infinite backward K-distance and goes first
(least recently referenced first), so a scan (blocks read once) only ever replaces
other once-read blocks and never pushes out the ones used again and again. The
reference history of an evicted key is kept for a while (the "retained information
period"), so a block that returns soon after its eviction counts its earlier uses.

Time is a logical clock: one tick per reference, so the policy is deterministic and
needs no clock passed in.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Entry:
    size: int
    refs: list[int] = field(default_factory=list)
    """The last K reference ticks, oldest first."""
    token: int = 0
    """The heap item that currently stands for this entry (older ones are stale)."""


class LruK:
    def __init__(self, capacity_bytes: int, k: int = 2, history: int | None = None) -> None:
        if capacity_bytes < 0 or k < 1:
            raise ValueError("capacity must be >= 0 and k >= 1")
        self.capacity = capacity_bytes
        self.k = k
        self.used = 0
        self._entries: dict[Hashable, _Entry] = {}
        self._heap: list[tuple[int, int, int, Hashable]] = []
        self._tick = 0
        self._tokens = 0
        self._history: OrderedDict[Hashable, list[int]] = OrderedDict()
        self._history_limit = history
        """Keys whose history is retained after eviction (default: four times as many
        as are resident; measured on the Mooncake trace, bench/kvspill_policy.py)."""

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._entries)

    def size_of(self, key: Hashable) -> int:
        return self._entries[key].size

    def access(self, key: Hashable) -> bool:
        """A reference to ``key``: a hit (True) updates its history; a miss records
        the reference in the retained history (so an admission soon after counts it)."""
        self._tick += 1
        entry = self._entries.get(key)
        if entry is None:
            refs = self._history.pop(key, [])
            refs.append(self._tick)
            self._history[key] = refs[-self.k :]
            self._trim_history()
            return False
        self._reference(key, entry)
        return True

    def admit(self, key: Hashable, size: int) -> list[Hashable]:
        """Insert (or re-reference) ``key`` of ``size`` bytes; returns the keys evicted
        to make room. An item larger than the whole capacity is not admitted: it is
        returned as evicted itself."""
        if key in self._entries:
            self.access(key)
            return []
        if size > self.capacity:
            return [key]
        refs = self._history.pop(key, [])
        entry = _Entry(size=size, refs=refs)
        evicted = self._make_room(size, keep=key)
        self._entries[key] = entry
        self.used += size
        if refs and refs[-1] == self._tick:
            # the miss that led to this admission was this same reference
            self._requeue(key, entry)
        else:
            self._tick += 1
            self._reference(key, entry)
        return evicted

    def remove(self, key: Hashable) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.used -= entry.size
        return True

    def clear(self) -> list[Hashable]:
        keys = list(self._entries)
        self._entries.clear()
        self._heap.clear()
        self.used = 0
        return keys

    def victims(self, size: int) -> list[Hashable]:
        """Evict until ``size`` more bytes fit; returns the evicted keys."""
        return self._make_room(size)

    def pop_victim(self, keep: Hashable = None) -> Hashable | None:
        """Evict the one entry LRU-K would (never ``keep``); its history is retained."""
        while self._heap:
            _, _, token, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry.token != token or key == keep:
                continue  # stale: re-referenced or removed since
            self.evict(key)
            return key
        return None

    def evict(self, key: Hashable) -> None:
        """Evict ``key`` (chosen by someone else), retaining its history."""
        entry = self._entries.pop(key)
        self.used -= entry.size
        self._history[key] = entry.refs
        self._trim_history()

    def _reference(self, key: Hashable, entry: _Entry) -> None:
        entry.refs.append(self._tick)
        del entry.refs[: -self.k]
        self._requeue(key, entry)

    def _requeue(self, key: Hashable, entry: _Entry) -> None:
        self._tokens += 1
        entry.token = self._tokens
        heapq.heappush(self._heap, (*self._priority(entry), entry.token, key))

    def _priority(self, entry: _Entry) -> tuple[int, int]:
        # (1, K-th last tick) for entries with K references; (0, last tick) for the
        # rest, which all sort before: their backward K-distance is infinite
        if len(entry.refs) >= self.k:
            return 1, entry.refs[0]
        return 0, entry.refs[-1]

    def _make_room(self, size: int, keep: Hashable = None) -> list[Hashable]:
        evicted: list[Hashable] = []
        while self.used + size > self.capacity:
            key = self.pop_victim(keep)
            if key is None:
                break
            evicted.append(key)
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact()
        return evicted

    def _trim_history(self) -> None:
        limit = self._history_limit if self._history_limit is not None else 4 * len(self._entries)
        while len(self._history) > max(limit, 64):
            self._history.popitem(last=False)

    def _compact(self) -> None:
        self._heap = [
            item
            for item in self._heap
            if (e := self._entries.get(item[3])) is not None and e.token == item[2]
        ]
        heapq.heapify(self._heap)


class AdaptiveLruK:
    """LRU-K that turns into LRU where recency predicts reuse better.

    Two experts rank the same entries: LRU-K (scan-resistant) and LRU. The victim is
    the heavier expert's choice, and each expert remembers what it evicted (a ghost
    list as long as the cache has entries). A miss on a key in an expert's ghost list
    is that expert's mistake: the other gains weight, more for a recent eviction
    (LeCaR, Vietri et al., HotStorage 2018, with LRU-K in place of LFU). Scans make
    LRU evict hot keys, which return: LRU-K takes over. Conversations whose blocks
    return once, soon, make LRU-K evict fresh blocks first, which return: LRU takes
    over. On the Mooncake trace plain LRU-K fell to 0.86x the best of LRU and S3-FIFO
    at 10% capacity; this policy is within 0.5% of the best or above it at every
    capacity measured (bench/kvspill_policy.py).
    """

    EXPERTS = ("lru-k", "lru")

    def __init__(self, capacity_bytes: int, k: int = 2, learning_rate: float = 0.45) -> None:
        self._k = LruK(capacity_bytes, k=k)
        self._recency: OrderedDict[Hashable, None] = OrderedDict()
        self._ghosts: dict[str, OrderedDict[Hashable, int]] = {
            e: OrderedDict() for e in self.EXPERTS
        }
        self.weights = dict.fromkeys(self.EXPERTS, 0.5)
        self._rate = learning_rate
        self._tick = 0

    @property
    def capacity(self) -> int:
        return self._k.capacity

    @property
    def used(self) -> int:
        return self._k.used

    @property
    def k(self) -> int:
        return self._k.k

    def __contains__(self, key: Hashable) -> bool:
        return key in self._k

    def __len__(self) -> int:
        return len(self._k)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._k)

    def size_of(self, key: Hashable) -> int:
        return self._k.size_of(key)

    def leader(self) -> str:
        return max(self.EXPERTS, key=lambda e: self.weights[e])

    def access(self, key: Hashable) -> bool:
        self._tick += 1
        if self._k.access(key):
            self._recency.move_to_end(key)
            return True
        self._learn(key)
        return False

    def admit(self, key: Hashable, size: int) -> list[Hashable]:
        if key in self._k:
            self.access(key)
            return []
        if size > self._k.capacity:
            return [key]
        evicted = []
        while self._k.used + size > self._k.capacity and len(self._k):
            evicted.append(self._evict_one(keep=key))
        self._k.admit(key, size)
        self._recency[key] = None
        return evicted

    def victims(self, size: int) -> list[Hashable]:
        evicted = []
        while self._k.used + size > self._k.capacity and len(self._k):
            evicted.append(self._evict_one())
        return evicted

    def remove(self, key: Hashable) -> bool:
        self._recency.pop(key, None)
        return self._k.remove(key)

    def clear(self) -> list[Hashable]:
        self._recency.clear()
        return self._k.clear()

    def _evict_one(self, keep: Hashable = None) -> Hashable:
        expert = self.leader()
        if expert == "lru":
            victim = next(k for k in self._recency if k != keep)
            self._k.evict(victim)
        else:
            victim = self._k.pop_victim(keep)
        del self._recency[victim]
        ghost = self._ghosts[expert]
        ghost[victim] = self._tick
        while len(ghost) > max(len(self._k), 64):
            ghost.popitem(last=False)
        return victim

    def _learn(self, key: Hashable) -> None:
        n = max(len(self._k), 1)
        for expert, ghost in self._ghosts.items():
            evicted_at = ghost.pop(key, None)
            if evicted_at is None:
                continue
            # the other expert would have kept it: it gains, more for a fresh mistake
            other = next(e for e in self.EXPERTS if e != expert)
            reward = 0.005 ** ((self._tick - evicted_at) / n)
            self.weights[other] *= math.exp(self._rate * reward)
            total = sum(self.weights.values())
            self.weights = {e: w / total for e, w in self.weights.items()}
