"""What a service reads from the bus and writes to it, declared as data.

Each service lists its subscriptions once (``services/<name>/wiring.py``): the
subject, the event type it decodes to, the handler, and how it is read (plain NATS,
a durable consumer shared by its replicas, an ordered replay of a stream, or a
consumer of its own). The runtime subscribes from these declarations, decodes,
dead-letters what does not decode or comes from the wrong sender, counts, and calls
the handler with the event; ``inferbus up``'s NATS permissions are derived from the
same declarations, so the code and the permissions cannot drift.

Pure: no I/O here (``shared/subscriber.py`` carries the declarations out).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec


class ConsumerSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A durable push consumer delivered to ``deliver_subject`` in queue group ``durable``.

    Push rather than pull: each hop of a request adds no fetch round trip, and
    replicas of a service share the work through the queue group.
    """

    durable: str
    stream: str
    filter_subject: str
    deliver_subject: str
    ack_wait_s: float = 30.0
    max_ack_pending: int = 20_000
    max_deliver: int = 5


Deliver = Literal["new", "all", "last_per_subject"]


@dataclass(frozen=True)
class Listen:
    """Plain NATS: what is published while subscribed, nothing kept."""

    pending_msgs_limit: int = 512 * 1024
    """Messages buffered before the client drops them (nats-py's default); a reply or
    output stream that must never lose a chunk raises it."""


@dataclass(frozen=True)
class Consume:
    """A durable consumer (provisioned by the runtime), shared by the service's
    replicas; the handler acks, and a handler that raises leaves the message for
    redelivery."""

    consumer: ConsumerSpec


@dataclass(frozen=True)
class Follow:
    """An ordered replay of a stream from ``deliver``, read without acks; ``replay``
    hands every retained message (the latest per subject) to the handler before the
    service goes on (settings records)."""

    stream: str
    deliver: Deliver = "new"
    replay: bool = False
    start_after: str = ""
    """An attribute of the service holding a stream sequence (set by its ``start``):
    when not 0, delivery begins at the message after it instead of at ``deliver``."""


@dataclass(frozen=True)
class Own:
    """A consumer of this instance's own (its credentials allow no other), named
    ``name`` so a restarted instance takes it over; the handler acks."""

    stream: str
    name: str
    """A template like the subject's; dots become dashes."""
    deliver: Deliver = "new"
    inactive_s: float = 60.0


Source = Listen | Consume | Follow | Own


@dataclass(frozen=True)
class Subscription:
    subject: str
    """May name ``{instance}`` (this instance's subject token) or a field the service
    fills in (``Service.subject_fields``)."""
    event: Any
    """The event type or union decoded for the handler; ``bytes`` hands it the raw
    message's data, undecoded."""
    handler: str
    """The service's method (``"deliveries._on_load"`` reaches an attribute's), called
    as ``handler(event, msg)``."""
    source: Source = Listen()
    bad: Literal["dead_letter", "drop"] = "dead_letter"
    """What becomes of a message that does not decode or comes from the wrong sender."""
    sender: Callable[[Any], str] | None = None
    """The one subject the event's author may publish it on (a worker's heartbeat on
    its own subject): any other is treated as bad."""
    early: bool = False
    """Subscribed before the service's ``start`` (what start itself needs: settings
    records, an output filter a request may reach at once)."""
    when: str = ""
    """A settings field that must be true for it to be subscribed."""
    counted: bool = True
    """Counted in ``inferbus_events_handled_total``; a reply stream's chunks (thousands a
    second, counted as tokens elsewhere) are not."""
    only: str = ""
    """A method of the service that says from a message's subject alone whether to read
    it (``only(subject) -> bool``); one it declines is neither decoded nor counted (a
    partitioned scheduler's heartbeats and KV events of the workers it does not book)."""


def settings_records(
    subject: str,
    event: Any,
    handler: str,
    bad: Literal["dead_letter", "drop"] = "dead_letter",
) -> Subscription:
    """Settings records kept in IB_CONFIG (tenants, LLMServices): the latest of each
    subject handed over before the service starts, then each new one as it comes."""
    return Subscription(
        subject,
        event,
        handler,
        source=Follow("IB_CONFIG", deliver="last_per_subject", replay=True),
        bad=bad,
        early=True,
    )


@dataclass(frozen=True)
class Wiring:
    subscriptions: tuple[Subscription, ...] = ()
    publishes: tuple[str, ...] = ()
    """Subjects it publishes on (templates as a subscription's), beyond what every
    service does: the source of its NATS user's publish permissions."""

    def consumers(self) -> list[ConsumerSpec]:
        return [s.source.consumer for s in self.subscriptions if isinstance(s.source, Consume)]

    def handlers(self) -> list[str]:
        return [s.handler for s in self.subscriptions]


PERMISSION_FORMS = {"instance": "{instance}", "worker_id": "{instance}.*", "gateway_id": "*"}
"""How each template field reads in a NATS permission: ``{instance}`` stays for busauth
to fill per user; a worker id is its instance plus a nonce; a gateway's id is one token
no one else reads."""

_FIELD = re.compile(r"{(\w+)}")


def fill(template: str, fields: dict[str, str]) -> str:
    return _FIELD.sub(lambda m: fields[m.group(1)], template)


def as_permission(template: str) -> str:
    return fill(template, PERMISSION_FORMS)
