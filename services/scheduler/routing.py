"""Which worker a request goes to: one strategy per ``SchedulerPolicy.routing``. No I/O.

Each strategy is built once, with what it needs (the policy, the KV index), and
answers one question: of the workers that may take this request (``free``, a subset
of ``candidates``, the ready workers serving the model that the request's lane
allows), which one, and how many of the request's prefix blocks it holds. The
caller computes the prefix blocks (only for strategies that look at them) and keeps
the books of what was routed where; a strategy reads the index, never writes it.

- ``kv``: the free worker with the lowest ``load_weight x busy share -
  overlap_weight x cached share of the request's blocks``, among those within
  ``max_load_skew`` of the mean load (all free workers when none is).
- ``dynamo``: NVIDIA Dynamo's KV router cost, for comparison: blocks still to
  prefill times ``overlap_weight``, plus the worker's active blocks.
- ``round_robin``: the next free worker after the last one chosen, caches ignored.

Ties go to the lowest worker id, so a decision is a function of its inputs (and, for
round robin, of the strategy's own rotation).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from .kvindex import KvIndex
from .state import SchedulerPolicy, Worker


class Router(Protocol):
    """A routing strategy."""

    name: ClassVar[str]
    uses_prefix: ClassVar[bool]
    """Whether ``choose`` reads the request's prefix blocks: when not, the caller
    neither computes them nor counts the route in the cache statistics."""

    def choose(
        self, model: str, blocks: list[int], candidates: list[Worker], free: list[Worker]
    ) -> tuple[Worker, int]:
        """The worker for a request of ``model`` (one of ``free``, never empty) and how
        many of its leading ``blocks`` that worker holds. ``candidates`` are the
        eligible workers by worker id, ``free`` those of them with room for it."""
        ...


class RoundRobinRouter:
    name: ClassVar[str] = "round_robin"
    uses_prefix: ClassVar[bool] = False

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self._next: dict[str, int] = {}
        """Model → where the rotation over its candidates starts next."""

    def choose(
        self, model: str, blocks: list[int], candidates: list[Worker], free: list[Worker]
    ) -> tuple[Worker, int]:
        room = {w.worker_id for w in free}
        start = self._next.get(model, 0) % len(candidates)
        w = next(w for w in candidates[start:] + candidates[:start] if w.worker_id in room)
        self._next[model] = (candidates.index(w) + 1) % len(candidates)
        return w, 0


class KvRouter:
    name: ClassVar[str] = "kv"
    uses_prefix: ClassVar[bool] = True

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self.policy = policy
        self.kv = kv

    def choose(
        self, model: str, blocks: list[int], candidates: list[Worker], free: list[Worker]
    ) -> tuple[Worker, int]:
        p = self.policy
        load = {w.worker_id: w.assigned_seqs / max(1, w.max_num_seqs) for w in candidates}
        mean = sum(load.values()) / len(load)
        ceiling = (1 + p.max_load_skew) * mean + 1 / max(1, min(w.max_num_seqs for w in candidates))
        allowed = [w for w in free if load[w.worker_id] <= ceiling] or free
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
            return p.load_weight * load[wid] - p.overlap_weight * worth / n, wid

        best = min(allowed, key=cost)
        return best, overlap[best.worker_id] + restore[best.worker_id]


class DynamoRouter:
    name: ClassVar[str] = "dynamo"
    uses_prefix: ClassVar[bool] = True

    def __init__(self, policy: SchedulerPolicy, kv: KvIndex) -> None:
        self.policy = policy
        self.kv = kv

    def choose(
        self, model: str, blocks: list[int], candidates: list[Worker], free: list[Worker]
    ) -> tuple[Worker, int]:
        p = self.policy
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
