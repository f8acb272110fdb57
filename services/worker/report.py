"""What the worker tells about a request once it ends: metrics by stage, the stage
spans, the trace decision (the worker is where most requests end) and the one
canonical log line."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from inferbus.contracts import RequestFailed, RequestFinished, StageTimings, WorkerHeartbeat
from inferbus.shared import logs, metrics
from inferbus.shared.tracing import Tracing
from inferbus.shared.tracing import attributes as t

from .core import RequestStream

log = logs.get("inferbus.worker")

_NS = 1_000_000_000


class _ModelMetrics:
    """One model's metric children, looked up once (``labels`` costs more than the
    update itself, on every request)."""

    def __init__(self, service: str, model: str) -> None:
        self.e2e = metrics.E2E.labels(service, model)
        self.engine_queue = metrics.ENGINE_QUEUE_TIME.labels(model)
        self.prefill = metrics.PREFILL_TIME.labels(model)
        self.decode = metrics.DECODE_TIME.labels(model)
        self.prefill_tokens = metrics.TOKENS.labels(service, model, "prefill")
        self.cached_tokens = metrics.TOKENS.labels(service, model, "cached")
        self.decode_tokens = metrics.TOKENS.labels(service, model, "decode")


@lru_cache(maxsize=1024)
def _model_metrics(service: str, model: str) -> _ModelMetrics:
    return _ModelMetrics(service, model)


def stage_times(stream: RequestStream, terminal: Any, now: float) -> StageTimings:
    """Engine timings where the engine gave them, else what the worker saw (a sim
    engine, or a request that did not finish): no split of queue and prefill then."""
    timings = terminal.timings if isinstance(terminal, RequestFinished) else stream.timings(now)
    if not timings.queued_s and not timings.prefill_s and stream.first_token_at is not None:
        timings = StageTimings(
            queued_s=0.0,
            prefill_s=timings.first_token_s,
            first_token_s=timings.first_token_s,
            decode_s=timings.decode_s,
        )
    return timings


def report_end(
    tracing: Tracing,
    service: str,
    stream: RequestStream,
    terminal: Any,
    parent: Any,
    received: float,
    now: float,
) -> None:
    """``received``: Unix time the assignment arrived; ``now``: monotonic, at the end."""
    a = stream.assignment
    req = a.request
    model = req.model
    outcome = terminal.__struct_config__.tag
    failed = isinstance(terminal, RequestFailed)
    timings = stage_times(stream, terminal, now)
    started = stream.first_token_at is not None
    end_wall = received + (now - stream.started_at)

    m = _model_metrics(service, model)
    metrics.REQUESTS.labels(service, model, outcome).inc()
    m.e2e.observe(now - stream.started_at)
    usage = terminal.usage if isinstance(terminal, RequestFinished) else None
    if usage is not None:
        m.engine_queue.observe(timings.queued_s)
        m.prefill.observe(timings.prefill_s)
        m.decode.observe(timings.decode_s)
        cached = usage.cached_prompt_tokens
        m.prefill_tokens.inc(usage.prompt_tokens - cached)
        m.cached_tokens.inc(cached)
        m.decode_tokens.inc(usage.completion_tokens)

    error = f"{terminal.code}: {terminal.reason}" if failed else ""
    if tracing.enabled and parent is not None:  # no context: no trace to join
        common = {
            t.REQUEST_ID: req.request_id,
            t.WORKER: stream.worker_id,
            t.GEN_AI_REQUEST_MODEL: model,
            t.ATTEMPT: a.attempt,
        }
        t0 = int(received * _NS)
        if started:
            first = t0 + int(timings.first_token_s * _NS)
            queued = min(first, t0 + int(timings.queued_s * _NS))
            tracing.record("engine queue", parent, t0, queued, common)
            restored = stream.restored
            if restored is not None:  # the first thing the prefill did
                tracing.record(
                    "kv restore",
                    parent,
                    queued,
                    min(first, queued + int(restored.seconds * _NS)),
                    common
                    | {
                        t.KV_RESTORED_TOKENS: restored.tokens,
                        t.KV_RESTORED_BYTES: restored.bytes,
                        t.KV_RESTORED_TIERS: sorted(restored.tiers),
                        t.KV_RESTORE_FAILED_BLOCKS: restored.failed,
                        t.KV_RESTORE_TIMED: restored.timed,
                    },
                )
            prefill_attrs = dict(common)
            if usage is not None:
                prefill_attrs[t.PREFILL_TOKENS] = usage.prompt_tokens - usage.cached_prompt_tokens
                prefill_attrs[t.CACHED_PREFIX_TOKENS] = usage.cached_prompt_tokens
                prefill_attrs[t.GEN_AI_INPUT_TOKENS] = usage.prompt_tokens
            tracing.record("prefill", parent, queued, first, prefill_attrs)
            decode_attrs = dict(common)
            decode_attrs[t.GEN_AI_RESPONSE_MODEL] = a.served_model or model
            if usage is not None:
                decode_attrs[t.GEN_AI_OUTPUT_TOKENS] = usage.completion_tokens
                decode_attrs[t.GEN_AI_FINISH_REASONS] = [terminal.finish_reason]
            tracing.record("decode", parent, first, int(end_wall * _NS), decode_attrs, error)
        else:  # it ended before any token: waiting in the engine, or in its prefill
            tracing.record("engine queue", parent, t0, int(end_wall * _NS), common, error)

    created = req.created_at or received
    ttft_s = (received + timings.first_token_s - created) if started else None
    decision = tracing.end_request(
        parent, request_id=req.request_id, failed=failed, e2e_s=end_wall - created, ttft_s=ttft_s
    )
    log.info(
        "request ended",
        request_id=req.request_id,
        model=model,
        served_model=a.served_model or model,
        tenant=req.tenant,
        attempt=a.attempt,
        outcome=outcome,
        code=getattr(terminal, "code", ""),
        finish_reason=getattr(terminal, "finish_reason", ""),
        prompt_tokens=usage.prompt_tokens if usage else None,
        cached_tokens=usage.cached_prompt_tokens if usage else None,
        restored_tokens=stream.restored.tokens if stream.restored else None,
        prompt_ids="sanitizer" if stream.prompt_ids_given else "worker",
        completion_tokens=usage.completion_tokens if usage else None,
        chunks=stream.seq,
        e2e_s=round(end_wall - created, 6),
        ttft_s=round(ttft_s, 6) if ttft_s is not None else None,
        engine_queue_s=round(timings.queued_s, 6),
        prefill_s=round(timings.prefill_s, 6),
        decode_s=round(timings.decode_s, 6),
        **tracing.log_fields(parent, decision),
    )


def report_stats(worker_id: str, hb: WorkerHeartbeat, seen: tuple[int, int]) -> tuple[int, int]:
    """KV usage and prefix-cache counters from the engine's cumulative stats; returns
    the (hits, queries) now seen, for the next call's increments."""
    metrics.KV_CACHE_USAGE.labels(worker_id).set(hb.kv_cache_usage)
    if hb.kv_block_size:
        total = hb.kv_capacity_tokens // hb.kv_block_size
        metrics.KV_CACHE_BLOCKS.labels(worker_id, "total").set(total)
        metrics.KV_CACHE_BLOCKS.labels(worker_id, "free").set(
            round(total * (1.0 - hb.kv_cache_usage))
        )
    hits, queries = hb.prefix_cache_hits, hb.prefix_cache_queries
    if hits >= seen[0] and queries >= seen[1]:  # an engine restart resets them
        metrics.PREFIX_CACHE_HITS.labels(worker_id).inc(hits - seen[0])
        metrics.PREFIX_CACHE_QUERIES.labels(worker_id).inc(queries - seen[1])
    else:
        metrics.PREFIX_CACHE_HITS.labels(worker_id).inc(hits)
        metrics.PREFIX_CACHE_QUERIES.labels(worker_id).inc(queries)
    return hits, queries


_SPILL_COUNTERS = {
    "saves": metrics.KV_SPILL_SAVES,
    "save_bytes": metrics.KV_SPILL_SAVED_BYTES,
    "restores": metrics.KV_SPILL_RESTORES,
    "restore_bytes": metrics.KV_SPILL_RESTORED_BYTES,
    "restore_s": metrics.KV_SPILL_RESTORE_SECONDS,
}
_SPILL_FAULTS = {"errors": "error", "corrupt": "corrupt", "dropped": "dropped"}


def report_spill(worker_id: str, data: dict[str, Any]) -> None:
    """The KV spill connector's stats for one interval: counter increments per tier,
    each tier's usage now, and whether a tier is set aside."""
    for name, value in data.items():
        tier, _, what = name.partition("_")
        if what in _SPILL_COUNTERS and value > 0:
            _SPILL_COUNTERS[what].labels(worker_id, tier).inc(value)
        elif what in _SPILL_FAULTS and value > 0:
            metrics.KV_SPILL_FAULTS.labels(worker_id, tier, _SPILL_FAULTS[what]).inc(value)
        elif name == "load_failures" and value > 0:
            metrics.KV_SPILL_FAULTS.labels(worker_id, "any", "load_failed").inc(value)
        elif what == "used":
            metrics.KV_SPILL_USED.labels(worker_id, tier).set(value)
        elif what == "capacity":
            metrics.KV_SPILL_CAPACITY.labels(worker_id, tier).set(value)
        elif what == "failing":
            metrics.KV_SPILL_FAILING.labels(worker_id, tier).set(value)
