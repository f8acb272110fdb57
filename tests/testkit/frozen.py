"""A stand-in worker that records a request's end and freezes before sending it (a
SIGSTOP landing there): its heartbeats stop, and only a scheduler can tell the end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from inferbus.client import Client, Stream
from inferbus.contracts import (
    RequestFinished,
    RequestStarted,
    Usage,
    WorkAssigned,
    WorkerHeartbeat,
    ended_subject,
    heartbeat_subject,
    started_subject,
    work_subject,
)
from inferbus.shared.bus import record_end
from inferbus.shared.codec import decode, encode


@asynccontextmanager
async def frozen_worker(
    c: Client, worker_id: str, model: str
) -> AsyncIterator[asyncio.Future[RequestFinished]]:
    """Serves ``model`` as ``worker_id`` (heartbeats every 0.3 s) until its first
    request, whose end it records and never sends; yields the end once recorded."""
    nc, js = c.nc, c.js
    serving: set[str] = set()
    silent = asyncio.Event()
    recorded: asyncio.Future[RequestFinished] = asyncio.get_running_loop().create_future()

    async def heartbeats() -> None:
        while not silent.is_set():
            beat = WorkerHeartbeat(
                worker_id=worker_id,
                models=[model],
                engine="stand-in",
                inflight=sorted(serving),
                interval_s=0.3,
                sent_at=time.time(),
            )
            await nc.publish(heartbeat_subject(worker_id), encode(beat))
            await asyncio.sleep(0.3)

    async def on_work(msg) -> None:
        work = decode(msg.data, WorkAssigned)
        await msg.ack()
        rid = work.request.request_id
        serving.add(rid)
        started = RequestStarted(request_id=rid, worker_id=worker_id, attempt=work.attempt)
        await nc.publish(started_subject(work.partition), encode(started))
        end = RequestFinished(
            request_id=rid,
            finish_reason="stop",
            usage=Usage(prompt_tokens=1, completion_tokens=0),
            chunks=0,
            worker_id=worker_id,
            attempt=work.attempt,
            served_model=model,
        )
        serving.discard(rid)  # a real worker lists it under `telling` from here
        await record_end(
            js, ended_subject(work.partition), end, request_id=rid, msg_id=f"{rid}:end"
        )
        silent.set()  # frozen here: the end recorded, never sent
        recorded.set_result(end)

    beating = asyncio.ensure_future(heartbeats())
    sub = await js.subscribe(work_subject(worker_id), cb=on_work, manual_ack=True)
    try:
        yield recorded
    finally:
        silent.set()
        await sub.unsubscribe()
        await beating


async def asked_and_recorded(
    c: Client, model: str, recorded: asyncio.Future[RequestFinished]
) -> tuple[Stream, asyncio.Future[None], RequestFinished]:
    """One streaming request to the frozen worker's ``model``, read to its end in the
    background (the future returned); returns once the worker recorded the end and a
    scheduler has had 0.3 s to read the record (and keep it to tell)."""
    stream = c.stream(model, "anyone there?", timeout=40)

    async def read() -> None:
        async for _ in stream:
            pass

    reading = asyncio.ensure_future(read())
    end = await asyncio.wait_for(recorded, 10)
    await asyncio.sleep(0.3)
    return stream, reading, end
