"""OpenTelemetry traces, one per request, with tail sampling decided when it ends.

Across processes it works like this:

- Each service records a span per stage of a request, a child of the request's root
  span (the gateway's), whose W3C context travels in NATS headers (``traceparent``).
- Finished spans wait in this process's :class:`TailSampler`, per trace, instead of
  going straight to the exporter.
- The service that ends the request (the worker, or whoever ends it early) decides
  with :func:`verdict`: keep it if it failed, missed its SLO or was slower than
  ``trace_slow_s``, or if its trace id falls in the kept share (drawn from the id,
  so every process draws alike). It publishes ``TraceDecided`` on ib.trace.decided.
- Every service listens there and exports or drops what it buffered of that trace.
  The decision is remembered for a while, so spans that end after it (the
  gateway's stream out, the PII filter) follow it.
- A trace that no decision reaches within ``trace_decision_wait_s`` is exported:
  in doubt, keep.

Tracing is on when an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` names one
(``otlp``, ``console``); ``OTEL_SDK_DISABLED=true`` turns it off. Off, nothing is
recorded and the context passes through untouched.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferbus.contracts import TRACE_DECIDED, TraceDecided
from inferbus.shared import logs, metrics
from inferbus.shared.codec import DecodeError, decode, encode

log = logs.get("inferbus.tracing")

_PROPAGATOR = TraceContextTextMapPropagator()
_LOW64 = (1 << 64) - 1


class TracePolicy(msgspec.Struct, kw_only=True, frozen=True):
    slow_s: float = 1.0
    """Keep every trace of a request slower than this, end to end."""
    keep_ratio: float = 0.001
    """The share of the other (fast, successful) requests whose traces are kept."""
    slo_ttft_s: float = 0.0
    """Keep every trace whose time to first token was over this (0: no TTFT SLO)."""
    buffer_spans: int = 100_000
    """Spans held while their trace is undecided; beyond it the oldest trace is dropped."""
    decision_wait_s: float = 300.0
    """An undecided trace is exported after this long."""
    remember_s: float = 60.0
    """How long a decision applies to spans that end after it."""


def verdict(*, failed: bool, e2e_s: float, ttft_s: float | None, trace_id: int,
            policy: TracePolicy) -> tuple[bool, str]:
    """Keep this request's trace, and why."""
    if failed:
        return True, "failed"
    if policy.slo_ttft_s > 0 and ttft_s is not None and ttft_s > policy.slo_ttft_s:
        return True, "slo"
    if e2e_s >= policy.slow_s:
        return True, "slow"
    # the low 64 bits, as OpenTelemetry's TraceIdRatioBased: the same draw everywhere
    if (trace_id & _LOW64) < int(policy.keep_ratio * (1 << 64)):
        return True, "sampled"
    return False, "fast"


class TailSampler(SpanProcessor):
    """Holds finished spans per trace until the trace is decided, then hands the kept
    ones to ``export`` (a batch processor). Thread-safe: spans may end anywhere."""

    def __init__(self, export: SpanProcessor, policy: TracePolicy, service: str,
                 clock: Any = time.monotonic) -> None:
        self._export = export
        self._policy = policy
        self._service = service
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[int, tuple[float, list[ReadableSpan]]] = OrderedDict()
        self._n_pending = 0
        self._decided: OrderedDict[int, tuple[bool, float]] = OrderedDict()
        self._last_sweep = clock()

    @property
    def buffered_spans(self) -> int:
        return self._n_pending

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        tid = span.context.trace_id
        now = self._clock()
        with self._lock:
            decided = self._decided.get(tid)
            if decided is None:
                entry = self._pending.get(tid)
                if entry is None:
                    self._pending[tid] = (now, [span])
                else:
                    entry[1].append(span)
                self._n_pending += 1
                evicted = self._evict()
            else:
                evicted = 0
            late = self._sweep(now)
        if evicted:
            metrics.TRACE_SPANS_DROPPED.labels(self._service).inc(evicted)
        if decided is not None and decided[0]:
            self._export.on_end(span)
        self._export_all(late)

    def decision(self, trace_id: int) -> bool | None:
        """What was decided for this trace lately (None: nothing yet, or long ago)."""
        d = self._decided.get(trace_id)
        return None if d is None else d[0]

    def decide(self, trace_id: int, keep: bool) -> None:
        """Export or drop what is held of this trace, and apply the same to its spans
        that end in the next ``remember_s``. A later keep overrides a drop (for what
        is still to come); a repeat changes nothing."""
        now = self._clock()
        with self._lock:
            before = self._decided.get(trace_id)
            if before is not None and (before[0] or not keep):
                return
            self._decided[trace_id] = (keep, now)
            self._decided.move_to_end(trace_id)
            entry = self._pending.pop(trace_id, None)
            if entry is not None:
                self._n_pending -= len(entry[1])
            late = self._sweep(now)
        metrics.TRACES.labels(self._service, "kept" if keep else "dropped").inc()
        if keep and entry is not None:
            self._export_all(entry[1])
        self._export_all(late)

    def _evict(self) -> int:
        dropped = 0
        while self._n_pending > self._policy.buffer_spans and self._pending:
            _, (_, spans) = self._pending.popitem(last=False)
            self._n_pending -= len(spans)
            dropped += len(spans)
        return dropped

    def _sweep(self, now: float) -> list[ReadableSpan]:
        """Under the lock, at most once a second: forget old decisions; hand back the
        spans of traces left undecided too long (exported: in doubt, keep)."""
        if now - self._last_sweep < 1.0:
            return []
        self._last_sweep = now
        while self._decided:
            tid, (_, at) = next(iter(self._decided.items()))
            if now - at < self._policy.remember_s:
                break
            del self._decided[tid]
        late: list[ReadableSpan] = []
        while self._pending:
            tid, (first, spans) = next(iter(self._pending.items()))
            if now - first < self._policy.decision_wait_s:
                break
            del self._pending[tid]
            self._n_pending -= len(spans)
            late.extend(spans)
        return late

    def _export_all(self, spans: Sequence[ReadableSpan]) -> None:
        for span in spans:
            self._export.on_end(span)

    def shutdown(self) -> None:
        """Export what is still undecided (a draining process would otherwise lose
        the early spans of requests another service has yet to end)."""
        with self._lock:
            held = [s for _, spans in self._pending.values() for s in spans]
            self._pending.clear()
            self._n_pending = 0
        self._export_all(held)
        self._export.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._export.force_flush(timeout_millis)


def trace_id_hex(trace_id: int) -> str:
    return format(trace_id, "032x")


class Tracing:
    """This process's tracing: stage spans, context in and out of NATS headers, and
    the end-of-request decision. Disabled, every method is a cheap no-op."""

    def __init__(self, service: str, policy: TracePolicy,
                 provider: TracerProvider | None = None,
                 sampler: TailSampler | None = None) -> None:
        self.service = service
        self.policy = policy
        self.enabled = provider is not None
        self._provider = provider
        self.sampler = sampler
        self._tracer = (provider.get_tracer("inferbus") if provider is not None
                        else trace.NoOpTracer())
        self._nc: Any = None
        self._sub: Any = None

    @classmethod
    def disabled(cls, service: str = "") -> "Tracing":
        return cls(service, TracePolicy())

    @classmethod
    def with_exporter(cls, service: str, policy: TracePolicy, exporter: SpanExporter,
                      instance: str = "", export: SpanProcessor | None = None) -> "Tracing":
        """Tracing into ``exporter`` through a tail sampler (tests pass an in-memory
        exporter and a simple processor as ``export``)."""
        import inferbus

        resource = Resource.create({
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or f"inferbus-{service}",
            "service.namespace": "inferbus",
            "service.instance.id": instance,
            "service.version": inferbus.__version__,
        })
        sampler = TailSampler(export or BatchSpanProcessor(exporter), policy, service)
        # every span is recorded; the tail sampler decides what leaves the process
        provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        provider.add_span_processor(sampler)
        return cls(service, policy, provider, sampler)

    # -- context in NATS headers -----------------------------------------------------

    def parent(self, headers: Mapping[str, str] | None) -> Context | None:
        """The trace context a message carries (None: none, or tracing is off)."""
        if not self.enabled or not headers or "traceparent" not in headers:
            return None
        return _PROPAGATOR.extract(carrier=dict(headers))

    @staticmethod
    def trace_id(parent: Context | None) -> int:
        if parent is None:
            return 0
        return trace.get_current_span(parent).get_span_context().trace_id

    @staticmethod
    def headers(span_or_context: Any) -> dict[str, str]:
        """``traceparent``/``tracestate`` naming this span (or context) as the parent."""
        ctx = (span_or_context if isinstance(span_or_context, Context)
               else trace.set_span_in_context(span_or_context))
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=ctx)
        return carrier

    # -- spans -------------------------------------------------------------------------

    def start(self, name: str, parent: Context | None = None,
              attributes: Mapping[str, Any] | None = None, start_ns: int | None = None,
              kind: SpanKind = SpanKind.INTERNAL) -> trace.Span:
        """A live span, ended by the caller (``end(span, ...)``)."""
        return self._tracer.start_span(name, context=parent, kind=kind,
                                       attributes=attributes, start_time=start_ns)

    def record(self, name: str, parent: Context | None, start_ns: int, end_ns: int,
               attributes: Mapping[str, Any] | None = None, error: str = "",
               kind: SpanKind = SpanKind.INTERNAL) -> trace.Span | None:
        """A span of a stage that is already over (times in Unix nanoseconds)."""
        if not self.enabled:
            return None
        span = self._tracer.start_span(name, context=parent, kind=kind,
                                       attributes=attributes, start_time=start_ns)
        end(span, error, end_ns)
        return span

    # -- the end-of-request decision -----------------------------------------------------

    async def listen(self, nc: Any) -> None:
        """Follow every service's decisions (and keep ``nc`` to publish our own)."""
        self._nc = nc
        if self.enabled:
            self._sub = await nc.subscribe(TRACE_DECIDED, cb=self._on_decided)

    async def _on_decided(self, msg: Any) -> None:
        try:
            d = decode(msg.data, TraceDecided)
            tid = int(d.trace_id, 16)
        except (DecodeError, ValueError) as exc:
            log.warning("undecodable trace decision", error=str(exc))
            return
        assert self.sampler is not None
        self.sampler.decide(tid, d.keep)

    async def end_request(self, parent: Context | None, *, request_id: str, failed: bool,
                          e2e_s: float, ttft_s: float | None = None,
                          only_keep: bool = False) -> tuple[bool, str] | None:
        """Decide the request's trace from how it ended, apply it here and tell every
        other service. None when tracing is off or the request carries no trace.

        ``only_keep``: a second opinion (the gateway, after the service that ended the
        request has decided): published only to keep what the first would drop."""
        tid = self.trace_id(parent)
        if not tid or self.sampler is None:
            return None
        keep, reason = verdict(failed=failed, e2e_s=e2e_s, ttft_s=ttft_s, trace_id=tid,
                               policy=self.policy)
        if only_keep and (not keep or self.sampler.decision(tid)):
            return keep, reason
        await self.publish(tid, keep, reason, request_id)
        return keep, reason

    async def publish(self, trace_id: int, keep: bool, reason: str, request_id: str) -> None:
        assert self.sampler is not None
        self.sampler.decide(trace_id, keep)
        if self._nc is not None and self._nc.is_connected:
            await self._nc.publish(TRACE_DECIDED, encode(TraceDecided(
                trace_id=trace_id_hex(trace_id), keep=keep, reason=reason,
                request_id=request_id, service=self.service)))

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
        if self._provider is not None:
            self._provider.shutdown()


def end(span: trace.Span, error: str = "", end_ns: int | None = None) -> None:
    """End a span; a non-empty ``error`` marks it failed with that description."""
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
        span.set_attribute("error.type", error.split(":", 1)[0])
    span.end(end_time=end_ns)


def enabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_from_env() -> SpanExporter:
    """The exporter the standard variables name: OTLP (http/protobuf, or gRPC where
    its package is installed and OTEL_EXPORTER_OTLP_PROTOCOL says grpc) or console."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter()
        except ImportError:
            log.warning("OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; "
                        "exporting over HTTP instead")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself


def setup(service: str, policy: TracePolicy, instance: str = "") -> Tracing:
    """This process's tracing, from the standard OpenTelemetry variables."""
    if not enabled_by_env():
        return Tracing.disabled(service)
    tracing = Tracing.with_exporter(service, policy, _exporter_from_env(), instance)
    log.info("tracing on", slow_s=policy.slow_s, keep_ratio=policy.keep_ratio,
             endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
             or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    return tracing


# gen_ai semantic-convention attribute names, and ours
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_TOP_P = "gen_ai.request.top_p"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
REQUEST_ID = "inferbus.request_id"
TENANT = "inferbus.tenant"
LANE = "inferbus.lane"
WORKER = "inferbus.worker_id"
ATTEMPT = "inferbus.attempt"
PREFILL_TOKENS = "inferbus.prefill_tokens"
CACHED_PREFIX_TOKENS = "inferbus.cached_prefix_tokens"
