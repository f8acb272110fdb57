"""Idempotent JetStream provisioning from the specs in contracts.subjects."""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from inferbus.contracts import STREAMS, StreamSpec
from inferbus.shared.errors import ConfigError
from inferbus.shared.subscriptions import ConsumerSpec

LIMITS_ENV = "INFERBUS_STREAM_LIMITS"
"""The provisioner's overrides of the streams' limits: ``NAME=SIZE[/AGE],...``, e.g.
``IB_REQUESTS=8GiB/48h,IB_KV=512MiB`` (sizes in B, KiB, MiB, GiB, TiB; ages in s, m,
h, d)."""

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _number(text: str, units: dict[str, int], what: str) -> float:
    t = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if t.endswith(unit) and t[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return float(t[: -len(unit)]) * units[unit]
    raise ConfigError(f"{LIMITS_ENV}: {text!r} is not a {what} ({', '.join(units)})")


def stream_limits(text: str, streams: Sequence[StreamSpec] = STREAMS) -> tuple[StreamSpec, ...]:
    """``streams`` with the limits ``text`` sets (LIMITS_ENV's syntax)."""
    by_name = {s.name: s for s in streams}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        spec = by_name.get(name.strip())
        if spec is None or not value:
            raise ConfigError(
                f"{LIMITS_ENV}: {item!r}: NAME=SIZE[/AGE] with NAME one of {sorted(by_name)}"
            )
        size, _, age = value.partition("/")
        changes: dict[str, float | int] = {"max_bytes": int(_number(size, _UNITS, "size"))}
        if age:
            changes["max_age_s"] = _number(age, _AGES, "duration")
        by_name[spec.name] = msgspec.structs.replace(spec, **changes)
    return tuple(by_name.values())


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas,
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        discard=DiscardPolicy.OLD,  # room is made, never refused
        duplicate_window=spec.duplicate_window_s,
        max_msgs_per_subject=spec.max_msgs_per_subject,
    )


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable,
        filter_subject=spec.filter_subject,
        deliver_subject=spec.deliver_subject,
        deliver_group=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_s,
        max_ack_pending=spec.max_ack_pending,
        max_deliver=spec.max_deliver,
    )


async def ensure_streams(
    js: JetStreamContext, replicas: int | None = None, *, update: bool = True
) -> None:
    """Create every missing stream and, for a provisioner (``inferbus up``, the
    Kubernetes operator, the CLI as operator), bring each to its spec. Only the
    provisioner that names ``replicas`` (``inferbus up --nats-cluster 3``) sets how many
    copies a stream keeps; everyone else keeps what is there (1 for a new one).

    Services pass ``update=False``: their NATS users may create a platform stream that
    is missing (a first start before any provisioner) but change none, so a service's
    credentials cannot shrink a stream's limits (busauth.JS_BOOTSTRAP)."""
    for spec in stream_limits(os.environ.get(LIMITS_ENV, "")):
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            try:
                await js.add_stream(stream_config(spec, replicas or 1))
                continue
            except Exception:  # another service created it between the two calls
                info = await js.stream_info(spec.name)
        if update:
            kept = replicas or info.config.num_replicas or 1
            await js.update_stream(stream_config(spec, kept))


async def ensure_consumers(js: JetStreamContext, consumers: Sequence[ConsumerSpec]) -> None:
    """Create or update a service's durable consumers (a new one starts from the start
    of its stream, so nothing submitted before the service first ran is lost)."""
    for consumer in consumers:
        await js.add_consumer(consumer.stream, consumer_config(consumer))
