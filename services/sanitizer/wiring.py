"""What the sanitizer reads and writes on the bus (shared/subscriptions.py)."""

from __future__ import annotations

from inferbus.contracts import (
    ACCEPTED,
    ACCEPTED_PARTITIONS,
    CANCEL,
    ENDED,
    FILTER_PREFIX,
    LLMSERVICES,
    SCHEDULER_LOAD,
    SUBMIT,
    TENANT_POLICIES,
    TENANT_SUBMITS,
    LLMServiceSettings,
    ReplyDelivery,
    SchedulerLoad,
    TenantPolicy,
)
from inferbus.shared.subscriptions import (
    Consume,
    ConsumerSpec,
    Listen,
    Subscription,
    Wiring,
    settings_records,
)

CHECK_ACK_WAIT_S = 5.0
"""A check takes milliseconds: a submit delivered to a sanitizer that died before it
acked goes to the next one this soon (at the stream's 30 s default it outlasted a
client's 20 s timeout: found by the fault suite, tests/integration/test_faults.py)."""
SUBMITTED_CONSUMER = ConsumerSpec(
    durable="sanitizer",
    stream="IB_REQUESTS",
    filter_subject=SUBMIT,
    deliver_subject="ib.deliver.sanitizer",
    ack_wait_s=CHECK_ACK_WAIT_S,
)
TENANT_SUBMITTED_CONSUMER = ConsumerSpec(
    durable="sanitizer-tenants",
    stream="IB_TENANT_SUBMITS",
    filter_subject=TENANT_SUBMITS,
    deliver_subject="ib.deliver.sanitizer-tenants",
    ack_wait_s=CHECK_ACK_WAIT_S,
)

WIRING = Wiring(
    subscriptions=(
        # the output filter first: an accepted request's tokens may come back at once
        Subscription(
            f"{FILTER_PREFIX}.{{instance}}.>",
            ReplyDelivery,
            "_on_output",
            source=Listen(pending_msgs_limit=1_000_000),
            counted=False,
            early=True,
        ),
        # tenants' records and the LLMServices' checks before their requests
        settings_records(TENANT_POLICIES, TenantPolicy, "_on_tenant_policy"),
        settings_records(LLMSERVICES, LLMServiceSettings, "_on_model_record"),
        # decoded by the handler: a malformed request is still answered if it can be
        Subscription(SUBMIT, bytes, "_on_submitted", source=Consume(SUBMITTED_CONSUMER)),
        Subscription(
            TENANT_SUBMITS, bytes, "_on_submitted", source=Consume(TENANT_SUBMITTED_CONSUMER)
        ),
        # a partitioned scheduler's instances: which partition serves which model
        Subscription(
            SCHEDULER_LOAD,
            SchedulerLoad,
            "_on_scheduler_load",
            bad="drop",
            when="partitioned",
            early=True,
        ),
    ),
    publishes=(ACCEPTED, ACCEPTED_PARTITIONS, ENDED, CANCEL),
)
