"""The ranges of the sampling parameters, declared once: the gateway's request types
are annotated with them (msgspec refuses what falls outside while decoding the HTTP
body) and the sanitizer holds every request to them, whichever way it came (a NATS
client never passed through the gateway). msgspec and the standard library only."""

from __future__ import annotations

from typing import Any

import msgspec

from .events import SamplingParams

I32 = 2**31 - 1
MAX_N = 128
"""Choices one request may ask for (OpenAI's limit)."""
MAX_LOGPROBS = 20
"""Alternatives per token (vLLM's default ``max_logprobs``; OpenAI's is 20 too)."""


class Range(msgspec.Struct, frozen=True, kw_only=True):
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """``low`` itself is outside (top_p > 0)."""

    def meta(self) -> msgspec.Meta:
        """The constraint as msgspec checks it while decoding."""
        bounds: dict[str, Any] = {}
        if self.low is not None:
            bounds["gt" if self.low_open else "ge"] = self.low
        if self.high is not None:
            bounds["le"] = self.high
        return msgspec.Meta(**bounds)

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        low = "" if self.low is None else _number(self.low)
        if self.high is None:
            return f"greater than {low}" if self.low_open else f"at least {low}"
        high = _number(self.high)
        if self.low is None:
            return f"at most {high}"
        return f"in ({low}, {high}]" if self.low_open else f"between {low} and {high}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


SAMPLING_RANGES: dict[str, Range] = {
    "temperature": Range(low=0.0, high=2.0),
    "top_p": Range(low=0.0, high=1.0, low_open=True),
    "top_k": Range(low=-1, high=I32),
    "presence_penalty": Range(low=-2.0, high=2.0),
    "frequency_penalty": Range(low=-2.0, high=2.0),
    "repetition_penalty": Range(low=0.0, low_open=True),
    "n": Range(low=1, high=MAX_N),
    "min_p": Range(low=0.0, high=1.0),
    "min_tokens": Range(low=0, high=I32),
    "logprobs": Range(low=0, high=MAX_LOGPROBS),
    "prompt_logprobs": Range(low=0, high=MAX_LOGPROBS),
    "truncate_prompt_tokens": Range(low=-1, high=I32),
}
"""OpenAI's ranges (temperature, top_p, the penalties, n) and vLLM's (top_k: -1 or 0
is no cut; repetition_penalty above 0; min_p; logprobs up to its ``max_logprobs``), by
``SamplingParams`` field. A field left None is not checked."""


def out_of_range(params: SamplingParams) -> tuple[str, str] | None:
    """The first parameter outside its range, or not allowed with the others, and why;
    None when all hold."""
    for name, allowed in SAMPLING_RANGES.items():
        value = getattr(params, name)
        if value is not None and not allowed.holds(value):
            return name, f"{name} must be {allowed.describe()}, got {value}"
    if params.min_tokens > params.max_tokens:
        return "min_tokens", (
            f"min_tokens ({params.min_tokens}) must not exceed max_tokens ({params.max_tokens})"
        )
    if params.structured is not None:
        kinds = params.structured.kinds()
        if len(kinds) != 1:
            return "structured_outputs", (
                "give exactly one structured-output constraint (json_schema, json_object, "
                f"regex, choice, grammar or structural_tag), got {len(kinds)}"
                + (f": {', '.join(kinds)}" if kinds else "")
            )
    return None
