"""Reading compose.yaml in tests."""

from __future__ import annotations

import re


def default(value: str) -> str:
    """A compose ``${VAR:-default}`` as its default; anything else as it is."""
    m = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", value)
    return m.group(1) if m else value
