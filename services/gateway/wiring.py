"""What the gateway reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    CANCEL,
    GATEWAY_REPLY_OWNER,
    HEARTBEATS,
    REPLY_PREFIX,
    RESPONSES,
    SCALING_STATUS,
    SCHEDULER_LOAD,
    SUBMIT,
    ReplyDelivery,
    ScalingStatus,
    SchedulerLoad,
    WorkerHeartbeat,
    heartbeat_subject,
)
from inferbus.shared.subscriptions import Listen, Subscription, Wiring

WIRING = Wiring(
    subscriptions=(
        # its replies under ib.reply.gw.<id>: the gateway's credentials read only those;
        # a stream's chunks must never be dropped for a slow reader
        Subscription(
            f"{REPLY_PREFIX}.{GATEWAY_REPLY_OWNER}.{{gateway_id}}.>",
            ReplyDelivery,
            "_on_reply",
            source=Listen(pending_msgs_limit=1_000_000),
            counted=False,
        ),
        # the scheduler dead-letters bad heartbeats; the gateway just ignores them
        Subscription(
            HEARTBEATS,
            WorkerHeartbeat,
            "_on_heartbeat",
            bad="drop",
            sender=lambda hb: heartbeat_subject(hb.worker_id),
        ),
        Subscription(SCHEDULER_LOAD, SchedulerLoad, "_on_load", bad="drop"),
        Subscription(SCALING_STATUS, ScalingStatus, "_on_scaling", bad="drop"),
    ),
    # stored responses: written (and deleted) by key; reads are granted apart
    publishes=(SUBMIT, CANCEL, f"$KV.{RESPONSES}.>"),
)
