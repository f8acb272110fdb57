"""Which scheduler partitions this instance owns: leases in a JetStream KV bucket.

Pure: the adapter watches the bucket and hands every change here (``seen``), calls
``step`` every ``renew_s`` and carries out what it returns (a put, a create, an update
on the revision the lease was seen at), then says how each went. A key is judged by
when this instance last saw it change, on its own clock: no two hosts' clocks are
compared. A lease not renewed for ``ttl_s`` is free; an instance releases its leases
when it drains, and the others take them at once.

Every instance announces its partition count with its membership, and none claims
while a live instance counts otherwise: two counts map workers to partitions
differently, and two instances would book the same worker. One joining with another
count than the live ones' is refused (``disagreeing``).

Each instance owns at most its share, ``ceil(partitions / live instances)``, and
claims free partitions up to it: in the order of a rendezvous hash of (instance,
partition), so instances starting together mostly want different partitions. It
waits ``ttl_s`` after its start before claiming (it hears who else is alive first):
an instance starting alone would otherwise take every partition.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

MEMBER = "member."
PART = "part."


RENEWALS = 3
"""Renewals a lease time (``step`` runs every ``ttl_s / RENEWALS``)."""


def part_key(partition: int) -> str:
    return f"{PART}{partition}"


def member_key(instance: str) -> str:
    return f"{MEMBER}{instance}"


@dataclass(frozen=True)
class Put:
    """Write ``key`` whatever it holds (this instance's membership)."""

    key: str
    value: str


@dataclass(frozen=True)
class Claim:
    """Take a partition: create its key (``revision`` 0) or update it on ``revision``
    (a stale or released lease), failing if another instance got there first."""

    partition: int
    revision: int


@dataclass(frozen=True)
class Renew:
    partition: int
    revision: int


LeaseOp = Put | Claim | Renew


@dataclass
class _Key:
    value: str
    revision: int
    changed_at: float


@dataclass
class Leases:
    me: str
    partitions: int
    ttl_s: float = 3.0
    started_at: float = 0.0
    owned: dict[int, int] = field(default_factory=dict)
    """Each partition this instance holds and the revision its lease was last written at."""
    lost: set[int] = field(default_factory=set)
    """Partitions it held and found taken (it stalled past ``ttl_s``): its books on them
    are stale, and only a restart makes them right (the adapter exits)."""
    _keys: dict[str, _Key] = field(default_factory=dict)
    _renewed: dict[int, float] = field(default_factory=dict)
    """When the last write of each held lease that was acknowledged was sent."""
    claiming: bool = True
    """False once it drains: it renews what it holds, takes nothing more."""

    def seen(self, key: str, value: str, revision: int, now: float) -> None:
        """A change to the bucket (``value`` empty: deleted or purged)."""
        if key.startswith(PART) and not key[len(PART) :].isdigit():
            return  # not a lease this code writes
        self._keys[key] = _Key(value, revision, now)
        if key.startswith(PART):
            p = int(key[len(PART) :])
            if p in self.owned and revision > self.owned[p] and value != self.me:
                del self.owned[p]
                self.lost.add(p)

    def members(self, now: float) -> set[str]:
        alive = {
            key[len(MEMBER) :]
            for key, k in self._keys.items()
            if key.startswith(MEMBER) and k.value and now - k.changed_at < self.ttl_s
        }
        return alive | {self.me}

    def disagreeing(self, now: float) -> dict[str, int]:
        """Live instances that announce another partition count, with theirs."""
        out = {}
        for key, k in self._keys.items():
            name = key[len(MEMBER) :]
            if key.startswith(MEMBER) and name != self.me and now - k.changed_at < self.ttl_s:
                if k.value.isdigit() and int(k.value) != self.partitions:
                    out[name] = int(k.value)
        return out

    def share(self, now: float) -> int:
        return math.ceil(self.partitions / len(self.members(now)))

    def holder(self, partition: int, now: float) -> str:
        """Who holds it now ('' for no one)."""
        k = self._keys.get(part_key(partition))
        if k is None or not k.value or now - k.changed_at >= self.ttl_s:
            return ""
        return k.value

    def free(self, now: float) -> list[int]:
        return [
            p for p in range(self.partitions) if p not in self.owned and not self.holder(p, now)
        ]

    def wanted(self, now: float) -> bool:
        """Short of its share while a partition is free."""
        return len(self.owned) < self.share(now) and bool(self.free(now))

    def step(self, now: float) -> list[LeaseOp]:
        # the others may take a lease a lease time after they saw its last write, which
        # was sent no earlier than ``_renewed``: one whose next renewal (a round from now)
        # could come too late is let go now, rather than served on beside another
        last_safe = self.ttl_s - self.ttl_s / RENEWALS
        for p in [p for p in self.owned if now - self._renewed.get(p, now) >= last_safe]:
            del self.owned[p]
            self.lost.add(p)
        ops: list[LeaseOp] = [Put(member_key(self.me), str(self.partitions))]
        ops += [Renew(p, rev) for p, rev in sorted(self.owned.items())]
        # its own from before a restart (the same instance id: a supervisor's restart):
        # no one else writes its name, so they are taken back at once
        if not self.claiming or self.disagreeing(now):
            return ops
        left = self._left_by_me()
        ops += [Claim(p, rev) for p, rev in sorted(left.items())]
        if now - self.started_at < self.ttl_s:
            return ops  # still hearing who else is alive
        room = self.share(now) - len(self.owned) - len(left)
        free = [p for p in self.free(now) if p not in left]
        free.sort(key=lambda p: zlib.crc32(f"{self.me}/{p}".encode()))
        for p in free[: max(0, room)]:
            k = self._keys.get(part_key(p))
            ops.append(Claim(p, k.revision if k is not None else 0))
        return ops

    def _left_by_me(self) -> dict[int, int]:
        """Partitions whose lease names this instance but it does not hold: its own,
        from before it restarted (each with the revision to take it back on)."""
        out = {}
        for key, k in self._keys.items():
            if key.startswith(PART) and k.value == self.me:
                p = int(key[len(PART) :])
                if p not in self.owned and p not in self.lost and p < self.partitions:
                    out[p] = k.revision
        return out

    def claimed(self, partition: int, revision: int, sent: float) -> None:
        """A claim or renewal written at ``revision``, sent at ``sent``."""
        self.owned[partition] = revision
        self._renewed[partition] = sent
        self._keys[part_key(partition)] = _Key(self.me, revision, sent)

    def refused(self, partition: int) -> None:
        """A renewal the bucket refused: another instance holds the lease now."""
        if self.owned.pop(partition, None) is not None:
            self.lost.add(partition)

    def release(self) -> list[tuple[int, int]]:
        """Partitions to give back on a drain, each with the revision to delete its key
        on (a lease taken since is not deleted)."""
        out = sorted(self.owned.items())
        self.owned.clear()
        return out
