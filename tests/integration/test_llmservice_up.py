"""``inferbus apply -f`` against a running ``inferbus up`` (sim engine, autoscaler on):
the autoscaler sizes the model by the LLMService at once, the sanitizer checks its
requests by it, a second LLMService may not take the same model, and ``inferbus
delete`` gives the model back to the services' flags."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import nats.errors
import pytest
import yaml
from testkit.faults import MODEL, Platform

from inferbus.client import Client, RequestError
from inferbus.contracts import LLMSERVICES, SCHEDULER_LOAD, LLMServiceSettings, SchedulerLoad
from inferbus.contracts.control import SupervisorQuery, SupervisorState, supervisor_subject
from inferbus.shared.bus import connect, replay
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAYLOAD = "username: ' OR 1=1 --"


def service(name: str, **spec) -> dict:
    return {
        "apiVersion": "inferbus.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, **spec},
    }


def cli(p: Platform, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferbus.cli", *args, "--nats-url", p.nats_url],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={**os.environ, "INFERBUS_NATS_CREDS": str(p.operator)},
    )


async def wait_for(check, timeout: float = 30.0):
    """Until ``check`` holds or ``timeout``; a check whose question went unanswered (the
    supervisor busy starting a worker beside an engine test on two cores: a 5 s
    timeout, once in a full run) is a "not yet", asked again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = await check()
        except nats.errors.TimeoutError:
            got = None
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.5)


async def test_apply_drives_the_autoscaler_and_the_sanitizer_of_a_running_platform(
    tmp_path: Path,
) -> None:
    p = Platform(
        tmp_path / "state",
        workers=1,
        decode_s=0.01,
        extra=(
            "--autoscale",
            "--autoscaler-arg=--max-replicas=3",
            "--autoscaler-arg=--cold-start-s=5",
        ),
    )
    try:
        nc = await connect(p.nats_url, "test-llmservice", load_credentials(p.operator))
        client = await Client.connect(p.nats_url, "test-llmservice-load", creds=p.tenant)

        async def workers() -> int:
            reply = await nc.request(supervisor_subject(), encode(SupervisorQuery()), timeout=5)
            state = decode(reply.data, SupervisorState)
            return sum(1 for x in state.processes if x.service == "worker" and x.state == "running")

        async def blocked() -> bool:
            try:
                await client.generate(MODEL, PAYLOAD, max_tokens=2, timeout=20)
            except RequestError as exc:
                assert exc.code == "input_blocked", exc
                return True
            return False

        assert await blocked()  # the sanitizer's flag: block
        assert await workers() == 1

        spec = service(
            "chat",
            scaling={"minReplicas": 2, "maxReplicas": 3, "ttftSloSeconds": 3.0},
            inputSanitization={"policy": "flag"},
            observability={"stages": [{"name": "ttft", "p95Seconds": 1.0}]},
        )
        path = tmp_path / "chat.yaml"
        path.write_text(yaml.safe_dump(spec))
        done = cli(p, "apply", "-f", str(path), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"llmservice chat: configured; model {MODEL}" in done.stdout
        # one worker of the two it asks for serves (or the second is up already)
        assert "phase Provisioning: WorkersStarting: 1 of 2" in done.stdout or (
            "phase Ready" in done.stdout
        ), done.stdout
        assert (tmp_path / ".inferbus" / "rules" / "chat.rules.yml").is_file()

        # the autoscaler takes minReplicas at once; the sanitizer lets the payload through
        assert await wait_for(lambda: _at_least(workers, 2)), "no second worker"
        assert await wait_for(lambda: _not(blocked), timeout=10)
        records = [
            decode(d, LLMServiceSettings)
            for d, _, _ in await replay(nc.jetstream(), "IB_CONFIG", LLMSERVICES, since_s=600)
        ]
        assert records[-1].service == "chat" and records[-1].scaling.min_replicas == 2
        assert records[-1].scale_target == "worker" and records[-1].input_policy == "flag"
        # one SLO: the scheduler admits the model's requests by the service's objective
        assert await wait_for(lambda: _objective(nc, 3.0)), "the scheduler kept its own"

        again = cli(p, "apply", "-f", str(path), cwd=tmp_path)
        assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout
        assert "phase Ready: Serving: 2 workers ready" in again.stdout, again.stdout

        other = tmp_path / "other.yaml"
        other.write_text(yaml.safe_dump(service("other")))
        refused = cli(p, "apply", "-f", str(other), cwd=tmp_path)
        assert refused.returncode == 1
        assert "is served by LLMService 'chat'" in refused.stderr

        deleted = cli(p, "delete", "-f", str(path), cwd=tmp_path)
        assert deleted.returncode == 0 and "deleted" in deleted.stdout
        assert await wait_for(blocked, timeout=10)  # the flag's policy again
        assert await wait_for(lambda: _objective(nc, 2.0)), "the service's objective stayed"
        assert not (tmp_path / ".inferbus" / "rules" / "chat.rules.yml").exists()
        await client.close()
        await nc.close()
    finally:
        out = p.stop()
    assert "Traceback" not in out, out[-4000:]


async def _at_least(count, n: int) -> bool:
    return await count() >= n


async def _not(check) -> bool:
    return not await check()


async def _objective(nc, seconds: float) -> bool:
    """The scheduler's next load report gives ``MODEL`` this TTFT objective."""
    sub = await nc.subscribe(SCHEDULER_LOAD)
    try:
        load = decode((await sub.next_msg(timeout=5)).data, SchedulerLoad)
    finally:
        await sub.unsubscribe()
    m = load.models.get(MODEL)
    return m is not None and m.ttft_slo_s == seconds
