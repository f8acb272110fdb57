"""The autoscaler's local actuator against ``inferbus up``'s own supervisor (no
stand-in): it reads the fleet, scales it down draining the worker it names, is refused
out of bounds with the supervisor's reason, and says so when no supervisor answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import msgspec
import nats
import pytest
from testkit.faults import Platform
from testkit.procs import ServiceProcess

from inferbus.contracts import (
    SCALING_STATUS,
    LLMServiceSettings,
    ScaleDecision,
    ScalingSettings,
    ScalingStatus,
    llmservice_subject,
    scale_subject,
)
from inferbus.contracts.control import SupervisorQuery, SupervisorState, supervisor_subject
from inferbus.services.autoscaler.actuators import ActuationError, LocalActuator
from inferbus.shared.bus import connect, publish_durable
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, encode

pytestmark = pytest.mark.integration


async def test_local_actuator_against_inferbus_up(tmp_path: Path) -> None:
    p = Platform(tmp_path, workers=3, decode_s=0.001)
    try:
        nc = await connect(p.nats_url, "test-actuator", load_credentials(p.operator))

        async def workers() -> list[str]:
            reply = await nc.request(supervisor_subject(), encode(SupervisorQuery()), timeout=5)
            state = decode(reply.data, SupervisorState)
            return sorted(x.name for x in state.processes if x.service == "worker")

        act = LocalActuator(nc, {"sim-model": "worker"}, "local", timeout_s=5)
        assert await act.current("sim-model") == 3
        assert await act.current("other") is None
        # the bus's worker id is <instance>.<nonce>: the supervisor is told the instance
        await act.apply(
            ScaleDecision(model="sim-model", desired=2, previous=3, stop_first=["worker-1.ab12"])
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and await workers() != ["worker-0", "worker-2"]:
            await asyncio.sleep(0.2)
        assert await workers() == ["worker-0", "worker-2"]
        with pytest.raises(ActuationError, match=r"within 0\.\.90"):
            await act.apply(ScaleDecision(model="sim-model", desired=91, previous=2))
        with pytest.raises(ActuationError, match="no local service"):
            await act.apply(ScaleDecision(model="x", desired=1, previous=0))
        await nc.close()
    finally:
        p.stop()


async def test_no_supervisor_answering_is_an_actuation_error(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        silent = LocalActuator(nc, {"m": "worker"}, "nobody", timeout_s=0.5)
        with pytest.raises(ActuationError, match="did not answer"):
            await silent.apply(ScaleDecision(model="m", desired=2, previous=1))
    finally:
        await nc.close()


async def test_started_with_no_models_it_takes_one_from_an_llmservice_record(
    nats_url: str, log_dir: Path
) -> None:
    """It once refused to start without --models; an LLMService's record now brings a
    model at run time, and a removed record takes it away."""
    model = f"llms-{uuid.uuid4().hex[:6]}"
    proc = (
        ServiceProcess(
            "autoscaler", nats_url, log_dir, "--actuator", "none", name=f"autoscaler-{model}"
        )
        .start()
        .wait_ready()
    )
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        decisions: list[ScaleDecision] = []
        statuses: list[ScalingStatus] = []

        async def on_decision(msg) -> None:
            decisions.append(decode(msg.data, ScaleDecision))

        async def on_status(msg) -> None:
            statuses.append(decode(msg.data, ScalingStatus))

        await js.subscribe(scale_subject(model), cb=on_decision, ordered_consumer=True)
        await nc.subscribe(SCALING_STATUS, cb=on_status)
        record = LLMServiceSettings(
            service="chat",
            model=model,
            scale_target="anywhere",
            scaling=ScalingSettings(min_replicas=2, max_replicas=3),
            set_at=time.time(),
        )
        await publish_durable(js, llmservice_subject(model), record, request_id="t")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(d.desired == 2 for d in decisions):
            await asyncio.sleep(0.2)
        assert any(d.desired == 2 for d in decisions), decisions  # minReplicas, decided
        removed = msgspec.structs.replace(record, removed=True, set_at=time.time())
        await publish_durable(js, llmservice_subject(model), removed, request_id="t")
        await asyncio.sleep(3.0)  # a status or two after the removal
        assert model not in statuses[-1].targets, statuses[-1]
    finally:
        await nc.close()
        proc.stop()
