"""A worker that falls silent between recording a request's end on ``ib.req.ended``
and sending it (CI's test_faults[worker-0-hang] caught a SIGSTOP landing there: one
HTTP client waited out its timeout after all its chunks). The real scheduler, sanitizer
and client, and a stand-in worker that records the end and stops there: the client
is told the recorded end by the scheduler once the worker is taken for lost."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

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

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]

MODEL = "untold-model"


async def test_the_scheduler_sends_the_end_a_silent_worker_recorded(client):
    nc, js = client.nc, client.js
    worker_id = f"untold.{uuid.uuid4().hex[:6]}"
    serving: set[str] = set()
    silent = asyncio.Event()
    recorded: asyncio.Future[RequestFinished] = asyncio.get_running_loop().create_future()

    async def heartbeats() -> None:
        while not silent.is_set():
            beat = WorkerHeartbeat(
                worker_id=worker_id,
                models=[MODEL],
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
            served_model=MODEL,
        )
        serving.discard(rid)  # a real worker lists it under `telling` from here
        await record_end(
            js, ended_subject(work.partition), end, request_id=rid, msg_id=f"{rid}:end"
        )
        silent.set()  # stopped here: the end recorded, never sent
        recorded.set_result(end)

    beating = asyncio.ensure_future(heartbeats())
    sub = await js.subscribe(work_subject(worker_id), cb=on_work, manual_ack=True)
    try:
        await asyncio.sleep(1.0)  # the scheduler hears of the worker
        began = time.monotonic()
        stream = client.stream(MODEL, "anyone there?", timeout=30)

        async def read() -> None:
            async for _ in stream:
                pass

        await asyncio.wait_for(read(), 20)
        told_in = time.monotonic() - began
        end = await asyncio.wait_for(recorded, 1)
    finally:
        silent.set()
        await sub.unsubscribe()
        await beating
    assert stream.text == ""
    assert stream.outcome is not None and stream.outcome.request_id == end.request_id
    assert stream.outcome.finish_reason == "stop" and stream.outcome.worker_id == worker_id
    assert told_in < 10, told_in  # the scheduler's worker timeout (1.5 s), not the client's
