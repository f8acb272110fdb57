"""The connector's scheduler-side decisions, free of vLLM and of I/O.

It knows which blocks the worker side holds in a spill tier (from what the worker
side reports after each step), answers how many of a request's next tokens can be
restored instead of computed, and plans each step's loads and saves.

A block's key is ``namespace:hash``: vLLM's block hash (sha256 of the parent hash,
the block's tokens and its extra keys such as the LoRA) under a namespace that
names the model's weights, the KV dtype, the block size and the cache layout, so a
block saved under other weights is never loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def namespace_of(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def block_key(namespace: str, block_hash: bytes) -> str:
    return f"{namespace}:{block_hash.hex()}"


def hash_of(key: str) -> bytes:
    return bytes.fromhex(key.partition(":")[2])


Scheduled = tuple[str, Sequence[bytes], Sequence[int], int]
"""A request in a step: its id, block hashes, block ids, tokens computed after it."""


@dataclass
class Transfer:
    request_id: str
    block_id: int
    key: str


@dataclass
class StepPlan:
    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)


@dataclass
class Restore:
    """What a request restored: summed over its loads."""

    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    tiers: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    timed: bool = True
    """False: the request ended in the step that restored it, before the worker side's
    report (vLLM frees a request before it reads the step's connector output), so
    only the planned blocks are known; the time is in the tier metrics."""

    def merge(self, other: Restore) -> None:
        self.blocks += other.blocks
        self.bytes += other.bytes
        self.seconds += other.seconds
        self.failed += other.failed
        for tier, n in other.tiers.items():
            self.tiers[tier] = self.tiers.get(tier, 0) + n

    def as_dict(self) -> dict[str, object]:
        return {
            "blocks": self.blocks,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "tiers": dict(self.tiers),
            "failed": self.failed,
            "timed": self.timed,
        }


@dataclass
class _Request:
    namespace: str
    saved_upto: int = 0
    """Blocks before this index are held already (local cache, restored or saved)."""
    first_load: int = -1
    """The first block it restores (-1: none): from there on a failed load is computed
    again, and must then be saved again."""
    loads: list[Transfer] = field(default_factory=list)
    planned: int = 0
    """Blocks sent to be restored."""
    restore: Restore | None = None


class SpillPlanner:
    def __init__(
        self,
        block_size: int,
        pending_steps: int = 64,
        shared: Callable[[str], bool] | None = None,
    ) -> None:
        self.block_size = block_size
        self._shared = shared
        """Whether the shared tier holds a key (its owner evicts without telling)."""
        self._tiers: dict[str, set[str]] = {}
        """Key → the tiers that hold it (restorable while not empty)."""
        self._requests: dict[str, _Request] = {}
        self._pending: dict[str, int] = {}
        """Keys sent to be saved → the step they were sent in (until the worker says)."""
        self._pending_steps = pending_steps
        self._step = 0

    def restorable(self, key: str) -> bool:
        return bool(self._tiers.get(key)) or (self._shared is not None and self._shared(key))

    def __len__(self) -> int:
        return sum(1 for tiers in self._tiers.values() if tiers)

    def match(
        self,
        request_id: str,
        namespace: str,
        block_hashes: Sequence[bytes],
        num_tokens: int,
        num_computed: int,
    ) -> int:
        """Tokens beyond ``num_computed`` (the engine's own prefix-cache hit) that can
        be restored: whole blocks, in a row, leaving at least one token to compute
        (the engine needs one to sample from)."""
        start = num_computed // self.block_size
        limit = min(len(block_hashes), (num_tokens - 1) // self.block_size)
        end = start
        while end < limit and self.restorable(block_key(namespace, block_hashes[end])):
            end += 1
        self._requests[request_id] = _Request(namespace=namespace, saved_upto=start)
        return (end - start) * self.block_size

    def allocated(
        self,
        request_id: str,
        block_hashes: Sequence[bytes],
        block_ids: Sequence[int],
        external_tokens: int,
    ) -> None:
        req = self._requests.get(request_id)
        if req is None or external_tokens <= 0:
            return
        start = req.saved_upto
        end = start + external_tokens // self.block_size
        req.loads = [
            Transfer(request_id, block_ids[i], block_key(req.namespace, block_hashes[i]))
            for i in range(start, end)
        ]
        req.first_load = start
        req.saved_upto = end

    def step(self, scheduled: Sequence[Scheduled]) -> StepPlan:
        """This step's loads (blocks allocated for restored tokens) and saves (blocks
        that this step fills, not held anywhere yet). ``scheduled``: per request, its
        id, block hashes, block ids and the tokens it will have computed after this
        step."""
        self._step += 1
        self._pending = {
            k: s for k, s in self._pending.items() if self._step - s <= self._pending_steps
        }
        plan = StepPlan()
        for request_id, hashes, block_ids, computed_after in scheduled:
            req = self._requests.get(request_id)
            if req is None:
                continue
            plan.loads += req.loads
            req.planned += len(req.loads)
            req.loads = []
            full = min(computed_after // self.block_size, len(hashes), len(block_ids))
            for i in range(req.saved_upto, full):
                key = block_key(req.namespace, hashes[i])
                if self.restorable(key) or key in self._pending:
                    continue
                self._pending[key] = self._step
                plan.saves.append(Transfer(request_id, block_ids[i], key))
            req.saved_upto = max(req.saved_upto, full)
        return plan

    def reported(
        self, events: Sequence[tuple[str, str, bool]], restores: dict[str, Restore]
    ) -> list[tuple[str, str, bool]]:
        """The worker side's (key, tier, stored) changes and per-request restores.
        Returns the changes that alter what is restorable where, for the platform."""
        out = []
        for key, tier, stored in events:
            tiers = self._tiers.setdefault(key, set())
            if stored:
                self._pending.pop(key, None)
                if tier not in tiers:
                    tiers.add(tier)
                    out.append((key, tier, True))
            elif tier in tiers:
                tiers.discard(tier)
                out.append((key, tier, False))
                if not tiers:
                    del self._tiers[key]
        for request_id, restore in restores.items():
            req = self._requests.get(request_id)
            if req is not None:
                if req.restore is None:
                    req.restore = Restore()
                req.restore.merge(restore)
                if restore.failed and req.first_load >= 0:
                    # the engine computes the blocks that failed: save them once it has
                    # (those that did load are restorable and are skipped)
                    req.saved_upto = min(req.saved_upto, req.first_load)
        return out

    def finished(self, request_id: str) -> Restore | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if req.restore is None and req.planned:
            return Restore(blocks=req.planned, timed=False)
        return req.restore

    def forget_all(self) -> list[tuple[str, str, bool]]:
        """Nothing is restorable any more (the cache was reset): the removals."""
        out = [(k, t, False) for k, tiers in self._tiers.items() for t in tiers]
        self._tiers.clear()
        self._pending.clear()
        return out
