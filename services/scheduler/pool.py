"""The ready workers serving one model, kept so that a decision costs about the same
at 64 workers as at 4,096. No I/O.

A placement reads the pool instead of scanning the fleet: the least-loaded worker
that fits (a heap by load, whose entries are checked when popped), the workers
holding long prefills (a count), and the sums admission estimates from (free
slots, pending prefill, measured rates), each kept as the sum of every worker's
last contribution. The core tells the pool of each change to a worker's books
(``touch``); an entry found out of date when popped is fixed then, and a full
recount every ``len(pool)`` touches keeps the float sums from drifting.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Generator, Iterable
from typing import NamedTuple

from .state import Worker


def load_of(w: Worker) -> float:
    """Its share of busy sequence slots (what the KV router weighs)."""
    return w.assigned_seqs / max(1, w.max_num_seqs)


class _Part(NamedTuple):
    """One worker's contribution to its pool's sums."""

    load: float
    pending: int
    slots: int
    free_seqs: int
    capacity: int
    holds_long: bool
    rate: float | None
    hold: float | None


def _part(w: Worker) -> _Part:
    return _Part(
        load=load_of(w),
        pending=w.pending_prefill,
        slots=w.max_num_seqs,
        free_seqs=max(0, w.max_num_seqs - w.assigned_seqs - len(w.foreign)),
        capacity=w.kv_capacity_tokens,
        holds_long=bool(w.prefilling_long),
        rate=w.rates.prefill_rate(),
        hold=w.rates.hold_s(),
    )


def _moved(total: float, count: int, old: float | None, new: float | None) -> tuple[float, int]:
    """A sum of measured values and how many, one of them changed (None: unmeasured)."""
    if old is not None:
        total, count = total - old, count - 1
    if new is not None:
        total, count = total + new, count + 1
    return total, count


class Pool:
    """The ready workers of one model. Who is in it is fixed: the core builds a new
    pool when a worker joins, leaves, or changes state or models."""

    def __init__(self, workers: Iterable[Worker]) -> None:
        self.workers = sorted(workers, key=lambda w: w.worker_id)
        """In worker id order."""
        self._by_id = {w.worker_id: w for w in self.workers}
        self._recount()

    def __len__(self) -> int:
        return len(self.workers)

    def get(self, worker_id: str) -> Worker | None:
        return self._by_id.get(worker_id)

    # -- books -------------------------------------------------------------------------

    def _recount(self) -> None:
        self._parts = {w.worker_id: _part(w) for w in self.workers}
        parts = self._parts.values()
        self.load_sum = sum(p.load for p in parts)
        self.pending = sum(p.pending for p in parts)
        self.slots = sum(p.slots for p in parts)
        self.free_seqs = sum(p.free_seqs for p in parts)
        self.holding_long = sum(p.holds_long for p in parts)
        rates = [p.rate for p in parts if p.rate is not None]
        holds = [p.hold for p in parts if p.hold is not None]
        self.rate_sum, self.rates_measured = sum(rates), len(rates)
        self.hold_sum, self.holds_measured = sum(holds), len(holds)
        self._by_load = [(p.load, wid) for wid, p in self._parts.items()]
        self._by_pending = [(p.pending, wid) for wid, p in self._parts.items()]
        heapq.heapify(self._by_load)
        heapq.heapify(self._by_pending)
        self._touches = 0
        self.min_slots = min((max(1, w.max_num_seqs) for w in self.workers), default=1)

    def touch(self, w: Worker) -> bool:
        """``w``'s books may have changed (what it holds, its slots, its measured
        rates): whether they did."""
        old = self._parts.get(w.worker_id)
        if old is None or _part(w) == old:
            return False
        self._touches += 1
        if self._touches > max(64, len(self.workers)) or w.max_num_seqs != old.slots:
            self._recount()  # bounds float drift; a changed slot count moves min_slots
        else:
            self._file(w, old)
        return True

    def _file(self, w: Worker, old: _Part) -> None:
        new = _part(w)
        self._parts[w.worker_id] = new
        self.load_sum += new.load - old.load
        self.pending += new.pending - old.pending
        self.free_seqs += new.free_seqs - old.free_seqs
        self.holding_long += new.holds_long - old.holds_long
        self.rate_sum, self.rates_measured = _moved(
            self.rate_sum, self.rates_measured, old.rate, new.rate
        )
        self.hold_sum, self.holds_measured = _moved(
            self.hold_sum, self.holds_measured, old.hold, new.hold
        )
        if new.load != old.load:
            heapq.heappush(self._by_load, (new.load, w.worker_id))
        if new.pending != old.pending:
            heapq.heappush(self._by_pending, (new.pending, w.worker_id))

    @property
    def mean_load(self) -> float:
        return self.load_sum / len(self.workers) if self.workers else 0.0

    @property
    def least_pending(self) -> int | None:
        """The fewest prompt tokens assigned to one worker and not started."""
        heap = self._by_pending
        while heap:
            pending, wid = heap[0]
            part = self._parts.get(wid)
            if part is not None and part.pending == pending:
                return pending
            heapq.heappop(heap)  # out of date: a newer entry stands for that worker
        return None

    # -- choices -------------------------------------------------------------------------

    def least_loaded(
        self, fits: Callable[[Worker], bool], skip: Collection[str] = ()
    ) -> Worker | None:
        """The worker of lowest load (then lowest id) that ``fits``, ``skip`` aside;
        None when none does."""
        scan = self.by_load()
        try:
            return next((w for w in scan if w.worker_id not in skip and fits(w)), None)
        finally:
            scan.close()

    def by_load(self) -> Generator[Worker, None, None]:
        """The workers in order of load, then id. Costs a heap pop per worker passed
        over (so a search should stop early: close it, and its entries go back),
        and none at all while no slot is free anywhere (``can_take`` needs one)."""
        if self.free_seqs <= 0:
            return
        heap = self._by_load
        kept: list[tuple[float, str]] = []
        seen: set[str] = set()
        try:
            while heap:
                entry = heapq.heappop(heap)
                load, wid = entry
                part = self._parts.get(wid)
                if part is None or part.load != load or wid in seen:
                    continue  # out of date (a newer entry stands for it) or a repeat
                w = self._by_id[wid]
                if load_of(w) != load:  # changed without a touch: filed again
                    self._file(w, part)
                    continue
                seen.add(wid)
                kept.append(entry)
                yield w
        finally:
            for entry in kept:
                heapq.heappush(heap, entry)
            if len(heap) > 4 * len(self.workers) + 64:
                self._recount()  # out-of-date entries pile up where nobody pops them
