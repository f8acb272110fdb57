"""What the delivery service reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    CANARIES,
    DELIVERY_COMMANDS,
    DELIVERY_LOADS,
    ENDED,
    ENDED_PARTITIONS,
    HEARTBEATS,
    MODEL_REGISTRY,
    ROLLOUTS,
    SWAPPED,
    DeployRequest,
    ModelSwapped,
    RollbackRequest,
    Terminal,
    WorkerHeartbeat,
)
from inferbus.shared.subscriptions import (
    Consume,
    ConsumerSpec,
    Follow,
    Subscription,
    Wiring,
)

COMMANDS = ConsumerSpec(
    durable="delivery-commands",
    stream="IB_DELIVERY",
    filter_subject=DELIVERY_COMMANDS,
    deliver_subject="ib.deliver.delivery-commands",
)
SWAPS = ConsumerSpec(
    durable="delivery-swapped",
    stream="IB_DELIVERY",
    filter_subject=SWAPPED,
    deliver_subject="ib.deliver.delivery-swapped",
)

WIRING = Wiring(
    subscriptions=(
        # events other services answer for (they dead-letter bad ones): skipped here
        Subscription(HEARTBEATS, WorkerHeartbeat, "_on_heartbeat", bad="drop"),
        # request ends from now on (each names the version that served it)
        Subscription(ENDED, Terminal, "_on_ended", source=Follow("IB_REQUESTS"), bad="drop"),
        # a partitioned scheduler's workers' (INFERBUS_SCHEDULER_PARTITIONS)
        Subscription(
            ENDED_PARTITIONS, Terminal, "_on_ended", source=Follow("IB_REQUESTS"), bad="drop"
        ),
        Subscription(
            DELIVERY_COMMANDS,
            DeployRequest | RollbackRequest,
            "_on_command",
            source=Consume(COMMANDS),
        ),
        Subscription(SWAPPED, ModelSwapped, "_on_swapped", source=Consume(SWAPS)),
    ),
    # model versions to workers, canary weights to the scheduler, its decisions; the
    # registry's KV bucket is its to write
    publishes=(CANARIES, DELIVERY_LOADS, ROLLOUTS, f"$KV.{MODEL_REGISTRY}.>"),
)
