"""inferbus top against the session's platform: real $SRV replies, real /metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.shared.natsserver import free_port
from inferbus.top.collect import Collector
from inferbus.top.view import build_view

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]


async def _http_stream(base: str, prompt: str) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": prompt}],
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()


async def test_the_view_shows_the_workers_lanes_and_traffic(client, nats_url, platform):
    async with Collector(nats_url) as collector:
        before = await collector.snapshot()
        await asyncio.gather(
            *[client.generate(MODEL, f"top over nats {i}", max_tokens=24) for i in range(24)],
            *[_http_stream(platform["gateway"].base, f"top over http {i}") for i in range(8)],
        )
        now = await collector.snapshot()
    view = build_view(before, now)

    assert not view.problem and view.missing_services == []
    assert all(s.metrics == "ok" for s in view.services), view.services
    served = {m for w in view.workers for m in w.models}
    assert {MODEL, SLOW_MODEL} <= served
    sim = [w for w in view.workers if MODEL in w.models]
    assert sim and all(w.state == "ready" and w.max_num_seqs for w in sim)
    assert any(w.decode_tokens_per_s for w in sim)
    assert {q.lane for q in view.queues if q.model == MODEL} >= {"short", "long"}

    (row,) = [m for m in view.models if m.model == MODEL]
    assert row.decode_tokens_per_s and row.decode_tokens_per_s > 0
    assert row.prefill_tokens_per_s and row.prefill_tokens_per_s > 0
    assert row.outcomes_per_s.get("request.finished", 0) > 0 and row.error_ratio is not None
    assert row.ttft_source in ("gateway", "worker") and row.ttft_count > 0
    assert row.ttft_p50_s is not None and row.ttft_p95_s is not None
    assert 0 < row.ttft_p50_s <= row.ttft_p95_s


def _top(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferbus.cli", "top", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_top_once_json_names_the_workers(nats_url):
    done = _top("--once", "--json", "--interval", "0.5", "--nats-url", nats_url)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert {MODEL, SLOW_MODEL} <= {m for w in view["workers"] for m in w["models"]}
    assert all(w["worker_id"] for w in view["workers"])
    assert view["interval_s"] > 0 and view["missing_services"] == []


def test_top_once_renders_the_tables(nats_url):
    done = _top("--once", "--interval", "0.3", "--nats-url", nats_url)
    assert done.returncode == 0, done.stderr
    for title in ("Workers", "Queues", "Throughput & latency", "Services", MODEL):
        assert title in done.stdout


def test_top_says_so_when_nats_cannot_be_reached():
    done = _top("--once", "--nats-url", f"nats://127.0.0.1:{free_port()}", timeout=20)
    assert done.returncode == 1
    assert "cannot reach NATS" in done.stderr
