"""Model delivery on ``inferbus up --engine sim`` (closed bus, real nats-server): push
and sign, roll out under a steady load, roll back by hand and on an SLO breach, and
refuse tampered or wrongly signed versions. Every request of the load must end in
full on exactly one version; none may fail or hang."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from testkit.delivery import SteadyLoad, canary_instance, cli, throttle, trail
from testkit.faults import MODEL, Platform

from inferbus.shared import modelstore
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.signing import generate_key
from inferbus.tinymodel import make_tiny, make_tiny_lora

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def heartbeat_versions(p: Platform, seconds: float = 2.0) -> dict[str, dict[str, str]]:
    from inferbus.contracts import HEARTBEATS, WorkerHeartbeat
    from inferbus.shared.codec import decode_or_none

    seen: dict[str, dict[str, str]] = {}
    nc = await connect(p.nats_url, "versions", load_credentials(p.operator))

    async def on(msg) -> None:
        hb = decode_or_none(msg.data, WorkerHeartbeat)
        if hb is not None and hb.state == "ready":
            seen[hb.worker_id.split(".")[0]] = hb.versions

    await nc.subscribe(HEARTBEATS, cb=on)
    await asyncio.sleep(seconds)
    await nc.close()
    return seen


async def wait_versions(p: Platform, want: dict[str, str], timeout: float = 30.0) -> None:
    """Until every worker of the platform is ready and serves ``want``. A worker still
    starting sends no ready heartbeat: seen nowhere is not serving it (a check of the
    workers heard from alone let a restarted worker miss the step: CI, once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = await heartbeat_versions(p, 1.2)
        if set(seen) == set(p.workers) and all(v == want for v in seen.values()):
            return
    raise AssertionError(f"workers serve {seen}, want {want} on each of {p.workers}")


@pytest.fixture()
def platform(tmp_path):
    p = Platform(tmp_path / "state", workers=2, decode_s=0.01)
    try:
        yield p
    finally:
        p.stop()


def test_a_rollout_under_load_promotes_and_a_rollback_by_hand_restores(platform, tmp_path):
    p = platform
    make_tiny(tmp_path / "v2", seed=1)
    pushed = cli(
        p.nats_url,
        p.operator,
        "model",
        "push",
        str(tmp_path / "v2"),
        "--name",
        MODEL,
        "--version",
        "v2",
        "--key",
        str(p.state / "signing" / "release.key"),
    )
    assert "sim-model@v2" in pushed and "signed" in pushed
    key = str(p.state / "signing" / "release.key")
    for version, seed in (("a1", 1), ("a2", 2)):
        make_tiny_lora(tmp_path / "v2", tmp_path / version, seed=seed)
        cli(
            p.nats_url,
            p.operator,
            "model",
            "push",
            str(tmp_path / version),
            "--name",
            "sim-lora",
            "--version",
            version,
            "--base",
            MODEL,
            "--key",
            key,
        )
    v2 = {MODEL: "v2", f"{MODEL}@v2": "v2"}

    async def scenario() -> SteadyLoad:
        async with SteadyLoad(p.nats_url, str(p.tenant), MODEL) as load:
            await asyncio.sleep(1.0)
            out = await asyncio.to_thread(
                cli,
                p.nats_url,
                p.operator,
                "model",
                "deploy",
                f"{MODEL}@v2",
                "--steps",
                "50,100",
                "--interval",
                "2s",
                "--min-samples",
                "5",
                "--wait",
                "--timeout",
                "90s",
            )
            assert "promote" in out and "done" in out, out
            await wait_versions(p, v2)
            on_v2 = time.monotonic()
            await asyncio.sleep(1.0)
            assert set(load.versions(since=on_v2)) == {f"{MODEL}@v2"}
            out = await asyncio.to_thread(
                cli,
                p.nats_url,
                p.operator,
                "model",
                "deploy",
                "sim-lora@a1",
                "--wait",
                "--timeout",
                "90s",
            )
            assert "done" in out, out
            v2_lora = {**v2, "sim-lora": "a1", "sim-lora@a1": "a1"}
            await wait_versions(p, v2_lora)
            # a worker restarted now comes back on the registry's versions, adapter too
            pids = await p.pids()
            os.kill(pids["worker-1"], signal.SIGKILL)
            await p.wait_running(("worker-1",))
            await wait_versions(p, v2_lora, timeout=60)
            # the adapter's next version: the old one is kept (by version) until the
            # residency policy says cold
            out = await asyncio.to_thread(
                cli,
                p.nats_url,
                p.operator,
                "model",
                "deploy",
                "sim-lora@a2",
                "--no-canary",
                "--wait",
            )
            assert "done" in out, out
            a2 = {"sim-lora": "a2", "sim-lora@a2": "a2"}
            await wait_versions(p, {**v2, **a2, "sim-lora@a1": "a1"})
            await asyncio.to_thread(
                cli, p.nats_url, p.operator, "model", "residency", "sim-lora", "cold"
            )
            await wait_versions(p, {**v2, **a2})
            await asyncio.to_thread(cli, p.nats_url, p.operator, "model", "rollback", MODEL)
            # each worker back on its own --model (a new engine), its adapter loaded again
            await wait_versions(p, a2)
            back = time.monotonic()
            await asyncio.sleep(1.0)
            assert set(load.versions(since=back + 0.5)) == {MODEL}
        return load

    load = asyncio.run(scenario())
    # the killed worker's in-flight requests are retried or refused as retryable (worker
    # faults are test_faults' subject): what must hold is that the swaps lost nothing
    failures = [f for f in load.failures() if "worker" not in f]
    assert failures == [] and load.count("hung") == 0
    served = load.versions()
    assert served[MODEL] > 0 and served[f"{MODEL}@v2"] > 0
    assert set(served) == {MODEL, f"{MODEL}@v2"}  # every answer names exactly one version
    actions = [d["action"] for d in trail(p.nats_url, p.operator, MODEL)]
    assert actions[:3] == ["start", "place", "step"], actions
    assert actions[-3:] == ["promote", "done", "rollback"], actions
    assert any(
        "sim-lora" in line
        for line in cli(p.nats_url, p.operator, "model", "list").splitlines()
        if line.startswith("*")
    )  # the adapter's current version


def test_tampered_and_wrongly_signed_versions_are_refused_and_a_slow_canary_rolls_back(
    platform, tmp_path
):
    p = platform
    key = str(p.state / "signing" / "release.key")
    make_tiny(tmp_path / "v", seed=2)
    for version in ("v-tampered", "v-slow"):
        cli(
            p.nats_url,
            p.operator,
            "model",
            "push",
            str(tmp_path / "v"),
            "--name",
            MODEL,
            "--version",
            version,
            "--key",
            key,
        )
    generate_key(tmp_path / "rogue.key")
    cli(
        p.nats_url,
        p.operator,
        "model",
        "push",
        str(tmp_path / "v"),
        "--name",
        MODEL,
        "--version",
        "v-rogue",
        "--key",
        str(tmp_path / "rogue.key"),
    )

    async def tamper() -> None:  # someone with write access to the store changes a file
        nc = await connect(p.nats_url, "tamper", load_credentials(p.operator))
        obs = await modelstore.artifacts(nc.jetstream())
        config = json.loads((tmp_path / "v" / "config.json").read_text())
        config["rms_norm_eps"] = 0.5
        await obs.put(f"{MODEL}/v-tampered/config.json", json.dumps(config).encode())
        await nc.close()

    asyncio.run(tamper())

    async def scenario() -> tuple[SteadyLoad, float, float]:
        async with SteadyLoad(p.nats_url, str(p.tenant), MODEL, clients=4) as load:
            await asyncio.sleep(1.0)
            for version, why in (
                ("v-tampered", "Hash mismatch for 'config.json'"),
                ("v-rogue", "Key mismatch"),
            ):
                out = await asyncio.to_thread(
                    cli,
                    p.nats_url,
                    p.operator,
                    "model",
                    "deploy",
                    f"{MODEL}@{version}",
                    "--wait",
                    "--timeout",
                    "60s",
                    "--interval",
                    "1s",
                    rc=1,
                )
                assert "failed" in out and "signature" in out and why in out, out
                assert await heartbeat_versions(p) == {"worker-0": {}, "worker-1": {}}
            # a canary that turns slow: its worker starved of CPU after placement
            cmd = asyncio.create_task(
                asyncio.to_thread(
                    cli,
                    p.nats_url,
                    p.operator,
                    "model",
                    "deploy",
                    f"{MODEL}@v-slow",
                    "--steps",
                    "50",
                    "--interval",
                    "60s",
                    "--min-samples",
                    "5",
                    "--slo",
                    "ttft_p95=0.3",
                    "--wait",
                    "--timeout",
                    "90s",
                    rc=1,
                )
            )
            canary = await canary_instance(p.nats_url, p.operator, MODEL, "v-slow", "place")
            stop = asyncio.Event()
            slowed = time.monotonic()
            slow = asyncio.create_task(throttle((await p.pids())[canary], 0.5, 0.05, stop))
            out = await cmd
            back = time.monotonic()
            stop.set()
            await slow
            assert "rollback" in out and "SLO breached" in out and "ttft_p95" in out, out
        return load, slowed, back

    load, slowed, back = asyncio.run(scenario())
    assert load.failures() == [] and load.count("hung") == 0
    assert back - slowed < 30  # the goal with a 10 s window
