"""deploy/k8s against Kubernetes' own schemas: kustomize builds it (kubectl's built-in
kustomize) and every object it renders is valid, strictly (no unknown fields), for the
oldest and newest Kubernetes this project supports. No cluster runs here: this is
what can be checked without one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
VERSIONS = ["1.29.0", "1.37.0"]
"""The oldest Kubernetes still in wide use, and the newest the schemas know."""


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its built-in kustomize renders the manifests)")
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_for_kubernetes(version):
    objects = kustomize(K8S)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", "Service", "Role", "PersistentVolumeClaim"} <= kinds
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} is invalid for Kubernetes {version}: {exc.message}")


def test_every_object_lands_in_the_namespace():
    for obj in kustomize(K8S):
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "inferbus", obj["metadata"]["name"]


def test_a_bad_manifest_is_caught():
    (deployment,) = [o for o in kustomize(K8S) if o["metadata"]["name"] == "gateway"
                     and o["kind"] == "Deployment"]  # fmt: skip
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
