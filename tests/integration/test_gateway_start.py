"""A gateway takes no request before it reads replies: under CI load a restarted
gateway took requests in the moment between its HTTP port opening and its reply
subscription, and those requests hung (4 in the fault suite's gateway kill)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from testkit.simplatform import MODEL

from inferbus.services.gateway.service import GatewayService, GatewaySettings
from inferbus.shared.runtime import Runtime

pytestmark = pytest.mark.integration


async def test_until_started_the_gateway_answers_503_starting(nats_url: str):
    release = asyncio.Event()

    class SlowStart(GatewayService):
        async def start(self) -> None:
            await super().start()
            await release.wait()

    runtime = Runtime(SlowStart, GatewaySettings(nats_url=nats_url, instance_id="gw-slow"))
    running = asyncio.create_task(runtime.run())
    try:
        async with asyncio.timeout(30):
            while runtime.http_port == 0:
                await asyncio.sleep(0.05)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession(f"http://127.0.0.1:{runtime.http_port}") as http:
            async with http.post("/v1/chat/completions", json=body) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "1"
                assert (await r.json())["error"]["code"] == "starting"
            async with http.get("/readyz") as r:
                assert r.status == 503
                assert (await r.json())["reason"] == "starting"
            async with http.get("/healthz") as r:  # alive: a probe must not restart it
                assert r.status == 200
            release.set()
            await asyncio.wait_for(runtime.started.wait(), 30)
            async with http.get("/v1/models") as r:
                assert r.status == 200
    finally:
        release.set()
        runtime.stop.set()
        await asyncio.wait_for(running, 60)
