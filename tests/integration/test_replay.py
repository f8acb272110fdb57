"""Reading back a stream's recent log (what a restarted scheduler relies on)."""

from __future__ import annotations

import time

import nats
import pytest

from inferbus.shared.bus import replay

pytestmark = [pytest.mark.integration]


async def test_replay_returns_everything_recorded_every_time(nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="REPLAYTEST", subjects=["replaytest.>"])
        assert await replay(js, "REPLAYTEST", "replaytest.>", 60) == []
        began = time.time()
        for i in range(50):
            await js.publish(f"replaytest.{i % 3}", str(i).encode(), headers={"i": str(i)})
        # the consumer may push every message before it answers how many are pending;
        # reading must not depend on which comes first, so ask many times
        t0 = time.monotonic()
        for _ in range(40):
            got = await replay(js, "REPLAYTEST", "replaytest.>", 60)
            assert [m.data for m in got] == [str(i).encode() for i in range(50)]
        some = await replay(js, "REPLAYTEST", "replaytest.1", 60)
        assert [(m.data, m.headers) for m in some] == [
            (str(i).encode(), {"i": str(i)}) for i in range(1, 50, 3)
        ]
        # when the stream stored each: what a restarted scheduler bounds untold ends by
        times = [m.at for m in some]
        assert times == sorted(times) and began - 1 < times[0] and times[-1] < time.time() + 1
        assert time.monotonic() - t0 < 10  # never waits out a silence
    finally:
        await js.delete_stream("REPLAYTEST")
        await nc.close()
