"""OpenTelemetry traces, one per request, with tail sampling decided when it ends.

Across processes it works like this:

- Each service records a span per stage of a request, a child of the request's root
  span (the gateway's), whose W3C context travels in NATS headers (``traceparent``).
- Finished spans wait in this process's :class:`TailSampler`, per request (its trace
  id and request id: a caller's trace may hold many requests), as plain records: the
  OpenTelemetry SDK's span objects (and their cost) are built only for what is kept,
  then exported by its batch processor and OTLP exporter.
- The service that ends the request (the worker, or whoever ends it early) decides
  with :func:`verdict`: keep it if it failed, missed its SLO or was slower than
  ``trace_slow_s``, or if its trace id falls in the kept share (drawn from the id,
  so every process, and every request of one trace, draws alike). It publishes
  ``TraceDecided`` on ib.trace.decided (in batches, a few times a second).
- Every service listens there and exports or drops what it holds of that request.
  A drop is tentative for ``drop_grace_s``: a keep that follows (the gateway saw a
  failure or a slow stream out the ender did not) still finds the spans. Decisions
  are remembered for a while, so spans that end after them follow them.
- A request that no decision reaches within ``trace_decision_wait_s`` is exported:
  in doubt, keep.

Tracing is on when an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` names one
(``otlp``, ``console``); ``OTEL_SDK_DISABLED=true`` turns it off. Off, nothing is
recorded and the context passes through untouched.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from inferbus.contracts import TRACE_DECIDED, DecidedRequest, TraceDecided
from inferbus.shared import logs, metrics
from inferbus.shared.codec import DecodeError, decode, encode

if TYPE_CHECKING:  # the SDK is imported only where tracing is on: no start-up cost off
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

log = logs.get("inferbus.tracing")

_LOW64 = (1 << 64) - 1
_DECISIONS_PER_MESSAGE = 1000
"""About 200 bytes each with a long request id: a message stays far under 1 MB."""
_OUTBOX_MAX = 100_000
# version 00 is exactly this; a later version may append fields after a "-"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,512}")


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
    publish_interval_s: float = 0.05
    """Decisions go out in batches this often (one message, not one per request)."""
    drop_grace_s: float = 2.0
    """Dropped spans are held this long: a keep from another service may follow."""
    hearsay_s: float = 5.0
    """How long a decision about a request this process holds nothing of (yet) is
    kept: its spans may still end here just after (a span recorded once a publish
    is acknowledged, while the request ran and ended elsewhere)."""


def verdict(
    *, failed: bool, e2e_s: float, ttft_s: float | None, trace_id: int, policy: TracePolicy
) -> tuple[bool, str]:
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


class TraceParent:
    """A W3C trace context: the trace, the parent span, the vendors' ``tracestate``."""

    __slots__ = ("flags", "remote", "span_id", "state", "trace_id")

    def __init__(
        self, trace_id: int, span_id: int, state: str = "", remote: bool = True, flags: str = "01"
    ) -> None:
        self.trace_id, self.span_id, self.state, self.remote = trace_id, span_id, state, remote
        self.flags = flags

    @classmethod
    def parse(cls, headers: Mapping[str, str]) -> TraceParent | None:
        """The W3C context in ``headers``; None when absent or malformed (a bad
        ``tracestate`` alone is left behind)."""
        m = _TRACEPARENT.fullmatch(headers.get("traceparent", ""))
        if m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
            return None
        trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
        if not trace_id or not span_id:
            return None
        state = headers.get("tracestate", "")
        return cls(
            trace_id, span_id, state if _TRACESTATE.fullmatch(state) else "", flags=m.group(4)
        )

    def headers(self) -> dict[str, str]:
        out = {"traceparent": f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags}"}
        if self.state:
            out["tracestate"] = self.state
        return out


def valid_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C context of ``headers``, rebuilt from its parsed fields (version 00,
    the sender's flags) when valid; else nothing. What a hop may pass on with
    tracing off: never the sender's raw bytes."""
    parent = TraceParent.parse(headers)
    return parent.headers() if parent is not None else {}


class Span:
    """A span of this process. Until its trace is kept it is only this record: the
    OpenTelemetry SDK's objects are built for kept traces alone."""

    __slots__ = (
        "_sink",
        "attributes",
        "end_ns",
        "error",
        "kind",
        "live",
        "name",
        "parent",
        "request_id",
        "span_id",
        "start_ns",
        "trace_id",
    )

    def __init__(
        self,
        sink: TailSampler,
        name: str,
        parent: TraceParent | None,
        attributes: Mapping[str, Any] | None,
        start_ns: int | None,
        kind: str = "internal",
        live: bool = False,
    ) -> None:
        self._sink = sink
        self.name = name
        self.parent = parent
        self.trace_id = parent.trace_id if parent is not None else random.getrandbits(128)
        self.span_id = random.getrandbits(64) or 1
        self.start_ns = start_ns if start_ns is not None else time.time_ns()
        self.end_ns = 0
        self.attributes = dict(attributes) if attributes else {}
        self.error = ""
        self.kind = kind
        self.request_id: str = self.attributes.get(REQUEST_ID, "")
        """With the trace id, what the tail sampler holds it under."""
        self.live = live
        """Started now and ended later (not a record of a stage already over)."""
        if live:
            sink.opened((self.trace_id, self.request_id))

    @property
    def context(self) -> TraceParent:
        """This span as the parent of others."""
        return TraceParent(
            self.trace_id,
            self.span_id,
            self.parent.state if self.parent is not None else "",
            remote=False,
        )

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, values: Mapping[str, Any]) -> None:
        self.attributes.update(values)

    def update_name(self, name: str) -> None:
        self.name = name

    def end(self, error: str = "", end_ns: int | None = None) -> None:
        """A non-empty ``error`` marks it failed with that description."""
        if self.end_ns:
            return
        self.end_ns = end_ns if end_ns is not None else time.time_ns()
        if error:
            self.error = error
            self.attributes["error.type"] = error.split(":", 1)[0]
        self._sink.on_end(self)


Key = tuple[int, str]
"""A request's spans: (trace id, request id)."""


class TailSampler:
    """Holds finished spans per request until it is decided, then hands the kept ones
    to ``export`` (a batch processor). Thread-safe: spans may end anywhere."""

    def __init__(
        self,
        export: SpanProcessor,
        policy: TracePolicy,
        service: str,
        resource: Resource,
        clock: Any = time.monotonic,
    ) -> None:
        self._export = export
        self._policy = policy
        self._readable = _to_readable(resource)
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[Key, tuple[float, list[Span]]] = OrderedDict()
        """Undecided, oldest first."""
        self._n_pending = 0
        self._dropping: OrderedDict[Key, tuple[float, list[Span]]] = OrderedDict()
        """Dropped, held for ``drop_grace_s`` in case a keep follows."""
        self._decided: OrderedDict[Key, tuple[bool, float]] = OrderedDict()
        self._open: dict[Key, int] = {}
        """Requests with a span started here and not ended (the gateway's root): a
        drop waits for them, since this process may still see a reason to keep."""
        self._heard: OrderedDict[Key, tuple[bool, float]] = OrderedDict()
        """Others' decisions about requests held nothing of here, for ``hearsay_s``."""
        self._last_sweep = clock()
        self._kept = metrics.TRACES.labels(service, "kept")
        self._dropped = metrics.TRACES.labels(service, "dropped")
        self._overflow = metrics.TRACE_SPANS_DROPPED.labels(service)

    @property
    def buffered_spans(self) -> int:
        return self._n_pending

    def opened(self, key: Key) -> None:
        with self._lock:
            self._open[key] = self._open.get(key, 0) + 1

    def on_end(self, span: Span) -> None:
        key = (span.trace_id, span.request_id)
        now = self._clock()
        export: list[Span] = []
        evicted = 0
        with self._lock:
            if span.live:
                left = self._open.get(key, 1) - 1
                if left > 0:
                    self._open[key] = left
                else:
                    self._open.pop(key, None)
            decided = self._decided.get(key)
            if decided is None and key in self._heard:  # decided before it ended here
                decided = self._decided[key] = self._heard.pop(key)
                (self._kept if decided[0] else self._dropped).inc()
            if decided is None or (not decided[0] and key in self._open):
                # undecided, or dropped while a span of it is still open here (this
                # process may yet see a reason to keep it): held
                entry = self._pending.get(key)
                if entry is None:
                    self._pending[key] = (now, [span])
                else:
                    entry[1].append(span)
                self._n_pending += 1
                evicted = self._evict()
            elif decided[0]:
                export.append(span)
            else:  # dropped: held for the grace from now, a keep may follow
                held = self._take_pending(key)
                held += self._dropping.pop(key, (now, []))[1]
                held.append(span)
                self._dropping[key] = (now, held)
            late = self._sweep(now)
        if evicted:
            self._overflow.inc(evicted)
        self._export_all(export)
        self._export_all(late)

    def decision(self, key: Key) -> bool | None:
        """What was decided for this request lately (None: nothing yet, long ago,
        or never of interest here)."""
        d = self._decided.get(key)
        return None if d is None else d[0]

    def decide(self, key: Key, keep: bool, own: bool = False) -> None:
        """Keep or drop this request's spans, those held and those that end in the
        next ``remember_s``. A keep overrides a drop (dropped spans are held for
        ``drop_grace_s``, and while a span of the request is open here); a repeat
        changes nothing. Someone else's decision about a request this process holds
        nothing of is kept for ``hearsay_s`` only (``own``: ours)."""
        now = self._clock()
        rescued: list[Span] = []
        with self._lock:
            before = self._decided.get(key)
            if before is not None and (before[0] or not keep):
                return
            if not own and before is None and key not in self._pending and key not in self._open:
                heard = self._heard.get(key)
                if heard is None or (keep and not heard[0]):
                    self._heard[key] = (keep, now)
                    self._heard.move_to_end(key)
                return
            self._decided[key] = (keep, now)
            self._decided.move_to_end(key)
            if keep:
                rescued = self._take_pending(key) + self._dropping.pop(key, (now, []))[1]
            elif key not in self._open:  # else held until its open span ends
                held = self._take_pending(key)
                if held:
                    self._dropping[key] = (now, held)
            late = self._sweep(now)
        (self._kept if keep else self._dropped).inc()
        self._export_all(rescued)
        self._export_all(late)

    def _take_pending(self, key: Key) -> list[Span]:
        entry = self._pending.pop(key, None)
        if entry is None:
            return []
        self._n_pending -= len(entry[1])
        return entry[1]

    def sweep(self) -> None:
        """The periodic work, for a quiet process: spans of requests left undecided
        for ``decision_wait_s`` are exported, dropped ones past their grace discarded."""
        with self._lock:
            late = self._sweep(self._clock())
        self._export_all(late)

    def _evict(self) -> int:
        dropped = 0
        while self._n_pending > self._policy.buffer_spans and self._pending:
            _, (_, spans) = self._pending.popitem(last=False)
            self._n_pending -= len(spans)
            dropped += len(spans)
        return dropped

    def _sweep(self, now: float) -> list[Span]:
        """Under the lock, at most once a second: forget old decisions and old drops;
        hand back the spans of requests left undecided too long (in doubt, keep)."""
        if now - self._last_sweep < 1.0:
            return []
        self._last_sweep = now
        p = self._policy
        while self._decided:
            key, (_, at) = next(iter(self._decided.items()))
            if now - at < p.remember_s:
                break
            del self._decided[key]
        while self._dropping:
            key, (at, _) = next(iter(self._dropping.items()))
            if now - at < p.drop_grace_s:
                break
            del self._dropping[key]
        while self._heard:
            key, (_, at) = next(iter(self._heard.items()))
            if now - at < p.hearsay_s:
                break
            del self._heard[key]
        late: list[Span] = []
        while self._pending:
            key, (first, spans) = next(iter(self._pending.items()))
            if now - first < p.decision_wait_s:
                break
            del self._pending[key]
            self._n_pending -= len(spans)
            late.extend(spans)
        return late

    def _export_all(self, spans: Sequence[Span]) -> None:
        for span in spans:
            self._export.on_end(self._readable(span))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is still undecided (a draining process would otherwise lose
        the early spans of requests another service has yet to end), within
        ``timeout_s`` when the collector is slow or gone."""
        with self._lock:
            held = [s for _, spans in self._pending.values() for s in spans]
            self._pending.clear()
            self._n_pending = 0
        self._export_all(held)
        self._export.force_flush(int(timeout_s * 1000))
        self._export.shutdown()


def _to_readable(resource: Resource) -> Any:
    """How a kept span record becomes the SDK's ReadableSpan, for its exporters."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    import inferbus

    scope = InstrumentationScope("inferbus", inferbus.__version__)
    sampled = TraceFlags(TraceFlags.SAMPLED)
    ok = Status(StatusCode.UNSET)

    def readable(span: Span) -> ReadableSpan:
        parent = None
        if span.parent is not None:
            parent = SpanContext(span.trace_id, span.parent.span_id, span.parent.remote, sampled)
        return ReadableSpan(
            name=span.name,
            context=SpanContext(span.trace_id, span.span_id, False, sampled),
            parent=parent,
            resource=resource,
            attributes=span.attributes,
            kind=SpanKind[span.kind.upper()],
            status=Status(StatusCode.ERROR, span.error) if span.error else ok,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=scope,
        )

    return readable


def trace_id_hex(trace_id: int) -> str:
    return format(trace_id, "032x")


class Tracing:
    """This process's tracing: stage spans, context in and out of NATS headers, and
    the end-of-request decision. Disabled, it records nothing and costs nothing."""

    def __init__(
        self, service: str, policy: TracePolicy, sampler: TailSampler | None = None
    ) -> None:
        self.service = service
        self.policy = policy
        self.enabled = sampler is not None
        self.sampler = sampler
        self._nc: Any = None
        self._sub: Any = None
        self._outbox: list[tuple[Key, bool]] = []
        self._flusher: asyncio.Task[None] | None = None

    @classmethod
    def disabled(cls, service: str = "") -> Tracing:
        return cls(service, TracePolicy())

    @classmethod
    def with_exporter(
        cls,
        service: str,
        policy: TracePolicy,
        exporter: SpanExporter,
        instance: str = "",
        export: SpanProcessor | None = None,
    ) -> Tracing:
        """Tracing into ``exporter`` through a tail sampler (tests pass an in-memory
        exporter and a simple processor as ``export``)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        import inferbus

        resource = Resource.create(
            {
                "service.name": os.environ.get("OTEL_SERVICE_NAME") or f"inferbus-{service}",
                "service.namespace": "inferbus",
                "service.instance.id": instance,
                "service.version": inferbus.__version__,
            }
        )
        sampler = TailSampler(export or BatchSpanProcessor(exporter), policy, service, resource)
        return cls(service, policy, sampler)

    # -- context in NATS headers -----------------------------------------------------

    def parent(self, headers: Mapping[str, str] | None) -> TraceParent | None:
        """The trace context a message carries (None: none, or tracing is off)."""
        if not self.enabled or not headers:
            return None
        return TraceParent.parse(headers)

    @staticmethod
    def trace_id(parent: TraceParent | None) -> int:
        return parent.trace_id if parent is not None else 0

    @staticmethod
    def headers(span_or_parent: Span | TraceParent) -> dict[str, str]:
        """``traceparent``/``tracestate`` naming this span (or context) as the parent."""
        ctx = span_or_parent.context if isinstance(span_or_parent, Span) else span_or_parent
        return ctx.headers()

    # -- spans -------------------------------------------------------------------------

    def start(
        self,
        name: str,
        parent: TraceParent | None = None,
        attributes: Mapping[str, Any] | None = None,
        start_ns: int | None = None,
        kind: str = "internal",
    ) -> Span:
        """A live span, ended by the caller (``span.end(error)``); tracing on only.
        ``kind``: OpenTelemetry's SpanKind by name (``server``, ``internal``...)."""
        assert self.sampler is not None, "start spans only with tracing on"
        return Span(self.sampler, name, parent, attributes, start_ns, kind, live=True)

    def record(
        self,
        name: str,
        parent: TraceParent | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        error: str = "",
        kind: str = "internal",
    ) -> Span | None:
        """A span of a stage that is already over (times in Unix nanoseconds)."""
        if self.sampler is None:
            return None
        span = Span(self.sampler, name, parent, attributes, start_ns, kind)
        span.end(error, end_ns)
        return span

    # -- the end-of-request decision -----------------------------------------------------

    async def listen(self, nc: Any) -> None:
        """Follow every service's decisions (and keep ``nc`` to publish our own)."""
        self._nc = nc
        if self.enabled:
            self._sub = await nc.subscribe(TRACE_DECIDED, cb=self._on_decided)
            self._flusher = asyncio.create_task(self._flush_forever(), name="trace-decisions")

    async def _on_decided(self, msg: Any) -> None:
        try:
            d = decode(msg.data, TraceDecided)
            decided = [((int(r.trace_id, 16), r.request_id), True) for r in d.kept]
            decided += [((int(r.trace_id, 16), r.request_id), False) for r in d.dropped]
        except (*DecodeError, ValueError) as exc:
            log.warning("undecodable trace decision", error=str(exc))
            return
        assert self.sampler is not None
        for key, keep in decided:
            self.sampler.decide(key, keep)

    def end_request(
        self,
        parent: TraceParent | None,
        *,
        request_id: str,
        failed: bool,
        e2e_s: float,
        ttft_s: float | None = None,
        tell: str = "all",
    ) -> tuple[bool, str] | None:
        """Decide the request's trace from how it ended and apply it here; the other
        services hear of it with the next batch. None when tracing is off or the
        request carries no trace. ``tell``:

        - ``all``: the service that ended the request;
        - ``keeps``: a second opinion (the gateway, after the service that ended the
          request decided): only a keep the first did not make goes out;
        - ``none``: a request only this process ever held spans of (refused before
          it went anywhere): another request may share its key."""
        tid = self.trace_id(parent)
        if not tid or self.sampler is None:
            return None
        keep, reason = verdict(
            failed=failed, e2e_s=e2e_s, ttft_s=ttft_s, trace_id=tid, policy=self.policy
        )
        key = (tid, request_id)
        if tell == "keeps" and (not keep or self.sampler.decision(key)):
            return keep, reason
        self.sampler.decide(key, keep, own=True)
        if tell != "none":
            self._outbox.append((key, keep))
        return keep, reason

    @staticmethod
    def log_fields(parent: TraceParent | None, decision: tuple[bool, str] | None) -> dict[str, str]:
        """The trace's part of a request's log line: its id, and what was decided."""
        return {
            "trace_id": trace_id_hex(parent.trace_id) if parent is not None else "",
            "trace": f"{'kept' if decision[0] else 'dropped'}: {decision[1]}"
            if decision
            else "off",
        }

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.policy.publish_interval_s)
            try:
                await self.flush()
                if self.sampler is not None:
                    self.sampler.sweep()
            except Exception:
                log.exception("trace decisions not published")

    async def flush(self) -> None:
        if not self._outbox or self._nc is None or not self._nc.is_connected:
            if len(self._outbox) > _OUTBOX_MAX:  # cut off a while: keep the newest
                del self._outbox[:-_OUTBOX_MAX]
            return
        batch, self._outbox = self._outbox, []
        for i in range(0, len(batch), _DECISIONS_PER_MESSAGE):  # well under max_payload
            part = batch[i : i + _DECISIONS_PER_MESSAGE]
            await self._nc.publish(
                TRACE_DECIDED,
                encode(
                    TraceDecided(
                        kept=[
                            DecidedRequest(trace_id=trace_id_hex(t), request_id=r)
                            for (t, r), keep in part
                            if keep
                        ],
                        dropped=[
                            DecidedRequest(trace_id=trace_id_hex(t), request_id=r)
                            for (t, r), keep in part
                            if not keep
                        ],
                        service=self.service,
                    )
                ),
            )

    async def close(self) -> None:
        """Tell the others what was decided here, then export what is still held
        (off the event loop, bounded: a gone collector must not hold up the drain)."""
        if self._flusher is not None:
            self._flusher.cancel()
        try:
            await self.flush()
            if self._sub is not None:
                await self._sub.unsubscribe()
        except Exception:
            pass
        if self.sampler is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.sampler.shutdown), 6.0)
            except TimeoutError:
                log.warning("spans still unexported at shutdown: the collector is slow")


def enabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter and exporter not in ("otlp", "console"):
        if exporter != "none":
            log.warning(
                "OTEL_TRACES_EXPORTER names an exporter inferbus does not ship; "
                "tracing stays off (otlp and console are supported)",
                exporter=exporter,
            )
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _exporter_from_env() -> SpanExporter:
    """The exporter the standard variables name: OTLP (http/protobuf, or gRPC where
    its package is installed and OTEL_EXPORTER_OTLP_PROTOCOL says grpc) or console."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter()
        except ImportError:
            log.warning(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; "
                "exporting over HTTP instead"
            )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself


def setup(service: str, policy: TracePolicy, instance: str = "") -> Tracing:
    """This process's tracing, from the standard OpenTelemetry variables."""
    if not enabled_by_env():
        return Tracing.disabled(service)
    tracing = Tracing.with_exporter(service, policy, _exporter_from_env(), instance)
    log.info(
        "tracing on",
        slow_s=policy.slow_s,
        keep_ratio=policy.keep_ratio,
        endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
    )
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
KV_RESTORED_TOKENS = "inferbus.kv.restored_tokens"
KV_RESTORED_BYTES = "inferbus.kv.restored_bytes"
KV_RESTORED_TIERS = "inferbus.kv.restored_tiers"
KV_RESTORE_FAILED_BLOCKS = "inferbus.kv.restore_failed_blocks"
KV_RESTORE_TIMED = "inferbus.kv.restore_timed"
"""False: the span's length is unknown (the request ended in its restore's step)."""
