"""End to end: ``inferbus up --engine sim --autoscale``. A load that outgrows one worker
adds workers through the supervisor; when it stops, the extra workers drain and go;
no request fails during either, and every decision is on JetStream with its reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client as NATS
from testkit.faults import Platform, http_one, nats_one

from inferbus.client import Client
from inferbus.contracts import SCALE_DECISIONS, ScaleDecision
from inferbus.contracts.control import SupervisorQuery, SupervisorState, supervisor_subject
from inferbus.shared.bus import connect, request_patiently
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# a sim worker of 4 slots at 20 ms a step: about 200 tokens/s; told it sustains 150
AUTOSCALER = (
    "--autoscale",
    "--autoscaler-arg=--min-replicas=1",
    "--autoscaler-arg=--max-replicas=3",
    "--autoscaler-arg=--worker-capacity=150",
    "--autoscaler-arg=--ttft-slo-s=0.5",
    "--autoscaler-arg=--forecaster=constant",
    "--autoscaler-arg=--stable-window-s=6",
    "--autoscaler-arg=--panic-window-s=2",
    "--autoscaler-arg=--scale-down-cooldown-s=6",
    "--autoscaler-arg=--burst-window-s=0",
    "--autoscaler-arg=--cold-start-s=5",
    "--worker-arg=--max-num-seqs=4",
)


async def workers(nc: NATS) -> list[str]:
    """The supervisor's workers, asked on a connection the test keeps: a new one made
    while the bus reloads its users (each worker the autoscaler adds is a new user) was
    once refused there (nats-server logged "authentication error" for existing users
    during that reload, too)."""
    # a supervisor busy starting workers answers late
    reply = await request_patiently(
        nc, supervisor_subject(), encode(SupervisorQuery()), patience_s=25
    )
    state = decode(reply.data, SupervisorState)
    return sorted(p.name for p in state.processes if p.service == "worker")


async def test_a_load_ramp_adds_workers_and_they_drain_when_it_stops(tmp_path: Path) -> None:
    p = Platform(tmp_path, workers=1, decode_s=0.02, extra=AUTOSCALER)
    try:
        watcher = await connect(p.nats_url, "test-scale", load_credentials(p.operator))
        decisions: list[ScaleDecision] = []

        async def on_decision(msg) -> None:
            decisions.append(decode(msg.data, ScaleDecision))

        await watcher.subscribe(SCALE_DECISIONS, cb=on_decision)
        client = await Client.connect(p.nats_url, "test-load", creds=p.tenant)
        outcomes = []
        stop_at = time.monotonic() + 25.0

        async def loop() -> None:
            while time.monotonic() < stop_at:
                outcomes.append(await nats_one(client, 20, 30.0))

        # twelve clients back to back: three times what one worker's slots take
        load = [asyncio.create_task(loop()) for _ in range(12)]
        peak: list[str] = []
        while time.monotonic() < stop_at:
            current = await workers(watcher)
            peak = max(peak, current, key=len)
            await asyncio.sleep(1.0)
        await asyncio.gather(*load)
        assert len(peak) >= 2, (peak, decisions)
        up = [d for d in decisions if d.desired > d.previous]
        assert up and up[0].reason, decisions

        # quiet: after the cooldown the fleet goes back to its minimum by draining
        deadline = time.monotonic() + 45.0
        while time.monotonic() < deadline and len(await workers(watcher)) > 1:
            await asyncio.sleep(1.0)
        said = [(d.previous, d.desired, d.ready, d.stop_first, d.reason) for d in decisions]
        assert len(await workers(watcher)) == 1, said
        down = [d for d in decisions if d.desired < d.previous]
        assert down and down[-1].desired == 1, said

        failed = [o for o in outcomes if o.kind != "ok"]
        assert outcomes and failed == [], failed[:5]
        await client.nc.close()
        await watcher.close()
    finally:
        p.stop()


async def test_a_model_at_zero_serves_its_next_requests_after_a_wait(tmp_path: Path) -> None:
    """Idle, the last worker goes (min 0); the next requests, over NATS and over HTTP,
    wait for the worker the autoscaler starts and are served, where they were refused
    with 503 before."""
    p = Platform(
        tmp_path,
        workers=1,
        decode_s=0.001,
        extra=(
            "--autoscale",
            "--autoscaler-arg=--min-replicas=0",
            "--autoscaler-arg=--idle-to-zero-s=4",
            "--autoscaler-arg=--stable-window-s=4",
            "--autoscaler-arg=--scale-down-cooldown-s=4",
            "--autoscaler-arg=--cold-start-s=5",
        ),
    )
    try:
        watcher = await connect(p.nats_url, "test-scale", load_credentials(p.operator))
        decisions: list[ScaleDecision] = []

        async def on_decision(msg) -> None:
            decisions.append(decode(msg.data, ScaleDecision))

        await watcher.subscribe(SCALE_DECISIONS, cb=on_decision)
        deadline = time.monotonic() + 40.0
        while time.monotonic() < deadline and await workers(watcher):
            await asyncio.sleep(0.5)
        assert await workers(watcher) == [], decisions
        assert decisions and decisions[-1].desired == 0 and "idle" in decisions[-1].reason

        client = await Client.connect(p.nats_url, "test-load", creds=p.tenant)
        async with aiohttp.ClientSession(p.http) as http:
            async with http.get("/v1/models") as r:  # listed while at zero
                assert "sim-model" in {m["id"] for m in (await r.json())["data"]}
            nats_out, http_out = await asyncio.gather(
                nats_one(client, 5, 60.0), http_one(http, 5, 60.0)
            )
        assert (nats_out.kind, http_out.kind) == ("ok", "ok"), (nats_out, http_out)
        woke = [d for d in decisions if d.previous == 0 and d.desired > 0]
        assert woke and "scale from zero" in woke[0].reason, decisions
        assert len(await workers(watcher)) == 1
        await client.nc.close()
        await watcher.close()
    finally:
        p.stop()
