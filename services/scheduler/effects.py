"""What the scheduler's core asks its adapter to do: assign, fail, cancel, refuse,
supersede, hand off, tell an end again."""

from __future__ import annotations

import msgspec

from inferbus.contracts import FailureCode, RequestSubmitted, Resume, Terminal, is_retryable


class Assign(msgspec.Struct, kw_only=True, frozen=True):
    worker_id: str
    request: RequestSubmitted
    attempt: int
    served_model: str = ""
    """Set when a canary sends the request to another model name."""
    migratable: bool = False
    """The worker is to send progress: the request can move if the worker is lost."""
    resume: Resume | None = None
    """A continuation: where the stream of the lost attempt stopped."""
    cause: str = ""
    """Why a continuation moved (``lost``, ``stopped``, ``failed``)."""
    lease_s: float = 0.0
    """The silence after which a migratable request moves (``stream_silence_s``)."""
    # diagnostics, for the trace and metrics
    lane: str = ""
    queued_s: float = 0.0
    """How long it waited in this scheduler's queue (this attempt)."""
    prefix_blocks: int = 0
    cached_blocks: int = 0
    """Of its prefix blocks, how many the chosen worker was known to hold (in its
    engine's cache or, to restore, in a KV spill tier)."""
    cached_tokens: int = 0
    """The prompt tokens those blocks stand for."""


class Fail(msgspec.Struct, kw_only=True, frozen=True):
    request: RequestSubmitted
    code: str
    """A ``FailureCode``."""
    reason: str
    retryable: bool = False
    served_model: str = ""
    """The name it ran under when its worker was lost (a canary's version counts it)."""
    retry_after_s: float = 0.0

    @classmethod
    def of(
        cls,
        request: RequestSubmitted,
        code: FailureCode,
        reason: str,
        served_model: str = "",
        retry_after_s: float = 0.0,
    ) -> Fail:
        """Retryable as the contract's table says for ``code``."""
        return cls(
            request=request,
            code=code,
            reason=reason,
            retryable=is_retryable(code),
            served_model=served_model,
            retry_after_s=retry_after_s,
        )


class Cancel(msgspec.Struct, kw_only=True, frozen=True):
    request: RequestSubmitted
    reason: str


class Refuse(msgspec.Struct, kw_only=True, frozen=True):
    """Answer only this copy's sender: another request with the same id lives or lived
    (its record is not touched)."""

    request: RequestSubmitted
    code: str
    reason: str


class Supersede(msgspec.Struct, kw_only=True, frozen=True):
    """Tell ``worker_id`` to stop ``attempt`` of the request, given up on when the worker
    was presumed lost: if it was only stalled, it must not go on with it."""

    request: RequestSubmitted
    worker_id: str
    attempt: int


class HandOff(msgspec.Struct, kw_only=True, frozen=True):
    """A partitioned scheduler's queued request for a model it has no worker for while
    another partition has: accepted again there (and no longer this one's)."""

    request: RequestSubmitted


class Retell(msgspec.Struct, kw_only=True, frozen=True):
    """Send ``end``, already recorded on ``ib.req.ended``, to the request's reader: the
    worker that recorded it fell silent before it said it had sent it. Not recorded
    again; a reader told twice keeps the first (the sanitizer drops a repeat)."""

    request: RequestSubmitted
    end: Terminal
    restored: bool = False
    """Kept from the records at a restore or handover, not read live: most were told
    long ago (a worker gone before the restart repeats its last ends), so they are
    counted apart (``retold_restored``) and a ``retold`` alert stays meaningful."""


Effect = Assign | Fail | Cancel | Refuse | Supersede | HandOff | Retell
