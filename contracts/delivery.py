"""Model delivery: the registry's records, delivery events, rollouts and their audit trail.

A model version is ``name@version``. The registry (JetStream KV bucket ``ib-models``)
keeps each version's manifest under ``v.<name>.<version>`` and the version a name
serves now under ``current.<name>``; small artifacts live in the JetStream Object
Store ``ib-models``, large ones on a volume every worker mounts (``store="path"``).

Workers serve the current version as ``name`` and every version they hold as
``name@version``: a canary (``CanaryWeights``) sends a share of ``name``'s requests
to ``name@<new>``, and each request's end names the version that served it
(``served_model``), which is what a rollout compares.
"""

from __future__ import annotations

import msgspec

from .events import Event

__all__ = [
    "DELIVERY_EVENTS",
    "DeployRequest",
    "ModelCurrent",
    "ModelDelivery",
    "ModelFile",
    "ModelResidency",
    "ModelSwapped",
    "ModelVersion",
    "ResidencyWindow",
    "RollbackRequest",
    "RolloutDecision",
    "VersionOutcomes",
    "split_versioned",
    "versioned_name",
]


def versioned_name(name: str, version: str) -> str:
    return f"{name}@{version}"


def split_versioned(served: str) -> tuple[str, str]:
    """``name@version`` → (name, version); a plain name → (name, "")."""
    name, _, version = served.partition("@")
    return name, version


class ModelFile(msgspec.Struct, kw_only=True, frozen=True):
    path: str
    """Relative to the version's folder, ``/``-separated."""
    size: int
    sha256: str


class ModelVersion(Event, tag="model.version"):
    """One pushed version's manifest (``inferbus model push``)."""

    name: str
    version: str
    kind: str = "model"
    """``model`` (full weights) or ``adapter`` (a LoRA adapter on ``base_model``)."""
    files: list[ModelFile] = []
    size_bytes: int = 0
    architecture: str = ""
    """The config's ``architectures[0]`` (``LlamaForCausalLM``)."""
    shape: str = ""
    """A fingerprint of the config's tensor shapes: two versions with the same shape
    (and quantization) swap in place (warm); otherwise a new engine starts (cold)."""
    quantization: str = ""
    """``awq-4bit-g128`` and the like; empty: unquantized."""
    base_model: str = ""
    """Adapters: the model name they apply to."""
    store: str = "object"
    """``object``: files in the JetStream Object Store ``ib-models`` under
    ``<name>/<version>/``; ``path``: files in ``location``, a folder on a volume every
    worker mounts (large models: the Object Store moves them in 128 KiB chunks through
    the bus, a shared volume at disk speed)."""
    location: str = ""
    signature: str = "model.sig"
    """The OpenSSF model-signing bundle, stored beside the files (not among them)."""
    pushed_at: float = 0.0
    pushed_by: str = ""

    @property
    def ref(self) -> str:
        return versioned_name(self.name, self.version)


class ModelCurrent(Event, tag="model.current"):
    """The version ``name`` serves now (registry key ``current.<name>``)."""

    name: str
    version: str
    previous: str = ""
    reason: str = ""
    set_at: float = 0.0


class ModelDelivery(Event, tag="model.delivery"):
    """Workers: load this version (``ib.delivery.load.<name>``, JetStream).

    ``role`` ``current``: serve it as ``name`` and ``name@version``; ``candidate``:
    as ``name@version`` only (a canary: the scheduler sends it only the share the
    canary weights give). ``workers`` empty: every worker serving ``name`` (or, for an
    adapter, its base model) takes it; otherwise only those named."""

    delivery_id: str
    model: ModelVersion
    role: str = "current"
    workers: list[str] = []
    reason: str = ""
    issued_at: float = 0.0


class ModelSwapped(Event, tag="model.swapped"):
    """A worker's answer to a delivery (``ib.delivery.swapped.<worker>``): loaded, or
    refused and still serving what it had (``code``: ``signature``, ``fetch``,
    ``engine``, ``incompatible``)."""

    delivery_id: str
    worker_id: str
    model: str
    """``name@version``."""
    role: str = "current"
    ok: bool = True
    mode: str = ""
    """``hot`` (an adapter loaded in the running engine), ``warm`` (new weights in
    place), ``cold`` (a new engine), ``none`` (already served)."""
    code: str = ""
    reason: str = ""
    fetch_s: float = 0.0
    verify_s: float = 0.0
    swap_s: float = 0.0
    """From verified to serving the new version."""
    total_s: float = 0.0
    """From the delivery event's arrival to serving."""
    at: float = 0.0


class ResidencyWindow(msgspec.Struct, kw_only=True, frozen=True):
    start: str
    """``HH:MM`` UTC; a window may wrap midnight (``22:00``–``06:00``)."""
    end: str
    residency: str


class ModelResidency(Event, tag="model.residency"):
    """How workers keep a model's versions (``ib.cfg.residency.<name>``, the latest
    kept): ``hot`` loaded in the engine (adapters; the serving version of a model is
    always hot), ``warm`` fetched and verified on the worker's disk (a swap reads no
    network), ``cold`` in the registry only. ``schedule`` overrides ``residency``
    inside its windows ("hot by day, warm by night")."""

    name: str
    residency: str = "hot"
    schedule: list[ResidencyWindow] = []
    set_at: float = 0.0


class DeployRequest(Event, tag="rollout.deploy"):
    """``inferbus model deploy name@version`` (``ib.delivery.cmd.<name>``)."""

    model: str
    version: str
    steps: list[float] = msgspec.field(default_factory=lambda: [1.0, 5.0, 25.0, 50.0, 100.0])
    """Percent of ``model``'s requests on the new version at each step."""
    interval_s: float = 300.0
    """Time at each step before it is judged (then ``min_samples`` must be met)."""
    slo: dict[str, float] = {}
    """Gates on the new version's own outcomes: ``ttft_p95``, ``itl_p95`` (seconds),
    ``error_rate`` (0..1); ``*_ratio`` keys bound it relative to the current version
    (``ttft_p95_ratio=1.5``)."""
    min_samples: int = 20
    canary_workers: int = 1
    """Workers that load the new version as the canary (full models; adapters load
    on every worker of their base)."""
    canary: bool = True
    """False: no canary; every worker loads it at once (a one-worker fleet, or a fix
    that cannot wait). The swaps are still checked and refused ones rolled back."""
    requested_by: str = ""
    requested_at: float = 0.0


class RollbackRequest(Event, tag="rollout.rollback"):
    """``inferbus model rollback name``: back to the version before the current one,
    or, during a rollout, end it on the old one."""

    model: str
    reason: str = "by hand"
    requested_by: str = ""
    requested_at: float = 0.0


class VersionOutcomes(msgspec.Struct, kw_only=True):
    """One version's requests over a window, from ``ib.req.ended``."""

    samples: int = 0
    errors: int = 0
    ttft_p95: float = 0.0
    itl_p95: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.samples if self.samples else 0.0


class RolloutDecision(Event, tag="rollout.decision"):
    """Every decision of a rollout, with its reason and figures
    (``ib.delivery.rollout.<name>``, JetStream: the audit trail)."""

    model: str
    version: str
    previous: str = ""
    action: str = ""
    """``start``, ``place`` (candidate workers loading), ``step`` (weight raised),
    ``hold`` (not enough samples yet), ``promote``, ``rollback``, ``done``,
    ``failed``."""
    step: int = 0
    weight: float = 0.0
    """Share of requests on the new version from now on, 0..1."""
    reason: str = ""
    candidate: VersionOutcomes = msgspec.field(default_factory=VersionOutcomes)
    baseline: VersionOutcomes = msgspec.field(default_factory=VersionOutcomes)
    workers: list[str] = []
    decided_at: float = 0.0


DELIVERY_EVENTS: tuple[type[Event], ...] = (
    ModelVersion,
    ModelCurrent,
    ModelDelivery,
    ModelSwapped,
    ModelResidency,
    DeployRequest,
    RollbackRequest,
    RolloutDecision,
)
