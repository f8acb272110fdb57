"""What a rule reports."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    type: str
    """``sql_injection``, ``xss`` or ``prompt_injection``."""
    start: int
    end: int


Rules = Sequence[tuple[str, re.Pattern[str]]]


def first_matches(
    text: str, rules: Rules, kind: str, needles: Mapping[str, tuple[str, ...]]
) -> Iterator[Finding]:
    """Each rule's first match. A rule with needles runs only when one of them is in the
    text (lower-cased): every match of its pattern holds one, and looking for a few
    substrings costs far less than a regular expression tried at every position."""
    low = text.lower()
    for rule, pattern in rules:
        need = needles.get(rule)
        if need and not any(n in low for n in need):
            continue
        if m := pattern.search(text):
            yield Finding(rule, kind, m.start(), m.end())
