"""What the integration tests' shared platform (tests/integration/conftest.py's
``platform`` fixture) serves, and waits on its scheduler's state."""

from __future__ import annotations

import asyncio
import json
import time

import nats.errors

MODEL = "sim-model"
"""The zero-cost sim worker's model."""
SLOW_MODEL = "slow-model"
"""The slow sim worker's model (0.02 s a decode step)."""


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return False


async def scheduler_status(nc) -> dict:
    """The scheduler's live state (its $SRV status endpoint)."""
    from inferbus.contracts import status_subject

    reply = await nc.request(status_subject("scheduler"), b"", timeout=2)
    return json.loads(reply.data)


async def wait_for_status(nc, predicate, timeout: float = 15.0) -> dict:
    """Until the scheduler's state satisfies ``predicate``: the condition itself, not a
    sleep standing in for it."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while True:
        try:
            status = await scheduler_status(nc)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass  # a scheduler busy or restarting: not yet
        else:
            if predicate(status):
                return status
        if time.monotonic() > deadline:
            raise AssertionError(f"the scheduler never got there: {status}")
        await asyncio.sleep(0.05)


def ready_workers(status: dict, model: str) -> int:
    return sum(model in w["models"] and w["state"] == "ready" for w in status["workers"].values())


async def gateway_lists(base: str, model: str, timeout: float = 15.0) -> None:
    """Until the gateway at ``base`` lists ``model`` (it learns models from heartbeats);
    it may still not when ``timeout`` runs out: the test's request then says why."""
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(base) as http:
        while time.monotonic() < deadline:
            async with http.get("/v1/models") as r:
                if any(m["id"] == model for m in (await r.json())["data"]):
                    return
            await asyncio.sleep(0.1)
