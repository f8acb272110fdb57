"""Which HTTP connection goes when a process holds as many as it may.

Closing every connection past the cap as it arrived let 4,096 idle TCP connections (no
key needed) lock the gateway out: 16 of 17 authenticated requests were refused (issue
42 item 5). At the cap, an arrival takes the place of a connection that is doing
nothing: first one that never sent a request, then one that never authenticated, then
an idle keep-alive one, oldest first within each. Only when every connection is busy
with a request is the arrival closed. Pure: the adapter (shared/runtime.py) says what
each connection does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class _Connection:
    made_at: float
    trusted: bool = False


class ConnectionLedger:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[Hashable, _Connection] = {}

    def __len__(self) -> int:
        return len(self._held)

    def made(self, conn: Hashable, now: float) -> None:
        self._held[conn] = _Connection(made_at=now)

    def lost(self, conn: Hashable) -> None:
        self._held.pop(conn, None)

    def trusted(self, conn: Hashable) -> None:
        """It carried a request that authenticated (an API key the gateway took)."""
        held = self._held.get(conn)
        if held is not None:
            held.trusted = True

    def to_close(
        self, arrival: Hashable, busy: Callable[[Hashable], bool], served: Callable[[Hashable], int]
    ) -> Hashable | None:
        """Past the cap: the connection to close so ``arrival`` may stay (``arrival``
        itself when every other one is busy); None under the cap."""
        if len(self._held) <= self.limit:
            return None
        idle = [c for c in self._held if c is not arrival and not busy(c)]
        if not idle:
            return arrival

        def worth(c: Hashable) -> tuple[bool, bool, float]:
            held = self._held[c]
            return (held.trusted, served(c) > 0, held.made_at)

        return min(idle, key=worth)
