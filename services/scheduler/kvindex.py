"""Which worker holds which prefix blocks, for KV-aware routing. No I/O.

Built from the workers' KV events (``ib.kv.<worker>`` in JetStream, replayed after a
scheduler restart): a block is a hash of a prefix chain, so a request's overlap with
a worker is the number of its leading blocks the worker holds. A worker that
publishes no events is tracked approximately: the scheduler records the blocks of
what it routed there, in an LRU bounded by the worker's cache size, which is what
the worker's own prefix cache does with them.
"""

from __future__ import annotations

from collections import OrderedDict

from inferbus.contracts import KvAllCleared, KvBlocksRemoved, KvBlocksStored, KvEvent


class KvIndex:
    def __init__(self, approx_capacity_blocks: int = 4096) -> None:
        self.approx_capacity_blocks = approx_capacity_blocks
        self._holders: dict[int, set[str]] = {}
        """block hash → workers holding it."""
        self._blocks: dict[str, set[int]] = {}
        self._exact: set[str] = set()
        """Workers whose KV events arrive: their blocks are what they report."""
        self._approx: dict[str, OrderedDict[int, None]] = {}

    # -- inputs ----------------------------------------------------------------------

    def on_event(self, event: KvEvent) -> None:
        w = event.worker_id
        if w not in self._exact:  # its own events from now on, not our guesses
            self._exact.add(w)
            self.forget(w)
        if isinstance(event, KvBlocksStored):
            for h in event.block_hashes:
                self._add(w, h)
        elif isinstance(event, KvBlocksRemoved):
            for h in event.block_hashes:
                self._remove(w, h)
        elif isinstance(event, KvAllCleared):
            self.forget(w)

    def on_routed(self, worker_id: str, block_hashes: list[int]) -> None:
        """A request went there: a worker without events now probably holds its blocks."""
        if worker_id in self._exact or not block_hashes:
            return
        lru = self._approx.setdefault(worker_id, OrderedDict())
        for h in block_hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._add(worker_id, h)
        while len(lru) > self.approx_capacity_blocks:
            old, _ = lru.popitem(last=False)
            self._remove(worker_id, old)

    def forget(self, worker_id: str) -> None:
        for h in self._blocks.pop(worker_id, set()):
            holders = self._holders.get(h)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[h]
        self._approx.pop(worker_id, None)

    def drop_worker(self, worker_id: str) -> None:
        self.forget(worker_id)
        self._exact.discard(worker_id)

    # -- views -----------------------------------------------------------------------

    def overlaps(self, block_hashes: list[int], workers: list[str]) -> dict[str, int]:
        """For each worker, how many of the request's leading blocks it holds."""
        out = dict.fromkeys(workers, 0)
        alive = set(workers)
        for h in block_hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            alive &= holders
            if not alive:
                break
            for w in alive:
                out[w] += 1
        return out

    def blocks(self, worker_id: str) -> int:
        return len(self._blocks.get(worker_id, ()))

    def exact(self, worker_id: str) -> bool:
        return worker_id in self._exact

    # -- internals -------------------------------------------------------------------

    def _add(self, w: str, h: int) -> None:
        self._holders.setdefault(h, set()).add(w)
        self._blocks.setdefault(w, set()).add(h)

    def _remove(self, w: str, h: int) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(w)
            if not holders:
                del self._holders[h]
        blocks = self._blocks.get(w)
        if blocks is not None:
            blocks.discard(h)


def text_blocks(text: str, block_chars: int = 256) -> list[int]:
    """Chained hashes of a prompt's fixed-size character blocks: the approximate
    prefix identity the scheduler can compute without the model's tokenizer."""
    out: list[int] = []
    parent = 0
    for i in range(0, len(text) - block_chars + 1, block_chars):
        parent = hash((parent, text[i:i + block_chars]))
        out.append(parent)
    return out
