from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from inferbus.client import Client

from .procs import ServiceProcess, start_all

MODEL = "sim-model"
SLOW_MODEL = "slow-model"


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
        req = urllib.request.Request(f"{gateway.base}/v1/chat/completions", data=probe.encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
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


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return False


async def scheduler_status(nc) -> dict:
    """The scheduler's live state (its $SRV status endpoint)."""
    from inferbus.contracts import status_subject

    reply = await nc.request(status_subject("scheduler"), b"", timeout=2)
    return json.loads(reply.data)


async def wait_for_status(nc, predicate, timeout: float = 15.0) -> dict:
    """Until the scheduler's state satisfies ``predicate``: the condition itself, not a
    sleep standing in for it."""
    deadline = time.monotonic() + timeout
    while True:
        status = await scheduler_status(nc)
        if predicate(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"the scheduler never got there: {status}")
        await asyncio.sleep(0.05)


def ready_workers(status: dict, model: str) -> int:
    return sum(model in w["models"] and w["state"] == "ready" for w in status["workers"].values())
