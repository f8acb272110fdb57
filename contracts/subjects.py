"""Subject names and JetStream stream specs, declared once (each service declares the
durable consumers it reads through, beside its handlers).

Durable where loss matters (requests, assignments, outcomes, dead letters live in
JetStream); core NATS where latency matters (token chunks, heartbeats, control).
"""

from __future__ import annotations

import re
import zlib

import msgspec

__all__ = [
    "ACCEPTED",
    "ACCEPTED_PARTITIONS",
    "BATCH_TOKEN",
    "CANARIES",
    "CANCEL",
    "DELIVERY_COMMANDS",
    "DELIVERY_LOADS",
    "ENDED",
    "ENDED_PARTITIONS",
    "FILTER_PREFIX",
    "GATEWAY_REPLY_OWNER",
    "HEADER_MSG_ID",
    "HEADER_REQUEST_ID",
    "HEADER_TRACEPARENT",
    "HEARTBEATS",
    "KV_EVENTS",
    "KV_INDEX",
    "KV_SPILL_INDEX",
    "LLMSERVICES",
    "MODEL_ARTIFACTS",
    "MODEL_REGISTRY",
    "PROGRESS",
    "REPLY_PREFIX",
    "RESIDENCIES",
    "RESPONSES",
    "ROLLOUTS",
    "SCALE_DECISIONS",
    "SCALING_STATUS",
    "SCHEDULER_LEASES",
    "SCHEDULER_LOAD",
    "STARTED",
    "STARTED_PARTITIONS",
    "STREAMS",
    "SUBMIT",
    "SWAPPED",
    "TENANT_CANCELS",
    "TENANT_POLICIES",
    "TENANT_SUBMITS",
    "TRACE_DECIDED",
    "StreamSpec",
    "accepted_subject",
    "batch_subject",
    "canary_subject",
    "dead_letter_subject",
    "delivery_command_subject",
    "delivery_load_subject",
    "ended_subject",
    "heartbeat_subject",
    "kv_resync_subject",
    "kv_subject",
    "llmservice_subject",
    "progress_subject",
    "reply_subject",
    "residency_subject",
    "rollout_subject",
    "scale_subject",
    "started_subject",
    "status_subject",
    "subject_token",
    "swapped_subject",
    "tenant_cancel_subject",
    "tenant_of_subject",
    "tenant_policy_subject",
    "tenant_reply_prefix",
    "tenant_request_id",
    "tenant_submit_subject",
    "work_subject",
    "worker_partition",
]

# JetStream subjects
SUBMIT = "ib.req.submitted"
"""RequestSubmitted from the platform's own submitters (the gateway, an operator), whose
tenant, priority and policies fields are trusted (JetStream; set Nats-Msg-Id to the
request id). With the bus closed, a tenant's client may not publish here."""
_TENANT_SUBMIT = "ib.req.submitted.{tenant}"
TENANT_SUBMITS = "ib.req.submitted.*"
"""A tenant's own submit subject: NATS permissions let only that tenant's credentials
publish on it, and the sanitizer takes the tenant, priority and policies of what
arrives here from the tenant's record, never from the payload."""
ACCEPTED = "ib.req.accepted"
"""Accepted requests for the scheduler; with the scheduler partitioned
(INFERBUS_SCHEDULER_PARTITIONS > 1), each partition's on ``ib.req.accepted.<p>``."""
_ACCEPTED_PARTITION = "ib.req.accepted.{partition}"
ACCEPTED_PARTITIONS = "ib.req.accepted.*"
ENDED = "ib.req.ended"
"""Every terminal event is recorded here as well as sent to the reply subject; a
partitioned scheduler's workers record theirs on ``ib.req.ended.<p>``, where only the
partition's instance reads them (readers of every end read both)."""
_ENDED_PARTITION = "ib.req.ended.{partition}"
ENDED_PARTITIONS = "ib.req.ended.*"
_WORK = "ib.work.{worker_id}"
_DEAD_LETTER = "ib.dlq.{service}"
_KV = "ib.kv.{worker_id}"
KV_EVENTS = "ib.kv.>"
_KV_RESYNC = "ib.kvsync.{worker_id}"
"""The scheduler asks a worker for its whole KV state (core NATS): it found one of the
worker's events missing."""

# core NATS subjects
CANCEL = "ib.ctl.cancel"
"""CancelRequest from the platform (the gateway when its client hangs up)."""
_TENANT_CANCEL = "ib.ctl.cancel.{tenant}"
TENANT_CANCELS = "ib.ctl.cancel.*"
"""A tenant's cancels: honoured only for that tenant's own requests."""
STARTED = "ib.ctl.started"
_STARTED_PARTITION = "ib.ctl.started.{partition}"
STARTED_PARTITIONS = "ib.ctl.started.*"
"""A partitioned scheduler's workers' starts (``ib.ctl.started.<p>``)."""
HEARTBEATS = "ib.hb.>"
"""Worker ids are ``<instance>.<nonce>``: a worker's credentials allow it the subjects
of its own instance only (``ib.hb.<instance>.*``, ``ib.kv.<instance>.*``)."""
SCHEDULER_LOAD = "ib.sched.load"
"""SchedulerLoad, a few times a second: queue depth and limits per model."""
TRACE_DECIDED = "ib.trace.decided"
"""TraceDecided, from the service that ended a request: every service that buffered
spans of its trace exports or drops them (tail sampling across processes)."""
_HEARTBEAT = "ib.hb.{worker_id}"
_PROGRESS = "ib.progress.{worker_id}"
PROGRESS = "ib.progress.>"
"""Copies of a migratable request's chunks, worker → scheduler (core NATS): what a
continuation on another worker picks up from if this worker is lost."""
REPLY_PREFIX = "ib.reply"
GATEWAY_REPLY_OWNER = "gw"
"""Gateways' replies are ``ib.reply.gw.<gateway>.<request id>``; tenants' are under
``ib.reply.tenant.<tenant>.``."""
FILTER_PREFIX = "ib.filter"
"""Output streams pass through a sanitizer instance at
``ib.filter.<instance>.<client reply subject>``."""
BATCH_TOKEN = "batch"
"""The last token of a platform reader's batch subject (``batch_subject``); no request
id a gateway makes and no client subject is this word."""
_STATUS = "ib.svc.{service}.status"

_CANARY = "ib.cfg.canary.{model}"
CANARIES = "ib.cfg.canary.*"
_TENANT_POLICY = "ib.cfg.tenant.{tenant}"
TENANT_POLICIES = "ib.cfg.tenant.*"
_TENANT_REPLY = "ib.reply.tenant.{tenant}."

_SCALE = "ib.scale.decided.{model}"
SCALE_DECISIONS = "ib.scale.decided.*"
"""ScaleDecision: the autoscaler's decisions, per model (JetStream IB_SCALE)."""
SCALING_STATUS = "ib.scaling.status"
"""ScalingStatus: the models the autoscaler sizes and their targets (core NATS)."""

# the shared KV spill tier (services/kvspill)
KV_SPILL_INDEX = "ib-kvspill"
"""JetStream KV bucket: ``ns.<namespace>`` → KvSpillNamespace, what the shared tier
holds of each model's weights (the kvspill service writes it after each scan)."""

# the scheduler's KV index, for its next start (services/scheduler/kvsnapshot.py)
SCHEDULER_LEASES = "ib-sched-leases"
"""JetStream KV bucket: which scheduler instance owns which partition (``part.<p>``)
and which instances are alive (``member.<instance>``), each renewed every second or so
(services/scheduler/leases.py)."""
KV_INDEX = "ib-kv-index"
"""JetStream KV bucket: ``<worker_id>.<medium>.<part>`` → KvIndexPart, the blocks each
worker's KV events said it holds, as of a position in IB_KV: a restarted scheduler
loads these and reads IB_KV on from there instead of from its start."""

# the gateway's stored responses (OpenAI's Responses API, services/gateway/responses.py)
RESPONSES = "ib-responses"
"""JetStream KV bucket: ``r.<response id>`` → the stored response and the conversation a
next turn (``previous_response_id``) continues; any gateway reads any."""

# model delivery (contracts/delivery.py), JetStream IB_DELIVERY
MODEL_REGISTRY = "ib-models"
"""JetStream KV bucket: ``v.<name>.<version>`` → ModelVersion, ``current.<name>`` →
ModelCurrent."""
MODEL_ARTIFACTS = "ib-models"
"""JetStream Object Store: ``<name>/<version>/<file>`` and the version's signature."""
_DELIVERY_CMD = "ib.delivery.cmd.{model}"
DELIVERY_COMMANDS = "ib.delivery.cmd.*"
"""DeployRequest and RollbackRequest, for the delivery service."""
_DELIVERY_LOAD = "ib.delivery.load.{model}"
DELIVERY_LOADS = "ib.delivery.load.*"
"""ModelDelivery, for workers."""
_SWAPPED = "ib.delivery.swapped.{worker_id}"
SWAPPED = "ib.delivery.swapped.>"
"""ModelSwapped, from workers (``ib.delivery.swapped.<instance>.<nonce>``)."""
_ROLLOUT = "ib.delivery.rollout.{model}"
ROLLOUTS = "ib.delivery.rollout.*"
"""RolloutDecision: every decision of every rollout (the audit trail)."""
_RESIDENCY = "ib.cfg.residency.{model}"
RESIDENCIES = "ib.cfg.residency.*"
_LLMSERVICE = "ib.cfg.llmservice.{model}"
LLMSERVICES = "ib.cfg.llmservice.*"
"""LLMServiceSettings, per model (contracts/llmservice.py)."""

HEADER_REQUEST_ID = "Ib-Request-Id"
HEADER_TRACEPARENT = "traceparent"
HEADER_MSG_ID = "Nats-Msg-Id"


def subject_token(text: str) -> str:
    """Make ``text`` safe as one subject token (host names may hold dots)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text) or "-"


def tenant_submit_subject(tenant: str) -> str:
    return _TENANT_SUBMIT.format(tenant=tenant)


TENANT_ID_SEPARATOR = "~"
"""Between a tenant's name and its own request id: no tenant name holds it."""


def tenant_request_id(tenant: str, request_id: str) -> str:
    """The platform's id for a request a tenant submitted (or cancels) on its own
    subject: ``<tenant>~<its id>``. A tenant chooses its ids, so two may choose the
    same; scoped, one tenant's id never meets another's, nor tells it that an id is in
    use or refuses its request for it (issue 42 item 11). Its events carry this id; an
    id already scoped to the tenant is kept."""
    prefix = tenant + TENANT_ID_SEPARATOR
    return request_id if request_id.startswith(prefix) else prefix + request_id


def tenant_cancel_subject(tenant: str) -> str:
    return _TENANT_CANCEL.format(tenant=tenant)


def tenant_reply_prefix(tenant: str) -> str:
    """Where a tenant's replies go (``ib.reply.tenant.<tenant>.<request id>``): the only
    reply subjects its credentials may subscribe to."""
    return _TENANT_REPLY.format(tenant=tenant)


def tenant_of_subject(subject: str, base: str) -> str | None:
    """The tenant token of ``<base>.<tenant>``; None for ``base`` itself (the platform's
    own subject) or anything else."""
    if subject.startswith(base + ".") and "." not in subject[len(base) + 1 :]:
        return subject[len(base) + 1 :]
    return None


def tenant_policy_subject(tenant: str) -> str:
    """A tenant's record (JetStream IB_CONFIG, the latest kept): set by an operator
    (``inferbus creds new --tenant``), read by the sanitizer."""
    return _TENANT_POLICY.format(tenant=tenant)


def accepted_subject(partition: int | None) -> str:
    """Where an accepted request goes: its scheduler partition's subject, or the one
    subject of an unpartitioned scheduler (None)."""
    return ACCEPTED if partition is None else _ACCEPTED_PARTITION.format(partition=partition)


def ended_subject(partition: int | None) -> str:
    """Where a worker records an end: its assignment's partition's, or ENDED."""
    return ENDED if partition is None else _ENDED_PARTITION.format(partition=partition)


def started_subject(partition: int | None) -> str:
    return STARTED if partition is None else _STARTED_PARTITION.format(partition=partition)


def worker_partition(worker_id: str, partitions: int) -> int:
    """The scheduler partition that books a worker: from its id alone, so a scheduler
    tells from a heartbeat's or KV event's subject whether to read it at all."""
    return zlib.crc32(worker_id.encode()) % partitions if partitions > 1 else 0


def heartbeat_subject(worker_id: str) -> str:
    return _HEARTBEAT.format(worker_id=worker_id)


def progress_subject(worker_id: str) -> str:
    return _PROGRESS.format(worker_id=worker_id)


def work_subject(worker_id: str) -> str:
    return _WORK.format(worker_id=worker_id)


def kv_subject(worker_id: str) -> str:
    """A worker's KV cache events (JetStream), for KV-aware routing and the spill service."""
    return _KV.format(worker_id=worker_id)


def kv_resync_subject(worker_id: str) -> str:
    return _KV_RESYNC.format(worker_id=worker_id)


def dead_letter_subject(service: str) -> str:
    return _DEAD_LETTER.format(service=service)


def batch_subject(subject: str) -> str | None:
    """Where a chunk for ``subject`` may go in a ``ChunkBatch``: the batch subject of
    the platform reader behind it (``ib.filter.<instance>.batch`` for a sanitizer's
    filter, ``ib.reply.gw.<gateway>.batch`` for a gateway); None for any other reader
    (a tenant's or a client's inbox reads events one by one)."""
    parts = subject.split(".", 3)
    if len(parts) == 4 and f"{parts[0]}.{parts[1]}" == FILTER_PREFIX:
        return f"{FILTER_PREFIX}.{parts[2]}.{BATCH_TOKEN}" if parts[3] != BATCH_TOKEN else None
    tokens = subject.split(".")
    if (
        len(tokens) == 5
        and f"{tokens[0]}.{tokens[1]}" == REPLY_PREFIX
        and tokens[2] == GATEWAY_REPLY_OWNER
        and tokens[4] != BATCH_TOKEN
    ):
        return f"{REPLY_PREFIX}.{GATEWAY_REPLY_OWNER}.{tokens[3]}.{BATCH_TOKEN}"
    return None


def reply_subject(owner: str, request_id: str) -> str:
    """A reply subject under an owner's wildcard (``ib.reply.<owner>.>``)."""
    return f"{REPLY_PREFIX}.{owner}.{request_id}"


def canary_subject(model: str) -> str:
    """A model's canary weights (JetStream IB_CONFIG, the latest kept): set by the
    delivery service or ``inferbus canary set``."""
    return _CANARY.format(model=subject_token(model))


def scale_subject(model: str) -> str:
    return _SCALE.format(model=subject_token(model))


def delivery_command_subject(model: str) -> str:
    return _DELIVERY_CMD.format(model=subject_token(model))


def delivery_load_subject(model: str) -> str:
    return _DELIVERY_LOAD.format(model=subject_token(model))


def swapped_subject(worker_id: str) -> str:
    return _SWAPPED.format(worker_id=worker_id)


def rollout_subject(model: str) -> str:
    return _ROLLOUT.format(model=subject_token(model))


def residency_subject(model: str) -> str:
    return _RESIDENCY.format(model=subject_token(model))


def llmservice_subject(model: str) -> str:
    return _LLMSERVICE.format(model=subject_token(model))


def status_subject(service: str) -> str:
    return _STATUS.format(service=service)


class StreamSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A stream and its limits: past its age or its bytes the oldest messages go (a
    publish is never refused for room), so no stream can fill the disk. Its bytes are
    its ``store_share`` of the platform's stream budget (INFERBUS_STREAM_STORE), which
    the provisioner's INFERBUS_STREAM_LIMITS may override (docs/deploy.md)."""

    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    store_share: float
    max_bytes: int = 0
    """Set from the budget when the streams are provisioned (shared/streams.py)."""
    duplicate_window_s: float = 120.0
    """JetStream's, for Nats-Msg-Id (at least 0.1 s). Tenants' submits keep its least:
    their ids are theirs to choose, and a longer window would dedupe one tenant's
    publish against another's, telling it that the id is in use."""
    description: str = ""
    max_msgs_per_subject: int = -1
    """1 for settings: a subject holds only its latest value."""


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        name="IB_REQUESTS",
        subjects=(SUBMIT, ACCEPTED, ACCEPTED_PARTITIONS, ENDED, ENDED_PARTITIONS),
        max_age_s=24 * 3600,
        store_share=0.27,
        description="submitted, accepted and ended requests: replayable and auditable",
    ),
    StreamSpec(
        name="IB_TENANT_SUBMITS",
        subjects=(TENANT_SUBMITS,),
        max_age_s=24 * 3600,
        store_share=0.08,
        duplicate_window_s=0.1,
        description="what tenants submit on their own subjects, as they sent it",
    ),
    StreamSpec(
        name="IB_WORK",
        subjects=("ib.work.>",),
        max_age_s=24 * 3600,
        store_share=0.2,
        description="work assignments, one subject per worker",
    ),
    StreamSpec(
        name="IB_KV",
        subjects=("ib.kv.>",),
        max_age_s=24 * 3600,
        store_share=0.2,
        description="workers' KV cache events (blocks stored, removed, cleared), by worker",
    ),
    StreamSpec(
        name="IB_CONFIG",
        subjects=("ib.cfg.>",),
        max_age_s=0,
        store_share=0.05,
        max_msgs_per_subject=1,
        description="settings services read at start and follow: the latest per subject",
    ),
    StreamSpec(
        name="IB_SCALE",
        subjects=("ib.scale.>",),
        max_age_s=7 * 24 * 3600,
        store_share=0.05,
        description="the autoscaler's decisions per model, with their reasons",
    ),
    StreamSpec(
        name="IB_DELIVERY",
        subjects=("ib.delivery.>",),
        max_age_s=90 * 24 * 3600,
        store_share=0.05,
        description="model deliveries, workers' swaps, rollout commands and decisions",
    ),
    StreamSpec(
        name="IB_DLQ",
        subjects=("ib.dlq.>",),
        max_age_s=7 * 24 * 3600,
        store_share=0.1,
        description="events a service could not decode or handle, with the reason",
    ),
)
