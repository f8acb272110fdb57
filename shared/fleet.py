"""The workers as their heartbeats describe them: one view for every core that needs
one (the gateway's registry, the autoscaler, delivery). Pure: time is passed in."""

from __future__ import annotations

from inferbus.contracts import WorkerHeartbeat


class FleetView:
    """The latest heartbeat of each live worker. A ``stopped`` or ``failed`` beat
    removes the worker at once; one silent for longer than its limit goes at the next
    ``expire``. Queries never change the view: the caller expires when it looks at time.
    """

    def __init__(self, stale_after_s: float = 3.0, interval_factor: float = 0.0) -> None:
        self.stale_after_s = stale_after_s
        self.interval_factor = interval_factor
        """A worker's limit is at least this many of its own heartbeat intervals."""
        self._beats: dict[str, tuple[WorkerHeartbeat, float]] = {}

    def on_heartbeat(self, hb: WorkerHeartbeat, now: float) -> WorkerHeartbeat | None:
        """Record ``hb``; the worker's previous heartbeat (None: new to the view)."""
        before = self._beats.pop(hb.worker_id, (None, 0.0))[0]
        if hb.state not in ("stopped", "failed"):
            self._beats[hb.worker_id] = (hb, now)
        return before

    def limit(self, hb: WorkerHeartbeat) -> float:
        return max(self.stale_after_s, self.interval_factor * hb.interval_s)

    def expire(self, now: float) -> list[str]:
        """Drop the workers silent past their limit; their ids, sorted."""
        gone = sorted(w for w, (hb, seen) in self._beats.items() if now - seen > self.limit(hb))
        for wid in gone:
            del self._beats[wid]
        return gone

    def remove(self, worker_id: str) -> WorkerHeartbeat | None:
        return self._beats.pop(worker_id, (None, 0.0))[0]

    def get(self, worker_id: str) -> WorkerHeartbeat | None:
        return self._beats.get(worker_id, (None, 0.0))[0]

    def __len__(self) -> int:
        return len(self._beats)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._beats

    def heartbeats(self) -> list[WorkerHeartbeat]:
        """Every live worker's heartbeat, by id."""
        return [self._beats[w][0] for w in sorted(self._beats)]

    def ready(self, model: str | None = None) -> list[WorkerHeartbeat]:
        """Ready workers (serving ``model`` under that name, when given), by id."""
        return [
            hb
            for hb in self.heartbeats()
            if hb.state == "ready" and (model is None or model in hb.models)
        ]

    def counts(self) -> dict[str, int]:
        """Model → ready workers serving it; 0 for a model only draining or starting
        workers list."""
        out: dict[str, int] = {}
        for hb, _ in self._beats.values():  # per request at the gateway: no sorting
            for m in hb.models:
                out[m] = out.get(m, 0) + (hb.state == "ready")
        return out

    def max_model_len(self, model: str) -> int:
        """The smallest context of the workers listing ``model``, whatever their state
        (0 when none says)."""
        lens = [hb.max_model_len for hb, _ in self._beats.values() if model in hb.models]
        return min((n for n in lens if n), default=0)

    def lineage(self, model: str) -> tuple[str, str | None]:
        """(root, parent) of a served name, as vLLM's model cards give them: the
        weights it is (``name@version`` when the registry versions it, else the name)
        and, for a LoRA adapter, the base model it runs on (None for a base model)."""
        for hb, _ in self._beats.values():
            if model not in hb.models:
                continue
            version = hb.versions.get(model)
            root = model if not version or "@" in model else f"{model}@{version}"
            if model in hb.adapters:
                bases = [m for m in hb.models if m not in hb.adapters and "@" not in m]
                return root, bases[0] if bases else None
            return root, None
        return model, None


def busy(hb: WorkerHeartbeat) -> int:
    """Sequences a worker runs or holds waiting."""
    return hb.running + hb.waiting
