"""The autoscaler's adapter on a real nats-server: its local actuator against a
supervisor that answers (a stand-in replying as `inferbus up` does) and one that does
not, and the service refusing to start without models."""

from __future__ import annotations

import nats
import pytest

from inferbus.contracts import ScaleDecision
from inferbus.contracts.control import (
    ProcessState,
    ScaleService,
    SupervisorCommand,
    SupervisorState,
    supervisor_subject,
)
from inferbus.services.autoscaler.actuators import ActuationError, LocalActuator
from inferbus.services.autoscaler.service import AutoscalerService, AutoscalerSettings
from inferbus.shared.codec import decode, encode

pytestmark = pytest.mark.integration


async def test_local_actuator_sends_scale_and_reads_the_fleet(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    got: list[object] = []
    workers = ["worker-0", "worker-1", "worker-2"]

    async def supervisor(msg) -> None:  # answers as inferbus up's control subject does
        cmd = decode(msg.data, SupervisorCommand)
        got.append(cmd)
        if isinstance(cmd, ScaleService) and cmd.instances > 4:
            state = SupervisorState(supervisor="t", processes=[], error="over the maximum")
        else:
            procs = [ProcessState(name=w, service="worker", state="running") for w in workers]
            state = SupervisorState(supervisor="t", processes=procs)
        await msg.respond(encode(state))

    await nc.subscribe(supervisor_subject("t"), cb=supervisor)
    act = LocalActuator(nc, {"m": "worker"}, "t", timeout_s=2)
    try:
        assert await act.current("m") == 3
        assert await act.current("other") is None
        await act.apply(
            ScaleDecision(model="m", desired=2, previous=3, stop_first=["worker-1.abc123"])
        )
        scale = got[-1]
        assert isinstance(scale, ScaleService)
        # the bus's worker id is <instance>.<nonce>: the supervisor is told the instance
        assert (scale.service, scale.instances, scale.stop_first) == ("worker", 2, ["worker-1"])
        with pytest.raises(ActuationError, match="over the maximum"):
            await act.apply(ScaleDecision(model="m", desired=9, previous=3))
        with pytest.raises(ActuationError, match="no local service"):
            await act.apply(ScaleDecision(model="x", desired=1, previous=0))
        silent = LocalActuator(nc, {"m": "worker"}, "nobody", timeout_s=0.5)
        with pytest.raises(ActuationError, match="did not answer"):
            await silent.apply(ScaleDecision(model="m", desired=2, previous=1))
    finally:
        await nc.close()


def test_the_service_needs_models() -> None:
    with pytest.raises(ValueError, match="--models"):
        AutoscalerService(AutoscalerSettings())
