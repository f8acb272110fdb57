"""What a rule reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    type: str
    """``sql_injection``, ``xss`` or ``prompt_injection``."""
    start: int
    end: int
