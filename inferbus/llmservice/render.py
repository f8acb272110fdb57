"""The LLMService's pure core: a spec and what was observed in, what should exist and
the status out. No I/O; time is passed in. The operator (inferbus/operator) and
``inferbus apply`` are its adapters."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from inferbus.contracts import DeployRequest, LLMServiceSettings, ScalingSettings, WorkerHeartbeat

from .spec import API_VERSION, KIND, LLMService

# -- what the services follow ------------------------------------------------------


def service_settings(
    svc: LLMService, *, scale_target: str, set_by: str, now: float
) -> LLMServiceSettings:
    """The record the autoscaler and the sanitizer follow for the model.
    ``scale_target``: what runs its workers (empty: the autoscaler leaves it alone)."""
    spec = svc.spec
    s = spec.scaling
    policy = spec.input_sanitization.policy
    data_policy = spec.input_sanitization.data_policy
    return LLMServiceSettings(
        service=svc.key,
        model=spec.model.name,
        version=spec.model.version,
        scaling=ScalingSettings(
            min_replicas=s.min_replicas,
            max_replicas=s.max_replicas,
            target_utilization=s.target_utilization,
            ttft_slo_s=s.ttft_slo_seconds,
            predictive_window_s=s.predictive_window_seconds,
            forecaster=s.forecaster,
        )
        if scale_target
        else None,
        scale_target=scale_target,
        input_policy="" if policy == "default" else policy,
        data_policy="" if data_policy == "default" else data_policy,
        mask_output_pii=spec.output_filtering.mask_pii,
        tool_call_policy=""
        if spec.output_filtering.tool_call_policy == "default"
        else spec.output_filtering.tool_call_policy,
        generation=svc.metadata.generation,
        set_by=set_by,
        set_at=now,
    )


def conflict(svc: LLMService, existing: LLMServiceSettings | None) -> str:
    """Why ``svc`` may not take its model (another LLMService serves it), or ""."""
    if existing is None or existing.removed or owns(svc, existing):
        return ""
    return (
        f"model {svc.spec.model.name!r} is served by LLMService {existing.service!r}; "
        "delete that one first"
    )


def owns(svc: LLMService, existing: LLMServiceSettings | None) -> bool:
    """The model's live record is this LLMService's (so deleting it withdraws it)."""
    return existing is not None and not existing.removed and existing.service == svc.key


def removed_settings(model: str, service: str, *, set_by: str, now: float) -> LLMServiceSettings:
    return LLMServiceSettings(service=service, model=model, removed=True, set_by=set_by, set_at=now)


# -- rollouts ----------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryView:
    """What the delivery service says of the model."""

    current: str = ""
    """The registry's current version (empty: the workers' own model)."""
    last_action: str = ""
    """The model's last rollout decision: start, place, step, hold, promote, rollback,
    done, failed; empty: none."""
    last_version: str = ""
    last_reason: str = ""
    last_at: float = 0.0

    @property
    def rolling_out(self) -> bool:
        return self.last_action in ("start", "place", "step", "hold", "promote")

    @property
    def rolled_back(self) -> bool:
        return self.last_action in ("rollback", "failed")


def deploy_request(
    svc: LLMService, delivery: DeliveryView, asked: str, *, set_by: str, now: float
) -> DeployRequest | None:
    """A rollout to ask for, if the spec's version is not served, not on its way, and
    not asked for already at this generation (``asked`` is ``<generation>:<version>``
    of the last request; a rolled-back version is asked again only when the spec
    changes)."""
    version = svc.spec.model.version
    if not version or delivery.current == version:
        return None
    if delivery.rolling_out and delivery.last_version == version:
        return None
    if asked == ask_key(svc):
        return None
    r = svc.spec.model.rollout
    return DeployRequest(
        model=svc.spec.model.name,
        version=version,
        steps=list(r.steps),
        interval_s=r.interval_seconds,
        slo=dict(r.slo),
        canary=r.canary,
        requested_by=set_by,
        requested_at=now,
    )


def ask_key(svc: LLMService) -> str:
    return f"{svc.metadata.generation}:{svc.spec.model.version}"


def asked_by_record(svc: LLMService, existing: LLMServiceSettings | None) -> str:
    """Where no status remembers the last rollout asked for (``inferbus apply``): it
    was asked when the live record with this version went out. So a rolled-back version
    is asked again by ``inferbus model deploy``, not by applying the same file."""
    if owns(svc, existing) and existing is not None and existing.version == svc.spec.model.version:
        return ask_key(svc)
    return ""


# -- Kubernetes objects ------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """How the platform runs on the cluster (the operator's settings)."""

    image: str = "inferbus"
    models_claim: str = "models"
    """The ReadOnlyMany volume with the models' folders, mounted at /models."""
    kv_spill_claim: str = "kv-spill-shared"
    autoscaler_account: str = "autoscaler"
    """The autoscaler's service account: each worker Deployment's scale is granted it."""
    gpu_resource: str = "nvidia.com/gpu"


def worker_name(svc: LLMService) -> str:
    return f"llm-{svc.metadata.name}"


def rules_name(svc: LLMService) -> str:
    return f"llm-{svc.metadata.name}-rules"


def _labels(svc: LLMService) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "inferbus",
        "app.kubernetes.io/component": "llmservice-worker",
        "app.kubernetes.io/managed-by": "inferbus-operator",
        "inferbus.io/llmservice": svc.metadata.name,
    }


def _owned(svc: LLMService, kind: str, api_version: str, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": svc.metadata.namespace or "default",
        "labels": _labels(svc),
    }
    if svc.metadata.uid:  # deleted with the LLMService (Kubernetes' garbage collector)
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": svc.metadata.name,
                "uid": svc.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def scale_access(svc: LLMService, autoscaler_account: str) -> list[dict[str, Any]]:
    """A Role that lets the autoscaler's service account resize this worker Deployment
    and nothing else, and its binding."""
    name = f"{worker_name(svc)}-scale"
    role = _owned(svc, "Role", "rbac.authorization.k8s.io/v1", name)
    role["rules"] = [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": [worker_name(svc)],
            "verbs": ["get", "patch"],
        }
    ]
    binding = _owned(svc, "RoleBinding", "rbac.authorization.k8s.io/v1", name)
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    binding["subjects"] = [{"kind": "ServiceAccount", "name": autoscaler_account}]
    return [role, binding]


def replicas(svc: LLMService, live: int | None) -> int:
    """The Deployment's replicas: the autoscaler owns them once it runs (``live``),
    kept within the spec's bounds; ``minReplicas`` to begin with."""
    s = svc.spec.scaling
    return s.min_replicas if live is None else max(s.min_replicas, min(s.max_replicas, live))


def worker_deployment(svc: LLMService, cluster: Cluster, live: int | None) -> dict[str, Any]:
    spec = svc.spec
    res = spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpus:
        requests[cluster.gpu_resource] = limits[cluster.gpu_resource] = str(res.gpus)
    model_dir = f"/models/{spec.model.path or spec.model.name}"
    env = [
        {"name": "NATS_URL", "value": "nats://nats:4222"},
        {"name": "INFERBUS_HTTP_HOST", "value": "0.0.0.0"},
        {"name": "INFERBUS_HTTP_PORT", "value": "9100"},
        {"name": "INFERBUS_MODEL", "value": model_dir},
        {"name": "INFERBUS_SERVED_MODEL_NAME", "value": spec.model.name},
        {"name": "INFERBUS_NATS_CREDS", "value": "/var/run/inferbus/bus/creds.json"},
        {"name": "INFERBUS_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "INFERBUS_TRUSTED_KEYS", "value": "/etc/inferbus/trusted-keys"},
        {"name": "INFERBUS_MODEL_CACHE_DIR", "value": "/var/cache/inferbus/models"},
        {"name": "INFERBUS_KV_SPILL_SHARED_DIR", "value": "/var/lib/inferbus/kv-spill"},
    ]
    container: dict[str, Any] = {
        "name": "worker",
        "image": cluster.image,
        "args": ["serve", "worker", "--engine", "vllm", "--state-dir", "/var/lib/inferbus/state"],
        "envFrom": [{"configMapRef": {"name": "inferbus-telemetry", "optional": True}}],
        "env": env,
        "ports": [{"name": "http", "containerPort": 9100}],
        "volumeMounts": [
            {"name": "bus", "mountPath": "/var/run/inferbus/bus", "readOnly": True},
            {"name": "trusted-keys", "mountPath": "/etc/inferbus/trusted-keys", "readOnly": True},
            {"name": "model-cache", "mountPath": "/var/cache/inferbus/models"},
            {"name": "kv-spill", "mountPath": "/var/lib/inferbus/kv-spill"},
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "state", "mountPath": "/var/lib/inferbus/state"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 120,
        },
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
    }
    if requests or limits:
        container["resources"] = {
            k: v for k, v in (("requests", requests), ("limits", limits)) if v
        }
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": 40,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
        },
        "containers": [container],
        "volumes": [
            {"name": "bus", "secret": {"secretName": "inferbus-bus-worker"}},
            {
                "name": "trusted-keys",
                "secret": {"secretName": "model-signing-keys", "optional": True},
            },
            {"name": "model-cache", "emptyDir": {}},
            {
                "name": "kv-spill",
                "persistentVolumeClaim": {"claimName": cluster.kv_spill_claim},
            },
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": cluster.models_claim, "readOnly": True},
            },
            {"name": "state", "emptyDir": {"sizeLimit": "20Gi"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm}},
        ],
    }
    if res.gpus:
        pod["tolerations"] = [
            {"key": cluster.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}
        ]
    obj = _owned(svc, "Deployment", "apps/v1", worker_name(svc))
    selector = {"inferbus.io/llmservice": svc.metadata.name}
    obj["spec"] = {
        "replicas": replicas(svc, live),
        "selector": {"matchLabels": selector},
        "template": {
            "metadata": {
                "labels": _labels(svc),
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": "9100",
                    "prometheus.io/path": "/metrics",
                },
            },
            "spec": pod,
        },
    }
    return obj


_STAGE_METRICS = {
    "ttft": ("inferbus_time_to_first_token_seconds", 'service="gateway",'),
    "e2e": ("inferbus_request_duration_seconds", 'service="gateway",'),
    "queue": ("inferbus_queue_time_seconds", ""),
    "engine_queue": ("inferbus_engine_queue_time_seconds", ""),
    "prefill": ("inferbus_prefill_time_seconds", ""),
    "decode": ("inferbus_decode_time_seconds", ""),
    "inter_token": ("inferbus_inter_token_latency_seconds", ""),
}


def prometheus_rules(svc: LLMService) -> dict[str, Any] | None:
    """The spec's stages and custom metrics as a Prometheus rule file (recording rules
    with the model's label; an alert per stage with a p95 goal); None when it asks for
    none."""
    obs = svc.spec.observability
    if not obs.stages and not obs.custom_metrics:
        return None
    model = svc.spec.model.name
    rules: list[dict[str, Any]] = []
    for stage in obs.stages:
        metric, extra = _STAGE_METRICS[stage.name]
        rules.append(
            {
                "record": "inferbus:stage_p95_seconds",
                "expr": f"histogram_quantile(0.95, sum by (le) (rate({metric}_bucket"
                f'{{{extra}model="{model}"}}[5m])))',
                "labels": {"model": model, "stage": stage.name},
            }
        )
        if stage.p95_seconds > 0:
            rules.append(
                {
                    "alert": "InferbusStageSlow",
                    "expr": f'inferbus:stage_p95_seconds{{model="{model}",stage="{stage.name}"}}'
                    f" > {stage.p95_seconds:g}",
                    "for": "5m",
                    "labels": {"severity": "warning", "llmservice": svc.metadata.name},
                    "annotations": {
                        "summary": f"{model}: {stage.name} p95 is above its "
                        f"{stage.p95_seconds:g} s goal",
                    },
                }
            )
    for m in obs.custom_metrics:
        rules.append(
            {"record": m.name, "expr": m.expr.replace("$model", model), "labels": {"model": model}}
        )
    return {"groups": [{"name": f"llmservice-{svc.metadata.name}", "rules": rules}]}


def rules_text(svc: LLMService) -> str | None:
    """The rule file's text; None when the spec asks for no rule."""
    rules = prometheus_rules(svc)
    return None if rules is None else yaml.safe_dump(rules, sort_keys=False)


def rules_configmap(svc: LLMService, rules_yaml: str) -> dict[str, Any]:
    """The rule file in a ConfigMap labelled for Prometheus' rule loaders."""
    obj = _owned(svc, "ConfigMap", "v1", rules_name(svc))
    obj["metadata"]["labels"]["inferbus.io/prometheus-rules"] = "true"
    obj["data"] = {f"{svc.metadata.name}.rules.yml": rules_yaml}
    return obj


# -- status ------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentView:
    """What the API server says of the worker Deployment."""

    exists: bool = False
    replicas: int = 0
    ready: int = 0
    generation: int = 0
    observed_generation: int = 0
    progress_deadline_exceeded: bool = False

    @classmethod
    def from_heartbeats(cls, beats: Iterable[WorkerHeartbeat], model: str) -> DeploymentView:
        """Outside Kubernetes: the workers heard serving ``model`` (ready ones count)."""
        heard = list(beats)
        serving = [hb for hb in heard if model in hb.models]
        return cls(
            exists=bool(heard),
            replicas=len(serving),
            ready=sum(1 for hb in serving if hb.state == "ready"),
        )

    @classmethod
    def of(cls, obj: dict[str, Any] | None) -> DeploymentView:
        if obj is None:
            return cls()
        status = obj.get("status") or {}
        conditions = status.get("conditions") or []
        return cls(
            exists=True,
            replicas=int((obj.get("spec") or {}).get("replicas", 1)),
            ready=int(status.get("readyReplicas") or 0),
            generation=int(obj.get("metadata", {}).get("generation") or 0),
            observed_generation=int(status.get("observedGeneration") or 0),
            progress_deadline_exceeded=any(
                c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
                for c in conditions
            ),
        )


ROLLBACK_SETTLE_S = 120.0
"""A rollback reads as RollingBack this long (the workers reload the old version),
then as Degraded until the spec names another version."""

PHASES = ("Provisioning", "Ready", "Degraded", "RollingBack")


@dataclass(frozen=True)
class Status:
    phase: str
    reason: str
    message: str


def status(
    svc: LLMService, workers: DeploymentView, delivery: DeliveryView, previous: str, now: float
) -> Status:
    """The phase: Provisioning until it first serves, Ready, Degraded when it served
    and no longer does (or its workers cannot roll out), RollingBack while delivery takes
    the spec's version back."""
    version = svc.spec.model.version
    if version and delivery.rolled_back and delivery.last_version == version:
        if delivery.current != version:
            why = f"{svc.spec.model.name}@{version} was rolled back: {delivery.last_reason}"
            if now - delivery.last_at < ROLLBACK_SETTLE_S:
                return Status("RollingBack", "VersionRolledBack", why)
            return Status(
                "Degraded", "VersionRolledBack", why + "; name another version to try again"
            )
    needed = max(1, svc.spec.scaling.min_replicas)
    # scaled to zero by the autoscaler (minReplicas 0) is serving: a request waits for
    # the worker it starts
    scaled_to_zero = workers.exists and workers.replicas == 0 and svc.spec.scaling.min_replicas == 0
    serving = workers.ready >= needed or scaled_to_zero
    if workers.progress_deadline_exceeded:
        return Status(
            "Degraded",
            "ProgressDeadlineExceeded",
            f"workers cannot roll out: {workers.ready}/{workers.replicas} ready",
        )
    if not serving:
        why = (
            "its workers are not created yet"
            if not workers.exists
            else f"{workers.ready} of {needed} workers ready"
        )
        if previous in ("Ready", "Degraded"):
            return Status("Degraded", "WorkersUnavailable", why)
        return Status("Provisioning", "WorkersStarting", why)
    if version and delivery.current != version:
        if delivery.rolling_out and delivery.last_version == version:
            return Status(
                "Provisioning",
                "RollingOut",
                f"{version}: {delivery.last_action} ({delivery.last_reason})",
            )
        return Status(
            "Provisioning",
            "VersionRequested",
            f"{version} asked of the delivery service; serving "
            f"{delivery.current or 'the model its workers started with'}",
        )
    if workers.exists and workers.observed_generation < workers.generation:
        return Status("Provisioning", "WorkersUpdating", "the workers' new spec is rolling out")
    return Status(
        "Ready", "Serving", f"{workers.ready} workers ready" if workers.exists else "served"
    )


def status_fields(
    st: Status, previous: dict[str, Any], generation: int, now: float
) -> dict[str, Any]:
    """The LLMService's status fields for ``st``, with a Ready condition that keeps its
    transition time while its truth holds."""
    ready = "True" if st.phase == "Ready" else "False"
    before = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == ready and before.get("lastTransitionTime")
        else datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    return {
        "phase": st.phase,
        "reason": st.reason,
        "message": st.message,
        "observedGeneration": generation,
        "conditions": [
            {
                "type": "Ready",
                "status": ready,
                "reason": st.reason,
                "message": st.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        ],
    }
