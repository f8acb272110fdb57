"""Chunks of many streams gathered into batches on a real nats-server: every stream's
chunks arrive whole and in order, its end after its last chunk, in far fewer messages
than chunks (issue 40's token path)."""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict

import pytest

from inferbus.contracts import (
    ChunkBatch,
    ReplyDelivery,
    RequestFinished,
    TokenChunk,
    Usage,
    reply_subject,
)
from inferbus.shared.bus import connect, round_trip
from inferbus.shared.chunksender import ChunkSender
from inferbus.shared.codec import decode, encode

pytestmark = pytest.mark.integration

STREAMS, STEPS = 40, 25


@pytest.mark.parametrize("window_s", [0.0, 0.02], ids=["a-turn", "a-window"])
async def test_streams_stepping_together_arrive_whole_in_order_in_fewer_messages(
    nats_url, window_s
):
    owner = f"gw.g{secrets.token_hex(3)}"
    reader = await connect(nats_url, "batch-reader")
    writer = await connect(nats_url, "batch-writer")
    got: dict[str, list[object]] = defaultdict(list)
    messages = most = 0
    ended = asyncio.Event()

    async def on(msg) -> None:
        nonlocal messages, most
        messages += 1
        event = decode(msg.data, ReplyDelivery)
        items = (
            [(c.subject, c.chunk) for c in event.chunks]
            if isinstance(event, ChunkBatch)
            else [(msg.subject, event)]
        )
        most = max(most, len(items))
        for subject, ev in items:
            got[subject.rsplit(".", 1)[-1]].append(ev)
        if sum(isinstance(e, RequestFinished) for evs in got.values() for e in evs) == STREAMS:
            ended.set()

    await reader.subscribe(reply_subject(owner, ">"), cb=on)
    await round_trip(reader)  # live on the server: a bare flush is no barrier (1 run in 16)
    out = ChunkSender(writer, window_s=window_s)
    try:

        async def stream(rid: str, steps: int) -> None:
            subject = reply_subject(owner, rid)
            for seq in range(steps):
                tok = TokenChunk(request_id=rid, seq=seq, text=f"{seq} ", token_ids=[seq])
                await out.send(subject, tok, at_once=seq == 0)
                await asyncio.sleep(0.002)  # an engine step
            await out.flush()  # as the worker does before a stream's end
            end = RequestFinished(request_id=rid, finish_reason="stop", usage=Usage(), chunks=steps)
            await writer.publish(subject, encode(end))

        # streams of different lengths: ends land between other streams' chunks
        await asyncio.gather(*(stream(f"r{i}", STEPS + i % 7) for i in range(STREAMS)))
        await asyncio.wait_for(ended.wait(), 10.0)
    finally:
        await writer.close()
        await reader.close()
    for i in range(STREAMS):
        events = got[f"r{i}"]
        assert [e.seq for e in events[:-1]] == list(range(STEPS + i % 7))  # type: ignore[attr-defined]
        assert isinstance(events[-1], RequestFinished)
        assert all(isinstance(e, TokenChunk) for e in events[:-1])
    chunks = sum(STEPS + i % 7 for i in range(STREAMS))
    assert out.stats()["chunks_sent"] == chunks
    assert messages < (chunks + STREAMS) / 5  # gathered: about one message a step
    if window_s:  # and several steps of every stream share one (each a chunk a step)
        assert most > 2 * STREAMS
