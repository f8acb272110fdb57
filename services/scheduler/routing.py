"""Which worker a request goes to: one strategy per ``SchedulerPolicy.routing``. No I/O.

Each strategy is built once, with what it needs (the policy, the KV index), and
answers one question: of the workers of a ``Pool`` (the ready workers serving the
model) that ``fit`` the request (room for it, and what its lane allows), which one,
and how many of the request's prefix blocks it holds; None when none fits. The
caller computes the prefix blocks (only for strategies that look at them) and keeps
the books of what was routed where; a strategy reads the index, never writes it.

- ``kv``: the fitting worker with the lowest ``load_weight x busy share -
  overlap_weight x cached share of the request's blocks``, among those within
  ``max_load_skew`` of the pool's mean load (all fitting workers when none is). Its
  cost does not grow with the fleet: a worker holding none of the request's blocks
  is worth only its load, so of those only the least loaded that fits can win (the
  pool's heap), and the others are the holders of the request's first block (the
  index's); it looks at those few, not at every worker.
- ``dynamo``: NVIDIA Dynamo's KV router cost, for comparison: blocks still to
  prefill times ``overlap_weight``, plus the worker's active blocks (a scan).
- ``round_robin``: the next fitting worker after the last one chosen, caches ignored.

Ties go to the lowest worker id, so a decision is a function of its inputs (and, for
round robin, of the strategy's own rotation).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import ClassVar, Protocol

from .kvindex import KvIndex
from .pool import Pool, load_of
from .state import SchedulerPolicy, Worker

Fits = Callable[[Worker], bool]


class Router(Protocol):
    """A routing strategy."""

    name: ClassVar[str]
    uses_prefix: ClassVar[bool]
    """Whether ``choose`` reads the request's prefix blocks: when not, the caller
    neither computes them nor counts the route in the cache statistics."""

    def choose(
        self, model: str, blocks: list[int], pool: Pool, fits: Fits
    ) -> tuple[Worker, int] | None:
        """The worker of ``pool`` for a request of ``model`` (one that ``fits``) and how
        many of its leading ``blocks`` that worker holds; None when none fits."""
        ...


class RoundRobinRouter:
    name: ClassVar[str] = "round_robin"
    uses_prefix: ClassVar[bool] = False

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self._next: dict[str, str] = {}
        """Model → the worker id the rotation over its pool starts from next."""

    def choose(
        self, model: str, blocks: list[int], pool: Pool, fits: Fits
    ) -> tuple[Worker, int] | None:
        ring = pool.workers
        if not ring:
            return None
        start = bisect.bisect_left(ring, self._next.get(model, ""), key=lambda w: w.worker_id)
        for k in range(len(ring)):
            w = ring[(start + k) % len(ring)]
            if fits(w):
                self._next[model] = ring[(start + k + 1) % len(ring)].worker_id
                return w, 0
        return None


FEW_HOLDERS = 32
"""A prefix block held by at most this many workers has them looked at one by one;
workers holding only blocks more widely held are found in order of load."""


class KvRouter:
    name: ClassVar[str] = "kv"
    uses_prefix: ClassVar[bool] = True

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self.policy = policy
        self.kv = kv

    def choose(
        self, model: str, blocks: list[int], pool: Pool, fits: Fits
    ) -> tuple[Worker, int] | None:
        p = self.policy
        if p.load_weight <= 0 or p.overlap_weight < 0:
            return self._by_holders(blocks, pool, fits)
        # the first block few workers hold: only they may hold more than ``wide`` blocks;
        # each of the others holds at most ``wide``, and of those holding the same
        # number only the least loaded can win
        wide = next(
            (d for d, h in enumerate(blocks) if self.kv.holder_count(h) <= FEW_HOLDERS), len(blocks)
        )
        deep = self.kv.holders(blocks[wide]) if wide < len(blocks) else set()
        direct = [w for w in map(pool.get, deep) if w is not None and fits(w)]
        ceiling = (1 + p.max_load_skew) * pool.mean_load + 1 / pool.min_slots
        found = self._search(blocks, pool, fits, direct, deep, wide, ceiling)
        if found is None:  # none within the load bound: the best of all that fit
            found = self._search(blocks, pool, fits, direct, deep, wide, float("inf"))
        return found

    def _search(
        self,
        blocks: list[int],
        pool: Pool,
        fits: Fits,
        direct: list[Worker],
        deep: set[str],
        wide: int,
        limit: float,
    ) -> tuple[Worker, int] | None:
        """The cheapest fitting worker at load ``limit`` or under: ``direct`` ones each,
        the rest in order of load until none left unseen can cost less (a threshold
        search: one of ``h`` held blocks costs at least ``load_weight x load -
        overlap_weight x h / n``)."""
        p = self.policy
        n = max(1, len(blocks))
        best: tuple[tuple[float, str], Worker, int] | None = None

        def consider(w: Worker, worth: float, hits: int) -> None:
            nonlocal best
            c = (p.load_weight * load_of(w) - p.overlap_weight * worth / n, w.worker_id)
            if best is None or c < best[0]:
                best = (c, w, hits)

        spills = self.kv.spills()

        def held(w: Worker) -> tuple[float, int]:
            """Its worth in blocks (a restorable one at its spill weight), and the blocks
            it has cached or can restore."""
            cached = self.kv.depth(w.worker_id, blocks)
            if not spills:
                return cached, cached
            restore = self.kv.restorable(blocks, {w.worker_id: cached})[w.worker_id]
            weight = p.spill_weight if w.spill_weight is None else w.spill_weight
            return cached + weight * restore, cached + restore

        for w in direct:
            if load_of(w) <= limit:
                consider(w, *held(w))
        # what the rest may be worth: at most ``wide`` blocks each; without spill tiers
        # a whole number of them, and only the least loaded holding each can win
        unresolved = set(range(wide + 1))
        top = max(1.0, p.spill_weight) if spills else 1.0  # a restorable block's most worth
        scan = pool.by_load()
        try:
            for w in scan:
                load = load_of(w)
                if load > limit:
                    break
                most = max(unresolved) * top
                bound = (p.load_weight * load - p.overlap_weight * most / n, w.worker_id)
                if best is not None and bound > best[0]:
                    break
                if w.worker_id in deep or not fits(w):
                    continue
                worth, hits = held(w)
                if spills:
                    consider(w, worth, hits)
                elif hits in unresolved:  # the least loaded holding that many
                    unresolved.discard(hits)
                    consider(w, worth, hits)
                    if not unresolved:
                        break
        finally:
            scan.close()
        return None if best is None else (best[1], best[2])

    def _by_holders(self, blocks: list[int], pool: Pool, fits: Fits) -> tuple[Worker, int] | None:
        """Each holder of the request's first block, and the least loaded of the rest
        (or, with ``load_weight`` 0, the lowest id): where spill tiers or weights
        make the cost more than load and held blocks."""
        p = self.policy
        holders = self.kv.holders(blocks[0]) if blocks else set()
        found = [w for w in map(pool.get, holders) if w is not None and fits(w)]
        ceiling = (1 + p.max_load_skew) * pool.mean_load + 1 / pool.min_slots
        if p.load_weight > 0:
            other = pool.least_loaded(fits, skip=holders)
        else:  # load counts for nothing: the lowest id wins among the non-holders, one
            # within the load bound if any is
            rest = [w for w in pool.workers if w.worker_id not in holders and fits(w)]
            other = next((w for w in rest if load_of(w) <= ceiling), rest[0] if rest else None)
        if other is not None:
            found.append(other)
        if not found:
            return None
        allowed = [w for w in found if load_of(w) <= ceiling] or found
        overlap = self.kv.overlaps(blocks, [w.worker_id for w in allowed])
        # blocks a worker restores from its spill tiers: cheaper than computing them,
        # dearer than having them (the engine reports both as cached), by what the
        # worker measured
        restore = self.kv.restorable(blocks, overlap)
        n = max(1, len(blocks))

        def cost(w: Worker) -> tuple[float, str]:
            wid = w.worker_id
            spill = p.spill_weight if w.spill_weight is None else w.spill_weight
            worth = overlap[wid] + spill * restore[wid]
            return p.load_weight * load_of(w) - p.overlap_weight * worth / n, wid

        best = min(allowed, key=cost)
        return best, overlap[best.worker_id] + restore[best.worker_id]


class DynamoRouter:
    name: ClassVar[str] = "dynamo"
    uses_prefix: ClassVar[bool] = True

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self.policy = policy
        self.kv = kv

    def choose(
        self, model: str, blocks: list[int], pool: Pool, fits: Fits
    ) -> tuple[Worker, int] | None:
        p = self.policy
        free = [w for w in pool.workers if fits(w)]
        if not free:
            return None
        hit = self.kv.overlaps(blocks, [w.worker_id for w in free])

        def cost(w: Worker) -> tuple[float, str]:
            new = len(blocks) - hit[w.worker_id]
            return p.overlap_weight * new + w.assigned_tokens / p.block_tokens, w.worker_id

        best = min(free, key=cost)
        return best, hit[best.worker_id]


ROUTERS: dict[str, type[RoundRobinRouter | KvRouter | DynamoRouter]] = {
    r.name: r for r in (KvRouter, RoundRobinRouter, DynamoRouter)
}
"""``SchedulerPolicy.routing`` → its strategy."""


def make_router(policy: SchedulerPolicy, kv: KvIndex) -> Router:
    """The strategy ``policy.routing`` names; ValueError for a name none has."""
    cls = ROUTERS.get(policy.routing)
    if cls is None:
        raise ValueError(
            f"unknown routing policy {policy.routing!r}; one of: {', '.join(sorted(ROUTERS))}"
        )
    return cls(policy, kv)
