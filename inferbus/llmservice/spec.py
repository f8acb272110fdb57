"""The ``LLMService`` resource as data: its fields, their limits and how a file or an
API server's object becomes one (a clear error naming the field, or a valid spec)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

GROUP = "inferbus.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMService"
PLURAL = "llmservices"

_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A DNS label: the resource's name makes its Deployment's and ConfigMap's."""
_MODEL = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A subject token and a Prometheus label value: what requests name as ``model``."""
_QUANTITY = r"^(([0-9]+(\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?)?$"
_METRIC = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"

Quantity = Annotated[str, msgspec.Meta(pattern=_QUANTITY)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class _Spec(msgspec.Struct, kw_only=True, frozen=True, rename="camel", forbid_unknown_fields=True):
    pass


class Rollout(_Spec, frozen=True):
    """How a new version reaches the workers (the delivery service's canary)."""

    canary: bool = True
    steps: list[Annotated[float, msgspec.Meta(gt=0, le=100)]] = msgspec.field(
        default_factory=lambda: [1.0, 5.0, 25.0, 50.0, 100.0]
    )
    interval_seconds: Seconds = 300.0
    slo: dict[str, Annotated[float, msgspec.Meta(ge=0)]] = {}
    """Gates on the new version: ttft_p95, itl_p95 (seconds), error_rate, *_ratio."""


class ModelRef(_Spec, frozen=True):
    """The model: the name requests ask for and the registry version to serve."""

    name: Annotated[str, msgspec.Meta(pattern=_MODEL)]
    version: Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")] = ""
    """A version pushed with ``inferbus model push``; empty: the weights at ``path``."""
    path: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._/-]*$")] = ""
    """The workers' model folder under the models volume; empty: the model's name."""
    rollout: Rollout = Rollout()


class Resources(_Spec, frozen=True):
    """What each worker gets."""

    gpus: Annotated[int, msgspec.Meta(ge=0, le=16)] = 0
    cpu: Quantity = ""
    memory: Quantity = ""
    shm: Quantity = "2Gi"
    """/dev/shm: vLLM needs more than a container's 64 MiB."""


class Scaling(_Spec, frozen=True):
    """The autoscaler's bounds and goals for the model's workers."""

    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 1
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 8
    target_utilization: Fraction = 0.8
    ttft_slo_seconds: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    predictive_window_seconds: Annotated[float, msgspec.Meta(ge=10, le=86400)] = 120.0
    forecaster: Literal["", "constant", "holt", "trend", "statsforecast"] = ""


Stage = Literal["ttft", "e2e", "queue", "engine_queue", "prefill", "decode", "inter_token"]


class StageSlo(_Spec, frozen=True):
    """A stage of the request path whose 95th percentile is recorded (and alerted on
    above ``p95Seconds`` when that is set)."""

    name: Stage
    p95_seconds: Seconds = 0.0


class CustomMetric(_Spec, frozen=True):
    """A recording rule: ``expr`` (PromQL, ``$model`` stands for the model's name),
    recorded as ``name`` with the model's label."""

    name: Annotated[str, msgspec.Meta(pattern=_METRIC)]
    expr: Annotated[str, msgspec.Meta(min_length=1)]


class Observability(_Spec, frozen=True):
    stages: list[StageSlo] = []
    custom_metrics: list[CustomMetric] = []


class InputSanitization(_Spec, frozen=True):
    """Injection checks on the prompt: block (400), flag (logged, let through) or off;
    ``default`` keeps the sanitizer's own policy."""

    policy: Literal["default", "block", "flag", "off"] = "default"
    data_policy: Literal["default", "block", "flag", "spotlight", "off"] = "default"
    """For instructions found in data an agent's tools returned; ``spotlight`` delimits
    and marks that data and lets the request run."""


class OutputFiltering(_Spec, frozen=True):
    """PII masking of the model's output stream; an API key's setting still wins."""

    mask_pii: bool = True
    tool_call_policy: Literal["default", "mask", "refuse"] = "default"
    """A tool call whose arguments carry PII the request never gave: ``mask`` it, or
    ``refuse`` it (the request ends ``output_blocked``); ``default`` keeps the
    sanitizer's own. An API key's or tenant's setting still wins."""


class LLMServiceSpec(_Spec, frozen=True):
    """One model served: its version, workers, scaling, checks and observability."""

    model: ModelRef
    resources: Resources = Resources()
    scaling: Scaling = Scaling()
    observability: Observability = Observability()
    input_sanitization: InputSanitization = InputSanitization()
    output_filtering: OutputFiltering = OutputFiltering()


class Metadata(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """What the core reads of an object's metadata (the API server sends more)."""

    name: Annotated[str, msgspec.Meta(pattern=_NAME)]
    namespace: str = ""
    """Empty in a file for ``inferbus apply``; the API server always sets it."""
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = {}


class LLMService(msgspec.Struct, kw_only=True, frozen=True, rename={"api_version": "apiVersion"}):
    api_version: str
    kind: str
    metadata: Metadata
    spec: LLMServiceSpec

    @property
    def key(self) -> str:
        """``namespace/name``, or the name alone outside Kubernetes."""
        m = self.metadata
        return f"{m.namespace}/{m.name}" if m.namespace else m.name


class SpecError(ValueError):
    """A resource that is not a valid LLMService; the message names the field."""


def load(doc: Any) -> LLMService:
    """An LLMService from a parsed document (a file's, or the API server's object)."""
    if not isinstance(doc, dict):
        raise SpecError("an LLMService is a mapping with apiVersion, kind, metadata and spec")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise SpecError(
            f"not an LLMService: apiVersion {doc.get('apiVersion')!r}, kind "
            f"{doc.get('kind')!r} (expected {API_VERSION}, {KIND})"
        )
    try:
        svc = msgspec.convert(doc, LLMService, str_keys=True)
    except msgspec.ValidationError as exc:
        raise SpecError(f"LLMService: {exc}") from None
    s = svc.spec.scaling
    if s.min_replicas > s.max_replicas:
        raise SpecError(
            f"LLMService {svc.key}: scaling.minReplicas ({s.min_replicas}) is above "
            f"maxReplicas ({s.max_replicas})"
        )
    names = [m.name for m in svc.spec.observability.custom_metrics]
    if len(set(names)) != len(names):
        raise SpecError(f"LLMService {svc.key}: observability.customMetrics repeats a name")
    return svc


def load_file(path: Path) -> list[LLMService]:
    """Every LLMService in a YAML or JSON file (``---``-separated documents)."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML: {exc}") from None
    if not docs:
        raise SpecError(f"{path}: no LLMService in it")
    return [load(d) for d in docs]
