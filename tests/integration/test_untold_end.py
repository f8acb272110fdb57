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
from testkit.frozen import frozen_worker

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]

MODEL = "untold-model"


async def test_the_scheduler_sends_the_end_a_silent_worker_recorded(client):
    worker_id = f"untold.{uuid.uuid4().hex[:6]}"
    async with frozen_worker(client, worker_id, MODEL) as recorded:
        await asyncio.sleep(1.0)  # the scheduler hears of the worker
        began = time.monotonic()
        stream = client.stream(MODEL, "anyone there?", timeout=30)

        async def read() -> None:
            async for _ in stream:
                pass

        await asyncio.wait_for(read(), 20)
        told_in = time.monotonic() - began
        end = await asyncio.wait_for(recorded, 1)
    assert stream.text == ""
    assert stream.outcome is not None and stream.outcome.request_id == end.request_id
    assert stream.outcome.finish_reason == "stop" and stream.outcome.worker_id == worker_id
    assert told_in < 10, told_in  # the scheduler's worker timeout (1.5 s), not the client's
