"""The view model of ``inferbus top``: what is shown, already computed. None means
"not known" (no data, or no interval yet), shown as a dash and as null in JSON."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    models: list[str]
    state: str
    """The scheduler's view of it, else its own."""
    running: int | None
    """Sequences its engine runs now (its own status)."""
    waiting: int | None
    assigned: int | None
    """Requests the scheduler has assigned to it."""
    max_num_seqs: int | None
    kv_cache_usage: float | None
    """0..1."""
    heartbeat_age_s: float | None
    """Since the scheduler last heard from it."""
    decode_tokens_per_s: float | None
    note: str = ""
    """Its failure reason, or that only one side knows it."""


@dataclass(frozen=True)
class QueueRow:
    model: str
    lane: str
    depth: int
    oldest_wait_s: float | None


@dataclass(frozen=True)
class ModelRow:
    model: str
    """A model name, or "(all)" for the totals row."""
    requests_per_s: float | None
    """Requests ended per second, whatever the outcome."""
    error_ratio: float | None
    """Share of those that did not end with request.finished."""
    outcomes_per_s: dict[str, float]
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_count: int
    """First tokens observed over the interval, by ``ttft_source``."""
    ttft_source: str | None
    """gateway (what HTTP clients saw) when it observed any, else worker."""


@dataclass(frozen=True)
class ServiceRow:
    service: str
    instance: str
    ready: bool | None
    inflight: int | None
    metrics: str
    """"ok", or why /metrics could not be read: the instance is shown as unreachable."""
    metrics_url: str
    detail: str


@dataclass(frozen=True)
class RolloutRow:
    model: str
    version: str
    phase: str
    """placing, stepping, promoting; done, rolled_back or failed once over."""
    weight: float | None
    """Share of the model's requests on the new version, 0..1."""
    workers: list[str]
    """Its canary workers (empty: every worker of an adapter's base)."""


@dataclass(frozen=True)
class TraceRates:
    kept_per_s: float | None
    dropped_per_s: float | None
    spans_dropped_per_s: float | None


@dataclass(frozen=True)
class View:
    interval_s: float | None
    """Seconds between the two snapshots the rates come from; None on the first one."""
    problem: str
    """Why nothing could be read (NATS unreachable); empty when all went well."""
    workers: list[WorkerRow] = field(default_factory=list)
    queues: list[QueueRow] = field(default_factory=list)
    queued: int | None = None
    """Requests waiting, all models (the scheduler's count); None without a scheduler."""
    scheduler_inflight: int | None = None
    models: list[ModelRow] = field(default_factory=list)
    totals: ModelRow | None = None
    gateway_refusals_per_s: float | None = None
    traces: TraceRates | None = None
    """None when no service exports trace counters."""
    services: list[ServiceRow] = field(default_factory=list)
    missing_services: list[str] = field(default_factory=list)
    """Services no instance of which answered on ``$SRV``."""
    rollouts: list[RolloutRow] = field(default_factory=list)
    """The delivery service's rollouts (``inferbus model status`` has their decisions)."""
