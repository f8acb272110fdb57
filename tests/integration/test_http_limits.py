"""Bad HTTP input gets a clear 4xx and holds nothing: bodies the bus cannot carry (a
500 MaxPayloadError before), JSON nested past reason (a RecursionError, 500), slow
bodies and headers, and more idle connections than the gateway should hold (10,000
took it from 68 to 137 MB, kept for ever)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from testkit.procs import ServiceProcess
from testkit.simplatform import MODEL

pytestmark = pytest.mark.integration


def chat_body(extra: str = "") -> bytes:
    return (
        b'{"model": "'
        + MODEL.encode()
        + b'", "messages": [{"role": "user", "content": "hi"}]'
        + extra.encode()
        + b"}"
    )


async def test_a_body_the_bus_cannot_carry_is_413_with_openai_s_shape(platform):
    big = chat_body(', "user": "' + "x" * (2 * 1024 * 1024) + '"')
    async with aiohttp.ClientSession(platform["gateway"].base) as http:
        async with http.post(
            "/v1/chat/completions", data=big, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "request_too_large"

        async def chunks():  # no Content-Length: the limit holds as it streams in
            for i in range(0, len(big), 64 * 1024):
                yield big[i : i + 64 * 1024]

        async with http.post(
            "/v1/chat/completions", data=chunks(), headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 413


async def test_json_nested_past_reason_is_400(platform):
    deep = chat_body(', "metadata": ' + "[" * 200_000 + "]" * 200_000)
    async with aiohttp.ClientSession(platform["gateway"].base) as http:
        async with http.post(
            "/v1/chat/completions", data=deep, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "invalid_json"


@pytest.fixture
def strict_gateway(nats_url: str, tmp_path: Path):
    gw = (
        ServiceProcess(
            "gateway",
            nats_url,
            tmp_path,
            "--body-timeout-s",
            "1",
            "--http-idle-timeout-s",
            "1",
            "--http-max-connections",
            "40",
            name="strict-gateway",
        )
        .start()
        .wait_ready()
    )
    yield gw
    gw.stop()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass  # a response first (408): read on to the close
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


async def test_a_slow_body_is_408_and_slow_headers_are_cut(strict_gateway):
    port = strict_gateway.http_port
    slow_body = socket.create_connection(("127.0.0.1", port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    slow_body.sendall(head + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    slow_headers = socket.create_connection(("127.0.0.1", port))
    slow_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    began = time.monotonic()
    slow_body.settimeout(5)
    assert b" 408 " in slow_body.recv(4096).split(b"\r\n")[0]
    assert await asyncio.to_thread(closed_by_server, slow_headers, 5)
    assert time.monotonic() - began < 5
    slow_body.close()
    slow_headers.close()


async def test_idle_connections_are_capped_and_closed(strict_gateway):
    port = strict_gateway.http_port
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    try:
        await asyncio.sleep(0.3)
        # past the cap, each arrival took the place of the oldest idle one
        shed = sum(
            await asyncio.gather(*(asyncio.to_thread(closed_by_server, s, 0.3) for s in socks[:60]))
        )
        assert shed == 60
        kept = sum(
            await asyncio.gather(*(asyncio.to_thread(closed_by_server, s, 3) for s in socks[60:]))
        )
        assert kept == 40  # idle: closed after the idle timeout
        # and the gateway serves as before
        async with aiohttp.ClientSession(strict_gateway.base) as http:
            async with http.get("/v1/models") as r:
                assert r.status == 200
    finally:
        for s in socks:
            s.close()


async def test_idle_connections_at_the_cap_do_not_lock_requests_out(strict_gateway):
    """Issue 42 item 5: 4,096 idle connections filled the cap and 16 of 17 requests
    were refused. Idle ones now make room; a connection busy with a request stays."""
    port = strict_gateway.http_port
    slow = socket.create_connection(("127.0.0.1", port))  # busy: its body is on the way
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    slow.sendall(head + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    await asyncio.sleep(0.1)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    try:
        await asyncio.sleep(0.2)
        served = 0
        for _ in range(17):  # a fresh connection each: every one past the cap
            async with aiohttp.ClientSession(
                strict_gateway.base, connector=aiohttp.TCPConnector(force_close=True)
            ) as http:
                async with http.get("/v1/models") as r:
                    served += r.status == 200
        assert served == 17
        slow.settimeout(5)  # never shed: its request ran to its own end (408)
        assert b" 408 " in slow.recv(4096).split(b"\r\n")[0]
    finally:
        slow.close()
        for s in idle:
            s.close()
