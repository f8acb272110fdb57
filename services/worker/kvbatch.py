"""A worker's KV events as the messages it publishes. No I/O."""

from __future__ import annotations

from collections.abc import Iterator

from inferbus.contracts import KvEvent, KvEventBatch
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
