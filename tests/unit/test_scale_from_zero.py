"""Scale from zero: a model the autoscaler sizes is one whose requests wait for the
worker being started, in the gateway (no 503) and in the scheduler (the cold-start
bound, not the queue timeout), and only while the autoscaler is heard."""

from __future__ import annotations

import pytest

from inferbus.contracts import (
    FailureCode,
    RequestSubmitted,
    ScalingStatus,
    WorkerHeartbeat,
)
from inferbus.services.autoscaler.service import AutoscalerSettings
from inferbus.services.gateway.admission import ModelRegistry
from inferbus.services.gateway.errors import ApiError
from inferbus.services.scheduler.core import Assign, Fail, SchedulerCore, SchedulerPolicy
from inferbus.shared.config import load_settings

POLICY = SchedulerPolicy(queue_timeout_s=10.0, cold_start_wait_s=60.0)


def req(rid: str) -> RequestSubmitted:
    return RequestSubmitted(request_id=rid, model="m", reply_to="r", prompt="hi")


def test_scheduler_holds_a_scaled_models_requests_for_the_cold_start() -> None:
    core = SchedulerCore(POLICY)
    core.on_scaling({"m": 1}, now=0.0, valid_s=6.0)
    core.on_accepted(req("a"), 0.0)
    for t in range(1, 40):  # the autoscaler keeps saying so every 2 s
        if t % 2 == 0:
            core.on_scaling({"m": 1}, now=float(t), valid_s=6.0)
        assert core.tick(float(t)) == [], t  # past queue_timeout_s, still waiting
    effects = core.on_heartbeat(WorkerHeartbeat(worker_id="w1", models=["m"], engine="sim"), 40.0)
    assert [e.worker_id for e in effects if isinstance(e, Assign)] == ["w1"]


def test_the_cold_start_wait_is_bounded_and_named() -> None:
    core = SchedulerCore(POLICY)
    core.on_accepted(req("a"), 0.0)
    effects = []
    for t in range(1, 70):
        core.on_scaling({"m": 1}, now=float(t), valid_s=6.0)
        effects += core.tick(float(t))
    (fail,) = [e for e in effects if isinstance(e, Fail)]
    assert fail.code == FailureCode.NO_WORKER and "60s" in fail.reason


def test_without_the_autoscaler_the_queue_timeout_applies() -> None:
    core = SchedulerCore(POLICY)
    core.on_scaling({"m": 1}, now=0.0, valid_s=6.0)  # then it goes quiet
    core.on_accepted(req("a"), 0.0)
    fails = [e for t in range(1, 12) for e in core.tick(float(t)) if isinstance(e, Fail)]
    assert [f.code for f in fails] == [FailureCode.NO_WORKER]


def test_gateway_lets_a_scaled_models_request_in_while_none_is_ready() -> None:
    reg = ModelRegistry(started_at=-100.0)
    with pytest.raises(ApiError) as refused:
        reg.admit("m", 0.0)
    assert refused.value.code == FailureCode.MODEL_NOT_FOUND
    reg.on_scaling(ScalingStatus(autoscaler_id="a", targets={"m": 0}, interval_s=2.0), 0.0)
    reg.admit("m", 1.0)  # waits for the worker the autoscaler starts
    assert reg.models(1.0) == {"m": 0}  # and /v1/models lists it
    with pytest.raises(ApiError) as refused:
        reg.admit("m", 7.0)  # three intervals of silence: no longer said
    assert refused.value.code == FailureCode.MODEL_NOT_FOUND


def test_autoscaler_settings_per_model() -> None:
    s = load_settings(
        AutoscalerSettings,
        [
            "--models",
            "a=worker,b=inferbus/b-workers",
            "--max-replicas",
            "6",
            "--model-overrides",
            '{"b": {"max_replicas": 2, "forecaster": "constant"}}',
        ],
        environ={},
    )
    policy = s.policy()
    assert policy.models["a"].max_replicas == 6 and policy.models["a"].forecaster == "trend"
    assert policy.models["b"].max_replicas == 2 and policy.models["b"].forecaster == "constant"
    bad = load_settings(
        AutoscalerSettings, ["--models", "a=worker", "--model-overrides", '{"c": {}}'], environ={}
    )
    with pytest.raises(ValueError, match="not in models"):
        bad.policy()
    worse = load_settings(
        AutoscalerSettings, ["--models", "a=worker", "--model-overrides", "{"], environ={}
    )
    with pytest.raises(ValueError, match="JSON"):
        worse.policy()
