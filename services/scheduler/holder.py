"""The adapter's half of the partition leases (leases.py decides): the KV bucket, its
watch, a renewal every third of a lease time that nothing else waits on, and the
partitions gained while running, handed to the service a batch at a time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyValueError

from inferbus.contracts import SCHEDULER_LEASES
from inferbus.shared import logs
from inferbus.shared.errors import ConfigError

from .leases import RENEWALS, Claim, Leases, Put, Release, Renew, member_key, part_key

log = logs.get("inferbus.scheduler")

BUCKET_AGE_S = 60.0
"""Keys not written for this long go (a dead instance's membership, a partition no
one took): every live key is rewritten each second."""


class LeaseHolder:
    def __init__(
        self,
        js: JetStreamContext,
        leases: Leases,
        on_gain: Callable[[set[int]], Awaitable[None]],
        on_fenced: Callable[[str], None],
        on_release: Callable[[int], Awaitable[None]],
    ) -> None:
        self.js = js
        self.leases = leases
        self._on_gain = on_gain
        self._on_release = on_release
        self._on_fenced = on_fenced
        self._kv: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._gained: set[int] = set()
        self._gain_due = asyncio.Event()
        self._serving = False
        self.fenced = ""
        self.initial: set[int] = set()
        """What it held when it joined: the start restores and opens these; the rest
        it gains goes through ``on_gain``."""

    async def join(self) -> None:
        """Join the bucket, hear who else is there for one lease time, claim a share of
        the partitions; from then on the leases are renewed whatever else runs (a
        restore of minutes must not let them lapse)."""
        try:
            self._kv = await self.js.key_value(SCHEDULER_LEASES)
        except BucketNotFoundError:
            self._kv = await self.js.create_key_value(
                KeyValueConfig(
                    bucket=SCHEDULER_LEASES,
                    history=1,
                    ttl=BUCKET_AGE_S,
                    storage=StorageType.FILE,
                    max_bytes=1 << 20,
                )
            )
        watcher = await self._kv.watchall()
        self._tasks.append(asyncio.create_task(self._watch(watcher), name="lease-watch"))
        leases = self.leases
        leases.started_at = time.monotonic()
        while time.monotonic() - leases.started_at < leases.ttl_s:
            await self._round()
            await asyncio.sleep(leases.ttl_s / 3)
        if others := leases.disagreeing(time.monotonic()):
            await self.release()  # its membership goes now, not a lease time later
            counts = ", ".join(f"{name}: {n}" for name, n in sorted(others.items()))
            raise ConfigError(
                f"scheduler_partitions is {leases.partitions} here but other running "
                f"instances count otherwise ({counts}): every instance must run the same "
                "count (INFERBUS_SCHEDULER_PARTITIONS); stop them all to change it"
            )
        for _ in range(20):  # a claim lost to another's, heard of late: the next free one
            await self._round()
            if not leases.wanted(time.monotonic()):
                break
            await asyncio.sleep(0.05)
        self._gained.clear()  # the start's restore covers these
        self.initial = set(leases.owned)
        self._tasks.append(asyncio.create_task(self._renew(), name="lease-renew"))
        log.info(
            "partitions held",
            partitions=sorted(leases.owned),
            of=leases.partitions,
            instances=len(leases.members(time.monotonic())),
        )

    def serve(self) -> None:
        """Hand partitions gained from now on (and since ``join``) to ``on_gain``."""
        self._serving = True
        self._tasks.append(asyncio.create_task(self._gains(), name="lease-gains"))
        if self._gained:
            self._gain_due.set()

    def stop_gaining(self) -> None:
        """On a drain: renew what it holds until ``release``, take nothing more."""
        self.leases.claiming = False
        self._serving = False
        for task in self._tasks:
            if task.get_name() == "lease-gains":
                task.cancel()

    async def _watch(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue  # the end of the values there were when it began
            value = b"" if entry.operation in ("DEL", "PURGE") else (entry.value or b"")
            try:
                self.leases.seen(entry.key, value.decode(), entry.revision, time.monotonic())
            except Exception:
                log.exception("lease change not understood", key=entry.key)
                continue
            self._check_lost()  # at once, not at the next round

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.leases.ttl_s / 3)
            try:
                await self._round()
            except Exception:
                log.exception("lease round failed")

    async def _round(self) -> None:
        """One step of the leases carried out; what was claimed queued for ``on_gain``;
        a lease lost fences the instance (it exits to be restarted)."""
        leases, kv = self.leases, self._kv
        me = leases.me.encode()
        patience = leases.ttl_s / RENEWALS  # a write answered later is a round missed
        for op in leases.step(time.monotonic()):
            sent = time.monotonic()
            try:
                if isinstance(op, Put):
                    await asyncio.wait_for(kv.put(op.key, op.value.encode()), patience)
                    continue
                key = part_key(op.partition)
                if isinstance(op, Release):  # beside the renewals, which must not wait
                    self._gained.discard(op.partition)
                    task = asyncio.create_task(self._release(op), name="lease-release")
                    self._tasks.append(task)
                    continue
                if isinstance(op, Claim) and not op.revision:
                    write = kv.create(key, me)
                else:
                    write = kv.update(key, me, last=op.revision)
                revision = await asyncio.wait_for(write, patience)
            except KeyValueError:  # another instance wrote it first
                if isinstance(op, Renew):
                    leases.refused(op.partition)
                continue
            except TimeoutError:  # the bus slow or down: the lease stands until step
                # gives it up (no traceback: an outage is no bug, and logs one a second)
                log.warning("lease write unanswered", partition=getattr(op, "partition", None))
                continue
            except Exception:
                log.exception("lease write failed", partition=getattr(op, "partition", None))
                continue
            leases.claimed(op.partition, revision, sent)
            if isinstance(op, Claim):
                log.info("partition taken", partition=op.partition)
                self._gained.add(op.partition)
                if self._serving:
                    self._gain_due.set()
        self._check_lost()

    def _check_lost(self) -> None:
        leases = self.leases
        if leases.lost and not self.fenced:
            self.fenced = f"partitions {sorted(leases.lost)} were lost while it stalled"
            log.error("lease lost: restarting", reason=self.fenced)
            self._on_fenced(self.fenced)

    async def _release(self, op: Release) -> None:
        """A partition given to an instance holding fewer: let go of here first (its
        workers, requests and subscriptions), then its key deleted for the other to
        claim (on the revision it wrote: never another's lease)."""
        try:
            await self._on_release(op.partition)
            await asyncio.wait_for(self._kv.delete(part_key(op.partition), last=op.revision), 2.0)
            log.info("partition released", partition=op.partition)
        except Exception:  # not deleted: it lapses a lease time later instead
            log.exception("partition not released", partition=op.partition)

    async def _gains(self) -> None:
        while True:
            await self._gain_due.wait()
            self._gain_due.clear()
            batch, self._gained = self._gained, set()
            batch &= set(self.leases.owned)
            if not batch:
                continue
            try:
                await self._on_gain(batch)
            except Exception:
                log.exception("taking partitions over failed", partitions=sorted(batch))

    async def release(self, reachable: bool = True) -> None:
        """On a drain: the others take its partitions at once instead of after a lease
        time (a key deleted only at the revision it wrote: never another's lease).
        ``reachable`` false (the bus is down): they lapse instead, with no wait."""
        for task in self._tasks:
            task.cancel()
        if self._kv is None or not reachable:
            return
        keys = [(part_key(p), revision) for p, revision in self.leases.release()]
        for key, last in [*keys, (member_key(self.leases.me), None)]:
            try:
                await asyncio.wait_for(self._kv.delete(key, last=last), 2.0)
            except Exception:  # taken since, or no answer: it lapses instead
                log.warning("lease not released", key=key)
