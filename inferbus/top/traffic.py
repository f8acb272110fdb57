"""Traffic over an interval: requests and errors, tokens/s, TTFT quantiles, traces.
Pure: counter and histogram increases between two snapshots, divided by the time.

* Requests count where they end (sanitizer rejections, scheduler failures, worker
  outcomes), which every request passes whether it came over HTTP or NATS; the
  gateway's own counts would repeat them. Errors are everything but request.finished.
* Tokens are the workers' ``inferbus_tokens_total`` by phase.
* TTFT is the gateway's histogram (what HTTP clients saw) when it observed any first
  tokens of that model over the interval, else the workers' (engine side).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .fleet import worker_id_of
from .quantile import histogram_quantile
from .rates import Interval, counter_increases, histogram_increases
from .rows import ModelRow, TraceRates
from .snapshot import Snapshot

SUCCESS = "request.finished"
ALL_MODELS = "(all)"
TTFT_SOURCES = ("gateway", "worker")

REQUESTS = "inferbus_requests_total"
TOKENS = "inferbus_tokens_total"
TTFT = "inferbus_time_to_first_token_seconds"
REFUSALS = "inferbus_gateway_refusals_total"
TRACES = "inferbus_traces_total"
SPANS_DROPPED = "inferbus_trace_spans_dropped_total"


def _buckets() -> defaultdict[float, float]:
    return defaultdict(float)


@dataclass
class _Traffic:
    """One model's increases over the interval."""

    outcomes: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    tokens: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    ttft: defaultdict[str, defaultdict[float, float]] = field(
        default_factory=lambda: defaultdict(_buckets)
    )

    def first_tokens(self) -> tuple[str | None, dict[float, float]]:
        """The TTFT source to show and its buckets."""
        for source in TTFT_SOURCES:
            buckets: dict[float, float] = self.ttft.get(source, {})
            if max(buckets.values(), default=0.0) > 0:
                return source, dict(buckets)
        return None, {}


def usable(interval: Interval | None) -> Interval | None:
    return interval if interval is not None and interval.seconds > 0 else None


def _gather(interval: Interval) -> dict[str, _Traffic]:
    by_model: defaultdict[str, _Traffic] = defaultdict(_Traffic)
    for inst, labels, grew in counter_increases(interval, REQUESTS):
        if labels.get("service", inst.service) != "gateway":
            by_model[labels.get("model", "?")].outcomes[labels.get("outcome", "?")] += grew
    for _, labels, grew in counter_increases(interval, TOKENS, service="worker"):
        by_model[labels.get("model", "?")].tokens[labels.get("phase", "?")] += grew
    for inst, labels, buckets in histogram_increases(interval, TTFT):
        source = labels.get("service", inst.service)
        if source in TTFT_SOURCES:
            into = by_model[labels.get("model", "?")].ttft[source]
            for bound, grew in buckets.items():
                into[bound] += grew
    return by_model


def _row(
    model: str,
    seconds: float,
    outcomes: dict[str, float],
    tokens: dict[str, float],
    ttft_source: str | None,
    ttft: dict[float, float],
) -> ModelRow:
    ended = sum(outcomes.values())
    return ModelRow(
        model=model,
        requests_per_s=ended / seconds,
        error_ratio=(ended - outcomes.get(SUCCESS, 0.0)) / ended if ended > 0 else None,
        outcomes_per_s={k: v / seconds for k, v in sorted(outcomes.items()) if v > 0},
        prefill_tokens_per_s=tokens.get("prefill", 0.0) / seconds,
        decode_tokens_per_s=tokens.get("decode", 0.0) / seconds,
        ttft_p50_s=histogram_quantile(0.5, ttft.items()),
        ttft_p95_s=histogram_quantile(0.95, ttft.items()),
        ttft_count=round(max(ttft.values(), default=0.0)),
        ttft_source=ttft_source,
    )


def _unknown(model: str) -> ModelRow:
    return ModelRow(
        model=model,
        requests_per_s=None,
        error_ratio=None,
        outcomes_per_s={},
        prefill_tokens_per_s=None,
        decode_tokens_per_s=None,
        ttft_p50_s=None,
        ttft_p95_s=None,
        ttft_count=0,
        ttft_source=None,
    )


def model_rows(
    interval: Interval | None,
    models: Iterable[str],
) -> tuple[list[ModelRow], ModelRow | None]:
    """A row per model (those given and any with traffic) and the totals row."""
    interval = usable(interval)
    if interval is None:
        return [_unknown(m) for m in sorted(set(models))], None
    seconds = interval.seconds
    by_model = _gather(interval)
    rows = []
    outcomes: defaultdict[str, float] = defaultdict(float)
    tokens: defaultdict[str, float] = defaultdict(float)
    ttft: defaultdict[float, float] = defaultdict(float)
    sources: set[str] = set()
    for model in sorted(set(models) | set(by_model)):
        traffic = by_model.get(model) or _Traffic()
        source, buckets = traffic.first_tokens()
        rows.append(_row(model, seconds, traffic.outcomes, traffic.tokens, source, buckets))
        for k, v in traffic.outcomes.items():
            outcomes[k] += v
        for k, v in traffic.tokens.items():
            tokens[k] += v
        for bound, grew in buckets.items():
            ttft[bound] += grew
        sources.update([source] if source else [])
    source = "+".join(sorted(sources)) or None
    return rows, _row(ALL_MODELS, seconds, outcomes, tokens, source, ttft)


def worker_decode_rates(interval: Interval | None) -> dict[str, float]:
    """Decode tokens/s of each worker read in both snapshots, by worker id."""
    interval = usable(interval)
    if interval is None:
        return {}
    rates = {worker_id_of(new): 0.0 for _, new in interval.paired("worker")}
    for inst, labels, grew in counter_increases(interval, TOKENS, service="worker"):
        if labels.get("phase") == "decode":
            rates[worker_id_of(inst)] += grew / interval.seconds
    return rates


def refusals_per_s(interval: Interval | None) -> float | None:
    interval = usable(interval)
    if interval is None or not any(True for _ in interval.paired("gateway")):
        return None
    return sum(grew for _, _, grew in counter_increases(interval, REFUSALS)) / interval.seconds


def trace_rates(now: Snapshot, interval: Interval | None) -> TraceRates | None:
    """Traces kept and dropped per second; None when no service exports them."""
    exported = any(
        i.metrics and (i.metrics.get(TRACES) or i.metrics.get(SPANS_DROPPED)) for i in now.instances
    )
    if not exported:
        return None
    interval = usable(interval)
    if interval is None:
        return TraceRates(kept_per_s=None, dropped_per_s=None, spans_dropped_per_s=None)
    decided: defaultdict[str, float] = defaultdict(float)
    for _, labels, grew in counter_increases(interval, TRACES):
        decided[labels.get("decision", "?")] += grew
    spans = sum(grew for _, _, grew in counter_increases(interval, SPANS_DROPPED))
    return TraceRates(
        kept_per_s=decided["kept"] / interval.seconds,
        dropped_per_s=decided["dropped"] / interval.seconds,
        spans_dropped_per_s=spans / interval.seconds,
    )
