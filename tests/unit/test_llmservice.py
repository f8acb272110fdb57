"""The LLMService: its spec (what a file or the API server gives; bad ones named), the
pure core (settings, objects, rollouts, status phases) and its CRD, checked against
Kubernetes' schemas. No cluster runs here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest
import yaml
from click.testing import CliRunner

from inferbus.cli import main
from inferbus.llmservice import render
from inferbus.llmservice.crd import crd
from inferbus.llmservice.render import DeliveryView, DeploymentView
from inferbus.llmservice.spec import SpecError, load, load_file

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "k8s" / "examples" / "llmservice.yaml"
CRD_FILE = ROOT / "deploy" / "k8s" / "base" / "llmservice-crd.yaml"
VERSIONS = ["1.29.0", "1.37.0"]


def doc(**spec) -> dict:
    base = {"model": {"name": "chat-model", "version": "2"}}
    return {
        "apiVersion": "inferbus.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1", "generation": 3},
        "spec": {**base, **spec},
    }


def svc(**spec):
    return load(doc(**spec))


# -- the spec -----------------------------------------------------------------------


def test_the_example_loads_with_every_field_the_issue_names():
    (s,) = load_file(EXAMPLE)
    assert s.spec.model.name == "tiny-llama"
    assert (s.spec.scaling.min_replicas, s.spec.scaling.max_replicas) == (1, 4)
    assert s.spec.scaling.predictive_window_seconds == 120
    assert [st.name for st in s.spec.observability.stages] == ["ttft", "queue", "prefill", "decode"]
    assert s.spec.observability.custom_metrics[0].name.startswith("inferbus:")
    assert s.spec.input_sanitization.policy == "block"
    assert s.spec.output_filtering.mask_pii is True
    assert s.key == "chat"  # no namespace in a file: the name alone


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas (5) is above"),
        ({"scaling": {"maxReplicass": 2}}, "unknown field `maxReplicass`"),
        ({"resources": {"memory": "lots"}}, "$.spec.resources.memory"),
        ({"scaling": {"targetUtilization": 0}}, "$.spec.scaling.targetUtilization"),
        ({"inputSanitization": {"policy": "ignore"}}, "$.spec.inputSanitization.policy"),
        ({"observability": {"stages": [{"name": "warp"}]}}, "$.spec.observability.stages[0].name"),
        ({"model": {"name": "a b"}}, "$.spec.model.name"),
        (
            {
                "observability": {
                    "customMetrics": [{"name": "x", "expr": "1"}, {"name": "x", "expr": "2"}]
                }
            },
            "repeats a name",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_its_field(change, named):
    with pytest.raises(SpecError) as err:
        svc(**change)
    assert named in str(err.value)


def test_not_an_llmservice_is_refused(tmp_path):
    with pytest.raises(SpecError, match="not an LLMService"):
        load({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}})
    (tmp_path / "bad.yaml").write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="not YAML"):
        load_file(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(SpecError, match="no LLMService"):
        load_file(tmp_path / "empty.yaml")


# -- the CRD ------------------------------------------------------------------------


def test_the_crd_file_is_the_one_the_spec_makes():
    assert yaml.safe_load(CRD_FILE.read_text()) == crd(), (
        "run: inferbus llmservice crd > deploy/k8s/base/llmservice-crd.yaml (keep its comment)"
    )


def _json_schema(node):
    """OpenAPI 3.0 (Kubernetes') → JSON Schema, to check objects as the API server does."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k not in ("nullable",)}
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if node.get("type") == "object" and "properties" in node:
        out["additionalProperties"] = False  # the API server prunes; strict here
    return out


def crd_validator():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = _json_schema(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_crd_is_valid_for_kubernetes(version):
    kubernetes_validate.validate(crd(), version, strict=True)


def test_the_crd_schema_takes_the_example_and_refuses_what_load_refuses():
    v = crd_validator()
    v.validate(yaml.safe_load(EXAMPLE.read_text()))
    for change in (
        {"scaling": {"maxReplicass": 2}},
        {"resources": {"memory": "lots"}},
        {"inputSanitization": {"policy": "ignore"}},
        {"scaling": {"targetUtilization": 0}},
    ):
        assert list(v.iter_errors(doc(**change))), change
    # the defaults it declares are what the Structs default to
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["scaling"]["properties"]["minReplicas"]["default"] == 1
    for name, prop in spec["properties"]["resources"]["properties"].items():
        if "default" in prop and "pattern" in prop:  # the API server refuses a bad default
            v2 = jsonschema.Draft202012Validator(_json_schema(prop))
            assert v2.is_valid(prop["default"]), name


# -- the core -----------------------------------------------------------------------


def test_settings_carry_the_scaling_and_checks_for_the_services():
    s = svc(
        scaling={
            "minReplicas": 2,
            "maxReplicas": 6,
            "targetUtilization": 0.6,
            "predictiveWindowSeconds": 300,
            "forecaster": "holt",
        },
        inputSanitization={"policy": "flag"},
        outputFiltering={"maskPii": False, "toolCallPolicy": "refuse"},
    )
    out = render.service_settings(s, scale_target="ml/llm-chat", set_by="t", now=5.0)
    assert out.service == "ml/chat" and out.model == "chat-model" and out.version == "2"
    assert out.scaling is not None
    assert (out.scaling.min_replicas, out.scaling.max_replicas) == (2, 6)
    assert (out.scaling.predictive_window_s, out.scaling.forecaster) == (300, "holt")
    assert (out.input_policy, out.mask_output_pii, out.generation) == ("flag", False, 3)
    default = render.service_settings(svc(), scale_target="", set_by="t", now=5.0)
    assert out.tool_call_policy == "refuse"
    assert default.scaling is None and default.input_policy == ""  # the services' own
    assert default.tool_call_policy == ""


def test_the_worker_deployment_gets_its_model_resources_and_gpus():
    s = svc(
        model={"name": "chat-model", "path": "llama/8b"},
        resources={"gpus": 2, "cpu": "8", "memory": "64Gi", "shm": "8Gi"},
    )
    d = render.worker_deployment(s, render.Cluster(image="reg/inferbus:gpu"), None)
    pod = d["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["INFERBUS_MODEL"] == "/models/llama/8b"
    assert env["INFERBUS_SERVED_MODEL_NAME"] == "chat-model"
    assert c["image"] == "reg/inferbus:gpu"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["requests"]["cpu"] == "8"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {v["name"]: v for v in pod["volumes"]}["shm"]["emptyDir"]["sizeLimit"] == "8Gi"
    owner = d["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("LLMService", "u-1", True)
    # its own selector: the base's worker Deployment never adopts its pods
    assert d["spec"]["selector"]["matchLabels"] == {"inferbus.io/llmservice": "chat"}
    assert d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] != "worker"


def test_replicas_start_at_the_minimum_and_the_autoscalers_are_kept_within_bounds():
    s = svc(scaling={"minReplicas": 2, "maxReplicas": 5})
    assert render.replicas(s, None) == 2
    assert render.replicas(s, 4) == 4  # the autoscaler's
    assert render.replicas(s, 9) == 5 and render.replicas(s, 0) == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_the_core_renders_is_valid_for_kubernetes(version):
    (s,) = load_file(EXAMPLE)
    s = msgspec.structs.replace(
        s, metadata=msgspec.structs.replace(s.metadata, namespace="inferbus", uid="0b6c")
    )
    objects = [
        render.worker_deployment(s, render.Cluster(), 3),
        *render.scale_access(s, "autoscaler"),
        render.rules_configmap(s, yaml.safe_dump(render.prometheus_rules(s))),
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    role, binding = objects[1:3]
    assert role["rules"][0]["resourceNames"] == ["llm-chat"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "autoscaler"}]


def test_the_rule_file_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool here (.ci/run installs it)")
    (s,) = load_file(EXAMPLE)
    rules = render.prometheus_rules(s)
    assert rules is not None
    path = tmp_path / "chat.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = path.read_text()
    assert (
        'inferbus_time_to_first_token_seconds_bucket{service="gateway",model="tiny-llama"}' in text
    )
    assert 'model="tiny-llama",phase="decode"' in text  # $model filled in
    alerts = [r for r in rules["groups"][0]["rules"] if "alert" in r]
    assert len(alerts) == 2  # the two stages with a p95 goal
    assert render.prometheus_rules(svc()) is None


def test_a_rollout_is_asked_once_per_generation_and_never_over_one_underway():
    s = svc()  # version 2, generation 3
    none = DeliveryView(current="1")
    req = render.deploy_request(s, none, "", set_by="t", now=1.0)
    assert req is not None and (req.model, req.version) == ("chat-model", "2")
    assert req.steps == [1.0, 5.0, 25.0, 50.0, 100.0] and req.canary
    assert render.deploy_request(s, none, render.ask_key(s), set_by="t", now=1.0) is None
    underway = DeliveryView(current="1", last_action="step", last_version="2")
    assert render.deploy_request(s, underway, "", set_by="t", now=1.0) is None
    assert render.deploy_request(s, DeliveryView(current="2"), "", set_by="t", now=1.0) is None
    # rolled back at this generation: not asked again until the spec changes
    back = DeliveryView(current="1", last_action="rollback", last_version="2")
    assert render.deploy_request(s, back, "3:2", set_by="t", now=1.0) is None
    assert render.deploy_request(s, back, "2:2", set_by="t", now=1.0) is not None
    assert render.deploy_request(svc(model={"name": "m"}), none, "", set_by="t", now=1) is None


READY = DeploymentView(exists=True, replicas=2, ready=2, generation=1, observed_generation=1)


@pytest.mark.parametrize(
    ("workers", "delivery", "previous", "now", "phase", "reason"),
    [
        (DeploymentView(), DeliveryView(current="2"), "", 0, "Provisioning", "WorkersStarting"),
        (
            DeploymentView(exists=True, replicas=1),
            DeliveryView(current="2"),
            "",
            0,
            "Provisioning",
            "WorkersStarting",
        ),
        (READY, DeliveryView(current="2"), "Provisioning", 0, "Ready", "Serving"),
        (READY, DeliveryView(current="1"), "", 0, "Provisioning", "VersionRequested"),
        (
            READY,
            DeliveryView(current="1", last_action="step", last_version="2"),
            "Ready",
            0,
            "Provisioning",
            "RollingOut",
        ),
        (
            DeploymentView(exists=True, replicas=2, ready=0),
            DeliveryView(current="2"),
            "Ready",
            0,
            "Degraded",
            "WorkersUnavailable",
        ),
        (
            DeploymentView(exists=True, replicas=2, ready=1, progress_deadline_exceeded=True),
            DeliveryView(current="2"),
            "Provisioning",
            0,
            "Degraded",
            "ProgressDeadlineExceeded",
        ),
        (
            READY,
            DeliveryView(current="1", last_action="rollback", last_version="2", last_at=100.0),
            "Ready",
            150.0,
            "RollingBack",
            "VersionRolledBack",
        ),
        (
            READY,
            DeliveryView(current="1", last_action="failed", last_version="2", last_at=100.0),
            "RollingBack",
            400.0,
            "Degraded",
            "VersionRolledBack",
        ),
        (
            DeploymentView(exists=True, replicas=2, ready=2, generation=2, observed_generation=1),
            DeliveryView(current="2"),
            "Ready",
            0,
            "Provisioning",
            "WorkersUpdating",
        ),
    ],
)
def test_status_phases(workers, delivery, previous, now, phase, reason):
    st = render.status(svc(), workers, delivery, previous, now)
    assert (st.phase, st.reason) == (phase, reason), st.message
    assert st.phase in render.PHASES


def test_a_model_served_by_another_llmservice_is_refused():
    s = svc()
    mine = render.service_settings(s, scale_target="", set_by="t", now=1)
    theirs = msgspec.structs.replace(mine, service="ml/other")
    assert render.conflict(s, None) == "" and render.conflict(s, mine) == ""
    assert "ml/other" in render.conflict(s, theirs)
    assert render.conflict(s, msgspec.structs.replace(theirs, removed=True)) == ""


# -- the CLI without a bus ----------------------------------------------------------


def test_render_prints_valid_objects_and_apply_refuses_a_bad_file(tmp_path):
    runner = CliRunner()
    done = runner.invoke(main, ["llmservice", "render", "-f", str(EXAMPLE), "--image", "x:1"])
    assert done.exit_code == 0, done.output
    kinds = [o["kind"] for o in yaml.safe_load_all(done.output)]
    assert kinds == ["Deployment", "Role", "RoleBinding", "ConfigMap"]
    dry = runner.invoke(main, ["apply", "-f", str(EXAMPLE), "--dry-run"])
    assert dry.exit_code == 0 and '"model": "tiny-llama"' in dry.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("maxReplicas: 4", "maxReplicas: 0"))
    done = runner.invoke(main, ["apply", "-f", str(bad), "--nats-url", "nats://127.0.0.1:1"])
    assert done.exit_code == 1 and "$.spec.scaling.maxReplicas" in done.output


def test_the_rendered_worker_keeps_in_step_with_the_base_worker():
    """The operator's worker is written in code, the base's in YAML: what a worker needs
    (its variables, volumes, mounts and probes) must not drift apart."""
    base = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy/k8s/base/worker.yaml").read_text())
        if d["kind"] == "Deployment"
    )
    mine = render.worker_deployment(svc(), render.Cluster(), None)
    b, m = (d["spec"]["template"]["spec"] for d in (base, mine))
    (bc,), (mc,) = b["containers"], m["containers"]
    assert [e["name"] for e in mc["env"]] == [e["name"] for e in bc["env"]]
    assert mc["volumeMounts"] == bc["volumeMounts"] and mc["args"] == bc["args"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert mc[probe] == bc[probe]
    assert [v["name"] for v in m["volumes"]] == [v["name"] for v in b["volumes"]]
    assert m["securityContext"] == b["securityContext"]
