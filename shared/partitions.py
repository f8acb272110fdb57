"""Which scheduler partition an accepted request goes to (a partitioned scheduler).

Pure; read by the sanitizer (where a request first goes) and by the scheduler (where a
queued request whose partition has no worker for its model goes on to). The coarse
choice of the two-level placement (docs/architecture.md): among the scheduler instances
that report ready workers for the model, those with about the most room per worker
(within ``ROOM_SLACK`` slots of the best) are equal, and among them a rendezvous hash of
the request's prefix picks one, so the turns of a conversation (the same leading blocks)
go where its KV cache is. The instance places it among its own workers, KV-aware. With
no report for the model (its first worker not up yet, or no word from the schedulers),
the model's name picks the partition, the same one for all its requests.
"""

from __future__ import annotations

import zlib

from inferbus.contracts import RequestSubmitted, SchedulerLoad

ROOM_SLACK = 1.0
"""Free slots less queued requests, per ready worker, counted as equal room."""

KEY_BLOCK = 3
"""The prefix block the rendezvous hash reads (the 4th): past most system prompts'
first block, within a conversation's first turn."""


def _rank(key: str, candidate: str) -> int:
    return zlib.crc32(f"{key}/{candidate}".encode())


def prefix_key(request: RequestSubmitted) -> str:
    hashes = request.prefix_hashes
    if hashes:
        return str(hashes[min(len(hashes), KEY_BLOCK + 1) - 1])
    return request.request_id


class PartitionView:
    """The scheduler instances' last reports (``ib.sched.load``): what each partition
    holds of each model."""

    def __init__(self, partitions: int, stale_s: float = 2.0) -> None:
        self.partitions = partitions
        self.stale_s = stale_s
        self._reports: dict[str, tuple[SchedulerLoad, float]] = {}

    def on_load(self, load: SchedulerLoad, now: float) -> None:
        if load.partitions:
            self._reports[load.scheduler_id] = (load, now)

    def choose(self, request: RequestSubmitted, now: float, but: str = "") -> int | None:
        """The partition, or None for an unpartitioned scheduler (``but``: not one of
        that instance's; None when no other serves the model)."""
        if self.partitions <= 1:
            return None
        rooms = self._rooms(request.model, now, but)
        if not rooms:
            if but:
                return None
            # the partitions some instance holds (a mismatched setting reads no others),
            # else all
            seen = {p for _, (load, _) in self._fresh(now) for p in load.partitions}
            everyone = [str(p) for p in sorted(seen or range(self.partitions))]
            return int(max(everyone, key=lambda p: _rank(request.model, p)))
        best = max(room for room, _, _ in rooms)
        key = prefix_key(request)
        _, _, held = max(
            (r for r in rooms if r[0] >= best - ROOM_SLACK), key=lambda r: _rank(key, r[1])
        )
        return max(held, key=lambda p: _rank(key, str(p)))

    def serving(self, now: float, but: str = "") -> set[str]:
        """The models some instance (other than ``but``) has ready workers for."""
        out: set[str] = set()
        for sid, (load, _) in self._fresh(now):
            if sid != but:
                out.update(m for m, ml in load.models.items() if ml.ready_workers)
        return out

    def _fresh(self, now: float) -> list[tuple[str, tuple[SchedulerLoad, float]]]:
        for sid, (load, seen) in list(self._reports.items()):
            if now - seen > max(self.stale_s, 4 * load.interval_s):
                del self._reports[sid]
        return list(self._reports.items())

    def _rooms(self, model: str, now: float, but: str) -> list[tuple[float, str, list[int]]]:
        rooms: list[tuple[float, str, list[int]]] = []
        for sid, (load, _) in self._fresh(now):
            if sid == but:
                continue
            m = load.models.get(model)
            held = [p for p in load.partitions if p < self.partitions]
            if m is None or not m.ready_workers or not held:
                continue
            rooms.append(((m.free_slots - m.queued) / m.ready_workers, sid, held))
        return rooms
