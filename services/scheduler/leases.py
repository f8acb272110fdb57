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

An instance added while the others run is given partitions: the one holding the
most (the first by name among equals) releases one when a member that has been alive
a lease time holds two fewer, one partition every two lease times, the one it wants
least by the rendezvous hash below; the service lets go of the partition's workers
and requests first (``Release``), and the newcomer claims it as a free one. A
partition it released is not its to claim again for two lease times.

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


@dataclass(frozen=True)
class Release:
    """Give a held partition up while running, to an instance holding fewer: the
    service lets go of it, then its key is deleted on ``revision``."""

    partition: int
    revision: int


LeaseOp = Put | Claim | Renew | Release


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
    _joined: dict[str, float] = field(default_factory=dict)
    """When each live member was first seen (a newcomer is given partitions only once
    it has heard the others for a lease time, and claims)."""
    _released: dict[int, float] = field(default_factory=dict)
    """Partitions it released while running, and when."""

    def seen(self, key: str, value: str, revision: int, now: float) -> None:
        """A change to the bucket (``value`` empty: deleted or purged)."""
        if key.startswith(PART) and not key[len(PART) :].isdigit():
            return  # not a lease this code writes
        self._keys[key] = _Key(value, revision, now)
        if key.startswith(MEMBER):
            name = key[len(MEMBER) :]
            if value:
                self._joined.setdefault(name, now)
            else:
                self._joined.pop(name, None)
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
        given = self._to_give(now)
        if given is not None:  # released, not renewed
            revision = self.owned.pop(given)
            self._renewed.pop(given, None)
            self._released[given] = now
        ops += [Renew(p, rev) for p, rev in sorted(self.owned.items())]
        if given is not None:
            ops.append(Release(given, revision))
        # its own from before a restart (the same instance id: a supervisor's restart):
        # no one else writes its name, so they are taken back at once
        if not self.claiming or self.disagreeing(now):
            return ops
        left = self._left_by_me(now)
        ops += [Claim(p, rev) for p, rev in sorted(left.items())]
        if now - self.started_at < self.ttl_s:
            return ops  # still hearing who else is alive
        room = self.share(now) - len(self.owned) - len(left)
        free = [
            p
            for p in self.free(now)
            if p not in left and now - self._released.get(p, -math.inf) >= 2 * self.ttl_s
        ]
        free.sort(key=lambda p: zlib.crc32(f"{self.me}/{p}".encode()))
        for p in free[: max(0, room)]:
            k = self._keys.get(part_key(p))
            ops.append(Claim(p, k.revision if k is not None else 0))
        return ops

    def _to_give(self, now: float) -> int | None:
        """A partition to release to a member holding two fewer (None: balanced, a
        release of its own in the last two lease times, or it is not the one to give)."""
        if (
            not self.claiming
            or now - self.started_at < self.ttl_s
            or not self.owned
            or self.disagreeing(now)
            or any(now - t < 2 * self.ttl_s for t in self._released.values())
            or self.free(now)  # one on its way to someone already
        ):
            return None
        members = self.members(now)
        held = {m: 0 for m in members}
        for p in range(self.partitions):
            owner = self.me if p in self.owned else self.holder(p, now)
            if owner in held:
                held[owner] += 1
        settled = [
            m for m in members if m != self.me and now - self._joined.get(m, now) >= self.ttl_s
        ]
        if not settled or held[self.me] - min(held[m] for m in settled) < 2:
            return None
        most = max(held.values())
        if held[self.me] < most or min(m for m in members if held[m] == most) != self.me:
            return None  # the first by name among those holding the most gives
        return max(self.owned, key=lambda p: zlib.crc32(f"{self.me}/{p}".encode()))

    def _left_by_me(self, now: float) -> dict[int, int]:
        """Partitions whose lease names this instance but it does not hold: its own,
        from before it restarted (each with the revision to take it back on); not one
        it released (its key is being deleted)."""
        out = {}
        for key, k in self._keys.items():
            if key.startswith(PART) and k.value == self.me:
                p = int(key[len(PART) :])
                if (
                    p not in self.owned
                    and p not in self.lost
                    and p < self.partitions
                    and now - self._released.get(p, -math.inf) >= 2 * self.ttl_s
                ):
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
