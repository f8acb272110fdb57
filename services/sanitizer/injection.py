"""Input checks: SQL injection, XSS and prompt-injection payloads, judged by shape
(the rule families are in ``checks/``), on the text as sent and once more decoded
(``normalize``: percent-encoding, HTML entities, escapes, fullwidth forms, invisible
characters), with every finding's offsets in the text as sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from .checks.finding import Finding
from .checks.fragments import fragment_findings
from .checks.prompt import prompt_findings
from .checks.sql import sql_findings
from .checks.xss import joined_findings, xss_findings
from .normalize import decoded, joined_literals, without_inline_comments

__all__ = ["Decision", "Finding", "Policy", "decide", "findings"]

Decision = Literal["block", "flag", "pass"]
Policy = Literal["block", "flag", "off"]


def _raw_findings(text: str) -> Iterator[Finding]:
    yield from sql_findings(text)
    sql = without_inline_comments(text)
    if sql is not None:  # "UNION/**/SELECT", "/*!00000select*/"
        for f in sql_findings(sql.text):
            yield Finding(f.rule, f.type, *sql.span(f.start, f.end))
    yield from xss_findings(text)
    js = joined_literals(text)
    if js is not None:  # "'java'+'script:'", "'ev'+'al'": only what the joining made
        for f in joined_findings(js.text):
            start, end = js.span(f.start, f.end)
            if "+" in text[start:end]:
                yield Finding(f.rule, f.type, start, end)
    yield from fragment_findings(text)
    yield from prompt_findings(text)


def findings(text: str) -> list[Finding]:
    """Every rule that matched, once each (at its first place), in text order: on the
    text as sent, and on the text decoded (offsets still into the text as sent)."""
    first: dict[str, Finding] = {}
    for f in _raw_findings(text):
        first.setdefault(f.rule, f)
    plain = decoded(text)
    if plain is not None:  # "%27%20OR%201%3D1--", "&lt;script&gt;", "ｉｇｎｏｒｅ ..."
        for lo, hi in plain.changed(text, _MARGIN):
            # a window inside the text starts with a mark no rule reads past, so that
            # rules meant for the text's start ("1 OR 1=1") hold only at the real one
            view = plain.text[lo:hi] if lo == 0 else _NOT_A_START + plain.text[lo:hi]
            shift = lo - (0 if lo == 0 else len(_NOT_A_START))
            for f in _raw_findings(view):
                a, b = max(lo, shift + f.start), max(lo, shift + f.end)
                first.setdefault(f.rule, Finding(f.rule, f.type, *plain.span(a, b)))
    return sorted(first.values(), key=lambda f: (f.start, f.rule))


_MARGIN = 400
"""How far around a decoded character the rules read again: more than any rule's
reach (the SQL reader stops at 400 characters)."""
_NOT_A_START = "\x00\x00"


def decide(found: Sequence[object], policy: Policy) -> Decision:
    """What ``policy`` makes of the findings (of a text, or of a request's fields)."""
    if not found or policy == "off":
        return "pass"
    return "block" if policy == "block" else "flag"
