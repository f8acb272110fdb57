"""The autoscaler's local actuator against ``inferbus up``'s own supervisor (no
stand-in): it reads the fleet, scales it down draining the worker it names, is refused
out of bounds with the supervisor's reason, and says so when no supervisor answers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest
from testkit.faults import Platform

from inferbus.contracts import ScaleDecision
from inferbus.contracts.control import SupervisorQuery, SupervisorState, supervisor_subject
from inferbus.services.autoscaler.actuators import ActuationError, LocalActuator
from inferbus.services.autoscaler.service import AutoscalerService, AutoscalerSettings
from inferbus.shared.bus import connect
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
        with pytest.raises(ActuationError, match="within 0..90"):
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


def test_the_service_needs_models() -> None:
    with pytest.raises(ValueError, match="--models"):
        AutoscalerService(AutoscalerSettings())
