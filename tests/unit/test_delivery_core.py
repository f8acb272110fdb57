"""The rollout state machine on fake inputs: placement, steps, holds, promotion, and
rollback on a breach (and not on a platform-wide slowdown)."""

from __future__ import annotations

import pytest

from inferbus.contracts import (
    DeployRequest,
    ModelCurrent,
    ModelSwapped,
    ModelVersion,
    RequestFailed,
    RequestFinished,
    RollbackRequest,
    StageTimings,
    Usage,
    WorkerHeartbeat,
)
from inferbus.services.delivery.core import (
    DeliveryCore,
    DeliveryPolicy,
    Outcome,
    Rollout,
    breaches,
    check_slo,
    summarize,
)
from inferbus.shared.codec import decode, encode

V2 = ModelVersion(name="m", version="v2", shape="s1")
V1 = ModelVersion(name="m", version="v1", shape="s1")
SLO = {"ttft_p95": 0.5, "error_rate": 0.01}


def hb(core: DeliveryCore, wid: str, models: list[str], now: float, versions=None) -> None:
    core.on_heartbeat(
        WorkerHeartbeat(worker_id=wid, models=models, engine="sim", versions=versions or {}),
        now,
    )


def fleet(core: DeliveryCore, now: float, n: int = 3) -> None:
    for i in range(n):
        hb(core, f"w{i}", ["m", "m@v1"], now, {"m": "v1", "m@v1": "v1"})


def ended(core: DeliveryCore, served: str, now: float, ttft: float = 0.1, n: int = 1) -> None:
    for _ in range(n):
        core.on_ended(
            RequestFinished(
                request_id="r",
                finish_reason="length",
                chunks=9,
                usage=Usage(prompt_tokens=5, completion_tokens=10),
                timings=StageTimings(first_token_s=ttft, decode_s=0.09),
                served_model=served,
            ),
            now,
        )


def deploy(core: DeliveryCore, now: float, **kw) -> tuple[Rollout, object]:
    req = DeployRequest(
        model="m", version="v2", steps=[10, 50], interval_s=30, slo=SLO, min_samples=5, **kw
    )
    effects = core.deploy(req, V2, ModelCurrent(name="m", version="v1"), V1, now)
    return core.rollouts.get("m"), effects


def placed(core: DeliveryCore, now: float = 0.0):
    fleet(core, now)
    rollout, effects = deploy(core, now)
    (delivery,) = effects.deliveries
    assert delivery.role == "candidate" and delivery.workers == rollout.workers
    for w in rollout.workers:
        core.on_swapped(
            ModelSwapped(
                delivery_id=delivery.delivery_id, worker_id=w, model="m@v2", role="candidate"
            ),
            now + 1,
        )
    hb(core, rollout.workers[0], ["m@v2"], now + 1, {"m@v2": "v2"})
    return rollout


def test_a_deploy_places_the_candidate_on_the_least_busy_worker_and_keeps_others_on_current():
    core = DeliveryCore()
    fleet(core, 0.0)
    core.on_heartbeat(  # w0 is the busiest: running 3, waiting 2
        WorkerHeartbeat(
            worker_id="w0",
            models=["m", "m@v1"],
            engine="sim",
            running=3,
            waiting=2,
            versions={"m": "v1", "m@v1": "v1"},
        ),
        0.0,
    )
    rollout, effects = deploy(core, 0.0)
    assert rollout.workers == ["w1"] and rollout.phase == "placing"
    assert [d.action for d in effects.decisions] == ["start", "place"]
    assert effects.canary is None  # no traffic before it is loaded


def test_the_first_step_starts_once_the_canary_answers():
    core = DeliveryCore()
    fleet(core, 0.0)
    rollout, effects = deploy(core, 0.0)
    delivery = effects.deliveries[0]
    step = core.on_swapped(
        ModelSwapped(delivery_id=delivery.delivery_id, worker_id="w0", model="m@v2"), 2.0
    )
    assert rollout.phase == "stepping"
    assert step.canary.weights == {"m@v2": pytest.approx(0.10)}
    # an answer to another delivery changes nothing
    assert (
        core.on_swapped(ModelSwapped(delivery_id="old", worker_id="w0", model="m@v2"), 2.0).canary
        is None
    )


def test_steps_advance_only_with_enough_samples_then_promote_then_done():
    core = DeliveryCore()
    rollout = placed(core)
    t = 1.0
    ended(core, "m@v2", t + 5, n=3)
    held = core.tick(t + 31)  # interval passed, 3 of 5 samples
    assert [d.action for d in held.decisions] == ["hold"]
    assert core.tick(t + 32).decisions == []  # said once
    ended(core, "m@v2", t + 33, n=3)
    ended(core, "m@v1", t + 33, n=20)
    up = core.tick(t + 34)
    assert up.canary.weights == {"m@v2": pytest.approx(0.5)}
    assert up.decisions[0].candidate.samples == 6
    ended(core, "m@v2", t + 40, n=10)
    last = core.tick(t + 65)  # steps end at 100% even when not asked for
    assert last.canary.weights == {"m@v2": pytest.approx(1.0)} and rollout.steps[-1] == 100
    ended(core, "m@v2", t + 70, n=10)
    promote = core.tick(t + 96)
    assert [d.action for d in promote.decisions] == ["promote"]
    assert promote.current.version == "v2" and promote.current.previous == "v1"
    (everyone,) = promote.deliveries
    assert everyone.role == "current" and everyone.workers == []
    assert core.tick(t + 97).canary is None  # weights stay until every worker swapped
    for i in range(3):
        hb(core, f"w{i}", ["m", "m@v2"], t + 98, {"m": "v2", "m@v2": "v2"})
    done = core.tick(t + 99)
    assert [d.action for d in done.decisions] == ["done"] and done.canary.weights == {}
    assert rollout.phase == "done" and not rollout.active


def test_a_breach_rolls_back_at_once_with_its_figures():
    core = DeliveryCore(DeliveryPolicy(window_s=10.0, breach_min_samples=5))
    rollout = placed(core)
    ended(core, "m@v1", 5.0, ttft=0.1, n=20)
    ended(core, "m@v2", 5.0, ttft=2.0, n=6)
    effects = core.tick(6.0)  # long before the step's interval
    (decision,) = effects.decisions
    assert decision.action == "rollback" and "ttft_p95 2 > 0.5" in decision.reason
    assert decision.candidate.samples == 6 and decision.baseline.samples == 20
    assert effects.canary.weights == {}  # traffic back on the old version
    (back,) = effects.deliveries
    assert back.model == V1 and back.role == "current" and back.workers == rollout.workers
    assert rollout.phase == "rolled_back"


def test_errors_on_the_new_version_roll_back_but_client_errors_do_not_count():
    core = DeliveryCore()
    placed(core)
    for _ in range(10):
        core.on_ended(
            RequestFailed(request_id="r", code="invalid_request", reason="x", served_model="m@v2"),
            3.0,
        )
    ended(core, "m@v2", 3.0, n=5)
    assert core.tick(4.0).decisions == []
    core.on_ended(
        RequestFailed(request_id="r", code="engine_error", reason="x", served_model="m@v2"), 4.5
    )
    assert core.tick(5.0).decisions[0].action == "rollback"


def test_a_slowdown_of_both_versions_is_not_the_new_versions_fault():
    core = DeliveryCore()
    rollout = placed(core)
    ended(core, "m@v1", 5.0, ttft=3.0, n=20)
    ended(core, "m@v2", 5.0, ttft=2.0, n=6)
    assert core.tick(6.0).decisions == [] and rollout.phase == "stepping"


def test_ratio_gates_compare_against_the_current_version():
    cand = summarize([Outcome(at=0, ttft=0.3, itl=0.01, error=False)] * 10)
    base = summarize([Outcome(at=0, ttft=0.1, itl=0.01, error=False)] * 10)
    assert breaches(cand, base, {"ttft_p95_ratio": 2.0}) == [
        "ttft_p95 0.3 > 2x the current version's 0.1"
    ]
    assert breaches(cand, base, {"ttft_p95_ratio": 4.0}) == []
    with pytest.raises(ValueError, match="SLO key"):
        check_slo({"p99": 1.0})


def test_a_refused_swap_fails_the_rollout_and_sends_nothing_to_the_new_version():
    core = DeliveryCore()
    fleet(core, 0.0)
    rollout, effects = deploy(core, 0.0)
    failed = core.on_swapped(
        ModelSwapped(
            delivery_id=effects.deliveries[0].delivery_id,
            worker_id=rollout.workers[0],
            model="m@v2",
            ok=False,
            code="signature",
            reason="does not verify",
        ),
        1.0,
    )
    (decision,) = failed.decisions
    assert decision.action == "failed" and "signature" in decision.reason
    assert failed.canary.weights == {} and rollout.phase == "failed"


def test_canary_workers_that_never_answer_fail_the_rollout():
    core = DeliveryCore(DeliveryPolicy(place_timeout_s=60, worker_timeout_s=1000))
    fleet(core, 0.0)
    deploy(core, 0.0)
    assert core.tick(30.0).decisions == []
    assert core.tick(61.0).decisions[0].action == "failed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (dict(candidate=None), "not in the registry"),
        (dict(current=ModelCurrent(name="m", version="v2")), "serves v2 already"),
        (dict(steps=[50, 10]), "rising percentages"),
        (dict(slo={"latency": 1.0}), "SLO key"),
        (dict(workers=1), "needs two workers"),
        (dict(workers=0), "no worker serves m"),
    ],
)
def test_deploys_that_cannot_work_are_refused_with_the_reason(change, reason):
    core = DeliveryCore()
    fleet(core, 0.0, n=change.pop("workers", 3))
    req = DeployRequest(
        model="m", version="v2", steps=change.pop("steps", [10]), slo=change.pop("slo", {})
    )
    args = {"candidate": V2, "current": ModelCurrent(name="m", version="v1"), **change}
    effects = core.deploy(req, args["candidate"], args["current"], V1, 0.0)
    assert effects.decisions[0].action == "failed" and reason in effects.decisions[0].reason
    assert effects.deliveries == [] and "m" not in core.rollouts


def test_one_rollout_at_a_time_per_model():
    core = DeliveryCore()
    fleet(core, 0.0)
    deploy(core, 0.0)
    _, again = deploy(core, 1.0)
    assert "being rolled out" in again.decisions[0].reason


def test_rollback_by_hand_during_a_rollout_and_after_it():
    core = DeliveryCore()
    rollout = placed(core)
    during = core.rollback(
        RollbackRequest(model="m", reason="looks off"),
        ModelCurrent(name="m", version="v1"),
        V1,
        None,
        3.0,
    )
    assert during.decisions[0].action == "rollback" and "looks off" in during.decisions[0].reason
    assert during.canary.weights == {} and rollout.phase == "rolled_back"
    after = core.rollback(
        RollbackRequest(model="m"), ModelCurrent(name="m", version="v2", previous="v1"), V2, V1, 9.0
    )
    assert after.current.version == "v1" and after.current.previous == "v2"
    assert after.deliveries[0].model == V1 and after.deliveries[0].workers == []
    # back past the first registered version: each worker's own --model
    first = core.rollback(
        RollbackRequest(model="m"), ModelCurrent(name="m", version="v1"), V1, None, 10.0
    )
    assert first.deliveries[0].model.version == "" and first.current.version == ""
    nothing = core.rollback(RollbackRequest(model="x"), None, None, None, 11.0)
    assert nothing.decisions[0].action == "failed"


def test_an_adapters_first_version_goes_straight_in_and_its_next_is_a_canary_on_one_worker():
    core = DeliveryCore()
    hb(core, "w0", ["base"], 0.0)
    ad1 = ModelVersion(name="ad", version="a1", kind="adapter", base_model="base")
    first = core.deploy(DeployRequest(model="ad", version="a1"), ad1, None, None, 0.0)
    assert [d.action for d in first.decisions] == ["start", "promote"]
    assert first.current.version == "a1" and first.deliveries[0].role == "current"
    hb(core, "w0", ["base", "ad", "ad@a1"], 1.0, {"ad": "a1", "ad@a1": "a1"})
    assert core.tick(2.0).decisions[0].action == "done"
    ad2 = ModelVersion(name="ad", version="a2", kind="adapter", base_model="base")
    canary = core.deploy(
        DeployRequest(model="ad", version="a2", steps=[50]),
        ad2,
        ModelCurrent(name="ad", version="a1"),
        ad1,
        3.0,
    )
    assert canary.deliveries[0].workers == [] and canary.deliveries[0].role == "candidate"
    hb(core, "w0", ["base", "ad", "ad@a1", "ad@a2"], 4.0)
    assert core.tick(4.0).canary.weights == {"ad@a2": 0.5}
    back = core.rollback(
        RollbackRequest(model="ad"), ModelCurrent(name="ad", version="a1"), ad1, None, 5.0
    )
    assert back.deliveries[0].workers == [] and back.deliveries[0].model == ad1


def test_an_adapters_first_version_is_done_when_every_base_worker_serves_it():
    # measured: "done" came once the first worker had loaded it (no other worker served
    # the adapter yet, so none counted), and a test waiting on the second then timed out
    core = DeliveryCore()
    hb(core, "w0", ["base"], 0.0)
    hb(core, "w1", ["base"], 0.0)
    ad1 = ModelVersion(name="ad", version="a1", kind="adapter", base_model="base")
    core.deploy(DeployRequest(model="ad", version="a1"), ad1, None, None, 0.0)
    hb(core, "w0", ["base", "ad", "ad@a1"], 1.0, {"ad": "a1", "ad@a1": "a1"})
    assert [d.action for d in core.tick(2.0).decisions] == []
    hb(core, "w1", ["base", "ad", "ad@a1"], 2.5, {"ad": "a1", "ad@a1": "a1"})
    assert core.tick(3.0).decisions[0].action == "done"


def test_a_promotion_a_worker_refuses_is_rolled_back_everywhere():
    core = DeliveryCore()
    hb(core, "w0", ["base"], 0.0)
    ad1 = ModelVersion(name="ad", version="a1", kind="adapter", base_model="base")
    first = core.deploy(DeployRequest(model="ad", version="a1"), ad1, None, None, 0.0)
    refused = core.on_swapped(
        ModelSwapped(
            delivery_id=first.deliveries[0].delivery_id,
            worker_id="w0",
            model="ad@a1",
            ok=False,
            code="signature",
            reason="x",
        ),
        1.0,
    )
    assert refused.decisions[0].action == "failed" and refused.current.version == ""


def test_a_saved_rollout_resumes():
    core = DeliveryCore()
    rollout = placed(core)
    saved = decode(encode(rollout), Rollout)
    fresh = DeliveryCore()
    fresh.restore(saved)
    hb(fresh, rollout.workers[0], ["m@v2"], 2.0)
    ended(fresh, "m@v2", 3.0, ttft=5.0, n=6)
    ended(fresh, "m@v1", 3.0, ttft=0.1, n=6)
    assert fresh.tick(4.0).decisions[0].action == "rollback"


def test_no_canary_loads_everywhere_at_once_even_on_one_worker():
    core = DeliveryCore()
    fleet(core, 0.0, n=1)
    req = DeployRequest(model="m", version="v2", canary=False)
    effects = core.deploy(req, V2, ModelCurrent(name="m", version="v1"), V1, 0.0)
    assert [d.action for d in effects.decisions] == ["start", "promote"]
    assert "no canary, as asked" in effects.decisions[0].reason
    assert effects.deliveries[0].workers == [] and effects.current.version == "v2"
