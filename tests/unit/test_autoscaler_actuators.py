"""The Kubernetes actuator's requests, against an API server that answers with recorded
responses (no cluster runs on these machines): the path, verb, content type and body
of each call, what it makes of the answers, and a refusal turned into a clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from inferbus.contracts import ScaleDecision
from inferbus.services.autoscaler.actuators import ActuationError, KubernetesActuator

RECORDED = json.loads((Path(__file__).parent / "data" / "k8s_scale_responses.json").read_text())
SCALE_PATH = "/apis/apps/v1/namespaces/inferbus/deployments/worker/scale"


@pytest.fixture
async def api_server(tmp_path: Path):
    """An API server on a free port: GET and PATCH of the worker's scale, answered
    from the recorded responses; ``state`` holds what it received and can refuse."""
    state: dict[str, Any] = {"calls": [], "forbid": False, "replicas": 2}

    async def scale(request: web.Request) -> web.Response:
        body = await request.text()
        state["calls"].append(
            {
                "method": request.method,
                "path": request.path,
                "content_type": request.headers.get("Content-Type", ""),
                "authorization": request.headers.get("Authorization", ""),
                "body": json.loads(body) if body else None,
            }
        )
        if state["forbid"] and request.method == "PATCH":
            return web.json_response(RECORDED["forbidden"], status=403)
        answer = json.loads(json.dumps(RECORDED["get"]))
        if request.method == "PATCH":
            state["replicas"] = json.loads(body)["spec"]["replicas"]
        answer["spec"]["replicas"] = state["replicas"]
        return web.json_response(answer)

    app = web.Application()
    app.router.add_route("GET", SCALE_PATH, scale)
    app.router.add_route("PATCH", SCALE_PATH, scale)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "recorded-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    yield state, str(kubeconfig)
    await runner.cleanup()


def decision(desired: int) -> ScaleDecision:
    return ScaleDecision(model="sim-model", desired=desired, previous=2, decided_at=1.0)


async def test_reads_and_patches_the_scale_subresource(api_server) -> None:
    state, kubeconfig = api_server
    act = KubernetesActuator({"sim-model": "inferbus/worker"}, kubeconfig)
    try:
        assert await act.current("sim-model") == 2
        await act.apply(decision(5))
        assert await act.current("sim-model") == 5
        assert await act.current("other-model") is None
    finally:
        await act.close()
    get, patch, _ = state["calls"]
    assert get["method"] == "GET" and get["path"] == SCALE_PATH
    assert get["authorization"] == "Bearer recorded-token"
    assert patch["method"] == "PATCH" and patch["path"] == SCALE_PATH
    # a merge patch of spec.replicas alone: nothing else of the Deployment is touched
    assert patch["content_type"].startswith("application/merge-patch+json"), patch
    assert patch["body"] == {"spec": {"replicas": 5}}


async def test_a_refusal_is_an_actuation_error_naming_the_missing_permission(api_server) -> None:
    state, kubeconfig = api_server
    state["forbid"] = True
    act = KubernetesActuator({"sim-model": "inferbus/worker"}, kubeconfig)
    try:
        with pytest.raises(ActuationError, match="cannot patch resource"):
            await act.apply(decision(3))
    finally:
        await act.close()


def test_a_target_must_name_namespace_and_deployment() -> None:
    with pytest.raises(ValueError, match="namespace/deployment"):
        KubernetesActuator({"m": "worker"})


async def test_a_model_without_a_deployment_is_refused() -> None:
    act = KubernetesActuator({"m": "inferbus/worker"})
    with pytest.raises(ActuationError, match="no Deployment"):
        await act.apply(ScaleDecision(model="other", desired=1, previous=0))


def test_the_k8s_manifests_agree_with_the_platform() -> None:
    """The autoscaler's Role grants exactly what its actuator calls, on the Deployment its
    --models names; the KEDA alternative reads the scheduler's real consumer."""
    import yaml

    from inferbus.services.scheduler.service import ACCEPTED_CONSUMER

    root = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
    docs = list(yaml.safe_load_all((root / "base" / "autoscaler.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    (rule,) = role["rules"]
    assert rule == {
        "apiGroups": ["apps"],
        "resources": ["deployments/scale"],
        "resourceNames": ["worker"],
        "verbs": ["get", "patch"],
    }
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "autoscaler"
    args = spec["containers"][0]["args"]
    assert args[args.index("--models") + 1] == "llm=inferbus/worker"
    assert args[args.index("--actuator") + 1] == "kubernetes"
    keda = yaml.safe_load((root / "keda" / "scaledobject.yaml").read_text())
    assert keda["spec"]["scaleTargetRef"]["name"] == "worker"
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "nats-jetstream"
    assert trigger["metadata"]["stream"] == ACCEPTED_CONSUMER.stream
    assert trigger["metadata"]["consumer"] == ACCEPTED_CONSUMER.durable
