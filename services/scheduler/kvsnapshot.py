"""The KV index as parts to store, and back. No I/O.

A restarted scheduler used to rebuild its index by reading IB_KV from its start:
about 5 s per million events, bounded only by the stream's bytes. The service now
stores what the index holds every ``kv_snapshot_interval_s`` (and when it stops),
with the IB_KV position it is as of, in the KV bucket ``ib-kv-index``; a new one
loads the parts and reads IB_KV on from that position. Only what the workers' events
said is kept (the engine's cache and its spill tiers), not what was routed.

A round is written a worker at a time (each worker's parts at the position when they
were taken, the service yielding between workers), and a scheduler that dies
mid-round leaves some keys at one position and some at another. Reading on from the
earliest is safe: an event a loaded worker's part already covers has a number its
count has passed, and is ignored.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Iterable

from inferbus.contracts import KvIndexPart

from .kvindex import KvIndex

_NOT_IN_KEY = re.compile(r"[^-/_=.a-zA-Z0-9]")

PART_BLOCKS = 50_000
"""Blocks a part holds: about 530 KB as JSON (base64 of 8 bytes a block), under NATS'
1 MiB message limit."""


def _pack(hashes: list[int]) -> bytes:
    """Little-endian uint64s (a hash out of that range, from a worker's bug, left out:
    it could not have matched a request's)."""
    try:
        a = array("Q", hashes)
    except OverflowError:
        a = array("Q", [h for h in hashes if 0 <= h < 1 << 64])
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def _unpack(data: bytes) -> list[int]:
    a = array("Q")
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()


def key_of(part: KvIndexPart) -> str:
    """Its key in the bucket (characters a key may not hold become ``_``: the part
    names its worker exactly)."""
    worker = _NOT_IN_KEY.sub("_", part.worker_id)
    return f"{worker}.{part.medium or 'cache'}.{part.part}"


def worker_parts(
    index: KvIndex, worker: str, stream_seq: int, part_blocks: int = PART_BLOCKS
) -> dict[str, KvIndexPart]:
    """One worker's blocks, after IB_KV's message ``stream_seq``: key → part."""
    out: dict[str, KvIndexPart] = {}
    for medium, blocks in index.held_by(worker).items():
        hashes = list(blocks)
        parts = max(1, -(-len(hashes) // part_blocks))
        for i in range(parts):
            part = KvIndexPart(
                worker_id=worker,
                stream_seq=stream_seq,
                seq=index.last_seq(worker),
                block_size=index.known_block_size(worker),
                medium=medium,
                part=i,
                parts=parts,
                hashes=_pack(hashes[i * part_blocks : (i + 1) * part_blocks]),
            )
            out[key_of(part)] = part
    return out


def snapshot(
    index: KvIndex, stream_seq: int, part_blocks: int = PART_BLOCKS
) -> dict[str, KvIndexPart]:
    """The whole index as it stands, after IB_KV's message ``stream_seq``."""
    out: dict[str, KvIndexPart] = {}
    for worker in index.reporters():
        out.update(worker_parts(index, worker, stream_seq, part_blocks))
    return out


def load(index: KvIndex, parts: Iterable[KvIndexPart]) -> int:
    """Put the stored parts into ``index``; the IB_KV position to read on after (0:
    nothing loaded, read it all). A worker whose parts are not of one round, or not
    all there, is left out (its blocks come back as its engine reports them)."""
    by_worker: dict[str, list[KvIndexPart]] = {}
    for p in parts:
        by_worker.setdefault(p.worker_id, []).append(p)
    resume = 0
    for worker, mine in by_worker.items():
        rounds = {(p.stream_seq, p.seq) for p in mine}
        media: dict[str, list[KvIndexPart]] = {}
        for p in mine:
            media.setdefault(p.medium, []).append(p)
        whole = all(sorted(p.part for p in ps) == list(range(ps[0].parts)) for ps in media.values())
        if len(rounds) != 1 or not whole:
            continue
        [(stream_seq, seq)] = rounds
        index.load(
            worker,
            seq,
            max(p.block_size for p in mine),
            {
                m: [h for p in sorted(ps, key=lambda p: p.part) for h in _unpack(p.hashes)]
                for m, ps in media.items()
            },
        )
        resume = stream_seq if not resume else min(resume, stream_seq)
    return resume
