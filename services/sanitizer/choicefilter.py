"""One choice's output through the PII filter: its text masked as a stream, and its
token logprobs held back with the text they spell, so that what was masked in the
text never comes back through a logprob (the token, or an alternative at its
position); its reasoning and each tool call's arguments masked as streams of their
own (arguments as JSON documents). Pure: the filter's core (core.FilteredStream)
keeps one ``ChoiceParts`` per choice."""

from __future__ import annotations

from collections import deque

import msgspec

from inferbus.contracts import TokenChunk, TokenLogprob, ToolCallDelta, TopLogprob

from .pii import Entity, StreamMasker, mask


def _maybe_pii(token: str) -> bool:
    """Whether a token could be an entity by itself: every entity the masker finds has
    an @ or at least four digits (an IPv4 address; cards, phones and IDs have more).
    Tokenizers cut numbers into groups of three digits or fewer, so this is rare."""
    return "@" in token or sum(ch.isdigit() for ch in token) >= 4


class JsonNumbers:
    """Keeps a masked JSON document valid: a masked digit outside a string (a number the
    model wrote, a card number as an integer) becomes a digit, not a ``*``: ``0``, or
    ``9`` where it leads the number (JSON numbers have no leading zeros). The value is
    then another number of about the same size: valid JSON, and valid against a schema
    that asks for an integer or a number without bounds; a schema bounding it may be
    broken (the masked value is not the model's). Inside strings masks stay as they are."""

    __slots__ = ("escaped", "in_number", "in_string")

    def __init__(self) -> None:
        self.in_string = False
        self.escaped = False
        self.in_number = False
        """Inside a number; False before its first digit."""

    def fix(self, text: str) -> str:
        out = []
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string, self.in_number = True, False
            elif ch == "*":
                ch = "0" if self.in_number else "9"
                self.in_number = True
            elif ch.isdigit():
                self.in_number = True
            elif ch not in "-+.eE":
                self.in_number = False
            out.append(ch)
        return "".join(out)


class ChoiceFilter:
    __slots__ = ("_entities_seen", "_json", "_live", "_pending", "masker", "received", "tokens")

    def __init__(self, json_output: bool = False) -> None:
        self._json = JsonNumbers() if json_output else None
        """Set when the output is a JSON document (a JSON constraint): masks keep it one."""
        self.masker = StreamMasker()
        self.received = 0
        """Characters of unmasked text received."""
        self.tokens = 0
        """Tokens received and not yet sent on (they go with the next chunk out)."""
        self._pending: deque[tuple[int, int, TokenLogprob, bool]] = deque()
        """Logprobs not yet sent on, with the span of unmasked text they stand for and
        whether that span is the token's own (else its chunk's)."""
        self._entities_seen = 0
        self._live = 0
        """The first entity that may still overlap a pending logprob (entities come in
        the order of the text, and so do pending spans)."""

    @property
    def entities(self) -> list[Entity]:
        return self.masker.entities

    def new_entities(self) -> list[Entity]:
        """What was masked since the last call."""
        found = self.masker.entities[self._entities_seen :]
        self._entities_seen += len(found)
        return found

    def feed(
        self, text: str, logprobs: list[TokenLogprob], tokens: int
    ) -> tuple[str, list[TokenLogprob]]:
        """(masked text final so far, the logprobs of the text released)."""
        self._hold(text, logprobs)
        self.tokens += tokens
        out = self.masker.feed(text)
        if self._json is not None:
            out = self._json.fix(out)
        return out, self._release(self.received - self.masker.held)

    def flush(self) -> tuple[str, list[TokenLogprob]]:
        out = self.masker.flush()
        if self._json is not None:
            out = self._json.fix(out)
        return out, self._release(self.received)

    def _hold(self, text: str, logprobs: list[TokenLogprob]) -> None:
        start, end = self.received, self.received + len(text)
        self.received = end
        if not logprobs:
            return
        spelled = "".join(lp.token for lp in logprobs)
        if spelled == text:  # each token its own span
            at = start
            for lp in logprobs:
                self._pending.append((at, at + len(lp.token), lp, True))
                at += len(lp.token)
        else:  # the text was held back or cut by the engine (a stop string): the chunk's
            for lp in logprobs:
                self._pending.append((start, end, lp, False))

    def _release(self, upto: int) -> list[TokenLogprob]:
        """The pending logprobs whose text is out by ``upto``, masked where it was."""
        entities = self.masker.entities
        out: list[TokenLogprob] = []
        while self._pending and self._pending[0][1] <= upto:
            start, end, lp, own = self._pending.popleft()
            live = self._live
            while live < len(entities) and entities[live].end <= start:
                live += 1
            self._live = live
            hits = []
            for e in entities[live:]:
                if e.start >= end:
                    break
                hits.append(e)
            out.append(_masked(lp, hits, start, end, own) if hits else _alternatives(lp))
        return out


def _masked(lp: TokenLogprob, hits: list[Entity], start: int, end: int, own: bool) -> TokenLogprob:
    """A token that overlaps masked spans: its text outside them is kept, and the token
    where a span starts stands for the span's masked form (so the tokens still spell
    the masked text); the alternatives at its position are shown as the token, and no
    token id is passed on (it would spell what was masked)."""
    pieces: list[str] = []
    at = start
    for e in sorted(hits, key=lambda e: e.start):
        if own and e.start > at:
            pieces.append(lp.token[at - start : e.start - start])
        if e.start >= start:
            pieces.append(e.masked)
        at = max(at, e.end)
    if own and at < end:
        pieces.append(lp.token[at - start :])
    shown = "".join(pieces)
    return TokenLogprob(
        token=shown,
        logprob=lp.logprob,
        top=[TopLogprob(token=shown, logprob=t.logprob) for t in lp.top],
    )


def _alternatives(lp: TokenLogprob) -> TokenLogprob:
    """A token outside every masked span, with any alternative that is PII on its own
    masked (a token the model did not pick was never part of the text)."""
    if not any(_maybe_pii(t.token) for t in lp.top):
        return lp
    top = []
    for t in lp.top:
        if _maybe_pii(t.token):
            masked, found = mask(t.token)
            if found:
                t = TopLogprob(token=masked, logprob=t.logprob)
        top.append(t)
    return TokenLogprob(token=lp.token, logprob=lp.logprob, token_id=lp.token_id, top=top)


class Filtered(msgspec.Struct, kw_only=True):
    """What may go out of one choice now, masked."""

    text: str = ""
    logprobs: list[TokenLogprob] = []
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = []

    def __bool__(self) -> bool:
        return bool(self.text or self.logprobs or self.reasoning or self.tool_calls)


class ChoiceParts:
    """One choice's parts through the filter: its text (with its logprobs), its
    reasoning, and each tool call's arguments, each masked as a stream of its own: a
    call's arguments are a JSON document (masks keep it one), and what an agent's tool
    would be sent is masked as what a reader would be shown is."""

    __slots__ = ("_calls_checked", "call_args", "calls", "reasoning", "started", "text")

    def __init__(self, json_output: bool = False) -> None:
        self.started = False
        """A chunk of it went out: its first goes at once, empty or not, so that the
        client sees the first token when the engine made it (a parser or the masker
        may hold the text back for a while: a tool call's name, a number)."""
        self.text = ChoiceFilter(json_output)
        self.reasoning: ChoiceFilter | None = None
        self.calls: dict[int, ChoiceFilter] = {}
        self.call_args: dict[int, str] = {}
        """Each call's arguments as the engine wrote them (what its entities index)."""
        self._calls_checked: dict[int, int] = {}

    @property
    def tokens(self) -> int:
        return self.text.tokens

    @tokens.setter
    def tokens(self, value: int) -> None:
        self.text.tokens = value

    def _filters(self) -> list[ChoiceFilter]:
        rest = [self.reasoning] if self.reasoning is not None else []
        return [self.text, *rest, *self.calls.values()]

    def new_entities(self) -> list[Entity]:
        return [e for f in self._filters() for e in f.new_entities()]

    def feed(self, chunk: TokenChunk) -> Filtered:
        text, logprobs = self.text.feed(chunk.text, chunk.logprobs, chunk.tokens)
        out = Filtered(text=text, logprobs=logprobs)
        if chunk.reasoning:
            if self.reasoning is None:
                self.reasoning = ChoiceFilter()
            out.reasoning, _ = self.reasoning.feed(chunk.reasoning, [], 0)
        for piece in chunk.tool_calls:
            args = self.calls.get(piece.index)
            if args is None:
                args = self.calls[piece.index] = ChoiceFilter(json_output=True)
            self.call_args[piece.index] = self.call_args.get(piece.index, "") + piece.arguments
            masked, _ = args.feed(piece.arguments, [], 0)
            if masked or piece.id is not None or piece.name is not None:
                out.tool_calls.append(
                    ToolCallDelta(index=piece.index, id=piece.id, name=piece.name, arguments=masked)
                )
        return out

    def new_call_values(self) -> list[tuple[str, str]]:
        """(type, value as written) of each entity found in a tool call's arguments
        since the last call of this."""
        out = []
        for index, args in sorted(self.calls.items()):
            found = args.entities
            for e in found[self._calls_checked.get(index, 0) :]:
                out.append((e.type, self.call_args[index][e.start : e.end]))
            self._calls_checked[index] = len(found)
        return out

    def flush(self) -> Filtered:
        text, logprobs = self.text.flush()
        out = Filtered(text=text, logprobs=logprobs)
        if self.reasoning is not None:
            out.reasoning, _ = self.reasoning.flush()
        for index, args in sorted(self.calls.items()):
            masked, _ = args.flush()
            if masked:
                out.tool_calls.append(ToolCallDelta(index=index, arguments=masked))
        return out
