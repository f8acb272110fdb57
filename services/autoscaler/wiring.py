"""What the autoscaler reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    ACCEPTED,
    ACCEPTED_PARTITIONS,
    ENDED,
    ENDED_PARTITIONS,
    HEARTBEATS,
    LLMSERVICES,
    SCALE_DECISIONS,
    SCALING_STATUS,
    SCHEDULER_LOAD,
    STARTED,
    STARTED_PARTITIONS,
    LLMServiceSettings,
    RequestAccepted,
    RequestStarted,
    SchedulerLoad,
    Terminal,
    WorkerHeartbeat,
)
from inferbus.contracts.control import SUPERVISORS
from inferbus.shared.subscriptions import Follow, Subscription, Wiring, settings_records

WIRING = Wiring(
    subscriptions=(
        # LLMServices' records first: the models they add are managed from the start
        settings_records(LLMSERVICES, LLMServiceSettings, "_on_service", bad="drop"),
        # events other services answer for (they dead-letter bad ones): skipped here
        Subscription(HEARTBEATS, WorkerHeartbeat, "_on_heartbeat", bad="drop"),
        Subscription(STARTED, RequestStarted, "_on_started", bad="drop"),
        Subscription(STARTED_PARTITIONS, RequestStarted, "_on_started", bad="drop"),
        Subscription(SCHEDULER_LOAD, SchedulerLoad, "_on_load", bad="drop"),
        # the request stream from now on, read without holding anything back
        Subscription(
            ACCEPTED, RequestAccepted, "_on_accepted", source=Follow("IB_REQUESTS"), bad="drop"
        ),
        # a partitioned scheduler's (INFERBUS_SCHEDULER_PARTITIONS)
        Subscription(
            ACCEPTED_PARTITIONS,
            RequestAccepted,
            "_on_accepted",
            source=Follow("IB_REQUESTS"),
            bad="drop",
        ),
        Subscription(ENDED, Terminal, "_on_ended", source=Follow("IB_REQUESTS"), bad="drop"),
        Subscription(
            ENDED_PARTITIONS, Terminal, "_on_ended", source=Follow("IB_REQUESTS"), bad="drop"
        ),
    ),
    publishes=(SCALE_DECISIONS, SCALING_STATUS, SUPERVISORS),
)
