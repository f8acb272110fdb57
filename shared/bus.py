"""NATS connection, event publishing, dead letters, background handlers and replays."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from inferbus.contracts import (
    HEADER_MSG_ID,
    HEADER_REQUEST_ID,
    DeadLetter,
    Event,
    dead_letter_subject,
    tenant_submit_subject,
)
from inferbus.shared import logs, metrics
from inferbus.shared.buscreds import TLS_CA_ENV, BusCredentials, tls_context
from inferbus.shared.codec import encode

log = logs.get("inferbus.bus")


class BusAuthError(ConnectionRefusedError):
    """The server refused the connection's credentials (or their absence)."""


CLI_PATIENCE_S = 10.0
"""How long a command waits for a NATS server before it says none answered."""


class BusUnreachableError(ConnectionError):
    """No NATS server answered within a command's patience (a CLI, not a service: a
    service waits for its bus for ever)."""


class ConnectionWatch:
    """Callbacks for a connection's outages: a service that holds streams across the
    bus (the gateway) ends them when the connection drops, since what was published
    meanwhile is lost."""

    def __init__(self) -> None:
        self.disconnected: list[Callable[[], Awaitable[None]]] = []
        self.reconnected: list[Callable[[], Awaitable[None]]] = []

    async def _fire(self, callbacks: list[Callable[[], Awaitable[None]]]) -> None:
        for cb in callbacks:
            try:
                await cb()
            except Exception:
                log.exception("connection callback failed")


AT_LIMIT = "maximum account active connections exceeded"
REFUSALS = ("authorization violation", AT_LIMIT)
"""What the server says when it refuses a connection retrying would not change."""


async def connect(
    url: str,
    name: str,
    creds: BusCredentials | None = None,
    tls_ca: str = "",
    watch: ConnectionWatch | None = None,
    give_up_s: float = 0.0,
) -> Client:
    """Connect with unlimited reconnects; the runtime drains on shutdown. With
    ``creds``, as that NATS user, its inboxes under ``_INBOX.<user>``. ``give_up_s``: a
    command's bound on the first connection (BusUnreachableError): nats-py tries for
    ever when reconnects are unlimited (``inferbus ps`` with no server hung 10 minutes)."""
    if give_up_s > 0:
        try:
            return await asyncio.wait_for(connect(url, name, creds, tls_ca, watch), give_up_s)
        except TimeoutError:
            raise BusUnreachableError(
                f"no NATS server answered at {url} within {give_up_s:g}s"
            ) from None

    nc = Client()

    connected = False

    refused = 0

    async def on_error(exc: Exception) -> None:
        nonlocal refused
        if not connected and any(why in str(exc).lower() for why in REFUSALS):
            # wrong or missing credentials, or a tenant at its connection limit: fail
            # now, not retry for ever
            raise BusAuthError(f"NATS at {url} refused {name!r}: {exc}") from None
        if not connected:  # waiting for a server: said once, not twice a second
            refused += 1
            if refused > 1:
                return
        log.warning("nats error", error=repr(exc))

    async def on_disconnect() -> None:
        if not (nc.is_closed or nc.is_draining):
            log.warning("nats disconnected")
            if watch is not None:
                await watch._fire(watch.disconnected)

    async def on_reconnect() -> None:
        log.info("nats reconnected")
        if watch is not None:
            await watch._fire(watch.reconnected)

    auth: dict[str, Any] = dict(creds.connect_options()) if creds is not None else {}
    # a TLS bus: the CA that signed the server's certificate (INFERBUS_NATS_TLS_CA)
    tls = tls_context(tls_ca or os.environ.get(TLS_CA_ENV, ""))
    if tls is not None:
        auth["tls"] = tls
    await nc.connect(
        url.split(","),  # a cluster: every node's URL, for failover
        name=name,
        max_reconnect_attempts=-1,
        # nats-py annotates this int, but it is seconds for asyncio.sleep: a float works
        reconnect_time_wait=0.5,  # type: ignore[arg-type]
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
        **auth,
    )
    connected = True
    return nc


async def round_trip(nc: Client, timeout: float = 10.0) -> None:
    """Flush and wait for the server's PONG, at most ``timeout`` (TimeoutError).

    Never ``nc.flush(timeout=...)``: nats-py cancels the PING's future when its own
    timeout passes and leaves it in line, and the late PONG then sets a result on a
    cancelled future: InvalidStateError ends the client's read loop, and the
    connection goes deaf while it still publishes (a worker resumed from SIGSTOP kept
    heartbeating and never got its work: requests hung in the fault suite). The
    flush here waits without a limit of its own, shielded, so the PONG always finds
    its future pending.

    A barrier: when it returns, the server has read every command sent before it (a
    SUB is live, a PUB routed). A bare ``await nc.flush()`` is not one: nats-py writes
    its PING straight to the socket, ahead of the commands still in its buffer, so the
    PONG may come back before the server has the SUB, and a message another connection
    published next was missed (6 subscriptions of 80 in
    test_round_trip.py with a bare flush; the chunk-batch test lost its first
    message 1 run in 16). Here the flush runs as a task, after the client's flusher
    (woken first) has written its buffer; the second PING, after that buffer for
    certain, makes it so whatever the loop's order.
    """

    async def twice() -> None:
        await asyncio.shield(nc.flush(timeout=_NO_LIMIT_S))
        await asyncio.shield(nc.flush(timeout=_NO_LIMIT_S))

    await asyncio.wait_for(twice(), timeout)


_NO_LIMIT_S = 24 * 3600


STALL_S = 0.25
"""A wake this late past its time means the process (or its event loop) was stalled."""


async def ask_until_answered(
    nc: Client,
    subject: str,
    payload: bytes,
    *,
    window_s: float,
    headers: dict[str, str] | None = None,
    asks: int = 3,
    absent_s: float = 1.0,
) -> bool | None:
    """Ask ``subject`` (a request) until someone answers, within ``window_s``: asked
    again every ``window_s / asks`` (an answer lost on the way, a bus node killed, is
    asked for again) while the earlier asks wait on to the end of the window (a slow
    answer still counts); with no one listening, asked again every 0.1 s for
    ``absent_s``. True: answered; False: no answer in the window, or no one listened;
    None: the connection is closing. The one who answers must take a repeat as a
    repeat.

    A process stopped while it waits (SIGSTOP, a VM paused) wakes late, its asks timed
    out on wall time it did not see pass: an answer that came meanwhile is read, but
    one may have been lost with its connection (a server cuts a client that stopped
    reading), so a wake ``STALL_S`` or more past its time with no answer asks once
    more and waits one more ask's time, at least, before it can say False."""
    loop = asyncio.get_running_loop()
    step = window_s / asks
    start = loop.time()
    deadline, next_ask, wake = start + window_s, start, start
    pending: set[asyncio.Future[Any]] = set()
    late = False
    try:
        while True:
            now = loop.time()
            if not late and now - wake >= STALL_S:
                late = True  # woke well past its time: it did not see that time pass
                deadline, next_ask = max(deadline, now + step), now
            if now >= deadline:
                return False
            if now >= next_ask:
                ask = nc.request(subject, payload, timeout=deadline - now, headers=headers)
                pending.add(asyncio.ensure_future(ask))
                next_ask = now + step
            wake = min(deadline, next_ask)
            if not pending:
                await asyncio.sleep(max(0.0, wake - loop.time()))
                continue
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, wake - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                exc = task.exception()
                if exc is None:
                    return True
                if isinstance(exc, nats.errors.NoRespondersError):
                    if loop.time() - start >= absent_s:
                        return False
                    next_ask = min(next_ask, loop.time() + 0.1)
                elif not isinstance(exc, nats.errors.TimeoutError):
                    return None
    finally:
        for task in pending:
            task.cancel()


async def wait_accepted(
    nats_url: str,
    creds: BusCredentials,
    timeout: float = 10.0,
    nudge: Callable[[], object] | None = None,
) -> None:
    """Until every server of ``nats_url`` takes ``creds`` (a server rereads its users on
    reload quickly, not at once) and, for a tenant's, routes its submits into the
    platform: a reload that adds a tenant's account does not wire its imports
    (nats-server 2.15.1), the next one does; ``nudge`` reloads again. BusAuthError past
    ``timeout``."""
    for url in nats_url.split(","):
        deadline = time.monotonic() + timeout
        while True:
            try:
                left = max(0.5, deadline - time.monotonic())
                nc = await connect(url, "inferbus-auth-check", creds, give_up_s=left)
            except BusAuthError as exc:
                if AT_LIMIT in str(exc).lower():
                    break  # taken, and its account holds all it may: an old tenant's
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            try:
                if not creds.tenant or await gates_open(nc, creds.tenant):
                    break
            finally:
                await nc.close()
            if time.monotonic() > deadline:
                raise BusAuthError(f"{url}: tenant {creds.tenant!r}'s submits reach no stream")
            if nudge is not None:
                nudge()
            await asyncio.sleep(0.2)


GATE_PROBE_STREAM = "inferbus-gate-probe"


async def gates_open(nc: Client, tenant: str) -> bool:
    """Whether this connection's submits reach the platform's stream. The probe expects
    a stream of another name, so JetStream answers it with an error and stores
    nothing; where no stream hears it, no one answers."""
    try:
        await nc.request(
            tenant_submit_subject(tenant),
            b"",
            timeout=2,
            headers={"Nats-Expected-Stream": GATE_PROBE_STREAM},
        )
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False
    return True


def request_headers(request_id: str, trace: dict[str, str] | None = None) -> dict[str, str]:
    headers = {HEADER_REQUEST_ID: request_id}
    if trace:
        headers.update(trace)
    return headers


def trace_headers(msg: Msg) -> dict[str, str]:
    """The W3C trace context of an incoming message, to carry on to the next hop
    (only when well formed)."""
    from inferbus.shared.tracing import valid_context

    return valid_context(msg.headers or {})


async def publish_durable(
    js: JetStreamContext,
    subject: str,
    event: Event,
    *,
    request_id: str,
    msg_id: str | None = None,
    trace: dict[str, str] | None = None,
) -> PubAck:
    """Publish to JetStream and wait for the ack; ``msg_id`` makes retries idempotent
    (the ack says ``duplicate`` when JetStream already had that id)."""
    headers = request_headers(request_id, trace)
    if msg_id:
        headers[HEADER_MSG_ID] = msg_id
    return await js.publish(subject, encode(event), headers=headers)


async def request_patiently(
    nc: Client, subject: str, payload: bytes, *, timeout_s: float = 5.0, patience_s: float = 30.0
) -> Msg:
    """A request asked again while its answer is slow (a busy supervisor), up to
    ``patience_s``, then the last timeout raised: for requests that may be repeated
    (a query, an absolute setting)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return await nc.request(subject, payload, timeout=timeout_s)
        except nats.errors.TimeoutError:
            if time.monotonic() >= deadline:
                raise


END_PATIENCE_S = 60.0
"""How long a request's end waits for JetStream to record it (a NATS server coming
back) before it is given up: unrecorded, it is not sent. Under IB_REQUESTS's 120 s
duplicate window, so a late record still meets another's of the same end."""


async def record_end(
    js: JetStreamContext,
    subject: str,
    terminal: Event,
    *,
    request_id: str,
    msg_id: str,
    patience_s: float = END_PATIENCE_S,
) -> bool:
    """Record a request's end on ``ib.req.ended`` before anyone tells its client:
    whether to tell it. The services that may end a request (the sanitizer, the
    scheduler, a worker's first attempt) share its Nats-Msg-Id, so the one whose record
    comes first tells the client and the others say nothing. Told first and recorded
    after, an end the record lost was decided again: a whole platform restarted under
    load (`bench/faults.py --faults up`) told 16 clients ``request.finished`` and then
    ``worker_lost``.

    Retried while JetStream cannot take it (the same Nats-Msg-Id: idempotent). Where
    it is not sure, this tells: a duplicate after a try that got no answer may be that
    try's own record, and past ``patience_s`` the end is told unrecorded. Told twice
    is a client's to drop (the first end is its end); never told, it waits out its
    timeout."""
    deadline = time.monotonic() + patience_s
    unanswered = False
    while True:
        try:
            ack = await publish_durable(js, subject, terminal, request_id=request_id, msg_id=msg_id)
            return unanswered or not ack.duplicate
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.js.errors.NoStreamResponseError,
            nats.js.errors.ServiceUnavailableError,
            TimeoutError,
        ) as exc:
            # a timeout may have been stored; a refusal or no responder was not
            unanswered = unanswered or isinstance(exc, nats.errors.TimeoutError | TimeoutError)
            if time.monotonic() >= deadline:
                log.warning("a request's end could not be recorded", request_id=request_id)
                return True
            await asyncio.sleep(0.2)


class DeadLetterer:
    """Sends what a service cannot handle to ``ib.dlq.<service>`` with the reason."""

    def __init__(self, js: JetStreamContext, service: str) -> None:
        self._js = js
        self._service = service
        self._subject = dead_letter_subject(service)

    async def send(self, msg: Msg, reason: str) -> None:
        headers = dict(msg.headers or {})
        headers.pop(HEADER_MSG_ID, None)
        letter = DeadLetter(
            service=self._service,
            subject=msg.subject,
            reason=reason,
            payload=msg.data,
            headers=headers,
            received_at=time.time(),
        )
        metrics.DEAD_LETTERS.labels(self._service, msg.subject).inc()
        log.warning("dead letter", subject=msg.subject, reason=reason)
        await self._js.publish(self._subject, encode(letter))


class Background:
    """Work a handler hands off so the next message need not wait for this one's acks.

    A service's hops publish to JetStream and wait for the ack; done one message at a
    time, every request queues behind the previous one's round trips. Up to ``limit``
    run at once; ``wait`` lets a draining service finish them. An exception is logged
    and the message it was handling stays unacked, so JetStream redelivers it.
    """

    def __init__(self, limit: int = 1024) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(limit)

    def __len__(self) -> int:
        return len(self._tasks)

    async def spawn(self, coro: Awaitable[None]) -> None:
        await self._slots.acquire()
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("background handler failed", error=repr(task.exception()))

    async def wait(self, timeout: float | None = None) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)


class Stored(NamedTuple):
    """A message as its stream holds it."""

    data: bytes
    headers: dict[str, str]
    at: float
    """When the stream stored it (Unix seconds)."""


async def replay(
    js: JetStreamContext, stream: str, subject: str, since_s: float, timeout: float = 10.0
) -> list[Stored]:
    """The messages a stream holds on ``subject`` from ``since_s`` seconds ago up to
    now, in order (an ephemeral consumer, read to the stream's end)."""
    import datetime

    from nats.js.api import ConsumerConfig, DeliverPolicy

    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=since_s)
    sub = await js.subscribe(
        subject,
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start),
    )
    out: list[Stored] = []
    try:
        info = await sub.consumer_info()
        # a push consumer may have sent everything before this answer: then nothing is
        # pending on the server, but some was delivered and waits in the subscription
        if info.num_pending or (info.delivered and info.delivered.consumer_seq):
            while True:  # each message says how many are still to come
                msg = await sub.next_msg(timeout=timeout)
                meta = msg.metadata
                at = meta.timestamp.timestamp()
                out.append(Stored(msg.data, dict(msg.headers or {}), at))
                if not meta.num_pending:
                    break
    finally:
        await sub.unsubscribe()
    return out
