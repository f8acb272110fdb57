"""An SSE stream the gateway has started always ends as a stream: with an error event and
``[DONE]``, never a second HTTP response inside the chunked body (curl failed with code
56 and an aiohttp client hung). The gateway runs as a real process on its own
nats-server; the test plays the platform behind it: heartbeats for one model, and a
responder that sends two tokens for each request and then goes silent."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import nats
import pytest
from testkit.procs import ServiceProcess
from testkit.simplatform import gateway_lists

from inferbus.contracts import SUBMIT, RequestSubmitted, TokenChunk, WorkerHeartbeat
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import ensure_streams

pytestmark = pytest.mark.integration
MODEL = "silent-model"


class SilentPlatform:
    """Two tokens for every request, then nothing."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.submitted: list[RequestSubmitted] = []

    async def __aenter__(self) -> SilentPlatform:
        async def quiet(_: Exception) -> None:  # the server goes away on purpose
            pass

        self.nc = await nats.connect(
            self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, error_cb=quiet
        )
        await ensure_streams(self.nc.jetstream(timeout=30))
        self._sub = await self.nc.jetstream().subscribe(SUBMIT, cb=self._on_submit)
        self._beats = asyncio.create_task(self._heartbeats())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._beats.cancel()
        try:
            await asyncio.wait_for(self.nc.close(), 2)
        except (OSError, TimeoutError):
            pass  # the test took the server away

    async def _heartbeats(self) -> None:
        hb = WorkerHeartbeat(worker_id="silent.1", models=[MODEL], engine="sim")
        while True:
            try:
                await self.nc.publish("ib.hb.silent.1", encode(hb))
            except Exception:
                pass  # the server is down for a moment: beat again when it is back
            await asyncio.sleep(0.3)

    async def _on_submit(self, msg) -> None:
        await msg.ack()
        req = decode(msg.data, RequestSubmitted)
        self.submitted.append(req)
        for seq in range(2):
            chunk = TokenChunk(
                request_id=req.request_id, seq=seq, text=f"tok{seq} ", token_ids=[seq]
            )
            await self.nc.publish(req.reply_to, encode(chunk))


async def sse_events(resp: aiohttp.ClientResponse) -> list[dict | str]:
    out: list[dict | str] = []
    async for line in resp.content:  # ends cleanly, or the test fails on a broken body
        if line.startswith(b"data: "):
            data = line[6:].strip()
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


@pytest.fixture
async def gateway(tmp_path: Path):
    server = NatsServer(tmp_path / "js", log_file=tmp_path / "nats.log").start()
    gw = ServiceProcess(
        "gateway", server.url, tmp_path, "--worker-stale-s", "1.5", "--request-timeout-s", "30"
    ).start()
    try:
        async with SilentPlatform(server.url) as platform:
            gw.wait_ready()
            await gateway_lists(gw.base, MODEL)  # it learns the model from heartbeats
            yield gw, server, platform
    finally:
        gw.stop()
        server.stop()


def chat(max_tokens: int = 100) -> dict:
    return {
        "model": MODEL,
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}],
    }


async def test_the_gateway_s_own_deadline_mid_stream_ends_the_sse_stream(gateway):
    gw, _, _ = gateway
    async with aiohttp.ClientSession(gw.base) as http:
        began = time.monotonic()
        async with http.post(
            "/v1/chat/completions", json=chat(), headers={"X-Request-Timeout": "0.5"}
        ) as r:
            assert r.status == 200
            events = await asyncio.wait_for(sse_events(r), 15)
    assert time.monotonic() - began < 10
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "deadline_exceeded"
    text = "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events[:-2]
        if isinstance(e, dict) and e.get("choices")
    )
    assert text == "tok0 tok1 "


async def test_a_lost_bus_ends_streams_in_flight_with_a_retryable_error(gateway, tmp_path: Path):
    gw, server, _ = gateway
    async with aiohttp.ClientSession(gw.base) as http:
        async with http.post("/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
            await r.content.readline()  # streaming: the first token is out
            server.stop()  # the bus goes away mid-stream
            began = time.monotonic()
            events = await asyncio.wait_for(sse_events(r), 15)
    assert time.monotonic() - began < 5  # not the 30 s request timeout
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "bus_unavailable"
    # and while the bus is down, new requests are told to come back, not "no such model"
    async with aiohttp.ClientSession(gw.base) as http:
        await asyncio.sleep(2.0)  # every heartbeat stale
        async with http.post("/v1/chat/completions", json=chat()) as r:
            assert r.status == 503, await r.text()
            assert r.headers.get("Retry-After")


async def test_the_python_client_ends_its_streams_when_the_bus_is_lost(gateway):
    from inferbus.client import Client, RequestError

    _, server, _ = gateway
    client = await Client.connect(server.url)
    try:
        stream = client.stream(MODEL, "hello", max_tokens=100, timeout=60)
        assert (await stream.__anext__()).text == "tok0 "
        server.stop()
        began = time.monotonic()
        with pytest.raises(RequestError) as info:
            async for _ in stream:
                pass
        assert info.value.code == "bus_unavailable" and info.value.retryable
        assert time.monotonic() - began < 5  # not the stream's 60 s timeout
    finally:
        await client.nc.close()
