"""Backpressure end to end: a platform of its own whose scheduler queues at most three
requests per model, and one slow worker with a single slot."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from testkit.procs import one_worker_platform
from testkit.simplatform import wait_for_status

from inferbus.client import Client, RequestError
from inferbus.contracts import SCHEDULER_LOAD, SchedulerLoad
from inferbus.shared.codec import decode

pytestmark = [pytest.mark.integration]

MODEL = "narrow-model"


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    with one_worker_platform(
        tmp_path_factory.mktemp("backpressure"),
        "bp",
        MODEL,
        scheduler_args=("--max-queue-per-model", "3", "--load-interval-s", "0.1"),
        worker_args=("--max-num-seqs", "1", "--sim-decode-s-per-step", "0.01"),
    ) as platform:
        yield platform


async def test_a_full_queue_gets_429_with_retry_after_and_nothing_is_lost(narrow):
    c = await Client.connect(narrow["url"])
    try:
        # a long request holds the only slot; three short ones fill the queue behind it
        long = c.stream(MODEL, "a long job", max_tokens=5000, timeout=60)
        first = await long.__anext__()
        assert first.seq == 0
        held = [
            asyncio.create_task(
                c.generate(MODEL, f"job {i}", max_tokens=5, request_id=f"bp-{i}", timeout=60)
            )
            for i in range(3)
        ]
        # wait for the scheduler to report its queue full, as the gateway hears it
        loads = await c.nc.subscribe(SCHEDULER_LOAD)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            load = decode((await loads.next_msg(timeout=5)).data, SchedulerLoad)
            if MODEL in load.models and load.models[MODEL].queued == 3:
                break
        await loads.unsubscribe()
        # the gateway refuses from that report, or the scheduler from its full queue:
        # a 429 either way, and nothing else is accepted
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession(narrow["gateway"].base) as http:
            async with http.post("/v1/chat/completions", json=body) as r:
                status, headers, reply = r.status, r.headers, await r.json()
        assert status == 429, reply
        assert reply["error"]["code"] == "queue_full"
        assert reply["error"]["type"] == "rate_limit_error"
        assert 1 <= int(headers["Retry-After"]) <= 60
        # a client on NATS that skips the gateway is refused by the scheduler itself
        with pytest.raises(RequestError) as err:
            await c.generate(MODEL, "one too many", max_tokens=5, timeout=10)
        assert (err.value.code, err.value.retryable) == ("queue_full", True)
        # the long one ends; the queued ones are still served
        await long.cancel()
        results = await asyncio.gather(*held)
        assert [r.outcome.finish_reason for r in results] == ["length"] * 3
        # and once the queue drains (and the gateway hears so), requests are admitted again
        await wait_for_status(c.nc, lambda st: not st["queued"].get(MODEL))
        async with aiohttp.ClientSession(narrow["gateway"].base) as http:
            deadline = time.monotonic() + 5
            while True:
                async with http.post("/v1/chat/completions", json=body) as r:
                    if r.status == 200 or time.monotonic() > deadline:
                        assert r.status == 200, await r.text()
                        break
                await asyncio.sleep(0.1)
    finally:
        await c.close()


async def test_a_short_prompt_overtakes_a_long_one_in_the_running_scheduler(narrow):
    c = await Client.connect(narrow["url"])
    try:
        holder = c.stream(MODEL, "hold the slot", max_tokens=5000, timeout=60)
        await holder.__anext__()

        def queued(lane: str):
            return lambda st: st["lanes"].get(MODEL, {}).get(lane) == 1

        long = asyncio.create_task(c.generate(MODEL, "x " * 5000, max_tokens=3, timeout=60))
        await wait_for_status(c.nc, queued("long"))  # the long prompt queues first
        short = asyncio.create_task(c.generate(MODEL, "hi", max_tokens=3, timeout=60))
        await wait_for_status(c.nc, queued("short"))  # both wait behind the holder
        await holder.cancel()
        done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
        assert short in done and long not in done  # lanes: the short one went first
        await long
    finally:
        await c.close()
