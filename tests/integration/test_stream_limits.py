"""Every stream is bounded by bytes and age (issue 40, issue 42 item 3: a tenant's
rejected 1 MB prompts and garbage submits grew IB_REQUESTS and IB_DLQ without limit):
at its limit the oldest messages go and a publish is still taken. JetStream reserves a
stream's byte limit, so on a disk too small for the budget the streams shrink rather
than the platform failing to start. Real nats-servers of their own."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import DiscardPolicy
from testkit.tmpfs import tmpfs

from inferbus.contracts import STREAMS
from inferbus.shared.errors import ConfigError
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import (
    LIMITS_ENV,
    STORE_ENV,
    ensure_streams,
    stream_limits,
)

pytestmark = pytest.mark.integration


async def test_a_stream_at_its_limit_drops_its_oldest_and_takes_the_publish(tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, "256MiB")
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        for spec in stream_limits(store=256 << 20):  # each bounded, its share, oldest out first
            config = (await js.stream_info(spec.name)).config
            assert config.max_bytes == spec.max_bytes == int(spec.store_share * (256 << 20))
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


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs (JetStream takes 24 MiB of it)."""
    with tmpfs(tmp_path / "disk", "32m") as where:
        yield where


async def test_on_a_disk_too_small_for_the_budget_the_streams_shrink(small_disk):
    server = NatsServer(small_disk / "nats").start()
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)  # the default budget, 2 GiB: no room for it here
        sizes = {s.name: (await js.stream_info(s.name)).config.max_bytes for s in STREAMS}
        assert all(0 < size < 32 << 20 for size in sizes.values()), sizes
        ack = await js.publish("ib.dlq.x", b"fits")
        assert ack.stream == "IB_DLQ"
    finally:
        await nc.close()
        server.stop()


def test_a_bad_limit_is_a_clear_error():
    for bad in ("IB_NOPE=1GiB", "IB_KV=lots", "IB_KV=1GiB/forever", "IB_KV"):
        with pytest.raises(ConfigError, match=LIMITS_ENV):
            stream_limits(bad)
    (kv,) = [s for s in stream_limits("IB_KV=1.5GiB/2d") if s.name == "IB_KV"]
    assert kv.max_bytes == int(1.5 * (1 << 30)) and kv.max_age_s == 2 * 86400


async def test_a_store_an_older_version_made_is_provisioned_not_crashed_on(tmp_path):
    """IB_REQUESTS once took every ib.req subject, which IB_TENANT_SUBMITS now has a
    share of: a service (which may only create what is missing) met an overlap it
    could not mend and died on it in every container. It now says what to run, and
    `inferbus nats provision` (compose's provision step) brings the streams to spec."""
    import subprocess
    import sys

    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="IB_REQUESTS", subjects=["ib.req.>"])
        with pytest.raises(ConfigError, match="inferbus nats provision"):
            await ensure_streams(js, update=False)
        done = subprocess.run(
            [sys.executable, "-m", "inferbus.cli", "nats", "provision", "--nats-url", server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert (await js.stream_info("IB_REQUESTS")).config.subjects == [
            "ib.req.submitted",
            "ib.req.accepted",
            "ib.req.accepted.*",
            "ib.req.ended",
            "ib.req.ended.*",
        ]
        assert (await js.stream_info("IB_TENANT_SUBMITS")).config.subjects == ["ib.req.submitted.*"]
        await ensure_streams(js, update=False)  # a service's start: nothing to mend
    finally:
        await nc.close()
        server.stop()
