"""The sanitizer's accepted publish stored while its ack is lost (a JetStream answer
slower than the publish's timeout): the request goes on to be scheduled and its output
comes back through this filter, so the filter must still know the stream's settings.
It once dropped them on the error, and the output was then filtered as plain text,
not as the JSON document it is, and without the request's deadline. The service runs
in this process on a real nats-server; its JetStream context loses the ack of the
first accepted publish."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.js import JetStreamContext

from inferbus.contracts import (
    SUBMIT,
    RequestSubmitted,
    SamplingParams,
    StructuredOutput,
)
from inferbus.services.sanitizer.service import SanitizerService, SanitizerSettings
from inferbus.shared.bus import ConnectionWatch, DeadLetterer
from inferbus.shared.codec import encode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.runtime import Context
from inferbus.shared.streams import ensure_streams
from inferbus.shared.tracing import TracePolicy, Tracing

pytestmark = pytest.mark.integration


class AckLost:
    """The JetStream context, but the first publish to ``subject_prefix`` is stored and
    its ack lost."""

    def __init__(self, js: JetStreamContext, subject_prefix: str) -> None:
        self.js, self.prefix, self.lost = js, subject_prefix, 0

    async def publish(self, subject: str, payload: bytes, **kw: Any) -> Any:
        ack = await self.js.publish(subject, payload, **kw)
        if subject.startswith(self.prefix) and not self.lost:
            self.lost += 1
            raise nats.errors.TimeoutError
        return ack

    def __getattr__(self, name: str) -> Any:
        return getattr(self.js, name)


async def test_an_accepted_publish_whose_ack_is_lost_keeps_the_filters_settings(
    tmp_path: Path,
) -> None:
    server = NatsServer(tmp_path / "nats").start()  # its submit stream read by the test
    try:
        await _ack_lost(server.url)
    finally:
        server.stop()


async def _ack_lost(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream(timeout=30)
    await ensure_streams(js)
    settings = SanitizerSettings(nats_url=nats_url, instance_id="ack-lost")
    lossy = AckLost(js, "ib.req.accepted")
    ctx = Context(
        settings=settings,
        nc=nc,
        js=lossy,  # type: ignore[arg-type]
        dead_letters=DeadLetterer(js, "sanitizer"),
        tracing=Tracing("sanitizer", TracePolicy()),
        connection=ConnectionWatch(),
        subscriptions=None,  # type: ignore[arg-type]
    )
    service = SanitizerService(settings, ctx)
    client = nc.new_inbox()
    request = RequestSubmitted(
        request_id=f"ack-lost-{time.time_ns()}",
        model="m",
        reply_to=client,
        prompt="a JSON record of the customer, please",
        sampling=SamplingParams(structured=StructuredOutput(json_object=True)),
        deadline=time.time() + 60,
    )
    await js.publish(SUBMIT, encode(request))
    (msg,) = await (await js.pull_subscribe(SUBMIT, "test-sanitizer")).fetch(1, timeout=10)

    with pytest.raises(nats.errors.TimeoutError):
        await service._check(msg)
    assert lossy.lost == 1
    kept = service._streams[client]  # the stored request's output comes back here
    assert kept.json_output and kept.deadline == request.deadline

    await service._check(msg)  # the submit redelivered: the same stream, not a new one
    assert service._streams[client] is kept
    await nc.close()
