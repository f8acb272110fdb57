"""The codes a request's end can carry, once: name, HTTP status, retryable, meaning.

``RequestFailed.code`` and ``RequestRejected.code`` stay typed ``str`` on the wire: a
new value in an enum is a breaking change for older readers, so a reader meets a code
it does not know as a plain string (``http_status`` answers 500 for it, and
``RequestFailed.retryable`` says whether to retry). ``FailureCode`` is what producers
write: a ``StrEnum`` member is a ``str`` and msgspec encodes it as the string.

``cancelled`` and ``timeout`` name outcomes without a code on the bus: a
``request.cancelled`` event, and no terminal event in time; the gateway and the Python
client report them under these codes. Errors the gateway raises on its own over HTTP
(``invalid_api_key``, ``rate_limit_exceeded``, ``invalid_json``...) never travel on
the bus and are not listed here.

docs/nats-api.md ("Failure codes") documents this table; a unit test keeps the two
the same.
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast

import msgspec

from .events import RequestFailed

__all__ = [
    "FAILURES",
    "Failure",
    "FailureCode",
    "failure",
    "http_status",
    "is_retryable",
    "request_failed",
]


class FailureCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    PROMPT_TOO_LONG = "prompt_too_long"
    INPUT_BLOCKED = "input_blocked"
    OUTPUT_BLOCKED = "output_blocked"
    QUEUE_FULL = "queue_full"
    RATE_LIMITED = "rate_limited"
    QUEUE_TIMEOUT = "queue_timeout"
    OVERLOADED = "overloaded"
    NO_WORKER = "no_worker"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    WORKER_LOST = "worker_lost"
    WORKER_SHUTDOWN = "worker_shutdown"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNSUPPORTED_BY_ENGINE = "unsupported_by_engine"
    MODEL_NOT_FOUND = "model_not_found"
    ENGINE_ERROR = "engine_error"
    DUPLICATE_REQUEST = "duplicate_request"
    PERMISSION_DENIED = "permission_denied"
    BUS_UNAVAILABLE = "bus_unavailable"
    STREAM_INTERRUPTED = "stream_interrupted"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"


class Failure(msgspec.Struct, kw_only=True, frozen=True):
    http_status: int
    """The gateway's HTTP status for it."""
    retryable: bool
    """The same request may succeed later (submitted again, with a new request id)."""
    meaning: str


FAILURES: dict[FailureCode, Failure] = {
    FailureCode.INVALID_REQUEST: Failure(
        http_status=400,
        retryable=False,
        meaning="bad shape or sampling values, JSON that does not decode, or parameters "
        "the engine refuses",
    ),
    FailureCode.PROMPT_TOO_LONG: Failure(
        http_status=400,
        retryable=False,
        meaning="the prompt has more characters than the deployment accepts",
    ),
    FailureCode.INPUT_BLOCKED: Failure(
        http_status=400,
        retryable=False,
        meaning="the input matched an injection rule under the block policy",
    ),
    FailureCode.OUTPUT_BLOCKED: Failure(
        http_status=400,
        retryable=False,
        meaning="a tool call's arguments carried PII the request's own messages never gave, "
        "under the refuse tool-call policy: the stream ends before the call is complete",
    ),
    FailureCode.QUEUE_FULL: Failure(
        http_status=429,
        retryable=True,
        meaning="the model's queue is at its limit; back off",
    ),
    FailureCode.RATE_LIMITED: Failure(
        http_status=429,
        retryable=True,
        meaning="a tenant's submits weighed more than its bytes per minute; retry after "
        "retry_after_s",
    ),
    FailureCode.OVERLOADED: Failure(
        http_status=429,
        retryable=True,
        meaning="the model's workers would not start it within its latency objective "
        "(or its deadline); refused at once: retry after Retry-After, or elsewhere",
    ),
    FailureCode.QUEUE_TIMEOUT: Failure(
        http_status=503,
        retryable=True,
        meaning="workers for the model exist but stayed busy for the queue timeout",
    ),
    FailureCode.NO_WORKER: Failure(
        http_status=503,
        retryable=True,
        meaning="no worker serving the model is ready (or appeared within the queue timeout)",
    ),
    FailureCode.DEADLINE_EXCEEDED: Failure(
        http_status=504,
        retryable=False,
        meaning="the request's deadline passed before queueing, while queued or generating",
    ),
    FailureCode.WORKER_LOST: Failure(
        http_status=503,
        retryable=True,
        meaning="the worker vanished after streaming began and the stream could not move "
        "to another worker (the reason says why), or on every attempt",
    ),
    FailureCode.WORKER_SHUTDOWN: Failure(
        http_status=503,
        retryable=True,
        meaning="the worker stopped before the request finished",
    ),
    FailureCode.CONTEXT_LENGTH_EXCEEDED: Failure(
        http_status=400,
        retryable=False,
        meaning="prompt tokens plus max_tokens exceed the model's context",
    ),
    FailureCode.UNSUPPORTED_BY_ENGINE: Failure(
        http_status=400,
        retryable=False,
        meaning="the worker's engine cannot honour a parameter the request set: an output "
        "constraint on the sim engine, or a structured-output option vLLM takes per engine",
    ),
    FailureCode.MODEL_NOT_FOUND: Failure(
        http_status=404,
        retryable=False,
        meaning="no worker serves the model, or the worker's engine does not have it",
    ),
    FailureCode.ENGINE_ERROR: Failure(
        http_status=500,
        retryable=False,
        meaning="the engine failed; the reason has the detail",
    ),
    FailureCode.DUPLICATE_REQUEST: Failure(
        http_status=409,
        retryable=False,
        meaning="the request id was already used for another request",
    ),
    FailureCode.PERMISSION_DENIED: Failure(
        http_status=403,
        retryable=False,
        meaning="the tenant's record does not allow it: no record, revoked, or a model or "
        "max_tokens outside its scope",
    ),
    FailureCode.BUS_UNAVAILABLE: Failure(
        http_status=503,
        retryable=True,
        meaning="the connection to NATS dropped while the request was in flight: what "
        "was streamed meanwhile is lost",
    ),
    FailureCode.STREAM_INTERRUPTED: Failure(
        http_status=503,
        retryable=True,
        meaning="part of the output was lost on its way (the output filter restarted): the "
        "text is incomplete",
    ),
    FailureCode.CANCELLED: Failure(
        http_status=499,
        retryable=False,
        meaning="the request was cancelled (request.cancelled)",
    ),
    FailureCode.TIMEOUT: Failure(
        http_status=504,
        retryable=False,
        meaning="no terminal event came within the client's or the gateway's wait",
    ),
}


def failure(code: str) -> Failure | None:
    """The table's row for ``code`` (a ``FailureCode`` or its string), None when unknown."""
    # a FailureCode hashes and compares as its string: the table answers either
    return FAILURES.get(cast(FailureCode, code))


def http_status(code: str, default: int = 500) -> int:
    """The HTTP status for ``code``; ``default`` (500) for a code this table lacks."""
    f = failure(code)
    return f.http_status if f is not None else default


def is_retryable(code: str) -> bool:
    """Whether ``code`` means the same request may succeed later; False when unknown."""
    f = failure(code)
    return f is not None and f.retryable


def request_failed(request_id: str, code: str, reason: str) -> RequestFailed:
    """The ``request.failed`` event for ``code`` (a ``FailureCode``; a string such as an
    engine's error code is taken as it is), retryable as the table says."""
    return RequestFailed(
        request_id=request_id, code=code, reason=reason, retryable=is_retryable(code)
    )
