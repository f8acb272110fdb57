"""The sanitizer's input decisions, free of I/O.

For now: request shape and prompt size limits, enforced for every entry (the
gateway validates HTTP, but NATS clients reach the sanitizer directly). Injection
detectors and output PII masking join here later.
"""

from __future__ import annotations

import re

import msgspec

from inferbus.contracts import RequestRejected, RequestSubmitted


# dot-separated tokens without whitespace or wildcards
_PUBLISH_SUBJECT = re.compile(r"[^.\s*>]+(\.[^.\s*>]+)*")


class InputLimits(msgspec.Struct, kw_only=True, frozen=True):
    max_prompt_chars: int = 32_768
    max_tokens: int = 32_768
    max_messages: int = 1_024


def prompt_chars(request: RequestSubmitted) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    return len(request.prompt or "")


def check(request: RequestSubmitted, limits: InputLimits) -> RequestRejected | None:
    """``None`` when the request may go on, else the rejection to send back."""

    def reject(code: str, reason: str, param: str | None = None) -> RequestRejected:
        return RequestRejected(request_id=request.request_id, code=code, reason=reason,
                               param=param)

    if not request.request_id or not request.model:
        return reject("invalid_request", "request_id and model must not be empty", "model")
    if not _PUBLISH_SUBJECT.fullmatch(request.reply_to):
        return reject("invalid_request",
                      f"reply_to {request.reply_to!r} is not a subject one can publish to",
                      "reply_to")
    if (request.prompt is None) == (request.messages is None):
        return reject("invalid_request", "give exactly one of prompt or messages", "messages")
    if request.messages is not None:
        if not request.messages:
            return reject("invalid_request", "messages must not be empty", "messages")
        if len(request.messages) > limits.max_messages:
            return reject("invalid_request",
                          f"{len(request.messages)} messages; at most {limits.max_messages}",
                          "messages")
    s = request.sampling
    if not 1 <= s.max_tokens <= limits.max_tokens:
        return reject("invalid_request",
                      f"max_tokens must be between 1 and {limits.max_tokens}, got {s.max_tokens}",
                      "max_tokens")
    if not 0.0 <= s.temperature <= 2.0:
        return reject("invalid_request", "temperature must be between 0 and 2", "temperature")
    if not 0.0 < s.top_p <= 1.0:
        return reject("invalid_request", "top_p must be in (0, 1]", "top_p")
    size = prompt_chars(request)
    if size > limits.max_prompt_chars:
        return reject(
            "prompt_too_long",
            f"the prompt has {size} characters; this deployment accepts at most "
            f"{limits.max_prompt_chars}",
            "messages" if request.messages is not None else "prompt",
        )
    return None
