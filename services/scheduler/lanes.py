"""One model's queue: lanes by prompt length, fair shares between tenants. No I/O.

Short requests (prompt below ``short_prompt_tokens``) go first, so a burst of long
contexts never holds a chat behind it; long ones keep a bound: one that has waited
``long_wait_bound_s`` goes ahead of every short one. Within a lane, tenants share by
virtual token counters (VTC): the next request is the oldest of the tenant that has
been served the fewest tokens, and a tenant arriving idle starts level with the
least-served busy one, so it cannot bank an idle hour into a burst.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .state import Queued

URGENT_S = 0.5
"""A long request whose objective runs out within this goes before short ones."""


class Item(Protocol):
    request: Any
    since: float
    order: int
    due: float


def prompt_tokens(request: Any) -> int:
    """The request's own count when the client knows it, else about 4 characters a token."""
    return int(request.estimated_prompt_tokens)


def cost_tokens(request: Any) -> int:
    """Prompt and output tokens at most: ``n`` choices share their prompt's KV."""
    output: int = request.sampling.output_tokens
    return prompt_tokens(request) + output


class ModelQueue:
    """FIFO per tenant, tenants by VTC, short lane before long (within the bound)."""

    def __init__(
        self,
        short_prompt_tokens: int,
        long_wait_bound_s: float,
        lanes: bool = True,
        by_slack: bool = False,
    ) -> None:
        self.short_prompt_tokens = short_prompt_tokens
        self.long_wait_bound_s = long_wait_bound_s
        self.lanes = lanes
        self.by_slack = by_slack
        """Lane heads go by their objective's deadline (``due``), not short first."""
        self._lanes: dict[str, dict[str, deque[Any]]] = {"short": {}, "long": {}}
        self.counters: dict[str, float] = {}
        """Tenant → tokens served (virtual)."""
        self._level = 0.0
        """The counter of the tenant served last: where an arrival starts when no one
        else is waiting."""
        self._n = 0
        self._prune_at = 1000

    def lane_of(self, item: Item) -> str:
        """By prompt length, unless the API key's priority class says: interactive
        requests ride the short lane whatever their length, batch ones the long."""
        if not self.lanes:
            return "short"
        priority = item.request.priority
        if priority in ("interactive", "batch"):
            return "short" if priority == "interactive" else "long"
        return "short" if prompt_tokens(item.request) < self.short_prompt_tokens else "long"

    def push(self, item: Item, front: bool = False) -> None:
        tenants = self._lanes[self.lane_of(item)]
        tenant = item.request.tenant
        if tenant not in tenants or not tenants[tenant]:
            # idle until now: start level with the least-served tenant that is waiting
            busy = [
                self.counters.get(t, 0.0)
                for lane in self._lanes.values()
                for t, q in lane.items()
                if q
            ]
            self.counters[tenant] = max(
                self.counters.get(tenant, 0.0), min(busy, default=self._level)
            )
        q = tenants.setdefault(tenant, deque())
        q.appendleft(item) if front else q.append(item)
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Queued]:
        for lane in self._lanes.values():
            for q in lane.values():
                yield from q

    def depths(self) -> dict[str, int]:
        return {name: sum(len(q) for q in lane.values()) for name, lane in self._lanes.items()}

    def held_by(self) -> dict[str, int]:
        """Tenant → requests it has waiting, both lanes."""
        out: dict[str, int] = {}
        for lane in self._lanes.values():
            for tenant, q in lane.items():
                out[tenant] = out.get(tenant, 0) + len(q)
        return out

    def newest_of(self, tenant: str) -> Any | None:
        """``tenant``'s latest arrival still waiting (a continuation, queued at the
        front, is never the newest)."""
        tails = [lane[tenant][-1] for lane in self._lanes.values() if lane.get(tenant)]
        fresh = [i for i in tails if getattr(i, "resume", None) is None]
        return max(fresh, key=lambda i: i.order) if fresh else None

    def oldest_wait(self, lane: str, now: float) -> float:
        return max((now - q[0].since for q in self._lanes[lane].values() if q), default=0.0)

    def next(self, now: float, allow: Callable[[str], bool] = lambda lane: True) -> Any | None:
        """The request to place next (not removed): a long one past its bound, else
        the short lane's, else the long lane's (``by_slack``: of the two heads, the one
        whose objective runs out first); ``allow`` may refuse a lane (no worker can take
        a long prompt now)."""
        oldest = self._oldest("long")  # the bound is any tenant's, not the head tenant's
        if oldest is not None and now - oldest.since >= self.long_wait_bound_s and allow("long"):
            return oldest
        if self.by_slack and allow("long"):
            head = self._head("long")
            if head is not None and head.due - URGENT_S <= now < head.due:
                return head  # its objective runs out: now or never
        for lane in ("short", "long"):
            if allow(lane):
                head = self._head(lane)
                if head is not None:
                    return head
        return None

    def remove(self, item: Item) -> None:
        lane = self._lanes[self.lane_of(item)]
        q = lane.get(item.request.tenant)
        if q is not None and item in q:
            q.remove(item)
            self._n -= 1
            if not q:
                del lane[item.request.tenant]

    def take(self, item: Item) -> None:
        """``item`` is placed: it leaves the queue and its tenant is charged."""
        self.remove(item)
        tenant = item.request.tenant
        self._level = self.counters.get(tenant, 0.0)
        self.counters[tenant] = self._level + cost_tokens(item.request)
        if len(self.counters) > self._prune_at:
            self._prune()
            self._prune_at = max(1000, 2 * len(self.counters))  # amortized: O(1) a take

    def _prune(self) -> None:
        """Forget the counters of tenants with nothing waiting that are at or below the
        least-served waiting one: back, they start there anyway."""
        waiting = {t for lane in self._lanes.values() for t in lane}
        floor = min((self.counters[t] for t in waiting), default=self._level)
        for t in [t for t, c in self.counters.items() if t not in waiting and c <= floor]:
            del self.counters[t]

    def drop_where(self, gone: Callable[[Any], bool]) -> list[Any]:
        out = []
        for lane in self._lanes.values():
            for tenant, q in lane.items():
                if any(gone(i) for i in q):
                    keep = deque(i for i in q if not gone(i))
                    out += [i for i in q if gone(i)]
                    lane[tenant] = keep
            for tenant in [t for t, q in lane.items() if not q]:
                del lane[tenant]
        self._n -= len(out)
        return out

    def _oldest(self, lane: str) -> Any | None:
        heads = [q[0] for q in self._lanes[lane].values() if q]
        return min(heads, key=lambda i: i.since) if heads else None

    def _head(self, lane: str) -> Any | None:
        """The oldest request of the least-served tenant with one waiting."""
        best = None
        for tenant, q in self._lanes[lane].items():
            if not q:
                continue
            key = (self.counters.get(tenant, 0.0), q[0].order)
            if best is None or key < best[0]:
                best = (key, q[0])
        return best[1] if best else None
