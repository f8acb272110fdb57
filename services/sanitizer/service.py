"""Sanitizer adapter: submitted requests in, accepted ones on, rejections to the client."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from nats.aio.msg import Msg

from inferbus.contracts import (
    ACCEPTED,
    ENDED,
    SANITIZER_SUBMITTED,
    RequestAccepted,
    RequestFailed,
    RequestSubmitted,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import (
    Background,
    consume,
    publish_durable,
    request_headers,
    trace_headers,
)
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service

from .core import InputLimits, check

log = logs.get("inferbus.sanitizer")


class SanitizerSettings(ServiceSettings, kw_only=True):
    """inferbus sanitizer: checks every submitted request before it is scheduled."""

    max_prompt_chars: int = 32_768
    max_tokens: int = 32_768


class _Addressed(msgspec.Struct):
    """What a malformed request still has to be answered: its id and reply subject."""

    request_id: str
    reply_to: str


class SanitizerService(Service[SanitizerSettings]):
    name = "sanitizer"

    def __init__(self, settings: SanitizerSettings) -> None:
        super().__init__(settings)
        self.limits = InputLimits(max_prompt_chars=settings.max_prompt_chars,
                                  max_tokens=settings.max_tokens)
        self._ctx: Context[SanitizerSettings] | None = None
        self._sub: Any = None
        self._work = Background()
        self._counts = {"accepted": 0, "rejected": 0, "invalid": 0}

    async def start(self, ctx: Context[SanitizerSettings]) -> None:
        self._ctx = ctx
        self._sub = await consume(ctx.nc, SANITIZER_SUBMITTED, self._on_submitted)

    async def drain(self) -> None:
        if self._sub:
            await self._sub.drain()
        await self._work.wait()

    def status(self) -> dict[str, Any]:
        return dict(self._counts)

    async def _on_submitted(self, msg: Msg) -> None:
        # requests are independent: check many at once rather than one ack round trip apiece
        await self._work.spawn(self._check(msg))

    async def _check(self, msg: Msg) -> None:
        assert self._ctx
        js, nc = self._ctx.js, self._ctx.nc
        try:
            request = decode(msg.data, RequestSubmitted)
        except DecodeError as exc:
            await self._invalid(msg, str(exc))
            return
        rid = request.request_id
        rejection = check(request, self.limits)
        if rejection is None:
            accepted = RequestAccepted(request=request, accepted_at=time.time())
            await publish_durable(js, ACCEPTED, accepted, request_id=rid,
                                  msg_id=f"{rid}:accepted", trace=trace_headers(msg))
            self._counts["accepted"] += 1
        else:
            if rejection.param == "reply_to":  # nowhere to answer: keep it with the reason
                await self._ctx.dead_letters.send(msg, rejection.reason)
            else:
                await nc.publish(request.reply_to, encode(rejection),
                                 headers=request_headers(rid))
            await publish_durable(js, ENDED, rejection, request_id=rid, msg_id=f"{rid}:end")
            self._counts["rejected"] += 1
            metrics.REQUESTS.labels(self.name, request.model, "request.rejected").inc()
            log.info("rejected", request_id=rid, code=rejection.code, reason=rejection.reason)
        metrics.EVENTS_HANDLED.labels(self.name, "request.submitted").inc()
        await msg.ack()

    async def _invalid(self, msg: Msg, error: str) -> None:
        """Dead-letter an undecodable request, and answer its sender when we can."""
        assert self._ctx
        self._counts["invalid"] += 1
        await self._ctx.dead_letters.send(msg, f"undecodable RequestSubmitted: {error}")
        try:
            addr = msgspec.json.decode(msg.data, type=_Addressed)
        except (msgspec.DecodeError, msgspec.ValidationError):
            addr = None
        if addr is not None and addr.reply_to:
            failed = RequestFailed(request_id=addr.request_id, code="invalid_request",
                                   reason=f"invalid request: {error}")
            await self._ctx.nc.publish(addr.reply_to, encode(failed))
        await msg.ack()
