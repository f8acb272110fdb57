from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from testkit.procs import ServiceProcess, start_all
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.client import Client


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
