"""``shared.bus.ask_until_answered`` on a real nats-server when the asking process
stalls (SIGSTOP, a paused VM): it wakes past its window with the answer unread in its
socket, and must read it, or ask once more, before it says no one answered. A worker
that got this wrong sent a backup ``stream_interrupted`` after the sanitizer had
passed the stream's end on: its client was told twice (found in
``test_faults.py::test_a_killed_process_strands_no_request[worker-0-hang]``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
import uvloop
from nats.aio.client import Client

from inferbus.shared.bus import ask_until_answered, round_trip

pytestmark = pytest.mark.integration

SUBJECT = "test.ask"


class Responder:
    """Answers ``SUBJECT`` from its own thread and event loop, so it goes on while the
    asker's loop is stalled; it leaves the first ``ignore`` asks unanswered."""

    def __init__(
        self, url: str, ignore: int = 0, answer: bool = True, delay_s: float = 0.0
    ) -> None:
        self.url, self.ignore, self.answer, self.delay_s = url, ignore, answer, delay_s
        self.asked = 0
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _serve(self) -> Client:
        nc = await nats.connect(self.url)

        async def on(msg) -> None:
            self.asked += 1
            if self.answer and self.asked > self.ignore:
                await asyncio.sleep(self.delay_s)
                await msg.respond(b"")

        await nc.subscribe(SUBJECT, cb=on)
        await round_trip(nc)  # live on the server (a bare flush is not a barrier)
        return nc

    def __enter__(self) -> Responder:
        self.thread.start()
        self.nc = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}
"""The services run on uvloop, whose timers fire before the socket is read on a wake."""


@pytest.fixture(params=sorted(LOOPS))
def run(request) -> Callable[[Awaitable[Any]], Any]:
    return LOOPS[request.param]


def stall(seconds: float) -> None:
    """What SIGSTOP does to a process's event loop: nothing runs, time passes."""
    time.sleep(seconds)


async def stalled_ask(url: str, window_s: float, stall_s: float) -> tuple[bool | None, float]:
    """Asks, then stalls the whole event loop for ``stall_s`` (as SIGSTOP would)."""
    nc = await nats.connect(url)
    try:
        started = time.monotonic()
        task = asyncio.ensure_future(ask_until_answered(nc, SUBJECT, b"end", window_s=window_s))
        await asyncio.sleep(0.05)  # the first ask is out
        stall(stall_s)
        answered = await task
        return answered, time.monotonic() - started
    finally:
        await nc.close()


def test_an_answer_that_came_while_stalled_counts(nats_url, run):
    with Responder(nats_url) as r:
        answered, took = run(stalled_ask(nats_url, window_s=1.0, stall_s=2.0))
    # read as the loop wakes (on both loops, before the ask's own timeout): no new ask
    assert answered is True
    assert r.asked == 1 and took < 2.5


def test_a_stall_that_ends_inside_the_window_still_asks_again(nats_url, run):
    # woken 50 ms before the window ends, the answer before the stall lost, the next one
    # 0.1 s away: asked only for what is left of the window, it would miss it
    with Responder(nats_url, ignore=1, delay_s=0.1) as r:
        answered, took = run(stalled_ask(nats_url, window_s=1.2, stall_s=1.1))
    assert answered is True
    assert r.asked == 2 and took < 1.8


def test_a_stalled_asker_whose_answer_was_lost_asks_once_more(nats_url, run):
    with Responder(nats_url, ignore=1) as r:  # the answer to the one ask before the stall: lost
        answered, _ = run(stalled_ask(nats_url, window_s=1.0, stall_s=2.0))
    assert answered is True
    assert r.asked == 2


def test_a_stalled_asker_no_one_answers_gives_up_one_ask_later(nats_url, run):
    with Responder(nats_url, answer=False) as r:
        answered, took = run(stalled_ask(nats_url, window_s=1.0, stall_s=2.0))
    assert answered is False
    assert r.asked == 2  # the one before the stall, the one after it
    assert 2.3 < took < 3.0  # the stall, then one more ask's time (a third of the window)


def test_an_asker_not_stalled_waits_its_window_and_no_longer(nats_url, run):
    async def ask() -> tuple[bool | None, float]:
        nc = await nats.connect(nats_url)
        try:
            started = time.monotonic()
            answered = await ask_until_answered(nc, SUBJECT, b"end", window_s=0.9)
            return answered, time.monotonic() - started
        finally:
            await nc.close()

    with Responder(nats_url, answer=False) as r:
        answered, took = run(ask())
    assert answered is False
    # a loaded machine may wake it late once: then one more ask, one more third
    assert r.asked in (3, 4) and 0.85 < took < 1.7
