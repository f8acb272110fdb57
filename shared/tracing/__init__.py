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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inferbus.contracts import TRACE_DECIDED, DecidedRequest, TraceDecided
from inferbus.shared import logs
from inferbus.shared.codec import DecodeError, decode, encode

from .context import TraceParent, trace_id_hex, valid_context
from .export import enabled_by_env, exporter_from_env
from .sampling import Key, Span, TailSampler, TracePolicy, verdict

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "Span",
    "TraceParent",
    "TracePolicy",
    "Tracing",
    "enabled_by_env",
    "setup",
    "trace_id_hex",
    "valid_context",
    "verdict",
]

log = logs.get("inferbus.tracing")

_DECISIONS_PER_MESSAGE = 1000
"""About 200 bytes each with a long request id: a message stays far under 1 MB."""
_OUTBOX_MAX = 100_000


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


def setup(service: str, policy: TracePolicy, instance: str = "") -> Tracing:
    """This process's tracing, from the standard OpenTelemetry variables."""
    if not enabled_by_env():
        return Tracing.disabled(service)
    tracing = Tracing.with_exporter(service, policy, exporter_from_env(), instance)
    log.info(
        "tracing on",
        slow_s=policy.slow_s,
        keep_ratio=policy.keep_ratio,
        endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
    )
    return tracing
