"""deploy/k8s against Kubernetes' own schemas: kustomize builds it (kubectl's built-in
kustomize) and every object it renders is valid, strictly (no unknown fields), for the
oldest and newest Kubernetes this project supports. No cluster runs here: this is
what can be checked without one."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inferbus import servicetable
from inferbus.busauth import Registry
from inferbus.cli import main
from inferbus.shared.natsserver import find_binary

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s" / "base"
OVERLAYS = {
    "dev": ROOT / "deploy" / "k8s" / "overlays" / "dev",
    "prod": ROOT / "deploy" / "k8s" / "overlays" / "prod",
}
VERSIONS = ["1.29.0", "1.37.0"]
"""The oldest Kubernetes still in wide use, and the newest the schemas know."""


CLUSTER_SCOPED = ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its built-in kustomize renders the manifests)")
    done = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kustomization", ["base", "dev", "prod"])
def test_every_rendered_object_is_valid_for_kubernetes(kustomization, version):
    objects = kustomize(OVERLAYS.get(kustomization, K8S))
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", "Service", "Role", "PersistentVolumeClaim"} <= kinds
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} is invalid for Kubernetes {version}: {exc.message}")


def test_every_object_lands_in_the_namespace():
    for path in [K8S, *OVERLAYS.values()]:
        for obj in kustomize(path):
            if obj["kind"] not in CLUSTER_SCOPED:
                assert obj["metadata"]["namespace"] == "inferbus", obj["metadata"]["name"]


def _deployment(objects: list[dict], name: str) -> dict:
    (d,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return d


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_dev_worker_serves_the_tiny_model_it_builds_on_cpus():
    objects = kustomize(OVERLAYS["dev"])
    pod = _deployment(objects, "worker")["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert worker["image"] == init["image"] == "inferbus:cpu"
    model = _env(worker)["INFERBUS_MODEL"]
    assert init["args"] == ["model", "make-tiny", model]
    assert worker["args"][worker["args"].index("--engine") + 1] == "vllm"
    assert _env(worker)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert "emptyDir" in models and "persistentVolumeClaim" not in models
    assert not [
        o
        for o in objects
        if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "models"
    ]
    autoscaler = _deployment(objects, "autoscaler")["spec"]["template"]["spec"]["containers"][0]
    served = _env(worker)["INFERBUS_SERVED_MODEL_NAME"]
    assert f"{served}=inferbus/worker" in autoscaler["args"]


def test_every_worker_has_room_in_dev_shm_for_its_engine():
    # measured in compose: vLLM asked 160 MiB of /dev/shm for the tiny model and refused
    # to start on the 64 MiB a container gets by default (a pod gets the same)
    for path in [K8S, *OVERLAYS.values()]:
        pod = _deployment(kustomize(path), "worker")["spec"]["template"]["spec"]
        shm = next(v for v in pod["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "shm")
        assert mount["mountPath"] == "/dev/shm"


def test_prod_gives_each_worker_a_gpu_and_runs_the_gpu_image():
    objects = kustomize(OVERLAYS["prod"])
    worker = _deployment(objects, "worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(":gpu")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    tolerations = worker["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    for obj in objects:  # every container says what it needs
        if obj["kind"] in ("Deployment", "StatefulSet"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                assert c["resources"]["requests"], obj["metadata"]["name"]
    # a PodDisruptionBudget for each service that runs more than one pod
    budgets = {o["metadata"]["name"] for o in objects if o["kind"] == "PodDisruptionBudget"}
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["spec"].get("replicas", 1) > 1:
            assert obj["metadata"]["name"] in budgets, obj["metadata"]["name"]


def test_the_argocd_application_syncs_an_overlay_of_this_repository():
    app = yaml.safe_load((ROOT / "deploy" / "k8s" / "argocd" / "application.yaml").read_text())
    assert app["kind"] == "Application" and app["apiVersion"] == "argoproj.io/v1alpha1"
    source = app["spec"]["source"]
    assert (ROOT / source["path"]).resolve() == OVERLAYS["prod"]
    assert app["spec"]["destination"]["namespace"] == "inferbus"


def test_a_bad_manifest_is_caught():
    (deployment,) = [
        o
        for o in kustomize(K8S)
        if o["metadata"]["name"] == "gateway" and o["kind"] == "Deployment"
    ]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


# -- the closed bus on Kubernetes ------------------------------------------------------


def _secrets(tmp_path: Path, replicas: int = 3) -> dict[str, dict[str, str]]:
    result = CliRunner().invoke(
        main, ["creds", "k8s", str(tmp_path / "auth"), "--nats-replicas", str(replicas)]
    )
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    return {s["metadata"]["name"]: s["stringData"] for s in listing["items"]}


def test_every_pod_mounts_a_secret_creds_k8s_makes(tmp_path):
    made = _secrets(tmp_path)
    objects = kustomize(K8S)
    mounted = set()
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = obj["spec"]["template"]["spec"]
        secrets = {
            v["name"]: v["secret"]["secretName"]
            for v in spec.get("volumes", [])
            if "secret" in v and not v["secret"].get("optional")
        }
        (container,) = spec["containers"]
        if obj["kind"] == "Deployment":  # a service: its own user, nothing else's
            env = {e["name"]: e.get("value") for e in container["env"]}
            user = obj["metadata"]["name"].removeprefix("llmservice-")  # the bus's operator
            assert secrets["bus"] == f"inferbus-bus-{user}"
            mount = next(m for m in container["volumeMounts"] if m["name"] == "bus")
            assert env["INFERBUS_NATS_CREDS"] == mount["mountPath"] + "/creds.json"
        mounted.update(secrets.values())
    assert mounted <= set(made), mounted - set(made)
    assert set(made) == mounted
    for name, data in made.items():
        if name.startswith("inferbus-bus-"):
            creds = json.loads(data["creds.json"])
            assert creds["user"] == f"pods-{name.removeprefix('inferbus-bus-')}" or (
                name == "inferbus-bus-operator" and creds["user"] == "operator"
            )


def test_creds_k8s_keeps_passwords_and_refuses_no_nats(tmp_path):
    first, again = _secrets(tmp_path), _secrets(tmp_path)
    assert first == again
    result = CliRunner().invoke(main, ["creds", "k8s", str(tmp_path / "x"), "--nats-replicas", "0"])
    assert result.exit_code == 2 and "--nats-replicas" in result.output


def test_a_service_user_acts_for_any_of_its_pods(tmp_path):
    _secrets(tmp_path)
    reg = Registry.open(tmp_path / "auth")
    worker = reg.permissions(reg.users["pods-worker"], servicetable.permissions())
    assert "ib.hb.*.*" in worker.publish  # a pod named at run time: worker-7d9f-x2k4q
    assert not [s for s in worker.publish if s.startswith("ib.submit")]
    assert "_INBOX.pods-worker.>" in worker.subscribe


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_nats_nodes_configuration_is_valid_for_nats_server(tmp_path, replicas):
    """The ConfigMap's nats.conf with the Secret's files beside it, as the StatefulSet
    mounts them, passes nats-server's own check (-t)."""
    auth = _secrets(tmp_path, replicas)["inferbus-nats-auth"]
    (config_map,) = [
        o
        for o in kustomize(K8S)
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nats-config"
    ]
    etc = tmp_path / "etc"
    (etc / "auth").mkdir(parents=True)
    (etc / "nats.conf").write_text(
        config_map["data"]["nats.conf"].replace("/data", str(tmp_path / "data"))
    )
    for name, text in auth.items():
        (etc / "auth" / name).write_text(text)
    done = subprocess.run(
        [find_binary(), "-c", str(etc / "nats.conf"), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"POD_NAME": "nats-0"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (statefulset,) = [o for o in kustomize(K8S) if o["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    # the server runs under the store watch (issue 42 item 2), watching its store_dir
    command = container["command"]
    assert command[:3] == ["inferbus", "nats", "run"]
    assert command[command.index("--") + 1 :] == ["nats-server", "-c", "/etc/nats/nats.conf"]
    store = command[command.index("--store-dir") + 1]
    assert f"store_dir: {store}" in config_map["data"]["nats.conf"]
    if replicas > 1:
        assert statefulset["spec"]["replicas"] == replicas
        assert statefulset["spec"]["serviceName"] in auth["cluster.conf"]


def test_a_folder_that_also_served_compose_gives_one_secret_per_service(tmp_path):
    stack = CliRunner().invoke(main, ["creds", "stack", str(tmp_path / "auth")])
    assert stack.exit_code == 0, stack.output
    listing = json.loads(
        CliRunner().invoke(main, ["creds", "k8s", str(tmp_path / "auth")]).output
    )  # svc-gateway (compose's instance) and pods-gateway (the pods') are both there
    names = [s["metadata"]["name"] for s in listing["items"]]
    assert len(names) == len(set(names)) == len(servicetable.names()) + 2
    gateway = json.loads(_secrets(tmp_path)["inferbus-bus-gateway"]["creds.json"])
    assert gateway["user"] == "pods-gateway"
