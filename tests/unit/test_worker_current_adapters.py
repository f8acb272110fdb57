"""A restarted worker serves the registry's current adapters even when its first read
of the registry fails (issue 41's flaky rollout test: a worker killed under load came
back without ``sim-lora@a1`` and never loaded it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from inferbus.contracts import ModelDelivery, ModelVersion
from inferbus.services.worker import delivery as worker_delivery
from inferbus.services.worker.delivery import Deliveries
from inferbus.services.worker.swap import Held, Holding

ADAPTER = ModelVersion(name="lora", version="a1", kind="adapter", base_model="m")
OTHER = ModelVersion(name="lora-x", version="b1", kind="adapter", base_model="other-model")


class Registry:
    """The registry's current pointers; the first ``failures`` reads time out."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.reads = 0

    async def keys(self, js, prefix: str = "") -> list[str]:
        self.reads += 1
        if self.reads <= self.failures:
            raise TimeoutError("nats: timeout")
        return ["current.lora", "current.lora-x"]

    async def get_current(self, js, name: str):
        return SimpleNamespace(name=name, version={"lora": "a1", "lora-x": "b1"}[name])

    async def get_version(self, js, name: str, version: str):
        return {"lora": ADAPTER, "lora-x": OTHER}[name]


def deliveries(monkeypatch, registry: Registry) -> tuple[Deliveries, list[ModelDelivery]]:
    for name in ("keys", "get_current", "get_version"):
        monkeypatch.setattr(worker_delivery.modelstore, name, getattr(registry, name))
    monkeypatch.setattr(worker_delivery, "ADAPTERS_RETRY_S", (0.01, 0.01, 0.01))
    worker = SimpleNamespace(holding=Holding(model=Held(name="m", path="/models/m")))
    d = Deliveries(worker, SimpleNamespace(js=None), Path("/nonexistent"), [])  # type: ignore[arg-type]
    delivered: list[ModelDelivery] = []

    async def deliver(delivery: ModelDelivery, arrived: float) -> None:
        delivered.append(delivery)

    monkeypatch.setattr(d, "deliver", deliver)
    return d, delivered


async def test_a_failed_first_read_is_read_again_and_the_adapter_loaded(monkeypatch):
    registry = Registry(failures=2)
    d, delivered = deliveries(monkeypatch, registry)
    await d.load_current_adapters()
    assert delivered == []  # the start goes on; the reads go on behind it
    for _ in range(100):
        if delivered:
            break
        await asyncio.sleep(0.01)
    assert [x.model for x in delivered] == [ADAPTER]  # only the one on its model
    assert delivered[0].role == "current" and registry.reads == 3


async def test_a_registry_that_answers_loads_at_once(monkeypatch):
    d, delivered = deliveries(monkeypatch, Registry(failures=0))
    await d.load_current_adapters()
    assert [x.model for x in delivered] == [ADAPTER]


async def test_a_registry_never_read_gives_up_and_says_so(monkeypatch):
    registry = Registry(failures=100)
    d, delivered = deliveries(monkeypatch, registry)
    said: list[str] = []
    monkeypatch.setattr(
        worker_delivery, "log", SimpleNamespace(warning=lambda *a, **k: None, error=said.append)
    )
    await d.load_current_adapters()
    for _ in range(100):
        if not d._prefetches:
            break
        await asyncio.sleep(0.01)
    assert delivered == [] and registry.reads == 4  # the first and three again
    assert said and "serving without them" in said[0]


async def test_the_current_model_version_is_read_again_after_a_timeout(monkeypatch):
    """The same at the worker's start for its model: a read that timed out once left a
    restarted worker on its own --model while the rest served the current version."""
    model = ModelVersion(name="m", version="v2")
    calls = {"n": 0}

    async def get_current(js, name: str):
        calls["n"] += 1
        if calls["n"] == 1:
            raise TimeoutError("nats: timeout")
        return SimpleNamespace(name=name, version="v2")

    async def get_version(js, name: str, version: str):
        return model

    d, _ = deliveries(monkeypatch, Registry(failures=0))
    monkeypatch.setattr(worker_delivery.modelstore, "get_current", get_current)
    monkeypatch.setattr(worker_delivery.modelstore, "get_version", get_version)
    monkeypatch.setattr(worker_delivery, "CURRENT_RETRY_S", (0.01,))

    async def fetch_verified(mv):
        return "verified"

    monkeypatch.setattr(d, "_fetch_verified", fetch_verified)
    assert await d.current_version("m") == (model, "verified")
    assert calls["n"] == 2
