"""A worker's KV events as the messages it publishes, and what it tells a scheduler
that missed some. No I/O."""

from __future__ import annotations

from collections.abc import Iterator

from inferbus.contracts import (
    KV_SPILL_MEDIA,
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    KvEvent,
    KvEventBatch,
)
from inferbus.shared.codec import encode

KV_BATCH_BYTES = 256 * 1024
"""Past this a batch is split (NATS refuses a message over its max payload, 1 MiB by
default; a long prompt's stored hashes come to about 10 bytes a block)."""


def kv_batches(
    worker_id: str, events: list[KvEvent], limit: int = KV_BATCH_BYTES
) -> Iterator[bytes]:
    """``events`` encoded as few ``KvEventBatch`` messages, in order, each at most
    ``limit`` bytes unless one event alone is bigger (then it goes alone)."""
    if not events:
        return
    data = encode(KvEventBatch(worker_id=worker_id, events=events))
    if len(data) <= limit or len(events) == 1:
        yield data
        return
    half = len(events) // 2
    yield from kv_batches(worker_id, events[:half], limit)
    yield from kv_batches(worker_id, events[half:], limit)


RESYNC_BLOCKS = 10_000
"""Hashes a stored event of a resync carries (about 210 KB of JSON)."""


class KvMirror:
    """What this worker's own KV events said it holds, by medium (None or ``GPU``: the
    engine's cache): what it answers a scheduler that missed some of them with."""

    def __init__(self) -> None:
        self.held: dict[str | None, set[int]] = {}
        self.block_size = 0

    def apply(self, events: list[KvEvent]) -> None:
        for e in events:
            if isinstance(e, KvBlocksStored):
                self.held.setdefault(e.medium, set()).update(e.block_hashes)
                self.block_size = max(self.block_size, e.block_size)
            elif isinstance(e, KvBlocksRemoved):
                self.held.get(e.medium, set()).difference_update(e.block_hashes)
            else:  # the engine's cache emptied; its spill tiers keep theirs
                self.held = {m: b for m, b in self.held.items() if m in KV_SPILL_MEDIA}

    def resync(self, worker_id: str) -> list[KvEvent]:
        """The whole state as events, not numbered: the engine's cache cleared, then
        what each medium holds (the cleared reader forgets nothing it should keep: a
        spill tier's blocks come again in full)."""
        out: list[KvEvent] = [KvAllCleared(worker_id=worker_id)]
        for medium, blocks in self.held.items():
            hashes = list(blocks)
            for i in range(0, len(hashes), RESYNC_BLOCKS):
                out.append(
                    KvBlocksStored(
                        worker_id=worker_id,
                        block_hashes=hashes[i : i + RESYNC_BLOCKS],
                        block_size=self.block_size,
                        medium=medium,
                    )
                )
        return out
