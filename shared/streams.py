"""Idempotent JetStream provisioning from the specs in contracts.subjects."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

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
from nats.js.errors import APIError, NotFoundError

from inferbus.contracts import STREAMS, StreamSpec
from inferbus.shared import logs
from inferbus.shared.errors import ConfigError
from inferbus.shared.subscriptions import ConsumerSpec

STORE_ENV = "INFERBUS_STREAM_STORE"
"""The bytes the platform's streams may hold together (each its ``store_share``), e.g.
``16GiB``. JetStream reserves a stream's byte limit when it is made, so the budget must
fit the server's storage with room left for the KV buckets and the model artifacts:
about half of it (``inferbus up`` sets a third of its disk's free space)."""
DEFAULT_STORE = 2 << 30
LIMITS_ENV = "INFERBUS_STREAM_LIMITS"
"""Overrides per stream: ``NAME=SIZE[/AGE],...``, e.g. ``IB_REQUESTS=8GiB/48h,IB_KV=512MiB``
(sizes in B, KiB, MiB, GiB, TiB; ages in s, m, h, d)."""

PLACEMENT_PATIENCE_S = 60.0
"""How long a stream waits for JetStream to find nodes for its replicas."""

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SMALLEST = 1 << 20
"""No stream is sized smaller than this."""


def _number(text: str, units: dict[str, int], what: str, env: str) -> float:
    t = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if t.endswith(unit) and t[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return float(t[: -len(unit)]) * units[unit]
    raise ConfigError(f"{env}: {text!r} is not a {what} ({', '.join(units)})")


def size_of(text: str, env: str = STORE_ENV) -> int:
    return int(_number(text, _UNITS, "size", env))


def stream_limits(
    text: str = "", store: int = DEFAULT_STORE, streams: Sequence[StreamSpec] = STREAMS
) -> tuple[StreamSpec, ...]:
    """``streams`` with their bytes: their share of ``store``, then what ``text`` (in
    LIMITS_ENV's syntax) sets."""
    by_name = {
        s.name: msgspec.structs.replace(s, max_bytes=max(_SMALLEST, int(s.store_share * store)))
        for s in streams
    }
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        spec = by_name.get(name.strip())
        if spec is None or not value:
            raise ConfigError(
                f"{LIMITS_ENV}: {item!r}: NAME=SIZE[/AGE] with NAME one of {sorted(by_name)}"
            )
        size, _, age = value.partition("/")
        spec = msgspec.structs.replace(spec, max_bytes=size_of(size, LIMITS_ENV))
        if age:
            spec = msgspec.structs.replace(
                spec, max_age_s=_number(age, _AGES, "duration", LIMITS_ENV)
            )
        by_name[spec.name] = spec
    return tuple(by_name.values())


def stream_budget(store_dir: Path) -> int:
    """What an embedded server's streams may hold: a third of its disk's free space
    (JetStream takes up to three quarters of it; the rest of that is for the KV
    buckets and model artifacts)."""
    folder = store_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return max(16 * _SMALLEST, shutil.disk_usage(folder).free // 3)


log = logs.get("inferbus.streams")


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
    js: JetStreamContext,
    replicas: int | None = None,
    *,
    update: bool = True,
    placement_patience_s: float = PLACEMENT_PATIENCE_S,
) -> None:
    """Create every missing stream and, for a provisioner (``inferbus up``, the
    Kubernetes operator), bring each to its spec. Only the provisioner that names
    ``replicas`` (``inferbus up --nats-cluster 3``) sets how many copies a stream keeps;
    everyone else keeps what is there (1 for a new one).

    The CLI's commands pass ``update=False``: they do not know the budget their
    platform's provisioner sized the streams by (``up`` takes a third of its disk's
    free space), and a ``creds new`` resized every stream to its own.

    Services pass ``update=False``: their NATS users may create a platform stream that
    is missing (a first start before any provisioner) but change none, so a service's
    credentials cannot shrink a stream's limits (busauth.JS_BOOTSTRAP).

    JetStream reserves each stream's byte limit: where it has no room for the budget
    (a small disk, a small ``max_file_store``), the streams are sized again at half of
    it, and so on: streams smaller than asked beat a platform that cannot start.

    A cluster that has just elected its JetStream leader may not yet count every node
    as a peer, and refuses a replicated stream's placement meanwhile: each stream is
    asked again for up to ``placement_patience_s``."""
    store = os.environ.get(STORE_ENV, "")
    budget = size_of(store) if store else DEFAULT_STORE
    while True:
        try:
            specs = stream_limits(os.environ.get(LIMITS_ENV, ""), budget)
            await _ensure(js, specs, replicas, update, placement_patience_s)
            return
        except NoRoomError as exc:
            if budget // 2 < 16 * _SMALLEST:
                raise NoRoomError(
                    f"{exc}: JetStream has no room for the streams even at a {budget}-byte "
                    f"budget; give it more storage"
                ) from None
            budget //= 2
            log.warning("streams sized again: JetStream had no room", budget=budget)


async def _ensure(
    js: JetStreamContext,
    specs: Sequence[StreamSpec],
    replicas: int | None,
    update: bool,
    patience_s: float,
) -> None:
    for spec in specs:
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            try:
                config = stream_config(spec, replicas or 1)
                await _placed(partial(js.add_stream, config), spec, patience_s)
                continue
            except (NoRoomError, NoPeersError):
                raise
            except Exception as exc:
                if isinstance(exc, APIError) and exc.err_code == _OVERLAP:
                    raise ConfigError(
                        f"stream {spec.name} cannot be made: its subjects "
                        f"{list(spec.subjects)} overlap an existing stream's (a store an "
                        "older inferbus made); bring the streams to their spec once as "
                        "the operator: `inferbus nats provision`"
                    ) from None
                info = await _made_meanwhile(js, spec, exc)
        if update:
            config = stream_config(spec, replicas or info.config.num_replicas or 1)
            await _placed(partial(js.update_stream, config), spec, patience_s)


async def _made_meanwhile(js: JetStreamContext, spec: StreamSpec, refusal: Exception) -> Any:
    """The stream another service made between our look and our add; else the refusal."""
    try:
        return await js.stream_info(spec.name)
    except NotFoundError:
        raise refusal from None


class NoRoomError(RuntimeError):
    """JetStream has no room for a stream's byte limit."""


class NoPeersError(RuntimeError):
    """JetStream found no nodes to place a stream's replicas on, for as long as asked."""


async def _placed(call: Callable[[], Awaitable[Any]], spec: StreamSpec, patience_s: float) -> None:
    """Make or update a stream, asking again while JetStream says its peers are not
    there yet (a new cluster, a node restarting)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            await _no_room_said(call(), spec)
            return
        except APIError as exc:
            if exc.err_code not in _NOT_YET:
                raise
            if time.monotonic() >= deadline:
                raise NoPeersError(
                    f"stream {spec.name}: JetStream still says {exc.description!r} after "
                    f"{patience_s:.0f} s; does the cluster have a node for each replica?"
                ) from None
            log.info("stream waits for its peers", stream=spec.name, said=exc.description)
            await asyncio.sleep(0.5)


async def _no_room_said(call: Awaitable[Any], spec: StreamSpec) -> None:
    try:
        await call
    except APIError as exc:
        if exc.err_code == _NO_ROOM:
            raise NoRoomError(f"no room for stream {spec.name} at {spec.max_bytes} bytes") from None
        raise


_NO_ROOM = 10047
"""JetStream's "insufficient storage resources available"."""
_OVERLAP = 10065
"""JetStream's "subjects overlap with an existing stream"."""
_NOT_YET = frozenset({10005, 10008})
"""JetStream's "no suitable peers for placement" and "JetStream system temporarily
unavailable": what a cluster says until its leader has heard from every node."""


async def ensure_consumers(js: JetStreamContext, consumers: Sequence[ConsumerSpec]) -> None:
    """Create or update a service's durable consumers (a new one starts from the start
    of its stream, so nothing submitted before the service first ran is lost)."""
    for consumer in consumers:
        await js.add_consumer(consumer.stream, consumer_config(consumer))
