"""kvspill adapter: scans the shared KV tier's folder, asks the core what to evict,
deletes it, and writes what the tier holds per model to the KV_SPILL_INDEX bucket.

The blocks themselves never cross the bus: workers read and write the folder (one
host's, or a volume every worker mounts), and NATS carries only the index. Measured
on this kind of machine, a block read from a local file is many times faster than
the same bytes from the JetStream Object Store (bench/kvspill.py, docs).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from inferbus.contracts import KV_SPILL_INDEX, KvSpillNamespace
from inferbus.shared import logs, metrics
from inferbus.shared.codec import encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.kvblocks import block_path, scan_blocks
from inferbus.shared.runtime import Context, Service

from .core import FileSeen, Scan, SharedTier
from .wiring import WIRING

log = logs.get("inferbus.kvspill")

STALE_TMP_S = 600.0
"""A temporary block file this old was left by a writer that died mid-write."""


class KvSpillSettings(ServiceSettings, kw_only=True):
    """inferbus kvspill: bounds the shared KV spill tier and evicts from it."""

    shared_dir: str = ""
    """The shared tier's folder, as the workers' ``--kv-spill-shared-dir`` (required)."""
    capacity_mb: int = 16384
    """The shared tier's size in MiB: past it, the policy evicts."""
    scan_interval_s: float = 2.0
    """The tier may exceed its bound by what workers write in one interval."""

    def __post_init__(self) -> None:
        if not self.shared_dir:  # said before connecting to anything
            raise ValueError("kvspill needs --shared-dir (the workers' --kv-spill-shared-dir)")


class KvSpillService(Service[KvSpillSettings]):
    name = "kvspill"
    wiring = WIRING

    def __init__(self, settings: KvSpillSettings, ctx: Context[KvSpillSettings]) -> None:
        super().__init__(settings, ctx)
        self.root = Path(settings.shared_dir)
        self.core = SharedTier(settings.capacity_mb << 20)
        self._task: asyncio.Task[None] | None = None
        self._index: KeyValue | None = None
        self._published: dict[str, tuple[int, int]] = {}
        self._last: Scan | None = None
        self._last_scan_s = 0.0
        self._scans = 0

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = await self._bucket()
        metrics.KV_SHARED_CAPACITY.set(self.core.capacity)
        await self.scan_once()
        self._task = asyncio.create_task(self._loop(), name="scans")

    async def drain(self) -> None:
        if self._task:
            self._task.cancel()

    def ready(self) -> tuple[bool, str]:
        return (self._scans > 0, "" if self._scans else "no scan of the shared tier yet")

    def status(self) -> dict[str, Any]:
        last = self._last
        return {
            "shared_dir": str(self.root),
            "capacity_bytes": self.core.capacity,
            "used_bytes": last.used_bytes if last else 0,
            "blocks": last.blocks if last else 0,
            "namespaces": len(last.namespaces) if last else 0,
            "last_scan_s": round(self._last_scan_s, 4),
            "scans": self._scans,
        }

    async def _bucket(self) -> KeyValue:
        js = self.ctx.js
        try:
            return await js.key_value(KV_SPILL_INDEX)
        except (BucketNotFoundError, NotFoundError):
            return await js.create_key_value(
                KeyValueConfig(bucket=KV_SPILL_INDEX, history=1, storage=StorageType.FILE)
            )

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.scan_interval_s)
            try:
                await self.scan_once()
            except Exception:  # a bad scan must not end the service: the next one runs
                log.exception("a scan of the shared KV tier failed", shared_dir=str(self.root))
                metrics.KV_SHARED_SCAN_ERRORS.inc()

    async def scan_once(self) -> Scan:
        start = time.perf_counter()
        blocks = await asyncio.to_thread(scan_blocks, self.root)
        scan = self.core.on_scan(FileSeen(b.key, b.size, b.atime, b.mtime) for b in blocks)
        if scan.evict:
            await asyncio.to_thread(self._delete, scan.evict)
        if self._scans % 30 == 0:
            await asyncio.to_thread(self._sweep_tmp)
        self._last_scan_s = time.perf_counter() - start
        self._scans += 1
        self._last = scan
        self._record(scan)
        await self._publish(scan)
        return scan

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                block_path(self.root, key).unlink(missing_ok=True)
            except OSError as exc:  # seen again next scan, and evicted again
                log.warning("could not evict a shared block", key=key, error=str(exc))

    def _sweep_tmp(self) -> None:
        cutoff = time.time() - STALE_TMP_S
        for path in self.root.glob("*/*/*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    os.unlink(path)
            except OSError:
                pass

    def _record(self, scan: Scan) -> None:
        metrics.KV_SHARED_USED.set(scan.used_bytes)
        metrics.KV_SHARED_BLOCKS.set(scan.blocks)
        metrics.KV_SHARED_SCAN_SECONDS.set(self._last_scan_s)
        for kind, n in (
            ("saved", scan.saved),
            ("restored", scan.restored),
            ("evicted", len(scan.evict)),
            ("vanished", scan.vanished),
        ):
            if n:
                metrics.KV_SHARED_BLOCK_EVENTS.labels(kind).inc(n)
        if scan.evict:
            log.info("evicted shared KV blocks", blocks=len(scan.evict), used=scan.used_bytes)

    async def _publish(self, scan: Scan) -> None:
        """Each namespace's holdings, when they changed (one key per namespace)."""
        assert self._index is not None
        now = time.time()
        current = {ns: (n.blocks, n.bytes) for ns, n in scan.namespaces.items()}
        for ns in self._published.keys() - current.keys():
            current[ns] = (0, 0)
        for ns, (blocks, size) in current.items():
            if self._published.get(ns) == (blocks, size):
                continue
            entry = scan.namespaces.get(ns) or KvSpillNamespace(namespace=ns)
            entry.updated_at = now
            await self._index.put(f"ns.{ns}", encode(entry))
        self._published = {ns: v for ns, v in current.items() if v != (0, 0)}
