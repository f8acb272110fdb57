"""The fleet at one moment: workers, queues and service instances, from ``$SRV`` stats
and gauges. Pure; every status field is read defensively (a service of another
version may lack it, or have it in another shape)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from inferbus import servicetable

from .rows import QueueRow, RolloutRow, ServiceRow, WorkerRow
from .snapshot import Instance, Snapshot

SERVICES = servicetable.names()
"""In the order a request meets them (the gateway first)."""


def as_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def gauge(instances: Iterable[Instance | None], name: str, **match: str) -> float | None:
    """The first value of gauge ``name`` with labels ``match`` among ``instances``."""
    for inst in instances:
        if inst is None or inst.metrics is None:
            continue
        for labels, value in inst.metrics.get(name, {}).items():
            have = dict(labels)
            if all(have.get(k) == v for k, v in match.items()):
                return value
    return None


def worker_id_of(inst: Instance) -> str:
    return str(inst.status.get("worker_id") or inst.instance)


def pick_scheduler(now: Snapshot) -> Instance | None:
    """The scheduler the view follows: a ready one, the one knowing most workers."""
    schedulers = [i for i in now.instances if i.service == "scheduler"]
    return max(
        schedulers,
        default=None,
        key=lambda i: (i.status.get("ready") is True, len(as_mapping(i.status.get("workers")))),
    )


def worker_rows(
    now: Snapshot, scheduler: Instance | None, decode_rates: Mapping[str, float]
) -> list[WorkerRow]:
    """Every worker the scheduler knows or that answered ``$SRV`` itself, merged by id."""
    known = as_mapping(scheduler.status.get("workers")) if scheduler else {}
    own = {worker_id_of(i): i for i in now.instances if i.service == "worker"}
    rows = []
    for wid in sorted(set(known) | set(own)):
        seen = as_mapping(known.get(wid))
        inst = own.get(wid)
        mine = inst.status if inst else {}
        notes = []
        if inst is None:
            notes.append("no $SRV answer")
        elif scheduler is not None and wid not in known:
            notes.append("unknown to the scheduler")
        if mine.get("reason"):
            notes.append(str(mine["reason"]))
        kv = as_float(mine.get("kv_cache_usage"))
        if kv is None:
            kv = gauge(now.instances, "inferbus_kv_cache_usage_ratio", worker=wid)
        rows.append(
            WorkerRow(
                worker_id=wid,
                models=as_strings(seen.get("models")) or as_strings(mine.get("models")),
                state=str(seen.get("state") or mine.get("state") or "?"),
                running=as_int(mine.get("running")),
                waiting=as_int(mine.get("waiting")),
                assigned=as_int(seen.get("assigned")),
                max_num_seqs=as_int(seen.get("max_num_seqs")),
                kv_cache_usage=kv,
                heartbeat_age_s=gauge(
                    [scheduler], "inferbus_worker_heartbeat_age_seconds", worker=wid
                ),
                decode_tokens_per_s=decode_rates.get(wid),
                note="; ".join(notes),
            )
        )
    return rows


def queue_rows(scheduler: Instance | None) -> list[QueueRow]:
    """Depth per model and lane (the scheduler's status), with the oldest wait (its gauge)."""
    if scheduler is None:
        return []
    lanes = as_mapping(scheduler.status.get("lanes"))
    if not lanes:  # a scheduler without lanes: one queue per model
        lanes = {m: {"all": n} for m, n in as_mapping(scheduler.status.get("queued")).items()}
    return [
        QueueRow(
            model=str(model),
            lane=str(lane),
            depth=as_int(depth) or 0,
            oldest_wait_s=gauge(
                [scheduler], "inferbus_queue_oldest_wait_seconds", model=str(model), lane=str(lane)
            ),
        )
        for model in sorted(lanes)
        for lane, depth in sorted(as_mapping(lanes[model]).items())
    ]


def queued_total(scheduler: Instance | None) -> int | None:
    if scheduler is None:
        return None
    return sum(as_int(n) or 0 for n in as_mapping(scheduler.status.get("queued")).values())


def _detail(inst: Instance) -> str:
    s = inst.status
    if inst.service == "gateway":
        models = s.get("models")  # model → ready workers
        count = len(models) if isinstance(models, (Mapping, list)) else 0
        return f"auth {s.get('auth', '?')}, {count} model{'' if count == 1 else 's'}"
    if inst.service == "sanitizer":
        return ", ".join(f"{k} {s[k]}" for k in ("accepted", "rejected", "blocked") if k in s)
    if inst.service == "scheduler":
        routing = as_mapping(s.get("routing"))
        hit = as_float(routing.get("prefix_hit_rate"))
        return f"routing {routing.get('policy', '?')}" + (
            f", prefix hits {hit:.0%}" if hit is not None else ""
        )
    if inst.service == "worker":
        loading = f", loading {s['loading']}" if s.get("loading") else ""
        return f"{s.get('engine', '?')} engine, worker {s.get('worker_id', '?')}{loading}"
    if inst.service == "kvspill":
        used, capacity = as_int(s.get("used_bytes")), as_int(s.get("capacity_bytes"))
        if used is None or not capacity:
            return ""
        share, gib = used / capacity, capacity / 2**30
        return f"shared tier {share:.0%} of {gib:.1f} GiB, {s.get('blocks', 0)} blocks"
    return ""


def _order(inst: Instance) -> tuple[int, str, str]:
    rank = SERVICES.index(inst.service) if inst.service in SERVICES else len(SERVICES)
    return rank, inst.service, inst.instance


def service_rows(now: Snapshot) -> list[ServiceRow]:
    return [
        ServiceRow(
            service=inst.service,
            instance=inst.instance,
            ready=inst.status.get("ready") if isinstance(inst.status.get("ready"), bool) else None,
            inflight=as_int(inst.status.get("inflight")),
            metrics="ok"
            if inst.metrics is not None
            else f"unreachable: {inst.metrics_error or 'no address'}",
            metrics_url=inst.metrics_url,
            detail=_detail(inst),
        )
        for inst in sorted(now.instances, key=_order)
    ]


def missing_services(now: Snapshot) -> list[str]:
    present = {i.service for i in now.instances}
    return [s for s in servicetable.default_names() if s not in present]


def rollout_rows(now: Snapshot) -> list[RolloutRow]:
    """What the delivery service reports of its rollouts, the ones in flight first."""
    rows = []
    for inst in now.instances:
        if inst.service != "delivery":
            continue
        for model, r in as_mapping(inst.status.get("rollouts")).items():
            r = as_mapping(r)
            rows.append(
                RolloutRow(
                    model=str(model),
                    version=str(r.get("version", "?")),
                    phase=str(r.get("phase", "?")),
                    weight=as_float(r.get("weight")),
                    workers=as_strings(r.get("workers")),
                )
            )
    over = ("done", "rolled_back", "failed")
    return sorted(rows, key=lambda r: (r.phase in over, r.model))
