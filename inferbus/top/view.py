"""Two snapshots in, the view model out. Pure: no clock, no I/O."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from . import fleet, traffic
from .rates import Interval
from .rows import View
from .snapshot import Snapshot


def build_view(before: Snapshot | None, now: Snapshot) -> View:
    """What ``inferbus top`` shows: the fleet as of ``now``, rates over ``before``→``now``
    (none without ``before``, or when no time passed)."""
    interval = traffic.usable(Interval(before, now) if before is not None else None)
    scheduler = fleet.pick_scheduler(now)
    workers = fleet.worker_rows(now, scheduler, traffic.worker_decode_rates(interval))
    queues = fleet.queue_rows(scheduler)
    models, totals = traffic.model_rows(
        interval, {m for w in workers for m in w.models} | {q.model for q in queues}
    )
    return View(
        interval_s=interval.seconds if interval else None,
        problem=now.problem,
        workers=workers,
        queues=queues,
        queued=fleet.queued_total(scheduler),
        scheduler_inflight=fleet.as_int(scheduler.status.get("inflight")) if scheduler else None,
        models=models,
        totals=totals,
        gateway_refusals_per_s=traffic.refusals_per_s(interval),
        traces=traffic.trace_rates(now, interval),
        services=fleet.service_rows(now),
        missing_services=fleet.missing_services(now),
        rollouts=fleet.rollout_rows(now),
    )


def _finite(value: Any) -> Any:
    """JSON has no infinities or NaN: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def view_json(view: View) -> str:
    return json.dumps(_finite(dataclasses.asdict(view)), indent=2)
