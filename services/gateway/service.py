"""Gateway adapter: the OpenAI-compatible HTTP API over the NATS request path."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from aiohttp import web
from nats.aio.msg import Msg

from inferbus.contracts import (
    CANCEL,
    HEARTBEATS,
    REPLY_PREFIX,
    SUBMIT,
    CancelRequest,
    ReplyEvent,
    RequestFinished,
    RequestSubmitted,
    TokenChunk,
    WorkerHeartbeat,
    reply_subject,
    subject_token,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import publish_durable
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service

from .core import (
    ApiError,
    ModelRegistry,
    Shapes,
    error_for,
    parse_chat,
    parse_completion,
    sse,
    submitted,
)

log = logs.get("inferbus.gateway")

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                "Connection": "keep-alive", "X-Accel-Buffering": "no"}


class GatewaySettings(ServiceSettings, kw_only=True):
    """inferbus gateway: OpenAI-compatible HTTP API."""

    http_port: int = 8000
    default_max_tokens: int = 256
    request_timeout_s: float = 600.0
    worker_stale_s: float = 3.0


class _Ended(Exception):
    """The request is over for the client; ``settled`` when the platform says so too."""

    def __init__(self, error: ApiError, settled: bool = True) -> None:
        self.error = error
        self.settled = settled


class GatewayService(Service[GatewaySettings]):
    name = "gateway"

    def __init__(self, settings: GatewaySettings) -> None:
        super().__init__(settings)
        self.gateway_id = subject_token(f"gw-{settings.instance_id}-{secrets.token_hex(3)}")
        self.registry = ModelRegistry(stale_after_s=settings.worker_stale_s)
        self._pending: dict[str, asyncio.Queue[Any]] = {}
        self._ctx: Context[GatewaySettings] | None = None
        self._subs: list[Any] = []
        self._draining = False

    def routes(self) -> Sequence[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.list_models),
        ]

    async def start(self, ctx: Context[GatewaySettings]) -> None:
        self._ctx = ctx
        self._subs = [
            await ctx.nc.subscribe(f"{REPLY_PREFIX}.{self.gateway_id}.>", cb=self._on_reply,
                                   pending_msgs_limit=1_000_000),
            await ctx.nc.subscribe(HEARTBEATS, cb=self._on_heartbeat),
        ]

    def status(self) -> dict[str, Any]:
        return {"gateway_id": self.gateway_id, "inflight": len(self._pending),
                "models": self.registry.models(time.monotonic())}

    async def drain(self) -> None:
        self._draining = True
        deadline = time.monotonic() + max(0.0, self.settings.drain_timeout_s - 2.0)
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for sub in self._subs:
            await sub.unsubscribe()

    # -- NATS inputs --------------------------------------------------------------------

    async def _on_reply(self, msg: Msg) -> None:
        rid = msg.subject.rsplit(".", 1)[-1]
        queue = self._pending.get(rid)
        if queue is None:
            return  # the client already went away
        try:
            queue.put_nowait(decode(msg.data, ReplyEvent))
        except DecodeError as exc:
            log.error("undecodable reply", request_id=rid, error=str(exc))

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            self.registry.on_heartbeat(decode(msg.data, WorkerHeartbeat), time.monotonic())
        except DecodeError:
            pass

    # -- HTTP ---------------------------------------------------------------------------

    async def list_models(self, _: web.Request) -> web.Response:
        models = self.registry.models(time.monotonic())
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "inferbus"}
                for m, ready in sorted(models.items()) if ready]
        return web.json_response({"object": "list", "data": data})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def _handle(self, http: web.Request, chat: bool) -> web.StreamResponse:
        rid = http.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            return await self._serve(http, rid, chat)
        except ApiError as err:
            return _error_response(err, rid)

    async def _serve(self, http: web.Request, rid: str, chat: bool) -> web.StreamResponse:
        assert self._ctx
        if self._draining:
            raise ApiError(503, "the gateway is shutting down", type="server_error",
                           code="draining", retry_after=1.0)
        if not rid.replace("-", "").replace("_", "").isalnum() or len(rid) > 128:
            raise ApiError(400, "x-request-id may hold only letters, digits, - and _",
                           param="x-request-id", code="invalid_value")
        body = await http.read()
        s = self.settings
        if chat:
            req, sampling, messages = parse_chat(body, s.default_max_tokens)
            event = submitted(request_id=rid, model=req.model, sampling=sampling,
                              reply_to=reply_subject(self.gateway_id, rid), now=time.time(),
                              messages=messages)
        else:
            creq, sampling, prompt = parse_completion(body, s.default_max_tokens)
            req = creq
            event = submitted(request_id=rid, model=req.model, sampling=sampling,
                              reply_to=reply_subject(self.gateway_id, rid), now=time.time(),
                              prompt=prompt)
        self.registry.admit(req.model, time.monotonic())
        if rid in self._pending:
            raise ApiError(409, f"request {rid} is already in flight", code="duplicate_request")
        shapes = Shapes(chat=chat, request_id=rid, model=req.model, created=int(time.time()))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        started = time.monotonic()
        events = self._submit(event)
        ended = False
        try:
            if req.stream:
                resp = await self._stream(http, rid, events, shapes, include_usage, started)
            else:
                resp = await self._complete(rid, events, shapes, started)
            ended = True
            return resp
        except _Ended as e:
            ended = e.settled
            raise e.error from None
        finally:
            self._pending.pop(rid, None)
            if not ended:  # client gone, or we gave up waiting: stop the work
                await self._cancel(rid, "client disconnected or timed out")

    async def _submit(self, event: RequestSubmitted) -> AsyncIterator[Any]:
        """Register for replies, publish, then yield chunks until the terminal event."""
        assert self._ctx
        rid = event.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[rid] = queue
        ack = await publish_durable(self._ctx.js, SUBMIT, event, request_id=rid, msg_id=rid)
        if ack.duplicate:
            raise _Ended(ApiError(409, f"request id {rid} was already submitted; use a new one",
                                  param="x-request-id", code="duplicate_request"))
        deadline = time.monotonic() + self.settings.request_timeout_s
        attempt = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                ev = await asyncio.wait_for(queue.get(), remaining) if remaining > 0 else None
            except asyncio.TimeoutError:
                ev = None
            if ev is None:
                raise _Ended(ApiError(504, f"no answer within {self.settings.request_timeout_s:g}s",
                                      type="server_error", code="timeout"), settled=False)
            if isinstance(ev, TokenChunk):
                attempt = attempt or ev.attempt
                if ev.attempt != attempt:
                    continue
                # under load, send what piled up as one chunk: fewer events, same text
                terminal = None
                while not queue.empty() and terminal is None:
                    nxt = queue.get_nowait()
                    if not isinstance(nxt, TokenChunk):
                        terminal = nxt
                    elif nxt.attempt == attempt:
                        ev = merge_chunks(ev, nxt)
                yield ev
                if terminal is None:
                    continue
                ev = terminal
            yield ev
            return

    async def _complete(self, rid: str, events: AsyncIterator[Any], shapes: Shapes,
                        started: float) -> web.Response:
        parts: list[str] = []
        async for ev in events:
            if isinstance(ev, TokenChunk):
                parts.append(ev.text)
            elif isinstance(ev, RequestFinished):
                self._observe(shapes.model, started, "request.finished")
                return web.json_response(shapes.complete("".join(parts), ev),
                                         headers={"x-request-id": rid})
            else:
                self._observe(shapes.model, started, ev.__struct_config__.tag)
                raise _Ended(error_for(ev))
        raise _Ended(ApiError(500, "the reply stream ended without a terminal event",
                              type="server_error", code="internal_error"))

    async def _stream(self, http: web.Request, rid: str, events: AsyncIterator[Any],
                      shapes: Shapes, include_usage: bool, started: float) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        async for ev in events:
            if isinstance(ev, TokenChunk):
                if resp is None:
                    # headers go out with the first token, so early failures keep their status
                    resp = web.StreamResponse(headers={**_SSE_HEADERS, "x-request-id": rid})
                    await resp.prepare(http)
                    metrics.TTFT.labels(self.name, shapes.model).observe(time.monotonic() - started)
                await resp.write(shapes.chunk_event(ev.text))
                continue
            if resp is None and not isinstance(ev, RequestFinished):
                self._observe(shapes.model, started, ev.__struct_config__.tag)
                raise _Ended(error_for(ev))
            if resp is None:
                resp = web.StreamResponse(headers={**_SSE_HEADERS, "x-request-id": rid})
                await resp.prepare(http)
            if isinstance(ev, RequestFinished):
                await resp.write(sse(shapes.final_chunk(ev)))
                if include_usage:
                    await resp.write(sse(shapes.usage_chunk(ev)))
            else:
                await resp.write(sse(error_for(ev).body()))
            self._observe(shapes.model, started, ev.__struct_config__.tag)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        raise _Ended(ApiError(500, "the reply stream ended without a terminal event",
                              type="server_error", code="internal_error"))

    def _observe(self, model: str, started: float, outcome: str) -> None:
        metrics.REQUESTS.labels(self.name, model, outcome).inc()
        metrics.E2E.labels(self.name, model).observe(time.monotonic() - started)

    async def _cancel(self, rid: str, reason: str) -> None:
        assert self._ctx
        try:
            await self._ctx.nc.publish(CANCEL, encode(CancelRequest(request_id=rid, reason=reason)))
        except Exception:
            log.exception("cancel publish failed", request_id=rid)


def merge_chunks(a: TokenChunk, b: TokenChunk) -> TokenChunk:
    return TokenChunk(request_id=a.request_id, seq=a.seq, text=a.text + b.text,
                      token_ids=a.token_ids + b.token_ids, attempt=a.attempt)


def _error_response(err: ApiError, rid: str) -> web.Response:
    headers = {"x-request-id": rid}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return web.json_response(err.body(), status=err.status, headers=headers)
