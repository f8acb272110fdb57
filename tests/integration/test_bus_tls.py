"""NATS over TLS: `inferbus certs make` and `inferbus up --nats-tls-dir` serve the
platform with every connection encrypted and the server verified against the CA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from testkit.ports import metrics_port_base

from inferbus import certs
from inferbus.shared.buscreds import tls_context
from inferbus.shared.natsserver import NatsServer

pytestmark = pytest.mark.integration
INFERBUS = [sys.executable, "-m", "inferbus.cli"]


def test_up_serves_over_tls_with_made_certificates(tmp_path: Path):
    made = subprocess.run(
        [*INFERBUS, "certs", "make", str(tmp_path / "tls")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert made.stdout.strip() == str(tmp_path / "tls")
    assert oct((tmp_path / "tls" / certs.SERVER_KEY).stat().st_mode & 0o777) == "0o600"
    run = subprocess.run(
        [
            *INFERBUS,
            "up",
            "--check",
            "--engine",
            "sim",
            "--port",
            "0",
            "--nats-port",
            "0",
            "--metrics-port-base",
            str(metrics_port_base()),
            "--state-dir",
            str(tmp_path / "state"),
            "--nats-tls-dir",
            str(tmp_path / "tls"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NATS_URL": ""},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tls://127.0.0.1" in run.stdout and "self-test" in run.stdout


async def test_a_tls_server_takes_only_verified_tls_clients(tmp_path: Path):
    folder = certs.make(tmp_path / "tls", ["localhost", "127.0.0.1"])
    other = certs.make(tmp_path / "other", ["localhost", "127.0.0.1"])
    server = NatsServer(
        tmp_path / "js", tls_cert=folder / certs.SERVER_CERT, tls_key=folder / certs.SERVER_KEY
    ).start()

    async def quiet(_: Exception) -> None:
        pass

    async def attempt(url: str = server.url, **kw) -> bool:
        try:
            nc = await nats.connect(
                url,
                max_reconnect_attempts=0,
                connect_timeout=2,
                allow_reconnect=False,
                error_cb=quiet,
                **kw,
            )
        except Exception:
            return False
        await nc.close()
        return True

    try:
        assert server.url.startswith("tls://")
        assert await attempt(tls=tls_context(str(folder / certs.CA)))
        assert not await attempt(tls=tls_context(str(other / certs.CA)))  # not its CA
        assert not await attempt(server.url.replace("tls://", "nats://"))  # no CA at all
    finally:
        server.stop()
