"""The shared KV tier's bookkeeping, free of I/O: what the folder holds, which blocks
were used, and which to evict to keep it within its bound.

Workers write blocks into the shared folder and mark the ones they restore (the
file's access time); each scan of the folder is the core's input. A file not seen
before is a save (a reference); a later access time is a restore (a reference); a
file gone was removed by someone else. The policy is the spill tiers' adaptive
LRU-K (shared/lruk.py), bounded in bytes; what it evicts, the adapter deletes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from inferbus.contracts import KvSpillNamespace
from inferbus.shared.lruk import AdaptiveLruK


class FileSeen(NamedTuple):
    key: str
    """``namespace:hash``, as the workers name blocks."""
    size: int
    atime: float
    mtime: float


class Scan(msgspec.Struct, kw_only=True):
    """What one scan found and decided."""

    evict: list[str] = []
    saved: int = 0
    """Blocks new since the last scan."""
    restored: int = 0
    """Blocks read (restored by a worker) since the last scan."""
    vanished: int = 0
    used_bytes: int = 0
    blocks: int = 0
    namespaces: dict[str, KvSpillNamespace] = {}
    """What the tier holds per namespace (``updated_at`` left for the adapter)."""


class SharedTier:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._policy = AdaptiveLruK(capacity_bytes)
        self._seen: dict[str, FileSeen] = {}

    def on_scan(self, files: Iterable[FileSeen]) -> Scan:
        scan = Scan()
        now = {f.key: f for f in files}
        for key in self._seen.keys() - now.keys():
            self._policy.remove(key)
            scan.vanished += 1
        evicted: set[str] = set()
        # references in the order they happened: saves at their write, restores at
        # their last read
        for f in sorted(now.values(), key=lambda f: max(f.atime, f.mtime)):
            before = self._seen.get(f.key)
            if before is None or f.key not in self._policy:
                if before is None:
                    scan.saved += 1
                evicted.update(str(k) for k in self._policy.admit(f.key, f.size))
            elif f.atime > before.atime:
                self._policy.access(f.key)
                scan.restored += 1
        evicted = {k for k in evicted if k not in self._policy}  # some came back in
        for key in evicted:
            now.pop(key, None)
        self._seen = now
        scan.evict = sorted(evicted)
        scan.used_bytes = self._policy.used
        scan.blocks = len(self._policy)
        for key, f in now.items():
            name = key.partition(":")[0]
            ns = scan.namespaces.setdefault(name, KvSpillNamespace(namespace=name))
            ns.blocks += 1
            ns.bytes += f.size
        return scan

    def __len__(self) -> int:
        return len(self._policy)
