"""A sanitizer that dies holding a submitted request: the request is checked by the
next sanitizer within seconds, not after a client has given up. A fleet of its own
(its NATS too), so the kill harms no one."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from inferbus.client import Client
from inferbus.shared.natsserver import NatsServer

from .procs import ServiceProcess, start_all

pytestmark = [pytest.mark.integration]

MODEL = "sanitizer-restart-model"


@pytest.fixture
def fleet(tmp_path):
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    url = server.url
    sanitizer = ServiceProcess("sanitizer", url, tmp_path, name="sr-sanitizer")
    procs = [
        sanitizer,
        ServiceProcess("scheduler", url, tmp_path, name="sr-scheduler"),
        ServiceProcess("worker", url, tmp_path, "--model", MODEL, name="sr-worker"),
    ]
    start_all(procs)
    yield url, sanitizer
    for p in reversed(procs):
        p.stop()
    server.stop()


async def test_a_request_held_by_a_dead_sanitizer_is_checked_by_the_next_one(fleet):
    url, sanitizer = fleet
    c = await Client.connect(url)
    try:
        assert (await c.generate(MODEL, "warm up", max_tokens=2, timeout=20)).text
        # frozen, it takes the next submit from JetStream and never acks it
        assert sanitizer.proc is not None
        sanitizer.proc.send_signal(signal.SIGSTOP)
        sent = time.monotonic()
        pending = asyncio.ensure_future(c.generate(MODEL, "held", max_tokens=2, timeout=25))
        await asyncio.sleep(1.0)
        sanitizer.kill()
        sanitizer.start().wait_ready()
        done = await pending
        took = time.monotonic() - sent
        # at the stream's 30 s default ack wait it came after the client's 25 s timeout
        assert done.text and took < 15.0, took
    finally:
        await c.close()
