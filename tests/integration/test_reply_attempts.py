"""The gateway and the Python client read a reply stream by the newest-attempt rule.

Masking off (as a key or tenant with ``mask_pii=false`` has it), the worker's events
reach them unfiltered: a worker presumed lost may still be talking while the request
runs again as attempt 2. The gateway runs as a real process on its own nats-server;
the test plays the platform, answering each request with the events its prompt names.
Before the shared reader both returned attempt 1's text ended by attempt 2's finish,
and ended on attempt 1's finish while attempt 2 streamed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import nats
import pytest
from testkit.procs import ServiceProcess
from testkit.simplatform import gateway_lists

from inferbus.contracts import (
    SUBMIT,
    FailureCode,
    RequestFailed,
    RequestFinished,
    RequestSubmitted,
    TokenChunk,
    Usage,
    WorkerHeartbeat,
)
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import ensure_streams

pytestmark = pytest.mark.integration
MODEL = "attempts-model"


def chunk(rid: str, attempt: int, seq: int) -> TokenChunk:
    return TokenChunk(
        request_id=rid, seq=seq, text=f"a{attempt}s{seq} ", token_ids=[seq], attempt=attempt
    )


def finish(rid: str, attempt: int, chunks: int) -> RequestFinished:
    return RequestFinished(
        request_id=rid,
        finish_reason="stop",
        chunks=chunks,
        attempt=attempt,
        usage=Usage(prompt_tokens=2, completion_tokens=chunks),
    )


SCRIPTS = {
    # attempt 1's worker streamed, then the request ran again as attempt 2
    "restart": lambda r: [chunk(r, 1, 0), chunk(r, 2, 0), chunk(r, 2, 1), finish(r, 2, 2)],
    # attempt 1's late end arrives while attempt 2 streams
    "late-end": lambda r: [chunk(r, 2, 0), finish(r, 1, 9), chunk(r, 2, 1), finish(r, 2, 2)],
    # attempt 1 streamed, then attempt 2 failed on its own: its code, not a restart's
    "restart-fails": lambda r: [
        chunk(r, 1, 0),
        RequestFailed(request_id=r, code=FailureCode.DEADLINE_EXCEEDED, reason="late", attempt=2),
    ],
}


class ScriptedPlatform:
    """Heartbeats for one model; each request answered with its prompt's script,
    one event at a time so none is read together with the next."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> ScriptedPlatform:
        self.nc = await nats.connect(self.url)
        await ensure_streams(self.nc.jetstream(timeout=30))
        self._sub = await self.nc.jetstream().subscribe(SUBMIT, cb=self._on_submit)
        self._beats = asyncio.create_task(self._heartbeats())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._beats.cancel()
        await self.nc.close()

    async def _heartbeats(self) -> None:
        hb = WorkerHeartbeat(worker_id="scripted.1", models=[MODEL], engine="sim")
        while True:
            await self.nc.publish("ib.hb.scripted.1", encode(hb))
            await asyncio.sleep(0.3)

    async def _on_submit(self, msg) -> None:
        await msg.ack()
        req = decode(msg.data, RequestSubmitted)
        text = req.prompt or (req.messages[0].content if req.messages else "")
        for event in SCRIPTS[text](req.request_id):
            await self.nc.publish(req.reply_to, encode(event))
            await self.nc.flush()
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
async def platform(tmp_path_factory: pytest.TempPathFactory):
    tmp_path: Path = tmp_path_factory.mktemp("attempts")
    server = NatsServer(tmp_path / "js", log_file=tmp_path / "nats.log").start()
    gw = ServiceProcess("gateway", server.url, tmp_path, "--request-timeout-s", "20").start()
    try:
        async with ScriptedPlatform(server.url):
            gw.wait_ready()
            await gateway_lists(gw.base, MODEL)  # it learns the model from heartbeats
            yield gw, server
    finally:
        gw.stop()
        server.stop()


def completion(script: str, stream: bool) -> dict:
    return {"model": MODEL, "prompt": script, "stream": stream, "max_tokens": 8}


async def test_the_gateway_answers_with_the_newest_attempts_text_only(platform):
    gw, _ = platform
    async with aiohttp.ClientSession(gw.base) as http:
        for script in ("restart", "late-end"):
            async with http.post("/v1/completions", json=completion(script, False)) as r:
                body = await r.json()
                assert r.status == 200, body
            assert body["choices"][0]["text"] == "a2s0 a2s1 ", script
            assert body["usage"]["completion_tokens"] == 2


async def test_a_stream_that_restarts_after_text_went_out_ends_interrupted(platform):
    gw, _ = platform
    async with aiohttp.ClientSession(gw.base) as http:
        async with http.post("/v1/completions", json=completion("restart", True)) as r:
            lines = [line async for line in r.content if line.startswith(b"data: ")]
        events = [json.loads(x[6:]) for x in lines if x.strip() != b"data: [DONE]"]
        assert events[0]["choices"][0]["text"] == "a1s0 "
        assert events[-1]["error"]["code"] == FailureCode.STREAM_INTERRUPTED
        assert lines[-1].strip() == b"data: [DONE]"
        # nothing of attempt 2 was appended to attempt 1's text
        assert not any("a2" in e["choices"][0]["text"] for e in events if "choices" in e)
        async with http.post("/v1/completions", json=completion("late-end", True)) as r:
            lines = [line async for line in r.content if line.startswith(b"data: ")]
        events = [json.loads(x[6:]) for x in lines if x.strip() != b"data: [DONE]"]
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        assert text == "a2s0 a2s1 " and events[-1]["choices"][0]["finish_reason"] == "stop"
        async with http.post("/v1/completions", json=completion("restart-fails", True)) as r:
            lines = [line async for line in r.content if line.startswith(b"data: ")]
        events = [json.loads(x[6:]) for x in lines if x.strip() != b"data: [DONE]"]
        assert events[-1]["error"]["code"] == FailureCode.DEADLINE_EXCEEDED


async def test_the_python_client_reads_by_the_same_rule(platform):
    from inferbus.client import Client, RequestError

    _, server = platform
    client = await Client.connect(server.url)
    try:
        stream = client.stream(MODEL, "late-end", max_tokens=8, timeout=20)
        assert [c.text async for c in stream] == ["a2s0 ", "a2s1 "]
        assert stream.outcome is not None and stream.outcome.attempt == 2
        stream = client.stream(MODEL, "restart", max_tokens=8, timeout=20)
        with pytest.raises(RequestError) as info:
            async for _ in stream:
                pass
        assert info.value.code == FailureCode.STREAM_INTERRUPTED and info.value.retryable
        assert stream.text == "a1s0 "  # what it handed out before the restart
        stream = client.stream(MODEL, "restart-fails", max_tokens=8, timeout=20)
        with pytest.raises(RequestError) as info:
            async for _ in stream:
                pass
        assert info.value.code == FailureCode.DEADLINE_EXCEEDED
    finally:
        await client.nc.close()
