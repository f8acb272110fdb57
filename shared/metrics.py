"""Prometheus metrics, every name declared once here and used by all services."""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class Tally:
    """One request's observations, kept locally (no lock, no label lookup)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (the tokens of one chunk)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n


class BatchedHistogram(Collector):
    """A histogram fed a whole request's observations at once: for values that come
    once per token, where a locked update per token would cost more than the token's
    own trip through the platform. Exposed like any histogram."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = (*tuple(float(b) for b in buckets), float("inf"))
        self._series: dict[tuple[str, ...], list[float]] = {}
        self._lock = threading.Lock()
        if _ON:
            REGISTRY.register(self)

    def tally(self) -> Tally:
        return Tally(self.bounds)

    def add(self, labels: tuple[str, ...], tally: Tally) -> None:
        if not _ON:
            return
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = [0.0] * (len(self.bounds) + 1)
            for i, n in enumerate(tally.counts):
                if n:
                    series[i] += n
            series[-1] += tally.total

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            for labels, series in self._series.items():
                cumulative, buckets = 0.0, []
                for bound, n in zip(self.bounds, series, strict=False):
                    cumulative += n
                    buckets.append((floatToGoString(bound), cumulative))
                family.add_metric(list(labels), buckets, series[-1])
        yield family


_ON = os.environ.get("INFERBUS_METRICS", "on").lower() != "off"

if not _ON:
    # for measuring what metrics cost (bench/telemetry_overhead.py): nothing is counted

    class _Off:
        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def labels(self, *_: Any, **__: Any) -> _Off:
            return self

        def _noop(self, *_: Any, **__: Any) -> None:
            pass

        inc = dec = set = observe = remove = _noop

    # the stand-in replaces prometheus_client's classes (mypy sees two definitions)
    Counter = Gauge = Histogram = _Off  # type: ignore[misc,assignment]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

EVENTS_HANDLED = Counter(
    "inferbus_events_handled_total", "Events a service consumed", ["service", "type"]
)
DEAD_LETTERS = Counter(
    "inferbus_dead_letters_total", "Events sent to the dead-letter subject", ["service", "subject"]
)
HTTP_CONNECTIONS_REFUSED = Counter(
    "inferbus_http_connections_refused_total",
    "HTTP connections closed on arrival: the service held --http-max-connections already",
    ["service"],
)
REQUESTS = Counter(
    "inferbus_requests_total", "Requests by the way they ended", ["service", "model", "outcome"]
)
TOKENS = Counter("inferbus_tokens_total", "Tokens processed", ["service", "model", "phase"])
TTFT = Histogram(
    "inferbus_time_to_first_token_seconds",
    "Time to first token",
    ["service", "model"],
    buckets=_LATENCY_BUCKETS,
)
E2E = Histogram(
    "inferbus_request_duration_seconds",
    "End-to-end request latency",
    ["service", "model"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("inferbus_queue_depth", "Requests waiting for a worker", ["model", "lane"])
QUEUE_OLDEST = Gauge(
    "inferbus_queue_oldest_wait_seconds",
    "How long the oldest waiting request has waited",
    ["model", "lane"],
)
SCHEDULER_DECISIONS = Counter(
    "inferbus_scheduler_decisions_total",
    "What the scheduler did with requests: assigned, or the code it ended them with",
    ["decision"],
)
ROUTED_PREFIX_BLOCKS = Counter(
    "inferbus_routed_prefix_blocks_total",
    "Prompt prefix blocks of routed requests, by whether the chosen worker held them",
    ["cached"],
)
LIVE_WORKERS = Gauge("inferbus_live_workers", "Workers heartbeating", ["model"])
ASSIGNMENTS = Counter(
    "inferbus_assignments_total", "Work assignments by attempt kind", ["model", "kind"]
)
MIGRATIONS = Counter(
    "inferbus_migrations_total",
    "Streams moved to another worker mid-stream, by why (lost: the worker went silent; "
    "stopped, failed: it said so; stalled: its engine hung; drain: it handed them over)",
    ["model", "cause"],
)
MIGRATED_TOKENS = Counter(
    "inferbus_migrated_tokens_total",
    "Output tokens a continuation carried to its new worker (prefilled there again, "
    "or restored from a KV tier)",
    ["model"],
)
MIGRATION_GAP = Histogram(
    "inferbus_migration_gap_seconds",
    "How long a moved stream stood still: from the lost attempt's last chunk to the "
    "continuation's first (what its client waited)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
GATEWAY_REFUSALS = Counter(
    "inferbus_gateway_refusals_total",
    "Requests the gateway answered with an error status, by error code",
    ["code"],
)
PII_MASKED = Counter("inferbus_pii_masked_total", "PII entities masked in output", ["type"])
TENANT_RATE_LIMITED = Counter(
    "inferbus_tenant_rate_limited_total",
    "A tenant's submits refused past its bytes per minute",
    ["tenant"],
)
INPUT_FINDINGS = Counter(
    "inferbus_input_findings_total",
    "Injection findings on input, by type, rule and decision (block, flag)",
    ["type", "rule", "decision"],
)
FILTER_SECONDS = Histogram(
    "inferbus_output_filter_seconds",
    "Time the PII filter spent on one request's output stream (all its chunks)",
    buckets=(0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1),
)
INFLIGHT = Gauge("inferbus_inflight_requests", "Requests being served", ["service"])

# -- where a request's time went (stage histograms, by model) ------------------------
ITL = BatchedHistogram(
    "inferbus_inter_token_latency_seconds",
    "Time between output tokens",
    ["service", "model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5),
)
QUEUE_TIME = Histogram(
    "inferbus_queue_time_seconds",
    "From acceptance to assignment to a worker",
    ["model", "lane"],
    buckets=_LATENCY_BUCKETS,
)
ENGINE_QUEUE_TIME = Histogram(
    "inferbus_engine_queue_time_seconds",
    "From a worker receiving work to the engine running it",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
PREFILL_TIME = Histogram(
    "inferbus_prefill_time_seconds",
    "Prompt processing: from scheduling to the first token",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
DECODE_TIME = Histogram(
    "inferbus_decode_time_seconds",
    "From the first output token to the last",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)

# -- the fleet ----------------------------------------------------------------------
KV_CACHE_USAGE = Gauge(
    "inferbus_kv_cache_usage_ratio", "Fraction of the KV cache in use", ["worker"]
)
PREFIX_CACHE_QUERIES = Counter(
    "inferbus_prefix_cache_queries_total",
    "Prompt tokens looked up in the prefix cache",
    ["worker"],
)
PREFIX_CACHE_HITS = Counter(
    "inferbus_prefix_cache_hits_total",
    "Prompt tokens found in the prefix cache",
    ["worker"],
)
KV_CACHE_BLOCKS = Gauge(
    "inferbus_kv_cache_blocks",
    "The engine's KV cache blocks: total, and free now (used = total - free)",
    ["worker", "state"],
)

# -- KV spill (the worker's connector: host memory and disk tiers) --------------------
KV_SPILL_SAVES = Counter(
    "inferbus_kv_spill_saves_total", "KV blocks saved to a spill tier", ["worker", "tier"]
)
KV_SPILL_SAVED_BYTES = Counter(
    "inferbus_kv_spill_saved_bytes_total",
    "Bytes of KV blocks saved to a spill tier",
    ["worker", "tier"],
)
KV_SPILL_RESTORES = Counter(
    "inferbus_kv_spill_restores_total",
    "KV blocks restored from a spill tier instead of computed",
    ["worker", "tier"],
)
KV_SPILL_RESTORED_BYTES = Counter(
    "inferbus_kv_spill_restored_bytes_total",
    "Bytes of KV blocks restored from a spill tier",
    ["worker", "tier"],
)
KV_SPILL_RESTORE_SECONDS = Counter(
    "inferbus_kv_spill_restore_seconds_total",
    "Time spent reading restored blocks from a spill tier",
    ["worker", "tier"],
)
KV_SPILL_FAULTS = Counter(
    "inferbus_kv_spill_faults_total",
    "KV spill faults, each served by computing instead: error (a read or write failed), "
    "corrupt (a block failed its checksum), dropped (a save not made: the write queue "
    "was full or the tier set aside), load_failed (tier any: a block planned for restore "
    "would not load, and was computed)",
    ["worker", "tier", "kind"],
)
KV_SPILL_USED = Gauge(
    "inferbus_kv_spill_used_bytes", "Bytes a spill tier holds", ["worker", "tier"]
)
KV_SPILL_CAPACITY = Gauge(
    "inferbus_kv_spill_capacity_bytes", "A spill tier's bound in bytes", ["worker", "tier"]
)
KV_SPILL_FAILING = Gauge(
    "inferbus_kv_spill_tier_failing",
    "1 while a worker's disk or shared tier is set aside after repeated errors (retried "
    "after 30 s)",
    ["worker", "tier"],
)
# -- the shared KV tier (the kvspill service) ------------------------------------------
KV_SHARED_USED = Gauge("inferbus_kv_shared_used_bytes", "Bytes the shared KV tier holds")
KV_SHARED_BLOCKS = Gauge("inferbus_kv_shared_blocks", "KV blocks the shared tier holds")
KV_SHARED_CAPACITY = Gauge(
    "inferbus_kv_shared_capacity_bytes", "The shared KV tier's bound in bytes"
)
KV_SHARED_BLOCK_EVENTS = Counter(
    "inferbus_kv_shared_block_events_total",
    "Shared-tier blocks seen per scan: saved (new), restored (read by a worker), evicted "
    "(deleted to keep the bound), vanished (deleted by someone else)",
    ["kind"],
)
KV_SHARED_SCAN_SECONDS = Gauge(
    "inferbus_kv_shared_scan_seconds", "How long the last scan of the shared tier took"
)
KV_SHARED_SCAN_ERRORS = Counter(
    "inferbus_kv_shared_scan_errors_total", "Scans of the shared KV tier that failed"
)
HEARTBEAT_AGE = Gauge(
    "inferbus_worker_heartbeat_age_seconds",
    "Seconds since the scheduler last heard from each worker it knows",
    ["worker"],
)

# -- autoscaler ---------------------------------------------------------------------
AUTOSCALER_DESIRED = Gauge(
    "inferbus_autoscaler_desired_replicas", "Workers the autoscaler wants per model", ["model"]
)
AUTOSCALER_READY = Gauge(
    "inferbus_autoscaler_ready_replicas", "Ready workers the autoscaler sees per model", ["model"]
)
AUTOSCALER_LOAD = Gauge(
    "inferbus_autoscaler_load_tokens_per_second",
    "Work tokens per second per model: observed over the stable window, the short (panic) "
    "window, and forecast one lead time ahead",
    ["model", "kind"],
)
AUTOSCALER_CAPACITY = Gauge(
    "inferbus_autoscaler_worker_capacity_tokens_per_second",
    "Work tokens per second one worker is taken to sustain within the SLO (learned)",
    ["model"],
)
AUTOSCALER_LEAD_TIME = Gauge(
    "inferbus_autoscaler_lead_time_seconds",
    "Measured time from a scale-up decision to the new worker ready",
    ["model"],
)
AUTOSCALER_PANIC = Gauge(
    "inferbus_autoscaler_panic", "1 while the model's panic window holds", ["model"]
)
AUTOSCALER_DECISIONS = Counter(
    "inferbus_autoscaler_decisions_total", "Scale decisions per model", ["model", "direction"]
)
AUTOSCALER_ACTUATION_ERRORS = Counter(
    "inferbus_autoscaler_actuation_errors_total",
    "Decisions an actuator failed to carry out (retried each tick)",
    ["model"],
)

# -- model delivery -----------------------------------------------------------------
MODEL_SWAPS = Counter(
    "inferbus_model_swaps_total",
    "Deliveries a worker took: by swap mode, and ok or why refused "
    "(signature, fetch, incompatible, engine)",
    ["mode", "outcome"],
)
MODEL_SWAP_SECONDS = Histogram(
    "inferbus_model_swap_seconds",
    "From a delivery event's arrival to serving the new version (fetch and signature "
    "check included)",
    ["mode"],
    buckets=_LATENCY_BUCKETS,
)
MODEL_SIGNATURE_FAILURES = Counter(
    "inferbus_model_signature_failures_total",
    "Fetched versions refused because their signature did not verify",
)
ROLLOUT_WEIGHT = Gauge(
    "inferbus_rollout_weight",
    "Share of the model's requests on the version being rolled out (0 when none)",
    ["model", "version"],
)
ROLLOUT_DECISIONS = Counter(
    "inferbus_rollout_decisions_total", "Rollout decisions by action", ["model", "action"]
)

# -- tracing ------------------------------------------------------------------------
TRACES = Counter(
    "inferbus_traces_total",
    "Traces this process decided on or followed a decision for: kept or dropped",
    ["service", "decision"],
)
TRACE_SPANS_DROPPED = Counter(
    "inferbus_trace_spans_dropped_total",
    "Spans dropped by the tail sampler's buffer before any decision (buffer full)",
    ["service"],
)


def add_label(body: bytes, prefix: bytes, key: str, value: str) -> bytes:
    """Add ``key="value"`` to every sample line of the exposition text starting with ``prefix``.

    For metrics another library registers without the label we need (vLLM's
    ``vllm:*`` carry no worker id).
    """
    label = f'{key}="{value}"'.encode()
    lines = body.split(b"\n")
    for i, line in enumerate(lines):
        if not line.startswith(prefix):
            continue
        name, brace, rest = line.partition(b"{")
        if brace:
            lines[i] = name + b"{" + label + (b"," + rest if not rest.startswith(b"}") else rest)
        else:
            name, _, value_part = line.partition(b" ")
            lines[i] = name + b"{" + label + b"} " + value_part
    return b"\n".join(lines)
