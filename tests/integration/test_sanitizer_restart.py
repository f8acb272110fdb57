"""A sanitizer that dies holding a submitted request: the request is checked by the
next sanitizer within seconds, not after a client has given up. A fleet of its own
(its NATS too), so the kill harms no one."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from testkit.procs import ServiceProcess, start_all

from inferbus.client import Client
from inferbus.contracts import ACCEPTED
from inferbus.shared.natsserver import NatsServer

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


async def test_stopping_waits_for_no_stream_whose_end_will_not_come(tmp_path):
    """After a bus outage some streams' ends are lost on the way; the sanitizer still
    filtered them, and stopping waited its whole drain budget (28 s) for them. A
    stream silent past ``--drain-quiet-s`` is not waited for."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    sanitizer = ServiceProcess(
        "sanitizer", server.url, tmp_path, "--drain-quiet-s", "1", name="quiet-sanitizer"
    )
    c = await Client.connect(server.url)
    pending = None
    try:
        sanitizer.start().wait_ready()
        accepted = await c.nc.subscribe(ACCEPTED)
        # no scheduler: accepted, filtered, and never ended
        pending = asyncio.ensure_future(c.generate(MODEL, "hello", max_tokens=2, timeout=60))
        await accepted.next_msg(timeout=10)
        await accepted.unsubscribe()
        await asyncio.sleep(1.5)
        began = time.monotonic()
        assert sanitizer.stop(timeout=25) == 0, sanitizer.logs()
        took = time.monotonic() - began
        assert took < 5.0, (took, sanitizer.logs())
    finally:
        if pending is not None:
            pending.cancel()
        await c.close()
        sanitizer.kill()
        server.stop()
