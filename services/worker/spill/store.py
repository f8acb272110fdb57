"""The worker's spill tiers: host memory and a local disk directory, each bounded in
bytes with adaptive LRU-K eviction (shared/lruk.py), plus the block codec that makes
a damaged block a miss.

Blocks are written through: a saved block goes to host memory at once, and to disk
and the shared tier in a background thread, so a full or failing disk only loses
the disk copy. A read tries host memory, then disk, then the shared tier (promoting
the block back to host memory); a block whose checksum or length is wrong is deleted
and reported as a miss.

The shared tier is a folder every worker of the model can read (one host's folder,
or a network volume), in the same block format. The kvspill service owns it: it
bounds it and evicts from it. A worker only writes blocks there, and marks the ones
it restores (their access time), which is what the service's eviction counts.

Every change of what a tier holds is recorded as an event (key, tier, stored or
removed) for the connector to report to vLLM's scheduler side and to the platform.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferbus.shared.kvblocks import (
    Buffer,
    CorruptBlock,
    block_path,
    decode_block,
    stored_on_disk,
    write_block,
)
from inferbus.shared.lruk import AdaptiveLruK

HOST, DISK, SHARED = "host", "disk", "shared"
TIERS = (HOST, DISK, SHARED)


@dataclass
class TierStats:
    saves: int = 0
    save_bytes: int = 0
    restores: int = 0
    restore_bytes: int = 0
    restore_s: float = 0.0
    misses: int = 0
    errors: int = 0
    corrupt: int = 0
    dropped: int = 0
    """Saves not made (the write queue was full, or the tier was failing)."""


@dataclass
class Event:
    key: str
    tier: str
    stored: bool


@dataclass
class StoreConfig:
    host_bytes: int = 1 << 30
    disk_dir: str = ""
    """Empty: no disk tier."""
    disk_bytes: int = 8 << 30
    k: int = 2
    write_queue: int = 256
    """Disk writes waiting at most; more are dropped (counted), never blocking a step."""
    failing_after: int = 3
    """Consecutive disk errors that mark the disk failing ..."""
    retry_after_s: float = 30.0
    """... for this long: no disk reads or writes meanwhile."""
    shared_dir: str = ""
    """The shared tier's folder (empty: none)."""


@dataclass
class _Faults:
    """A tier that errs repeatedly is set aside for a while."""

    errors_in_row: int = 0
    failing_until: float = 0.0


@dataclass
class _Disk:
    root: Path
    lru: AdaptiveLruK


class TieredStore:
    def __init__(self, config: StoreConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._host = AdaptiveLruK(config.host_bytes, k=config.k)
        self._host_data: dict[str, Buffer] = {}
        self._events: list[Event] = []
        self.stats = {t: TierStats() for t in TIERS}
        self._faults = {DISK: _Faults(), SHARED: _Faults()}
        self._disk: _Disk | None = None
        self._shared = Path(config.shared_dir) if config.shared_dir else None
        self._queue: queue.Queue[tuple[str, Buffer] | None] = queue.Queue(config.write_queue)
        self._writer: threading.Thread | None = None
        if config.disk_dir and config.disk_bytes > 0:
            self._disk = _Disk(Path(config.disk_dir), AdaptiveLruK(config.disk_bytes, k=config.k))
            self._open_disk()
        if self._disk is not None or self._shared is not None:
            self._writer = threading.Thread(
                target=self._write_loop, name="kv-spill-writer", daemon=True
            )
            self._writer.start()

    # -- reads and writes (the engine's thread) ---------------------------------------

    def put(self, key: str, payload: Buffer) -> None:
        with self._lock:
            if self._put_host(key, payload):
                self.stats[HOST].saves += 1
                self.stats[HOST].save_bytes += len(payload)
            if self._writer is None:
                return
            disk = self._disk
            if disk is not None and key not in disk.lru and self._failing(DISK):
                self.stats[DISK].dropped += 1
        try:
            self._queue.put_nowait((key, payload))
        except queue.Full:
            with self._lock:
                if self._disk is not None:
                    self.stats[DISK].dropped += 1
                if self._shared is not None:
                    self.stats[SHARED].dropped += 1

    def get(self, key: str, expected_len: int = 0) -> tuple[Buffer, str] | None:
        """The block's payload and the tier it came from, or None (a miss: absent,
        damaged, or the disk failed reading it)."""
        start = time.perf_counter()
        with self._lock:
            if self._host.access(key):
                payload = self._host_data[key]
                self._count_restore(HOST, len(payload), start)
                return payload, HOST
            disk = self._disk
            on_disk = disk is not None and key in disk.lru and not self._failing(DISK)
            if on_disk:
                assert disk is not None
                disk.lru.access(key)
        if on_disk:
            payload_or_none = self._read(DISK, key, expected_len, start)
            if payload_or_none is not None:
                return payload_or_none, DISK
        if self._shared is not None and not self.disk_failing(SHARED):
            payload_or_none = self._read(SHARED, key, expected_len, start)
            if payload_or_none is not None:
                return payload_or_none, SHARED
        with self._lock:
            self.stats[HOST].misses += 1
        return None

    def _read(self, tier: str, key: str, expected_len: int, start: float) -> Buffer | None:
        path = self._path(key) if tier == DISK else block_path(self._shared_root, key)
        try:
            payload = decode_block(key, path.read_bytes(), expected_len)
            if tier == SHARED:  # a reference, for the kvspill service's eviction
                os.utime(path, (time.time(), path.stat().st_mtime))
        except FileNotFoundError:
            if tier == DISK:
                with self._lock:
                    self._drop_disk(key, unlink=False)
            return None  # the shared tier's owner evicted it: a plain miss
        except CorruptBlock:
            with self._lock:
                self.stats[tier].corrupt += 1
                if tier == DISK:
                    self._drop_disk(key, unlink=True)
            if tier == SHARED:
                self._unlink_path(path)
            return None
        except OSError:
            with self._lock:
                self._tier_error(tier)
                if tier == DISK:
                    self._drop_disk(key, unlink=False)
            return None
        with self._lock:
            self._faults[tier].errors_in_row = 0
            self._count_restore(tier, len(payload), start)
            self._put_host(key, payload)
        return payload

    @property
    def _shared_root(self) -> Path:
        assert self._shared is not None
        return self._shared

    def shared_holds(self, key: str) -> bool:
        return self._shared is not None and block_path(self._shared, key).exists()

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._host or (self._disk is not None and key in self._disk.lru)

    def drain_events(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def usage(self) -> dict[str, tuple[int, int]]:
        """Tier → (bytes used, capacity)."""
        with self._lock:
            out = {HOST: (self._host.used, self._host.capacity)}
            if self._disk is not None:
                out[DISK] = (self._disk.lru.used, self._disk.lru.capacity)
            return out

    def disk_failing(self, tier: str = DISK) -> bool:
        with self._lock:
            return self._failing(tier)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until queued writes are done (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        if self._writer is not None:
            self.flush()
            self._queue.put(None)
            self._writer.join(timeout=5)

    # -- internals ---------------------------------------------------------------------

    def _put_host(self, key: str, payload: Buffer) -> bool:
        """Whether host memory took it (it may be larger than the whole tier)."""
        if key in self._host:
            self._host.access(key)
            return False
        evicted = self._host.admit(key, len(payload))
        if evicted == [key]:
            return False
        for gone in evicted:
            del self._host_data[str(gone)]
            self._events.append(Event(str(gone), HOST, stored=False))
        self._host_data[key] = payload
        self._events.append(Event(key, HOST, stored=True))
        return True

    def _count_restore(self, tier: str, size: int, start: float) -> None:
        s = self.stats[tier]
        s.restores += 1
        s.restore_bytes += size
        s.restore_s += time.perf_counter() - start

    def _path(self, key: str) -> Path:
        assert self._disk is not None
        return block_path(self._disk.root, key)

    def _open_disk(self) -> None:
        """Index what an earlier run left on disk (a restarted worker keeps its tier),
        then start the writer."""
        disk = self._disk
        assert disk is not None
        try:
            disk.root.mkdir(parents=True, exist_ok=True)
            found = stored_on_disk(disk.root)
        except OSError:
            found = []
            self._tier_error(DISK)
        for key, size in found:
            for gone in disk.lru.admit(key, size):
                self._unlink(str(gone))
            if key in disk.lru:
                self._events.append(Event(key, DISK, stored=True))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._disk is not None:
                    self._write(*item)
                if self._shared is not None:
                    self._write_shared(*item)
            finally:
                self._queue.task_done()

    def _write_shared(self, key: str, payload: Buffer) -> None:
        path = block_path(self._shared_root, key)
        with self._lock:
            if self._failing(SHARED):
                self.stats[SHARED].dropped += 1
                return
        if path.exists():  # another worker saved it first
            return
        if not self._write_file(SHARED, path, key, payload):
            return
        with self._lock:
            self.stats[SHARED].saves += 1
            self.stats[SHARED].save_bytes += len(payload)

    def _write_file(self, tier: str, path: Path, key: str, payload: Buffer) -> bool:
        """The block's file, whole or not at all; a failure counts against the tier."""
        # a name of this process's own: workers write a shared folder side by side
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_block(tmp, key, payload)
            os.replace(tmp, path)
        except OSError:
            self._unlink_path(tmp)
            with self._lock:
                self._tier_error(tier)
                self.stats[tier].dropped += 1
            return False
        with self._lock:
            self._faults[tier].errors_in_row = 0
        return True

    def _write(self, key: str, payload: Buffer) -> None:
        disk = self._disk
        assert disk is not None
        with self._lock:
            if key in disk.lru or self._failing(DISK):
                return
            evicted = disk.lru.victims(len(payload), key)
            for gone in evicted:
                self._events.append(Event(str(gone), DISK, stored=False))
        for gone in evicted:
            self._unlink(str(gone))
        if not self._write_file(DISK, self._path(key), key, payload):
            return
        with self._lock:
            evicted = disk.lru.admit(key, len(payload))
            if evicted == [key]:  # larger than the whole tier
                evicted = []
                self._unlink(key)
            for gone in evicted:
                self._events.append(Event(str(gone), DISK, stored=False))
                self._unlink(str(gone))
            if key not in disk.lru:
                return
            self.stats[DISK].saves += 1
            self.stats[DISK].save_bytes += len(payload)
            self._events.append(Event(key, DISK, stored=True))

    def _drop_disk(self, key: str, unlink: bool) -> None:
        assert self._disk is not None
        if self._disk.lru.remove(key):
            self._events.append(Event(key, DISK, stored=False))
        if unlink:
            self._unlink(key)

    def _unlink(self, key: str) -> None:
        self._unlink_path(self._path(key))

    @staticmethod
    def _unlink_path(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass

    def _failing(self, tier: str) -> bool:
        return self._clock() < self._faults[tier].failing_until

    def _tier_error(self, tier: str) -> None:
        faults = self._faults[tier]
        self.stats[tier].errors += 1
        faults.errors_in_row += 1
        if faults.errors_in_row < self.config.failing_after:
            return
        faults.failing_until = self._clock() + self.config.retry_after_s
        faults.errors_in_row = 0
        if tier == DISK and self._disk is not None:
            # what the disk holds cannot be trusted to load: it stops being restorable
            # (its files stay; a restart indexes them again)
            self._events.extend(Event(str(k), DISK, stored=False) for k in self._disk.lru.clear())
