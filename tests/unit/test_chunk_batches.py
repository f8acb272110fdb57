"""Token chunks of streams stepping together travel in one message a reader (issue 40's
token path): which readers take batches, and the order a ChunkSender keeps."""

from __future__ import annotations

import asyncio

import pytest

from inferbus.contracts import (
    ChunkBatch,
    ProgressBatch,
    ReplyDelivery,
    RequestFinished,
    RequestProgress,
    TokenChunk,
    Usage,
    batch_subject,
)
from inferbus.shared.chunksender import ChunkSender
from inferbus.shared.codec import decode, encode


@pytest.mark.parametrize(
    "subject, batch",
    [
        ("ib.filter.san-1.ib.reply.gw.g1.r1", "ib.filter.san-1.batch"),
        ("ib.filter.san-1._INBOX.abc.7", "ib.filter.san-1.batch"),
        ("ib.reply.gw.g1.r1", "ib.reply.gw.g1.batch"),
        # readers of one event a message: a tenant's, a client's inbox
        ("ib.reply.tenant.acme.r1", None),
        ("_INBOX.abc.7", None),
        # a batch subject is no stream's own
        ("ib.reply.gw.g1.batch", None),
        ("ib.filter.san-1.batch", None),
        ("ib.reply.gw.g1", None),
    ],
)
def test_only_the_platform_s_own_readers_take_batches(subject, batch):
    assert batch_subject(subject) == batch


class Bus:
    """What a ChunkSender publishes, in order (the real bus is in the integration test)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes, headers: dict | None = None) -> None:
        self.sent.append((subject, data))


def chunk(rid: str, seq: int) -> TokenChunk:
    return TokenChunk(request_id=rid, seq=seq, text=f"{rid}:{seq} ", token_ids=[seq])


async def test_chunks_of_one_turn_go_as_one_batch_a_reader():
    bus = Bus()
    out = ChunkSender(bus)  # type: ignore[arg-type]
    for rid in ("r1", "r2", "r3"):
        await out.send(f"ib.reply.gw.g1.{rid}", chunk(rid, 0))
    await out.send("ib.filter.s1.ib.reply.gw.g2.r9", chunk("r9", 0))  # another reader: alone
    assert bus.sent == []  # gathered until the loop's turn ends
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [s for s, _ in bus.sent] == ["ib.reply.gw.g1.batch", "ib.filter.s1.ib.reply.gw.g2.r9"]
    batch = decode(bus.sent[0][1], ReplyDelivery)
    assert isinstance(batch, ChunkBatch)
    assert [(c.subject, c.chunk.request_id) for c in batch.chunks] == [
        ("ib.reply.gw.g1.r1", "r1"),
        ("ib.reply.gw.g1.r2", "r2"),
        ("ib.reply.gw.g1.r3", "r3"),
    ]
    assert isinstance(decode(bus.sent[1][1], ReplyDelivery), TokenChunk)  # a lone one as itself
    assert out.stats() == {"chunks_sent": 4, "chunk_messages": 2}


async def test_an_end_sent_after_a_flush_follows_its_chunks():
    bus = Bus()
    out = ChunkSender(bus)  # type: ignore[arg-type]
    await out.send("ib.reply.gw.g1.r1", chunk("r1", 0))
    await out.send("ib.reply.gw.g1.r2", chunk("r2", 0))
    await out.flush()
    end = RequestFinished(request_id="r1", finish_reason="stop", usage=Usage(), chunks=1)
    await bus.publish("ib.reply.gw.g1.r1", encode(end))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the turn's own flush finds nothing left
    assert [s for s, _ in bus.sent] == ["ib.reply.gw.g1.batch", "ib.reply.gw.g1.r1"]


async def test_the_scheduler_s_copies_go_ahead_of_every_chunk():
    bus = Bus()
    out = ChunkSender(bus)  # type: ignore[arg-type]
    for rid in ("r1", "r2"):
        c = chunk(rid, 0)
        out.copy_ahead("ib.progress.w1", RequestProgress(worker_id="w1", chunk=c))
        await out.send(f"ib.reply.gw.g1.{rid}", c)
    # a tenant's chunk goes at once, but not before the copies gathered so far
    c = chunk("t1", 0)
    out.copy_ahead("ib.progress.w1", RequestProgress(worker_id="w1", chunk=c))
    await out.send("ib.reply.tenant.acme.t1", c)
    assert [s for s, _ in bus.sent] == [
        "ib.progress.w1",
        "ib.reply.gw.g1.batch",
        "ib.reply.tenant.acme.t1",
    ]
    copies = decode(bus.sent[0][1], ProgressBatch)
    assert [p.chunk.request_id for p in copies.progress] == ["r1", "r2", "t1"]


async def test_without_batching_every_chunk_goes_at_once_on_its_own_subject():
    bus = Bus()
    out = ChunkSender(bus, batching=False)  # type: ignore[arg-type]
    await out.send("ib.reply.gw.g1.r1", chunk("r1", 0))
    await out.send("ib.reply.gw.g1.r2", chunk("r2", 0))
    assert [s for s, _ in bus.sent] == ["ib.reply.gw.g1.r1", "ib.reply.gw.g1.r2"]


async def test_a_window_gathers_the_chunks_of_several_turns_in_one_message():
    bus = Bus()
    out = ChunkSender(bus, window_s=0.05)  # type: ignore[arg-type]
    c1 = chunk("r1", 1)
    out.copy_ahead("ib.progress.w1", RequestProgress(worker_id="w1", chunk=c1))
    await out.send("ib.reply.gw.g1.r1", c1)
    await asyncio.sleep(0.01)  # another engine step, within the window
    await out.send("ib.reply.gw.g1.r2", chunk("r2", 1))
    await asyncio.sleep(0.01)
    assert bus.sent == []
    await asyncio.sleep(0.06)  # the window from the first chunk is over
    assert [s for s, _ in bus.sent] == ["ib.progress.w1", "ib.reply.gw.g1.batch"]
    batch = decode(bus.sent[1][1], ReplyDelivery)
    assert isinstance(batch, ChunkBatch)
    assert [c.chunk.request_id for c in batch.chunks] == ["r1", "r2"]
    # the next chunk opens a window of its own
    await out.send("ib.reply.gw.g1.r1", chunk("r1", 2))
    await asyncio.sleep(0.01)
    assert len(bus.sent) == 2
    await asyncio.sleep(0.06)
    assert len(bus.sent) == 3


async def test_a_stream_s_first_chunk_takes_what_waits_along_at_the_end_of_its_turn():
    bus = Bus()
    out = ChunkSender(bus, window_s=10.0)  # type: ignore[arg-type]
    await out.send("ib.reply.gw.g1.r1", chunk("r1", 3))
    await out.send("ib.reply.gw.g1.r2", chunk("r2", 0), at_once=True)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [s for s, _ in bus.sent] == ["ib.reply.gw.g1.batch"]
    batch = decode(bus.sent[0][1], ReplyDelivery)
    assert isinstance(batch, ChunkBatch)
    assert [(c.chunk.request_id, c.chunk.seq) for c in batch.chunks] == [("r1", 3), ("r2", 0)]
    assert out._timer is None, "the window's flush is still armed after it went"


async def test_an_end_flushed_within_a_window_follows_its_chunks_at_once():
    bus = Bus()
    out = ChunkSender(bus, window_s=10.0)  # type: ignore[arg-type]
    await out.send("ib.reply.gw.g1.r1", chunk("r1", 0))
    await out.flush()  # as the worker does before a stream's end
    end = RequestFinished(request_id="r1", finish_reason="stop", usage=Usage(), chunks=1)
    await bus.publish("ib.reply.gw.g1.r1", encode(end))
    assert [s for s, _ in bus.sent] == ["ib.reply.gw.g1.r1", "ib.reply.gw.g1.r1"]
    assert isinstance(decode(bus.sent[0][1], ReplyDelivery), TokenChunk)
    await out.send("ib.reply.gw.g1.r2", chunk("r2", 0))  # a new window after the flush
    assert out._timer is not None
    await out.flush()
    assert out._timer is None and len(bus.sent) == 3
