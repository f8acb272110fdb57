"""LRU-K eviction (O'Neil, O'Neil and Weikum, 1993), bounded in bytes, free of I/O.

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
        """Keys whose history is retained after eviction (default: as many as resident)."""

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
        while self.used + size > self.capacity and self._heap:
            _, _, token, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry.token != token or key == keep:
                continue  # stale: re-referenced or removed since
            del self._entries[key]
            self.used -= entry.size
            self._history[key] = entry.refs
            evicted.append(key)
        self._trim_history()
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact()
        return evicted

    def _trim_history(self) -> None:
        limit = self._history_limit if self._history_limit is not None else len(self._entries)
        while len(self._history) > max(limit, 64):
            self._history.popitem(last=False)

    def _compact(self) -> None:
        self._heap = [
            item
            for item in self._heap
            if (e := self._entries.get(item[3])) is not None and e.token == item[2]
        ]
        heapq.heapify(self._heap)
