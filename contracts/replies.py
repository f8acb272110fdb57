"""Reading a request's reply stream: one rule for every reader.

A request's replies are token chunks, then one terminal event. When the scheduler
reassigns a request, the new worker's events carry ``attempt`` + 1 with ``seq``
restarting at 0, and a worker presumed lost may still be talking. So a reader keeps
the newest attempt it has seen: an older attempt's chunks, its ``request.finished``
and its worker's failure are ignored. A terminal event tied to no attempt (the
scheduler's, the sanitizer's: ``attempt`` 0) ends the stream whatever came before.

A continuation (a request migrated off a lost worker mid-stream) is a newer attempt
whose events say ``resumed``: its ``seq`` goes on from the earlier attempt's, so the
reader keeps the text it has and drops a chunk whose ``seq`` it has already seen (the
new worker sends the last chunk the scheduler knew of again, in case it was lost).

Pure (msgspec and the standard library), so a client can vendor it with the rest of
the contracts; the gateway, the Python client, the sanitizer's output filter and
docs/examples/nats_client.py all read replies through it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .events import (
    ReplyEvent,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestRejected,
    TokenChunk,
)
from .failures import FailureCode, request_failed

__all__ = ["Reading", "ReplyEnd", "ReplyReader", "merge_chunks"]

ReplyEnd = RequestFinished | RequestFailed | RequestCancelled | RequestRejected


class Reading(msgspec.Struct, kw_only=True, frozen=True):
    """What one or more reply events mean for the reader's client."""

    chunks: tuple[TokenChunk, ...] = ()
    """Text to pass on: one chunk a choice (the chunks of a choice read together
    merged into one), in the order the choices first spoke."""
    end: ReplyEnd | None = None
    """The stream is over: pass this on after ``chunk``."""
    restarted: bool = False
    """A newer attempt began after an older one's text was passed on: that text is
    void and the newer attempt's starts over. A reader that can take it back (a
    buffer) clears it; one that cannot (a stream already sent on) fails the request
    as ``stream_interrupted``: ``ReplyReader.interrupted`` builds that event."""

    @property
    def interrupts(self) -> bool:
        """A reader that cannot take sent text back must end ``stream_interrupted``: a
        restart, unless the newer attempt ended in a failure of its own (that failure is
        the answer, with its own code)."""
        failed = self.end is not None and not isinstance(self.end, RequestFinished)
        return self.restarted and not failed


def merge_chunks(a: TokenChunk, b: TokenChunk) -> TokenChunk:
    """``b`` appended to ``a`` (of the same choice): one chunk with both texts, token
    counts, logprobs, tool-call pieces and reasoning (every field a chunk carries: a
    merge that dropped one lost tool calls whenever replies piled up)."""
    return TokenChunk(
        request_id=a.request_id,
        seq=a.seq,
        text=a.text + b.text,
        token_ids=a.token_ids + b.token_ids,
        attempt=a.attempt,
        n_tokens=a.n_tokens + b.n_tokens,
        index=a.index,
        logprobs=a.logprobs + b.logprobs if b.logprobs else a.logprobs,
        tool_calls=a.tool_calls + b.tool_calls if b.tool_calls else a.tool_calls,
        reasoning=a.reasoning + b.reasoning,
        resumed=a.resumed,
        resumed_from=a.resumed_from,
    )


class ReplyReader:
    """One request's reply stream, read by the newest-attempt rule.

    ``whole``: a finished stream that lost chunks on the way ends as
    ``stream_interrupted`` (what a client wants); without it the finish passes on
    and ``lost`` says how many went missing (what a relay such as the sanitizer's
    filter wants, to tell its own reader)."""

    __slots__ = (
        "attempt",
        "ended",
        "lost",
        "next_seq",
        "passed",
        "received",
        "request_id",
        "resumed",
        "whole",
    )

    def __init__(self, request_id: str, *, whole: bool = True) -> None:
        self.request_id = request_id
        self.whole = whole
        self.attempt = 0
        """The newest attempt seen (0: none yet)."""
        self.next_seq = 0
        """The chunk number expected next from that attempt."""
        self.received = 0
        """That attempt's chunks that arrived."""
        self.lost = 0
        """That attempt's chunks that never arrived (gaps in ``seq``, and chunks its
        ``request.finished`` counts that never came)."""
        self.passed = 0
        """Chunks passed on since the reader started or last restarted."""
        self.resumed = False
        """The newest attempt continues an earlier one's stream (a migration)."""
        self.ended = False

    def read(self, event: ReplyEvent) -> Reading:
        return self.read_all((event,))

    def read_all(self, events: Iterable[ReplyEvent]) -> Reading:
        """Events in arrival order, as one ``Reading``: the current attempt's chunks
        merged, then its end if one came. Whatever follows the end is ignored."""
        chunks: dict[int, TokenChunk] = {}
        restarted = False
        for event in events:
            if self.ended:
                break
            attempt = getattr(event, "attempt", 0)
            if 0 < attempt < self.attempt:
                continue  # a lost attempt's straggler, or its worker's late end
            if attempt > self.attempt:
                if getattr(event, "resumed", False) and not self._ahead_of(event):
                    # a continuation: the text goes on
                    self.attempt, self.resumed = attempt, True
                else:
                    # text of the older attempt not yet passed on is simply dropped
                    restarted = restarted or self.passed > 0
                    self._restart(attempt)
                    chunks = {}
            if isinstance(event, TokenChunk):
                if event.seq < self.next_seq:
                    continue  # seen: a continuation's replay of the last chunk
                self._count(event)
                before = chunks.get(event.index)
                chunks[event.index] = event if before is None else merge_chunks(before, event)
                continue
            self.ended = True
            if chunks:
                self.passed += 1
            return Reading(chunks=tuple(chunks.values()), end=self._end(event), restarted=restarted)
        if chunks:
            self.passed += 1
        return Reading(chunks=tuple(chunks.values()), restarted=restarted)

    def interrupted(self) -> RequestFailed:
        """The end for a reader that cannot take text back when the output restarted."""
        self.ended = True
        return request_failed(
            self.request_id,
            FailureCode.STREAM_INTERRUPTED,
            f"the output restarted on attempt {self.attempt} after part of an earlier "
            "attempt's had been sent; submit the request again",
        )

    def _ahead_of(self, continuation: ReplyEvent) -> bool:
        """Whether this reader holds chunks past where ``continuation`` goes on from:
        text the scheduler never saw, which the continuation sends again cut otherwise
        (joined by ``seq``, tokens would repeat or go missing with no gap to see)."""
        start = getattr(continuation, "resumed_from", None)
        return start is not None and self.next_seq > start

    def _restart(self, attempt: int) -> None:
        self.attempt, self.next_seq, self.received, self.lost, self.passed = (
            attempt,
            0,
            0,
            0,
            0,
        )
        self.resumed = False

    def _count(self, chunk: TokenChunk) -> None:
        if chunk.seq > self.next_seq:
            self.lost += chunk.seq - self.next_seq
        self.next_seq = max(self.next_seq, chunk.seq + 1)
        self.received += 1

    def _end(self, event: ReplyEvent) -> ReplyEnd:
        assert not isinstance(event, TokenChunk)
        if not isinstance(event, RequestFinished):
            return event
        if event.chunks > self.next_seq:
            self.lost += event.chunks - self.next_seq
        if self.whole and self.lost:
            return request_failed(
                self.request_id,
                FailureCode.STREAM_INTERRUPTED,
                f"{self.lost} of the stream's {event.chunks} chunks were lost on the way "
                "(a service on the reply path restarted); submit it again",
            )
        return event
