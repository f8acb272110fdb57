"""The LLMService operator's reconcile against an API server answering as a cluster
does (tests/integration/data/k8s_llmservice_api.json: its responses were written after
the Kubernetes API reference, not captured from a cluster; none ran here) and a real
NATS: what it applies and in what order, what it sends on the bus, the phase it
reports, and an API error that leaves the bus untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from testkit.kubeapi import ReplayApiServer

from inferbus.contracts import (
    DeployRequest,
    LLMServiceSettings,
    ModelCurrent,
)
from inferbus.llmservice import render
from inferbus.llmservice.spec import load
from inferbus.operator.kube import KubeApi
from inferbus.operator.main import registry
from inferbus.operator.reconcile import Operator
from inferbus.shared import modelstore
from inferbus.shared.bus import connect, replay
from inferbus.shared.codec import decode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.streams import ensure_streams

pytestmark = pytest.mark.integration

DATA = json.loads((Path(__file__).parent / "data" / "k8s_llmservice_api.json").read_text())
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "examples" / "llmservice.yaml"
SCENARIOS = DATA["scenarios"]


def body(model: str, **changes) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(
        namespace="inferbus",
        uid="5a0f6f4e-1c1e-4f55-9a77-0c7d3b1e2f10",
        generation=1,
        creationTimestamp="2026-12-02T03:10:03Z",
        resourceVersion="999",
    )
    doc["spec"]["model"].update(name=model, version="2")
    doc["spec"].update(changes)
    return doc


async def records(js, subject: str, kind):
    return [
        decode(d, kind)
        for d, _, _ in await replay(
            js, "IB_CONFIG" if kind is LLMServiceSettings else "IB_DELIVERY", subject, since_s=600
        )
    ]


async def test_reconcile_applies_sends_and_reports_each_phase(tmp_path: Path) -> None:
    # a server of its own: on the session's, the suite's delivery service takes the
    # rollout this asks for and rolls it back (no such version), as it should (found
    # in CI, where that service runs)
    server = NatsServer(tmp_path / "nats").start()
    try:
        await _reconcile_phases(server.url)
    finally:
        server.stop()


async def _reconcile_phases(nats_url: str) -> None:
    model = "op-chat"
    nc = await connect(nats_url, "test-operator")
    js = nc.jetstream(timeout=30)  # a loaded runner answered a put in over 5 s
    await ensure_streams(js)
    async with ReplayApiServer(SCENARIOS["create"]) as api:
        kube = KubeApi(client.ApiClient(client.Configuration(host=api.url)))
        op = Operator(kube=kube, js=js, cluster=render.Cluster(image="inferbus:cpu"))
        doc = body(model)
        svc = load(doc)

        # created: nothing exists yet; every object applied; the rollout asked for
        status = await op.reconcile(doc, {}, now=1000.0)
        assert api.mismatches == [] and api.left == 0
        sent = {r.path.rsplit("/", 2)[-2]: r.body for r in api.received if r.method == "PATCH"}
        assert sent["deployments"] == render.worker_deployment(svc, op.cluster, None)
        assert sent["roles"] == render.scale_access(svc, "autoscaler")[0]
        assert yaml.safe_load(sent["configmaps"]["data"]["chat.rules.yml"]) == (
            render.prometheus_rules(svc)
        )
        assert (status["phase"], status["reason"]) == ("Provisioning", "WorkersStarting")
        assert status["conditions"][0]["status"] == "False"
        (settings,) = await records(js, f"ib.cfg.llmservice.{model}", LLMServiceSettings)
        assert settings.scale_target == "inferbus/llm-chat" and settings.service == "inferbus/chat"
        assert settings.scaling is not None and settings.scaling.max_replicas == 4
        (deploy,) = await records(js, f"ib.delivery.cmd.{model}", DeployRequest)
        assert (deploy.version, deploy.steps, deploy.slo["ttft_p95"]) == ("2", [5, 25, 100], 2.0)
        assert status["requested"] == "1:2"

        # its workers are up (the autoscaler made them 2): kept at 2; version 2 not yet
        # served, and not asked again
        api.load(SCENARIOS["ready"])
        status = await op.reconcile(doc, status, now=1100.0)
        assert api.mismatches == [] and api.left == 0
        applied = next(r.body for r in api.received[::-1] if r.path.endswith("/llm-chat"))
        assert applied["spec"]["replicas"] == 2
        assert (status["phase"], status["reason"]) == ("Provisioning", "VersionRequested")
        assert len(await records(js, f"ib.delivery.cmd.{model}", DeployRequest)) == 1
        assert len(await records(js, f"ib.cfg.llmservice.{model}", LLMServiceSettings)) == 1

        # the delivery service promoted it: Ready, with the condition's time kept after
        await modelstore.set_current(js, ModelCurrent(name=model, version="2", set_at=1150.0))
        api.load(SCENARIOS["ready"])
        status = await op.reconcile(doc, status, now=1200.0)
        assert (status["phase"], status["readyReplicas"], status["servedVersion"]) == (
            "Ready",
            2,
            "2",
        )
        since = status["conditions"][0]["lastTransitionTime"]
        api.load(SCENARIOS["ready"])
        status = await op.reconcile(doc, status, now=1300.0)
        assert status["conditions"][0]["lastTransitionTime"] == since

        # its workers cannot roll out, and the rule file is no longer asked for: deleted
        api.load(SCENARIOS["stuck_without_rules"])
        stuck = body(model, observability={})
        status = await op.reconcile(stuck, status, now=1400.0)
        assert api.mismatches == [] and api.left == 0
        assert api.received[-1].method == "DELETE"
        assert (status["phase"], status["reason"]) == ("Degraded", "ProgressDeadlineExceeded")
        assert status["rules"] is False

        # the API server refuses: the error goes to kopf (it retries), nothing is sent
        api.load(SCENARIOS["forbidden"])
        changed = body(model, scaling={"minReplicas": 1, "maxReplicas": 6})
        with pytest.raises(ApiException) as err:
            await op.reconcile(changed, status, now=1500.0)
        assert err.value.status == 403
        assert len(await records(js, f"ib.cfg.llmservice.{model}", LLMServiceSettings)) == 1

        # another LLMService may not take the model; a bad spec is reported, not applied
        api.load([])
        calls = len(api.received)
        other = body(model)
        other["metadata"]["name"] = "other"
        taken = await op.reconcile(other, {}, now=1600.0)
        assert (taken["phase"], taken["reason"]) == ("Degraded", "ModelTaken")
        bad = body(model, scaling={"minReplicas": 9, "maxReplicas": 2})
        refused = await op.reconcile(bad, {}, now=1600.0)
        assert (refused["phase"], refused["reason"]) == ("Degraded", "InvalidSpec")
        assert len(api.received) == calls  # neither called the API server

        # deleted: the services forget the model's record
        await op.forget(doc, now=1700.0)
        last = (await records(js, f"ib.cfg.llmservice.{model}", LLMServiceSettings))[-1]
        assert last.removed and last.service == "inferbus/chat"
        await kube.close()
    await nc.close()


def test_the_kopf_registry_has_every_handler_for_the_resource() -> None:
    reg = registry(Operator(kube=None, js=None, cluster=render.Cluster()))  # type: ignore[arg-type]
    # kopf keeps them in private lists: read, not changed
    changing = reg._changing.get_all_handlers()
    spawning = reg._spawning.get_all_handlers()
    for h in [*changing, *spawning]:
        assert (h.selector.group, h.selector.version, h.selector.any_name) == (
            "inferbus.io",
            "v1alpha1",
            "llmservices",
        )
    reasons = {(h.id.rsplit(".", 1)[-1], h.reason and h.reason.value) for h in changing}
    # resume: kopf's reason None (every object found at start)
    assert reasons == {
        ("reconcile", "create"),
        ("reconcile", "update"),
        ("reconcile", None),
        ("forget", "delete"),
    }
    assert [h.id.rsplit(".", 1)[-1] for h in spawning] == ["resync"]
