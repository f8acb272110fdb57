"""What the scheduler reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    ACCEPTED,
    CANARIES,
    CANCEL,
    ENDED,
    HEARTBEATS,
    KV_EVENTS,
    KV_INDEX,
    LLMSERVICES,
    PROGRESS,
    SCALING_STATUS,
    SCHEDULER_LOAD,
    STARTED,
    TENANT_CANCELS,
    CanaryWeights,
    CancelRequest,
    KvEvent,
    KvEventBatch,
    LLMServiceSettings,
    RequestAccepted,
    RequestProgress,
    RequestStarted,
    ScalingStatus,
    Terminal,
    WorkerHeartbeat,
    heartbeat_subject,
    kv_resync_subject,
    kv_subject,
    progress_subject,
)
from inferbus.shared.subscriptions import (
    Consume,
    ConsumerSpec,
    Follow,
    Subscription,
    Wiring,
    settings_records,
)

ACCEPTED_CONSUMER = ConsumerSpec(
    durable="scheduler-accepted",
    stream="IB_REQUESTS",
    filter_subject=ACCEPTED,
    deliver_subject="ib.deliver.scheduler-accepted",
    # queued requests are held unacked (kept alive by in-progress signals every third
    # of this): a scheduler that dies hands them to the next one this soon
    ack_wait_s=10.0,
)
ENDED_CONSUMER = ConsumerSpec(
    durable="scheduler-ended",
    stream="IB_REQUESTS",
    filter_subject=ENDED,
    deliver_subject="ib.deliver.scheduler-ended",
    max_deliver=-1,
)

WIRING = Wiring(
    subscriptions=(
        # LLMServices' records first: a model's TTFT objective before its requests
        settings_records(LLMSERVICES, LLMServiceSettings, "_on_service", bad="drop"),
        Subscription(
            HEARTBEATS,
            WorkerHeartbeat,
            "_on_heartbeat",
            # a worker's credentials allow its own subject only: the id must match it
            sender=lambda hb: heartbeat_subject(hb.worker_id),
        ),
        Subscription(STARTED, RequestStarted, "_on_started"),
        # copies of migratable requests' chunks: where a continuation picks up
        Subscription(
            PROGRESS,
            RequestProgress,
            "_on_progress",
            sender=lambda ev: progress_subject(ev.worker_id),
        ),
        Subscription(SCALING_STATUS, ScalingStatus, "_on_scaling", bad="drop"),
        Subscription(CANCEL, CancelRequest, "_on_cancel"),
        Subscription(TENANT_CANCELS, CancelRequest, "_on_cancel"),
        Subscription(ENDED, Terminal, "_on_ended", source=Consume(ENDED_CONSUMER)),
        Subscription(ACCEPTED, RequestAccepted, "_on_accepted", source=Consume(ACCEPTED_CONSUMER)),
        # the workers' KV events, replayed from the stream's start, or from where the
        # stored index loaded at start is as of: the index of which worker holds which
        # prefix is rebuilt after a restart
        Subscription(
            KV_EVENTS,
            KvEvent | KvEventBatch,
            "_on_kv",
            source=Follow("IB_KV", deliver="all", start_after="kv_resume_seq"),
            sender=lambda ev: kv_subject(ev.worker_id),
        ),
        # canary weights: the latest per model, then every change
        Subscription(
            CANARIES,
            CanaryWeights,
            "_on_canary",
            source=Follow("IB_CONFIG", deliver="last_per_subject"),
        ),
    ),
    # CANCEL: a superseded attempt's stop, for a presumed-lost worker that wakes
    # its KV index, for its next start (kvsnapshot.py)
    # (and asks workers for their whole KV state: kv_resync_subject)
    publishes=(
        "ib.work.>",
        ENDED,
        SCHEDULER_LOAD,
        CANCEL,
        f"$KV.{KV_INDEX}.>",
        kv_resync_subject(">"),
    ),
)
