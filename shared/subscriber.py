"""Carries out a service's declared subscriptions (shared/subscriptions.py): subscribes,
decodes or dead-letters, checks the sender's subject, counts, calls the handler."""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from inferbus.shared import logs, metrics
from inferbus.shared.bus import DeadLetterer, replay, round_trip
from inferbus.shared.codec import DecodeError, decode
from inferbus.shared.subscriptions import (
    Consume,
    Follow,
    Listen,
    Own,
    Subscription,
    fill,
)

log = logs.get("inferbus.subscriber")

LIVE_WAIT_S = 2.0

_DELIVER = {
    "new": DeliverPolicy.NEW,
    "all": DeliverPolicy.ALL,
    "last_per_subject": DeliverPolicy.LAST_PER_SUBJECT,
}
SETTINGS_HISTORY_S = 10 * 365 * 86400.0
"""A replay reads back as far as anything can be (settings never age out)."""

Handler = Callable[[Any, Msg], Awaitable[None]]


def event_type_name(event: Any, spec: Subscription) -> str:
    """The label a handled event is counted under: its tag (``request.accepted``), its
    type's name, or for a message handed on undecoded, the subject it came in on."""
    tag = getattr(getattr(event, "__struct_config__", None), "tag", None)
    if isinstance(tag, str):
        return tag
    if spec.event is bytes:
        return spec.subject
    members = typing.get_args(spec.event) or (spec.event,)
    return " | ".join(getattr(m, "__name__", str(m)) for m in members)


def resolve(owner: object, path: str) -> Handler:
    target: Any = owner
    for part in path.split("."):
        target = getattr(target, part)
    handler: Handler = target
    return handler


class Subscriber:
    """One service's subscriptions, open or closed by name."""

    def __init__(
        self,
        service: str,
        nc: Client,
        js: JetStreamContext,
        dead_letters: DeadLetterer,
    ) -> None:
        self._service = service
        self._nc = nc
        self._js = js
        self._dead = dead_letters
        self.fields: dict[str, str] = {}
        """What the subjects' templates name (the service's ``subject_fields``)."""
        self._open: list[tuple[Subscription, Any]] = []
        """Each open declaration and its NATS subscription, in the order opened."""

    async def open(self, owner: object, subscriptions: Collection[Subscription]) -> None:
        """Open each; when it returns the server has every one (a message published
        after, from anywhere, reaches it)."""
        for spec in subscriptions:
            handler = resolve(owner, spec.handler)  # a wrong name fails the start, not later
            self._open.append(
                (spec, await self._subscribe(spec, self._receiver(spec, handler, owner), owner))
            )
        await self._live()

    async def open_one(self, owner: object, spec: Subscription) -> Any:
        """A subscription opened while the service runs (a partition it took over), live
        on the server when it returns; the caller closes it (``sub.drain()``), ``close``
        does not."""
        handler = resolve(owner, spec.handler)
        sub = await self._subscribe(spec, self._receiver(spec, handler, owner), owner)
        await self._live()
        return sub

    async def _live(self) -> None:
        """Wait until the server has the subscriptions sent so far (``round_trip``). A
        bus that is down does not hold a start or a takeover up for long: nats-py sends
        every subscription again when it reconnects."""
        with contextlib.suppress(TimeoutError):
            await round_trip(self._nc, LIVE_WAIT_S)

    async def close(self, *, keep: Collection[str] = (), drain: bool = False) -> None:
        """Stop reading, the last opened first (``drain``: hand what already arrived to
        the handlers first), except the subscriptions of the handlers named in ``keep``."""
        closing = [(spec, sub) for spec, sub in self._open if spec.handler not in keep]
        self._open = [(spec, sub) for spec, sub in self._open if spec.handler in keep]
        for _, sub in reversed(closing):
            try:
                await (sub.drain() if drain else sub.unsubscribe())
            except Exception:  # gone with the connection
                pass

    def _receiver(
        self, spec: Subscription, handler: Handler, owner: object = None
    ) -> Callable[[Msg], Awaitable[None]]:
        acks = isinstance(spec.source, Consume | Own)
        service = self._service
        counters: dict[type, Any] = {}
        """Each event type's counter, labelled once (a stream's chunks come by the
        thousand a second)."""

        def count(event: Any) -> None:
            counter = counters.get(type(event))
            if counter is None:
                label = event_type_name(event, spec)
                counter = counters[type(event)] = metrics.EVENTS_HANDLED.labels(service, label)
            counter.inc()

        async def bad(msg: Msg, reason: str) -> None:
            if spec.bad == "dead_letter":
                await self._dead.send(msg, reason)
            if acks:
                await msg.ack()  # settled: never redelivered

        only: Callable[[str], bool] | None = getattr(owner, spec.only) if spec.only else None

        async def receive(msg: Msg) -> None:
            if only is not None and not only(msg.subject):
                if acks:
                    await msg.ack()
                return
            if spec.event is bytes:
                event: Any = msg.data
            else:
                try:
                    event = decode(msg.data, spec.event)
                except DecodeError as exc:
                    await bad(msg, f"undecodable {event_type_name(None, spec)}: {exc}")
                    return
                own = spec.sender(event) if spec.sender is not None else msg.subject
                if msg.subject != own:  # a sender's credentials allow its own subject only
                    await bad(msg, f"{type(event).__name__} on another's subject (not {own})")
                    return
            if spec.counted:
                count(event)
            try:
                await handler(event, msg)
            except Exception:
                # unacked, a consumer's message comes back after its ack wait: a bug
                # never silently drops a request
                log.exception("handler failed", subject=msg.subject, handler=spec.handler)

        return receive

    async def _subscribe(
        self, spec: Subscription, cb: Callable[[Msg], Awaitable[None]], owner: object
    ) -> Any:
        subject = fill(spec.subject, self.fields)
        source = spec.source
        if isinstance(source, Listen):
            limit = source.pending_msgs_limit
            return await self._nc.subscribe(subject, cb=cb, pending_msgs_limit=limit)
        if isinstance(source, Consume):
            c = source.consumer
            return await self._nc.subscribe(c.deliver_subject, queue=c.durable, cb=cb)
        if isinstance(source, Follow):
            if source.replay:
                for data, headers, _ in await replay(
                    self._js, source.stream, subject, since_s=SETTINGS_HISTORY_S
                ):
                    await cb(Msg(self._nc, subject=subject, data=data, headers=headers))
            after = int(getattr(owner, source.start_after, 0) or 0) if source.start_after else 0
            config = (
                ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1
                )
                if after
                else ConsumerConfig(deliver_policy=_DELIVER[source.deliver])
            )
            return await self._js.subscribe(
                subject, stream=source.stream, cb=cb, ordered_consumer=True, config=config
            )
        assert isinstance(source, Own)
        return await self._js.subscribe(
            subject,
            stream=source.stream,
            cb=cb,
            manual_ack=True,
            config=ConsumerConfig(
                name=fill(source.name, self.fields).replace(".", "-"),
                deliver_policy=_DELIVER[source.deliver],
                inactive_threshold=source.inactive_s,
            ),
        )
