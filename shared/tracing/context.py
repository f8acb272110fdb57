"""W3C trace context as it travels in NATS headers (``traceparent``, ``tracestate``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

# version 00 is exactly this; a later version may append fields after a "-"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,512}")


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


def trace_id_hex(trace_id: int) -> str:
    return format(trace_id, "032x")
