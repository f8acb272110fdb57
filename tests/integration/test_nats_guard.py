"""``inferbus nats run``: the nats-server of compose and Kubernetes under a store watch
(issue 42 item 2, where ``inferbus up`` does not run the server). A real nats-server
as its child, a real full disk (a small tmpfs)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
import nats.errors
import pytest
from testkit.tmpfs import tmpfs

from inferbus.shared.natsserver import find_binary, free_ports, port_open

pytestmark = pytest.mark.integration


def guarded(store: Path, port: int, monitor: int) -> subprocess.Popen[bytes]:
    config = store.parent / "nats.conf"  # a reload needs a file to read again
    config.write_text(f"port: {port}\nhttp_port: {monitor}\njetstream {{ store_dir: {store} }}\n")
    server = [find_binary(), "-c", str(config)]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferbus.cli",
            "nats",
            "run",
            "--store-dir",
            str(store),
            "--",
            *server,
        ],
        stderr=subprocess.PIPE,
    )


async def connected(port: int) -> nats.NATS:
    deadline = time.monotonic() + 20
    while not port_open("127.0.0.1", port):
        assert time.monotonic() < deadline, "the server did not start"
        await asyncio.sleep(0.1)
    return await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=-1)


def healthz(monitor: int) -> int:
    try:
        url = f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true"
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError as exc:
        return getattr(exc, "code", 0)


async def stored(js, payload: bytes) -> bool:
    try:
        await js.publish("s.x", payload, timeout=1)
        return True
    except (nats.errors.Error, TimeoutError):
        return False


async def test_the_server_s_signals_pass_through_and_its_status_is_kept(tmp_path: Path):
    port, monitor = free_ports(2)
    guard = guarded(tmp_path / "js", port, monitor)
    try:
        nc = await connected(port)
        guard.send_signal(signal.SIGHUP)  # a reload, not a stop
        await asyncio.sleep(0.5)
        assert guard.poll() is None
        await nc.flush(timeout=2)
        await nc.close()
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=20) == 0
        assert not port_open("127.0.0.1", port)  # the server went with it
    finally:
        guard.kill()
    assert b"Reloaded server configuration" in guard.stderr.read()  # its log passes through


async def test_a_full_disk_heals_once_space_returns(tmp_path: Path):
    """On a 32 MiB tmpfs filled: the stream refuses writes, and went on refusing them
    after space was freed (10 acked before, 0 of 5 after, 0 of 5 ten seconds later,
    while /healthz said ok). Under the guard it takes them again within 10 s."""
    with tmpfs(tmp_path / "disk", "32m") as disk:
        port, monitor = free_ports(2)
        guard = guarded(disk / "js", port, monitor)
        filler = disk / "filler"
        try:
            nc = await connected(port)
            js = nc.jetstream()
            await js.add_stream(name="S", subjects=["s.>"], max_bytes=8 << 20)
            payload = os.urandom(64 << 10)
            assert all([await stored(js, payload) for _ in range(10)])
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
            assert not any([await stored(js, payload) for _ in range(20)])
            health_while_failing = healthz(monitor)
            filler.unlink()
            freed = time.monotonic()
            while not await stored(js, payload):
                assert time.monotonic() - freed < 30, "the stream never took a write again"
                await asyncio.sleep(0.5)
            healed = time.monotonic() - freed
            print(f"stored again {healed:.1f}s after the space returned; "
                  f"/healthz said {health_while_failing} while it could not write")  # fmt: skip
            assert healed < 10.0
            await nc.close()
        finally:
            filler.unlink(missing_ok=True)
            guard.send_signal(signal.SIGTERM)
            try:
                guard.wait(timeout=20)
            finally:
                guard.kill()
        log = guard.stderr.read().decode(errors="replace")
        assert "restarting it" in log, log[-3000:]
