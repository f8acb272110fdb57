"""When to restart the embedded nats-server after its disk filled.

A write that fails for want of space leaves JetStream's stream in error for good: once
the disk had filled, 0 of 360 requests were served a minute after space was freed,
and only a restart of nats-server brought it back (issue 42 item 2). The server says so
in its log; the supervisor reads what each server writes there and how much room its
store's disk has, and this decides: a server that reported a store write error is
restarted once its disk has room again (and not more often than ``settle_s``, should
the errors be of another kind a restart does not cure). Pure: time and free bytes are
passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STORE_ERRORS = (
    "Critical write error",
    "failed to store a msg",
    "out of File resources",
    "no space left on device",
)
"""nats-server's words, in its log, for a store that could not write."""


@dataclass
class StoreWatch:
    min_free_bytes: int = 8 << 20
    settle_s: float = 30.0
    failed_since: dict[str, float] = field(default_factory=dict)
    """Server → when its log first reported a store write error (since its last start)."""
    restarted_at: dict[str, float] = field(default_factory=dict)

    def read(self, server: str, text: str, now: float) -> None:
        """What ``server`` wrote to its log since the last read."""
        if server not in self.failed_since and any(e in text for e in STORE_ERRORS):
            self.failed_since[server] = now

    def to_restart(self, server: str, free_bytes: int, now: float) -> bool:
        """Whether to restart ``server`` now (its store failed; its disk has room)."""
        if server not in self.failed_since or free_bytes < self.min_free_bytes:
            return False
        if now - self.restarted_at.get(server, float("-inf")) < self.settle_s:
            return False
        del self.failed_since[server]
        self.restarted_at[server] = now
        return True
