"""Tail sampling: the keep-or-drop rule (:func:`verdict`), the spans a process records
(:class:`Span`) and the sampler that holds them per request until it is decided
(:class:`TailSampler`). No I/O: the sampler hands kept spans to an exporter."""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from inferbus.shared import logs, metrics

from .attributes import REQUEST_ID
from .context import TraceParent

if TYPE_CHECKING:  # the SDK is imported only where tracing is on: no start-up cost off
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor

log = logs.get("inferbus.tracing")

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
