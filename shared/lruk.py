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
from itertools import chain


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

    def _pop_victim(self, keep: Hashable = None) -> Hashable | None:
        """Evict the one entry LRU-K would (never ``keep``); its history is retained."""
        while self._heap:
            _, _, token, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry.token != token or key == keep:
                continue  # stale: re-referenced or removed since
            del self._entries[key]
            self.used -= entry.size
            self._history[key] = entry.refs
            self._trim_history()
            return key
        return None

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
            key = self._pop_victim(keep)
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
    """LRU-K where it predicts reuse better than LRU, LRU where recency does.

    Two shadow caches, LRU (K=1) and LRU-K, simulate the whole cache at its capacity
    on the same references: keys and sizes only, no data. The shadow that has hit
    more often lately leads (hits decay with a half-life of ``half_life`` times the
    entries held; the challenger must lead by ``z`` standard deviations of the two
    counts, or noise makes the leader flap), and the real cache holds what the
    leader holds: its victims are the resident keys the leader's shadow no longer
    holds, oldest first. Following a shadow that simulates one policy exactly
    converges to that policy's own hit rate; mixing the two experts' victims (LeCaR,
    which this replaced) could fall below both, and did on Mooncake's synthetic
    trace (0.95x the better of LRU and S3-FIFO at 2% capacity;
    bench/kvspill_policy.py). LRU leads until the evidence says otherwise. Scans
    make LRU's shadow miss its hot set: LRU-K leads. Conversations whose blocks
    return once, soon, make LRU-K's shadow miss fresh blocks: LRU leads.
    """

    EXPERTS = ("lru", "lru-k")

    def __init__(
        self, capacity_bytes: int, k: int = 2, half_life: float = 10.0, z: float = 2.0
    ) -> None:
        if capacity_bytes < 0 or k < 1:
            raise ValueError("capacity must be >= 0 and k >= 1")
        self.capacity = capacity_bytes
        self.k = k
        self.used = 0
        self._resident: OrderedDict[Hashable, int] = OrderedDict()
        """Key to size, least recently used first (the fallback order)."""
        self._shadows = {"lru-k": LruK(capacity_bytes, k=k), "lru": LruK(capacity_bytes, k=1)}
        self.scores = dict.fromkeys(self.EXPERTS, 0.0)
        self._leader = self.EXPERTS[0]
        self._doomed: OrderedDict[Hashable, None] = OrderedDict()
        """Resident keys the leader's shadow does not hold: the next victims."""
        self._half_life = half_life
        self._z = z

    def __contains__(self, key: Hashable) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._resident)

    def size_of(self, key: Hashable) -> int:
        return self._resident[key]

    def leader(self) -> str:
        return self._leader

    def access(self, key: Hashable) -> bool:
        size = self._resident.get(key)
        decay = 0.5 ** (1 / max(self._half_life * len(self._resident), 1.0))
        for name, shadow in self._shadows.items():
            self.scores[name] *= decay
            if shadow.access(key):
                self.scores[name] += 1.0
            elif size is not None:  # the shadow would have saved it by now
                self._shadow_admit(name, key, size)
        self._follow()
        if size is None:
            return False
        self._resident.move_to_end(key)
        return True

    def admit(self, key: Hashable, size: int) -> list[Hashable]:
        """Insert (or re-reference) ``key`` of ``size`` bytes; returns the keys evicted
        to make room. An item larger than the whole capacity is not admitted: it is
        returned as evicted itself."""
        if key in self._resident:
            self.access(key)
            return []
        if size > self.capacity:
            return [key]
        evicted = self.victims(size, key)
        self._resident[key] = size
        self.used += size
        return evicted

    def victims(self, size: int, key: Hashable = None) -> list[Hashable]:
        """Evict until ``size`` more bytes fit; returns the evicted keys. With ``key``
        (about to be admitted), the shadows admit it first, so the room is made where
        the leader would make it. Nothing is evicted for more than the capacity."""
        if size > self.capacity:
            return []
        if key is not None:
            for name, shadow in self._shadows.items():
                if key not in shadow:
                    self._shadow_admit(name, key, size)
        evicted = []
        while self.used + size > self.capacity:
            # what the leader no longer holds, else the least recently used
            victim = next((k for k in chain(self._doomed, self._resident) if k != key), None)
            if victim is None:
                break
            self._drop(victim)
            evicted.append(victim)
        return evicted

    def remove(self, key: Hashable) -> bool:
        """``key`` is gone (deleted or damaged): from the shadows too."""
        for shadow in self._shadows.values():
            shadow.remove(key)
        if key not in self._resident:
            return False
        self._drop(key)
        return True

    def clear(self) -> list[Hashable]:
        keys = list(self._resident)
        for shadow in self._shadows.values():
            shadow.clear()
        self._resident.clear()
        self._doomed.clear()
        self.used = 0
        return keys

    def _drop(self, key: Hashable) -> None:
        self.used -= self._resident.pop(key)
        self._doomed.pop(key, None)

    def _shadow_admit(self, name: str, key: Hashable, size: int) -> None:
        gone = self._shadows[name].admit(key, size)
        if name != self._leader:
            return
        self._doomed.pop(key, None)
        for other in gone:
            if other in self._resident:
                self._doomed[other] = None

    def _follow(self) -> None:
        best = max(self.EXPERTS, key=self.scores.__getitem__)
        lead, challenger = self.scores[self._leader], self.scores[best]
        if challenger - lead <= self._z * math.sqrt(lead + challenger):
            return
        self._leader = best
        shadow = self._shadows[best]
        self._doomed = OrderedDict((k, None) for k in self._resident if k not in shadow)
