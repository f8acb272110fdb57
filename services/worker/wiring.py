"""What a worker reads and writes on the bus (shared/subscriptions.py).

A worker's id is ``<instance>.<nonce>``; its credentials allow it the subjects of its
own instance only (its work, heartbeats, KV events, swap answers)."""

from __future__ import annotations

from inferbus.contracts import (
    CANCEL,
    DELIVERY_LOADS,
    ENDED,
    ENDED_PARTITIONS,
    RESIDENCIES,
    STARTED,
    STARTED_PARTITIONS,
    TENANT_CANCELS,
    CancelRequest,
    KvResync,
    ModelDelivery,
    ModelResidency,
    WorkAssigned,
    kv_resync_subject,
    work_subject,
)
from inferbus.shared.subscriptions import Own, Subscription, Wiring

WIRING = Wiring(
    subscriptions=(
        # the scheduler dead-letters bad cancels; the worker just ignores them
        Subscription(CANCEL, CancelRequest, "_on_cancel", bad="drop"),
        Subscription(TENANT_CANCELS, CancelRequest, "_on_cancel", bad="drop"),
        # named, so the create request carries its filter: the worker's credentials
        # allow consumers on its own work subject only
        Subscription(
            work_subject("{worker_id}"),
            WorkAssigned,
            "_on_work",
            source=Own("IB_WORK", name="work-{worker_id}"),
        ),
        # a scheduler that missed some of its KV events asks for its whole state
        Subscription(kv_resync_subject("{worker_id}"), KvResync, "_on_kv_resync", bad="drop"),
        # deliveries and residency policies in (the latest of each, then every change)
        Subscription(
            DELIVERY_LOADS,
            ModelDelivery,
            "deliveries._on_delivery",
            source=Own("IB_DELIVERY", name="delivery-{worker_id}"),
            when="follow_registry",
        ),
        Subscription(
            RESIDENCIES,
            ModelResidency,
            "deliveries._on_residency",
            source=Own("IB_CONFIG", name="residency-{worker_id}", deliver="last_per_subject"),
            when="follow_registry",
        ),
    ),
    publishes=(
        "ib.hb.{instance}.*",
        "ib.progress.{instance}.*",
        "ib.kv.{instance}.*",
        "ib.delivery.swapped.{instance}.*",
        STARTED,
        STARTED_PARTITIONS,
        ENDED,
        ENDED_PARTITIONS,
    ),
)
