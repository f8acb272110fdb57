"""What the scheduler reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    ACCEPTED,
    ACCEPTED_PARTITIONS,
    CANARIES,
    CANCEL,
    ENDED,
    HEARTBEATS,
    KV_EVENTS,
    KV_INDEX,
    LLMSERVICES,
    PROGRESS,
    SCALING_STATUS,
    SCHEDULER_LEASES,
    SCHEDULER_LOAD,
    STARTED,
    TENANT_CANCELS,
    CanaryWeights,
    CancelRequest,
    KvEvent,
    KvEventBatch,
    LLMServiceSettings,
    Progress,
    RequestAccepted,
    RequestStarted,
    ScalingStatus,
    SchedulerLoad,
    Terminal,
    WorkerHeartbeat,
    accepted_subject,
    ended_subject,
    heartbeat_subject,
    kv_resync_subject,
    kv_subject,
    progress_subject,
    started_subject,
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


def accepted_consumer(partition: int) -> ConsumerSpec:
    """A partition's accepted requests, read by the instance holding its lease (one at
    a time: a shorter ack wait than the unpartitioned one's, so what a dead owner held
    comes to the next within the 5 s a partition may go unserved)."""
    return ConsumerSpec(
        durable=f"scheduler-accepted-{partition}",
        stream="IB_REQUESTS",
        filter_subject=accepted_subject(partition),
        deliver_subject=f"ib.deliver.scheduler-accepted.{partition}",
        ack_wait_s=4.0,
        max_deliver=-1,  # kept in progress by its holder: never dropped for redeliveries
    )


def ended_consumer(partition: int) -> ConsumerSpec:
    """The ends its workers record for a partition (as ENDED_CONSUMER, one partition's)."""
    return ConsumerSpec(
        durable=f"scheduler-ended-{partition}",
        stream="IB_REQUESTS",
        filter_subject=ended_subject(partition),
        deliver_subject=f"ib.deliver.scheduler-ended.{partition}",
        max_deliver=-1,
    )


def partition_subscriptions(partition: int) -> tuple[Subscription, ...]:
    """What the instance holding a partition reads of it: its workers' starts and
    ends, then its accepted requests (subscribed when the lease is taken)."""
    return (
        Subscription(started_subject(partition), RequestStarted, "_on_started"),
        Subscription(
            ended_subject(partition),
            Terminal,
            "_on_partition_ended",
            source=Consume(ended_consumer(partition)),
        ),
        Subscription(
            accepted_subject(partition),
            RequestAccepted,
            "_on_accepted",
            source=Consume(accepted_consumer(partition)),
        ),
        # partition 0's holder also reads ib.req.accepted: what a sanitizer told no
        # partitions sends, or what was handed back while the scheduler was not
        # partitioned yet
        *(
            (
                Subscription(
                    ACCEPTED,
                    RequestAccepted,
                    "_on_accepted",
                    source=Consume(ACCEPTED_CONSUMER),
                ),
            )
            if partition == 0
            else ()
        ),
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
            only="books_subject",  # partitioned: its own workers' only, undecoded else
        ),
        Subscription(STARTED, RequestStarted, "_on_started"),
        # copies of migratable requests' chunks: where a continuation picks up
        Subscription(
            PROGRESS,
            Progress,
            "_on_progress",
            sender=lambda ev: progress_subject(ev.worker_id),
            only="books_subject",
        ),
        Subscription(SCALING_STATUS, ScalingStatus, "_on_scaling", bad="drop"),
        Subscription(CANCEL, CancelRequest, "_on_cancel"),
        Subscription(TENANT_CANCELS, CancelRequest, "_on_cancel"),
        Subscription(
            ENDED, Terminal, "_on_ended", source=Consume(ENDED_CONSUMER), when="unpartitioned"
        ),
        Subscription(
            ACCEPTED,
            RequestAccepted,
            "_on_accepted",
            source=Consume(ACCEPTED_CONSUMER),
            when="unpartitioned",
        ),
        # partitioned: each held partition's starts, ends and accepted requests are read
        # while its lease is held (partition_subscriptions); the ends recorded here (a
        # worker from before partitions, the sanitizer's rejections) by every instance,
        # from where its restore began
        Subscription(
            ENDED,
            Terminal,
            "_on_ended",
            source=Follow("IB_REQUESTS", start_after="ended_resume_seq"),
            when="partitioned",
        ),
        # the workers' KV events, replayed from the stream's start, or from where the
        # stored index loaded at start is as of: the index of which worker holds which
        # prefix is rebuilt after a restart
        Subscription(
            KV_EVENTS,
            KvEvent | KvEventBatch,
            "_on_kv",
            source=Follow("IB_KV", deliver="all", start_after="kv_resume_seq"),
            sender=lambda ev: kv_subject(ev.worker_id),
            only="books_subject",
        ),
        # partitioned: the other instances' reports, for requests it has no worker for
        Subscription(
            SCHEDULER_LOAD, SchedulerLoad, "_on_peer_load", bad="drop", when="partitioned"
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
        ACCEPTED_PARTITIONS,
        ENDED,
        SCHEDULER_LOAD,
        CANCEL,
        f"$KV.{KV_INDEX}.>",
        kv_resync_subject(">"),
        f"$KV.{SCHEDULER_LEASES}.>",
    ),
)
