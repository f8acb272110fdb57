"""Idempotent JetStream provisioning from the specs in contracts.subjects."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from inferbus.contracts import CONSUMERS, STREAMS, ConsumerSpec, StreamSpec


def stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=spec.max_age_s,
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


async def ensure_streams(js: JetStreamContext) -> None:
    """Create or update every stream and durable consumer. Safe to run from every service."""
    for spec in STREAMS:
        config = stream_config(spec)
        try:
            await js.stream_info(spec.name)
        except NotFoundError:
            try:
                await js.add_stream(config)
                continue
            except Exception:  # another service created it between the two calls
                pass
        await js.update_stream(config)
    for consumer in CONSUMERS:
        await js.add_consumer(consumer.stream, consumer_config(consumer))
