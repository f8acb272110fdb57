"""A flush that times out leaves the connection able to hear (``shared/bus.py``'s
``round_trip``). nats-py's own ``flush(timeout=...)`` cancels the PING's future on its
timeout and leaves it in line; the late PONG then raises InvalidStateError in the
read loop, which ends, and the client goes deaf while it still publishes: a worker
resumed from SIGSTOP kept heartbeating and never received its work, and requests
hung in the fault suite's gateway kill (CI, 2026-12-06)."""

from __future__ import annotations

import asyncio
import importlib.metadata

import nats
import pytest

from inferbus.shared.bus import round_trip

pytestmark = pytest.mark.integration


async def heard(nc, subject: str) -> bool:
    """Whether a message to ``subject`` from another connection reaches ``nc``."""
    got = asyncio.Event()

    async def on(_msg) -> None:
        got.set()

    sub = await nc.subscribe(subject, cb=on)
    other = await nats.connect(nc.connected_url.geturl())
    try:
        for _ in range(20):
            await other.publish(subject, b"x")
            await other.flush()
            try:
                await asyncio.wait_for(got.wait(), 0.1)
                return True
            except TimeoutError:
                continue
        return False
    finally:
        await other.close()
        await sub.unsubscribe()


async def test_a_round_trip_past_its_limit_leaves_the_connection_hearing(nats_url: str):
    nc = await nats.connect(nats_url)
    try:
        for _ in range(20):  # a limit too short for any PONG: each times out
            with pytest.raises(TimeoutError):
                await round_trip(nc, 1e-9)
        await asyncio.sleep(0.2)  # the PONGs arrive
        assert await heard(nc, "rt.after")
        await round_trip(nc, 5.0)  # and a round trip still completes
    finally:
        await nc.close()


async def test_nats_py_s_own_flush_timeout_goes_deaf(nats_url: str):
    """The library's behaviour the helper avoids (nats-py 2.16): skipped once a
    release fixes it, when ``round_trip`` may call ``flush(timeout=...)`` again."""
    nc = await nats.connect(nats_url)
    try:
        for _ in range(20):
            try:
                await nc.flush(timeout=1e-9)  # type: ignore[arg-type]
            except Exception:
                pass
        await asyncio.sleep(0.2)
        if await heard(nc, "rt.deaf"):
            version = importlib.metadata.version("nats-py")
            pytest.skip(f"nats-py {version} no longer goes deaf after a flush timeout")
    finally:
        await nc.close()


async def test_a_subscription_round_tripped_hears_the_next_message_from_anywhere(nats_url: str):
    """``round_trip`` is a barrier: once it returns, the server has the subscription.
    nats-py's ``flush`` alone is not (its PING overtakes the SUB still in its buffer):
    one of about 10 subscriptions missed the message another connection published
    right after (CI's chunk-batch test lost its first message 1 run in 16)."""
    nc, other = await nats.connect(nats_url), await nats.connect(nats_url)
    missed = 0
    try:
        for i in range(80):
            got = asyncio.Event()

            async def on(_msg, got=got) -> None:
                got.set()

            sub = await nc.subscribe(f"rt.live.{i}", cb=on)
            await round_trip(nc)
            await other.publish(f"rt.live.{i}", b"x")
            await round_trip(other)
            try:
                await asyncio.wait_for(got.wait(), 3.0)
            except TimeoutError:
                missed += 1
            await sub.unsubscribe()
    finally:
        await other.close()
        await nc.close()
    assert missed == 0
