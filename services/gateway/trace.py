"""One HTTP request's trace: the root span and the gateway's three stages
(receive, first token, stream out). With tracing off every call is a no-op."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from inferbus.contracts import RequestFinished, SamplingParams
from inferbus.shared.tracing import Tracing, valid_context
from inferbus.shared.tracing import attributes as t

_NS = 1_000_000_000


class HttpTrace:
    __slots__ = (
        "context",
        "first_ns",
        "headers",
        "model",
        "op",
        "request_id",
        "root",
        "submitted",
        "submitted_ns",
        "t0",
        "tracing",
    )

    def __init__(
        self, tracing: Tracing, incoming: Mapping[str, str], request_id: str, chat: bool
    ) -> None:
        """``incoming``: the HTTP headers (a client's own ``traceparent`` is the parent)."""
        self.tracing = tracing
        self.t0 = time.time_ns()
        self.op = op = "chat" if chat else "text_completion"
        self.root = tracing.start(
            op,
            tracing.parent(incoming),
            {
                t.GEN_AI_OPERATION: op,
                t.GEN_AI_PROVIDER: "inferbus",
                t.REQUEST_ID: request_id,
                t.GEN_AI_RESPONSE_ID: request_id,
            },
            self.t0,
            "server",
        )
        self.context = self.root.context
        self.headers = self.context.headers()
        self.submitted_ns = self.first_ns = 0
        self.model = ""
        self.submitted = False
        self.request_id = request_id

    def describe(self, model: str, sampling: SamplingParams, tenant: str, stream: bool) -> None:
        self.model = model
        self.root.update_name(f"{self.op} {model}")  # gen_ai: "{operation} {model}"
        self.root.set_attributes(
            {
                t.GEN_AI_REQUEST_MODEL: model,
                t.GEN_AI_MAX_TOKENS: sampling.max_tokens,
                t.GEN_AI_TEMPERATURE: sampling.temperature,
                t.GEN_AI_TOP_P: sampling.top_p,
                t.TENANT: tenant,
                "inferbus.stream": stream,
            }
        )

    def on_submitted(self) -> None:
        """Parsed, checked, admitted and published: the receive stage is over."""
        self.submitted = True
        self.submitted_ns = time.time_ns()
        self.tracing.record(
            "gateway receive", self.context, self.t0, self.submitted_ns, self._attributes()
        )

    def on_first_token(self) -> None:
        if not self.first_ns:
            self.first_ns = time.time_ns()
            self.tracing.record(
                "first token",
                self.context,
                self.submitted_ns or self.t0,
                self.first_ns,
                self._attributes(),
            )

    def _attributes(self) -> dict[str, Any]:
        return {t.REQUEST_ID: self.request_id, t.GEN_AI_REQUEST_MODEL: self.model}

    def on_finished(self, ev: RequestFinished) -> None:
        self.root.set_attributes(
            {
                t.GEN_AI_RESPONSE_MODEL: self.model,
                t.GEN_AI_INPUT_TOKENS: ev.usage.prompt_tokens,
                t.GEN_AI_OUTPUT_TOKENS: ev.usage.completion_tokens,
                t.GEN_AI_FINISH_REASONS: [ev.finish_reason],
                t.CACHED_PREFIX_TOKENS: ev.usage.cached_prompt_tokens,
                t.WORKER: ev.worker_id,
            }
        )

    def end(self, status: int, error: str = "") -> None:
        """The response is written (or refused): close the spans and, when the gateway
        saw more than the service that ended the request (a failure of its own, a
        slow stream out), ask for the trace to be kept."""
        if not self.tracing.enabled:
            return
        end_ns = time.time_ns()
        if self.first_ns:
            self.tracing.record(
                "stream out", self.context, self.first_ns, end_ns, self._attributes()
            )
        self.root.set_attribute("http.response.status_code", status)
        self.root.end(error, end_ns)
        e2e = (end_ns - self.t0) / _NS
        ttft = (self.first_ns - self.t0) / _NS if self.first_ns else None
        # failed: the platform's fault (5xx); a refusal (4xx, or 503: draining, no
        # worker) or a client gone (499) is kept as any other request (slow, or in
        # the kept share)
        failed = status >= 500 and not (status == 503 and not self.submitted)
        # submitted: the platform ended it and decided, this is a second opinion;
        # refused here: only this process holds spans of it, no one else to tell
        self.tracing.end_request(
            self.context,
            request_id=self.request_id,
            failed=failed,
            e2e_s=e2e,
            ttft_s=ttft,
            tell="keeps" if self.submitted else "none",
        )


class NoTrace:
    """Tracing off: a client's own trace context still passes through."""

    __slots__ = ("headers", "submitted")

    def __init__(self, incoming: Mapping[str, str]) -> None:
        self.headers = dict(incoming)
        self.submitted = False

    def describe(self, *_: Any, **__: Any) -> None:
        pass

    def on_submitted(self) -> None:
        self.submitted = True

    def on_first_token(self) -> None:
        pass

    def on_finished(self, _: RequestFinished) -> None:
        pass

    def end(self, status: int, error: str = "") -> None:
        pass


def http_trace(
    tracing: Tracing, incoming: Mapping[str, str], request_id: str, chat: bool
) -> HttpTrace | NoTrace:
    # only a well-formed context goes on (a client's bytes never reach NATS headers)
    carrier = valid_context(incoming)
    if tracing.enabled:
        return HttpTrace(tracing, carrier, request_id, chat)
    return NoTrace(carrier)
