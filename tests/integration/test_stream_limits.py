"""Every stream is bounded by bytes and age (issue 40, issue 42 item 3: a tenant's
rejected 1 MB prompts and garbage submits grew IB_REQUESTS and IB_DLQ without limit):
at its limit the oldest messages go and a publish is still taken. A real nats-server
of its own."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import DiscardPolicy

from inferbus.contracts import STREAMS
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import LIMITS_ENV, ensure_streams

pytestmark = pytest.mark.integration


async def test_a_stream_at_its_limit_drops_its_oldest_and_takes_the_publish(tmp_path, monkeypatch):
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        for spec in STREAMS:  # the defaults: every one bounded, oldest out first
            config = (await js.stream_info(spec.name)).config
            assert config.max_bytes == spec.max_bytes > 0
            assert config.discard in ("old", DiscardPolicy.OLD)
        # the provisioner's override, applied to the stream already there
        monkeypatch.setenv(LIMITS_ENV, "IB_DLQ=64KiB/1h")
        await ensure_streams(js)
        info = await js.stream_info("IB_DLQ")
        assert info.config.max_bytes == 64 * 1024 and info.config.max_age == 3600
        payload = b"x" * 1024
        for i in range(200):  # 200 KiB into 64 KiB: each publish acknowledged
            ack = await js.publish(f"ib.dlq.flood{i % 3}", payload)
            assert ack.stream == "IB_DLQ"
        state = (await js.stream_info("IB_DLQ")).state
        assert state.bytes <= 64 * 1024 and state.last_seq == 200
        assert state.first_seq > 100  # the oldest went
    finally:
        await nc.close()
        server.stop()


def test_a_bad_limit_is_a_clear_error():
    from inferbus.shared.errors import ConfigError
    from inferbus.shared.streams import stream_limits

    for bad in ("IB_NOPE=1GiB", "IB_KV=lots", "IB_KV=1GiB/forever", "IB_KV"):
        with pytest.raises(ConfigError, match=LIMITS_ENV):
            stream_limits(bad)
    (kv,) = [s for s in stream_limits("IB_KV=1.5GiB/2d") if s.name == "IB_KV"]
    assert kv.max_bytes == int(1.5 * (1 << 30)) and kv.max_age_s == 2 * 86400
