"""The alert rules and the Grafana dashboard's queries on a real Prometheus scraping
the running platform: every panel that the traffic here can feed shows data, so a
renamed metric or label cannot leave a dashboard silently empty."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from testkit.procs import ServiceProcess, start_all
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.shared.natsserver import free_port
from inferbus.shared.signing import generate_key
from inferbus.tinymodel import make_tiny

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus server here (CI installs Debian's prometheus package)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
# panels the traffic here cannot feed: tracing is off on this platform, nothing is
# dead-lettered, and sim workers keep no KV to spill (test_vllm_engine.py checks that a
# vLLM worker exports the spill series and its KV block counts)
NEEDS_MORE = {
    "Dead letters",
    "Traces by decision",
    "Share of traces kept",
    "Spans dropped before a decision",
    "Spill saves and restores by tier (blocks/s)",
    "Spill tier usage",
    "Spill faults, engine KV blocks in use",
}


@pytest.fixture
def autoscaler(nats_url: str, log_dir):
    """An autoscaler that decides and records only, for a model of its own (the other
    tests' models stay unmanaged)."""
    proc = ServiceProcess(
        "autoscaler",
        nats_url,
        log_dir,
        "--models",
        "autoscaled-model=worker",
        "--actuator",
        "none",
        "--status-interval-s",
        "0.5",
    )
    start_all([proc])
    yield proc
    proc.stop()


@pytest.fixture
def delivered(nats_url: str, log_dir, tmp_path):
    """A worker of a model of its own, and a signed version of that model rolled out to
    it (the other tests' workers keep what they serve): swaps and rollout decisions."""
    key = tmp_path / "release.key"
    generate_key(key)
    worker = ServiceProcess(
        "worker",
        nats_url,
        log_dir,
        "--model",
        "delivered-model",
        "--heartbeat-interval-s",
        "0.3",
        "--trusted-keys",
        f"{key}.pub",
        name="delivered-worker",
    )
    start_all([worker])
    try:  # stopped whatever happens (a failed set-up would leave it running)
        make_tiny(tmp_path / "v2")
        env = {**os.environ, "NATS_URL": nats_url}
        for args in (
            (
                "push",
                str(tmp_path / "v2"),
                "--name",
                "delivered-model",
                "--version",
                "v2",
                "--key",
                str(key),
            ),
            ("deploy", "delivered-model@v2", "--no-canary", "--wait", "--timeout", "30s"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", "inferbus.cli", "model", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def prometheus(platform, autoscaler, delivered, tmp_path):
    targets = {**platform, "autoscaler": autoscaler, "delivered-worker": delivered}
    jobs = {
        "inferbus-gateway": ["gateway"],
        "inferbus-sanitizer": ["sanitizer"],
        "inferbus-scheduler": ["scheduler"],
        "inferbus-worker": ["worker", "slow-worker", "delivered-worker"],
        "inferbus-autoscaler": ["autoscaler"],
        "inferbus-delivery": ["delivery"],
        "inferbus-kvspill": ["kvspill"],
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(OBSERVABILITY / "rules" / "inferbus.rules.yml")],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{targets[name].http_port}" for name in names]}
                ],
            }
            for job, names in jobs.items()
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def panels() -> list[tuple[str, str]]:
    board = json.loads((OBSERVABILITY / "grafana" / "dashboards" / "inferbus.json").read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$service", "gateway").replace("$model", ".*")
            out.append((panel["title"], expr))
    return out


async def traffic(base: str) -> None:
    async with aiohttp.ClientSession(base) as http:

        async def one(model: str, content: str, max_tokens: int = 8) -> None:
            body = {
                "model": model,
                "stream": True,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": content}],
            }
            async with http.post("/v1/chat/completions", json=body) as r:
                await r.read()

        jobs = [one(MODEL, f"hello {i}") for i in range(40)]
        jobs += [one(SLOW_MODEL, f"slow {i}", 5) for i in range(8)]
        jobs += [one(MODEL, "/echo call me at +1 415 555 0100 or jane@example.com", 64)]
        jobs += [one(MODEL, "' OR 1=1 --")]  # an injection payload: a finding
        await asyncio.gather(*jobs)


async def query(http: aiohttp.ClientSession, base: str, expr: str) -> list:
    async with http.get(f"{base}/api/v1/query", params={"query": expr}) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


async def test_every_dashboard_panel_shows_the_running_platform(platform, prometheus):
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # up, and a first scrape of every target
            try:
                up = await query(http, prometheus, "up")
                if len(up) == 9 and all(s["value"][1] == "1" for s in up):
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
        else:
            pytest.fail("prometheus never scraped the nine processes")
        for _ in range(3):  # rates need two samples of a change
            await traffic(platform["gateway"].base)
            await asyncio.sleep(1.5)
        wanted = [(title, expr) for title, expr in panels() if title not in NEEDS_MORE]
        empty: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            empty = [
                f"{title}: {expr}"
                for title, expr in wanted
                if not await query(http, prometheus, expr)
            ]
            if not empty:
                break
            await asyncio.sleep(1.0)
        assert not empty, "panels without data:\n" + "\n".join(empty)
        # kvspill is scraped: the shared tier's bound is there even with nothing spilled
        assert await query(http, prometheus, "inferbus_kv_shared_capacity_bytes")
        # the rules load and evaluate: no alert fires on a healthy platform (a worker
        # is never lost here, the error ratio is low)
        async with http.get(f"{prometheus}/api/v1/rules") as r:
            groups = (await r.json())["data"]["groups"]
        rules = [rule for g in groups for rule in g["rules"]]
        assert rules and all(rule["health"] == "ok" for rule in rules), [
            (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"
        ]
