"""Which worker holds which prefix blocks, for KV-aware routing. No I/O.

Two views, both in block hashes of a prefix chain (a request's overlap with a worker
is the number of its leading blocks the worker holds):
- exact: the workers' own KV events (``ib.kv.<worker>`` in JetStream, replayed after
  a scheduler restart), in the engine's block hashes. A request is matched against
  it exactly when it carries its token ids (the sanitizer tokenizes with the served
  model's tokenizer): they are hashed as the engine hashes them, at the block size
  the workers' events report. A client may also send ``prefix_hashes`` itself.
- spilled: blocks a worker can restore from its KV spill tiers (host memory, medium
  ``CPU``; disk, ``STORAGE``) instead of computing them, from the same events. They
  count for less than blocks in the engine's cache (a restore costs a copy).
- approximate: the blocks of what the scheduler routed to each worker, in an LRU
  bounded like the worker's cache. Requests with neither are hashed from their
  text, which the engine's hashes cannot be matched with, so this view is what
  routes them, on every worker. Token-hashed requests are remembered here too (a
  conversation's next turn may come before the engine's events of the last one),
  and the engine's evictions remove them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import NamedTuple

from inferbus.contracts import (
    KV_SPILL_MEDIA,
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    KvEvent,
    RequestSubmitted,
)
from inferbus.shared.prefixhash import DEFAULT_SEED, block_hashes


class _Holders:
    """Block → who holds it; worker → its blocks. Most blocks have one holder, kept
    as its id: a set for each (216 bytes, and one more object every garbage
    collection walks) made the index about 300 MB and 0.3 s of collector pause per
    million blocks. A set is made only for a block several workers hold."""

    def __init__(self) -> None:
        self.by_block: dict[int, str | set[str]] = {}
        self.by_worker: dict[str, set[int]] = {}

    def of(self, h: int) -> Collection[str]:
        """Who holds ``h``."""
        held = self.by_block.get(h)
        if held is None:
            return ()
        return (held,) if isinstance(held, str) else held

    def add(self, w: str, h: int) -> None:
        held = self.by_block.get(h)
        if held is None:
            self.by_block[h] = w
        elif isinstance(held, str):
            if held != w:
                self.by_block[h] = {held, w}
        else:
            held.add(w)
        self.by_worker.setdefault(w, set()).add(h)

    def _unhold(self, w: str, h: int) -> None:
        held = self.by_block.get(h)
        if held is None:
            return
        if isinstance(held, str):
            if held == w:
                del self.by_block[h]
            return
        held.discard(w)
        if len(held) == 1:
            self.by_block[h] = next(iter(held))
        elif not held:
            del self.by_block[h]

    def remove(self, w: str, h: int) -> None:
        self._unhold(w, h)
        blocks = self.by_worker.get(w)
        if blocks is not None:
            blocks.discard(h)

    def forget(self, w: str) -> None:
        for h in self.by_worker.pop(w, set()):
            self._unhold(w, h)

    def run(self, w: str, blocks: list[int]) -> int:
        """How many of ``blocks``, from the first, ``w`` holds."""
        mine = self.by_worker.get(w)
        n = 0
        if mine:
            for h in blocks:
                if h not in mine:
                    break
                n += 1
        return n

    def overlaps(self, blocks: list[int], workers: list[str]) -> dict[str, int]:
        out = dict.fromkeys(workers, 0)
        alive = set(workers)
        for h in blocks:
            holders = self.of(h)
            if not holders:
                break
            alive.intersection_update(holders)
            if not alive:
                break
            for w in alive:
                out[w] += 1
        return out


SPILL_MEDIA = KV_SPILL_MEDIA

RESYNC_EVERY_S = 5.0
"""A worker is asked for its whole KV state at most this often."""


class KvIndex:
    def __init__(self, approx_capacity_blocks: int = 4096) -> None:
        self.approx_capacity_blocks = approx_capacity_blocks
        self._spilled = {m: _Holders() for m in SPILL_MEDIA}
        self._exact = _Holders()
        self._approx = _Holders()
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._reporting: set[str] = set()
        self._block_size: dict[str, int] = {}
        """Worker → the engine's block size, from its heartbeats or its events (partial
        blocks say less)."""
        self._seq: dict[str, int] = {}
        """Worker → the number of its last KV event."""
        self.gaps = 0
        """KV event streams found with an event missing."""
        self.resyncs: set[str] = set()
        """Workers to ask for their whole state (``KvResync``): an event of theirs was
        missed."""
        self._resync_asked: dict[str, float] = {}

    def on_event(self, event: KvEvent) -> None:
        w = event.worker_id
        if event.seq:
            last = self._seq.get(w)
            if last is not None and event.seq <= last:
                return  # seen: a redelivery
            if last is not None and event.seq != last + 1:
                # events were lost on the way: a lost removal would leave blocks believed
                # cached that are not; what it reported before is dropped, and it fills
                # in again as its engine stores blocks
                self.gaps += 1
                self.forget_reports(w)
                self.resyncs.add(w)  # its whole state, asked of it
            self._seq[w] = event.seq
        self._reporting.add(w)
        spilled = self._spilled.get(getattr(event, "medium", None) or "")
        if spilled is not None:
            if isinstance(event, KvBlocksStored):
                for h in event.block_hashes:
                    spilled.add(w, h)
            elif isinstance(event, KvBlocksRemoved):
                for h in event.block_hashes:
                    spilled.remove(w, h)
            return
        if isinstance(event, KvBlocksStored):
            if event.block_size > self._block_size.get(w, 0):
                self._block_size[w] = event.block_size
            for h in event.block_hashes:
                self._exact.add(w, h)
        elif isinstance(event, KvBlocksRemoved):
            lru = self._lru.get(w)
            for h in event.block_hashes:
                self._exact.remove(w, h)
                # routed in the engine's terms (token-hashed): the eviction names it too
                if lru is not None and lru.pop(h, 0) is None:
                    self._approx.remove(w, h)
        elif isinstance(event, KvAllCleared):  # the engine dropped its whole cache
            self._exact.forget(w)
            self._approx.forget(w)
            self._lru.pop(w, None)

    def on_routed(self, worker_id: str, block_hashes: list[int]) -> None:
        """A request went there: the worker now probably holds its blocks."""
        if not block_hashes:
            return
        lru = self._lru.setdefault(worker_id, OrderedDict())
        for h in block_hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._approx.add(worker_id, h)
        while len(lru) > self.approx_capacity_blocks:
            old, _ = lru.popitem(last=False)
            self._approx.remove(worker_id, old)

    def forget_reports(self, worker_id: str) -> None:
        """What ``worker_id``'s events said (the engine's cache and its spill tiers)."""
        for spilled in self._spilled.values():
            spilled.forget(worker_id)
        self._exact.forget(worker_id)

    def ask_whole_state(self, worker_id: str) -> None:
        """A worker whose events this index may not have read (a partitioned scheduler
        took over its partition): unless some were read, ask it for its whole state."""
        if worker_id not in self._seq:
            self.resyncs.add(worker_id)

    def take_resyncs(self, now: float) -> dict[str, int]:
        """The workers to ask for their whole state now, each with the highest event
        number seen of it: at most every ``RESYNC_EVERY_S`` a worker (its answer may be
        lost in turn); the others stay due."""
        due: dict[str, int] = {}
        for w in sorted(self.resyncs):
            if now - self._resync_asked.get(w, -RESYNC_EVERY_S) < RESYNC_EVERY_S:
                continue
            self.resyncs.discard(w)
            self._resync_asked[w] = now
            due[w] = self._seq.get(w, 0)
        if len(self._resync_asked) > 10_000:
            self._resync_asked = {
                w: t for w, t in self._resync_asked.items() if now - t < RESYNC_EVERY_S
            }
        return due

    def drop_worker(self, worker_id: str) -> None:
        self.forget_reports(worker_id)
        self._approx.forget(worker_id)
        self._lru.pop(worker_id, None)
        self._reporting.discard(worker_id)
        self._block_size.pop(worker_id, None)
        self._seq.pop(worker_id, None)
        self.resyncs.discard(worker_id)

    def overlaps(self, block_hashes: list[int], workers: list[str]) -> dict[str, int]:
        """For each worker, how many of the request's leading blocks it holds, by
        its events or, where they say less, by what was routed there."""
        if not self._approx.by_block:
            return self._exact.overlaps(block_hashes, workers)
        if not self._exact.by_block:
            return self._approx.overlaps(block_hashes, workers)
        exact = self._exact.overlaps(block_hashes, workers)
        approx = self._approx.overlaps(block_hashes, workers)
        return {w: max(exact[w], approx[w]) for w in workers}

    def depth(self, worker_id: str, block_hashes: list[int]) -> int:
        """``overlaps`` for one worker: its leading blocks held by either view."""
        return max(
            self._exact.run(worker_id, block_hashes), self._approx.run(worker_id, block_hashes)
        )

    def holder_count(self, block_hash: int) -> int:
        """At least as many as hold ``block_hash`` in any view."""
        return (
            len(self._exact.of(block_hash))
            + len(self._approx.of(block_hash))
            + sum(len(s.of(block_hash)) for s in self._spilled.values())
        )

    def spills(self) -> bool:
        """Some worker's spill tiers hold blocks now."""
        return any(s.by_block for s in self._spilled.values())

    def holders(self, block_hash: int) -> set[str]:
        """The workers holding ``block_hash`` in any view (cache, routed, spilled):
        only they can have a request starting with it cached or restorable."""
        out = set(self._exact.of(block_hash))
        out.update(self._approx.of(block_hash))
        for spilled in self._spilled.values():
            out.update(spilled.of(block_hash))
        return out

    def restorable(self, block_hashes: list[int], cached: dict[str, int]) -> dict[str, int]:
        """For each worker, how many blocks right after the ``cached`` ones (its
        overlap) it can restore from a spill tier: the rest of its run of leading
        blocks held in its cache or a tier."""
        out = dict.fromkeys(cached, 0)
        if not any(s.by_worker for s in self._spilled.values()):
            return out
        for w, start in cached.items():
            held = [s.by_worker.get(w, set()) for s in self._spilled.values()]
            n = 0
            for h in block_hashes[start:]:
                if not any(h in blocks for blocks in held):
                    break
                n += 1
            out[w] = n
        return out

    def reporters(self) -> list[str]:
        """Workers whose events say they hold blocks (in the cache or a spill tier)."""
        out = set(self._exact.by_worker)
        for spilled in self._spilled.values():
            out.update(spilled.by_worker)
        return sorted(out)

    def held_by(self, worker_id: str) -> dict[str, set[int]]:
        """What ``worker_id``'s events say it holds, by medium ("": the engine's cache)."""
        views = {"": self._exact, **self._spilled}
        return {m: blocks for m, h in views.items() if (blocks := h.by_worker.get(worker_id))}

    def last_seq(self, worker_id: str) -> int:
        return self._seq.get(worker_id, 0)

    def known_block_size(self, worker_id: str) -> int:
        return self._block_size.get(worker_id, 0)

    def load(self, worker_id: str, seq: int, block_size: int, media: dict[str, list[int]]) -> None:
        """What a snapshot says ``worker_id``'s events had said, up to its event ``seq``
        (medium "" the engine's cache): in place of what this index believed of it."""
        self.forget_reports(worker_id)
        self._reporting.add(worker_id)
        if seq:
            self._seq[worker_id] = seq
        if block_size:
            self._block_size[worker_id] = block_size
        for medium, hashes in media.items():
            holders = self._spilled[medium] if medium else self._exact
            for h in hashes:
                holders.add(worker_id, h)

    def blocks(self) -> int:
        """Blocks the engines' events say are cached, counted once however many hold each."""
        return len(self._exact.by_block)

    def workers(self) -> set[str]:
        return set(self._exact.by_worker) | set(self._approx.by_worker) | self._reporting

    def exact(self, worker_id: str) -> bool:
        """The worker publishes KV events."""
        return worker_id in self._reporting

    def set_block_size(self, worker_id: str, size: int) -> None:
        """What the worker's heartbeat says, before any of its events has."""
        self._block_size[worker_id] = size

    def block_size(self, workers: Iterable[str]) -> int:
        """The block size the first of ``workers`` that said one hashes with; 0 when
        none did yet."""
        return next((self._block_size[w] for w in workers if w in self._block_size), 0)


def text_blocks(text: str, block_chars: int = 256) -> list[int]:
    """Chained hashes of a prompt's fixed-size character blocks: the approximate
    prefix identity the scheduler can compute without the model's tokenizer."""
    out: list[int] = []
    parent = 0
    for i in range(0, len(text) - block_chars + 1, block_chars):
        parent = hash((parent, text[i : i + block_chars]))
        out.append(parent)
    return out


class PrefixBlocks(NamedTuple):
    hashes: list[int]
    exact: bool
    """In the engine's terms (KV events will name them), not text blocks."""


def prefix_blocks(
    request: RequestSubmitted, block_chars: int = 256, block_size: int = 0, seed: str = DEFAULT_SEED
) -> PrefixBlocks:
    """A request's prefix blocks: the client's ``prefix_hashes``; else, with its token
    ids and the engines' ``block_size`` known, the engine's block hashes of them; else
    ``text_blocks`` of its prompt, or of its messages as role and content lines. A
    prompt of token ids is its ids."""
    if request.prefix_hashes:
        return PrefixBlocks(list(request.prefix_hashes), True)
    ids = request.prompt_token_ids or request.token_prompt  # a token prompt is the ids
    if ids and block_size > 0:
        return PrefixBlocks(block_hashes(ids, block_size, seed), True)
    text = (
        request.prompt
        if request.prompt is not None
        else "".join(f"{m.role}\n{m.content}\n" for m in request.messages or ())
    )
    return PrefixBlocks(text_blocks(text, block_chars), False)
