"""Which streaming requests can move to another worker mid-stream, and from where.

A continuation runs the prompt plus the output's token ids so far on a new worker,
which generates on from there. That is the same generation only where nothing but
those ids decides the next token: state kept beside them (a grammar's position, a
tool-call or reasoning parser, counts behind presence and frequency penalties, text
held back for stop strings) would not survive the move, so such requests end
``worker_lost`` as before. Pure: the core and its tests call it.
"""

from __future__ import annotations

from inferbus.contracts import RequestSubmitted, Resume, TokenChunk


def unmovable(request: RequestSubmitted) -> str:
    """Why ``request`` cannot continue on another worker; "" when it can."""
    s = request.sampling
    if request.embed is not None:
        return "an embedding has no stream to continue"
    if s.n != 1:
        return f"it asked for {s.n} choices"
    if s.stop:
        return "stop strings are checked on text the new worker would not hold"
    if s.structured is not None:
        return "an output constraint's position does not move"
    if request.tools is not None and request.tools.choice != "none":
        return "the tool-call parser's state does not move"
    if s.presence_penalty or s.frequency_penalty:
        return "presence and frequency penalties count the output the new worker lacks"
    if s.prompt_logprobs is not None:
        return "prompt logprobs would cover the output streamed so far"
    return ""


class Progress:
    """What one attempt of a migratable request has streamed, from its worker's copies
    of its chunks: the continuation's starting point."""

    __slots__ = (
        "at",
        "finish_reason",
        "gap",
        "last_chunk",
        "migrations",
        "next_seq",
        "output_ids",
    )

    def __init__(self, resume: Resume | None = None) -> None:
        self.output_ids: list[int] = list(resume.output_ids) if resume else []
        self.next_seq = resume.next_seq if resume else 0
        self.last_chunk: TokenChunk | None = resume.last_chunk if resume else None
        self.migrations = resume.migrations if resume else 0
        self.gap = False
        """A copy never came (its worker's connection broke): the ids are incomplete."""
        self.at = 0.0
        """When the last copy came (0: none yet)."""
        self.finish_reason = resume.finish_reason if resume else ""
        """Set once the stream's last chunk came: nothing is left to generate."""

    def add(self, chunk: TokenChunk, now: float = 0.0, finish_reason: str = "") -> None:
        """A chunk of the attempt (an old or repeated ``seq`` changes nothing);
        ``finish_reason``: it is the stream's last."""
        if chunk.seq < self.next_seq:
            return
        self.at = now
        self.finish_reason = finish_reason or self.finish_reason
        if chunk.seq > self.next_seq:
            self.gap = True
        self.output_ids += chunk.token_ids
        self.next_seq = chunk.seq + 1
        self.last_chunk = chunk

    def resume(self, attempt: int) -> Resume:
        """Where a continuation of ``attempt`` picks up."""
        return Resume(
            from_attempt=attempt,
            output_ids=list(self.output_ids),
            next_seq=self.next_seq,
            last_chunk=self.last_chunk,
            migrations=self.migrations + 1,
            finish_reason=self.finish_reason,
        )
