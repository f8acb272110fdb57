"""Gateway adapter: the OpenAI-compatible HTTP API over the NATS request path."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
from aiohttp import web
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from inferbus.contracts import (
    CANCEL,
    GATEWAY_REPLY_OWNER,
    RESPONSES,
    SUBMIT,
    CancelRequest,
    ChatMessage,
    ChatTemplateOptions,
    ChunkBatch,
    EmbedParams,
    FailureCode,
    Reading,
    ReplyDelivery,
    ReplyReader,
    RequestFailed,
    RequestFinished,
    RequestSubmitted,
    SamplingParams,
    ScalingStatus,
    SchedulerLoad,
    ToolUse,
    WorkerHeartbeat,
    reply_subject,
    subject_token,
    tenant_request_id,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import publish_durable
from inferbus.shared.codec import encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.runtime import Context, Service, trust_connection
from inferbus.shared.tokenizers import TokenizerSet, parse_tokenizers

from .admission import Gates, LoadView, ModelRegistry
from .auth import OPEN_KEY, AccessControl, ApiKey, estimate_prompt_tokens, load_keys
from .errors import ApiError, error_for, failure_error
from .openapi import openapi_document
from .protocol import request_timeout
from .responses import ResponseShapes, StoredResponse, Turn, read_turn
from .shapes import Answer, EmbeddingShapes, Presenter, Shapes, batch_finished
from .tokenize import detokenize, model_of, read_tokenize, tokenize
from .torequest import (
    Prompt,
    chat_template,
    echoed,
    embedding_sampling,
    parse_chat,
    parse_completion,
    parse_embeddings,
    prompt_chars,
    submitted,
    tool_use,
)
from .trace import HttpTrace, NoTrace, http_trace
from .wiring import WIRING

log = logs.get("inferbus.gateway")

_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}


class GatewaySettings(ServiceSettings, kw_only=True):
    """inferbus gateway: OpenAI-compatible HTTP API."""

    http_port: int = 8000
    default_max_tokens: int = 256
    """max_tokens for a request that names none (within its key's cap): the scheduler budgets
    each request's tokens, so an unbounded one cannot be placed."""
    request_timeout_s: float = 600.0
    """The longest any request may take, whatever its own timeout says."""
    worker_stale_s: float = 3.0
    """A worker whose heartbeat is older than this no longer counts as serving its models."""
    api_keys_file: str = ""
    """TOML or JSON file of API keys (``[[keys]]`` with name, sha256, scopes); see
    ``inferbus keys new``. With no keys at all the gateway runs open."""
    api_keys: str = ""
    """The same key objects as a JSON list, for the environment (INFERBUS_API_KEYS)."""
    max_body_bytes: int = 0
    """The largest request body taken (413 past it); 0: as much as the bus carries (the
    NATS server's max_payload, less room for the event around it)."""
    tokenizers: str = ""
    """``model=folder,...``: the tokenizers /tokenize and /detokenize use (``inferbus up``
    gives its model's)."""
    responses_ttl_s: float = 30 * 24 * 3600.0
    """How long a stored response (``/v1/responses`` with ``store``) is kept, to be
    read back or continued (``previous_response_id``); 0: until deleted."""
    responses_max_bytes: int = 1 << 30
    """The stored responses' bound in bytes (the oldest go first past it); 0: none."""
    body_timeout_s: float = 30.0
    """A request body not received in this long is refused (408): slow uploads do not
    hold a connection and a handler."""


@dataclass
class _Asked:
    """What a request body asks for, whatever its API: the contract's parts of the
    request (one per prompt of a batch), and the shapes its answer takes."""

    model: str
    stream: bool
    sampling: SamplingParams
    prompts: list[Prompt | None]
    shapes: Callable[[str, int], Presenter]
    """(request id, created) → the presenter of its answer."""
    messages: list[ChatMessage] | None = None
    template: ChatTemplateOptions | None = None
    tools: ToolUse | None = None
    embed: EmbedParams | None = None


class _Continues(msgspec.Struct):
    previous_response_id: str | None = None


_RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9_-]{1,128}")


def _response_key(tenant: str, response_id: str) -> str:
    """A tenant's responses under its own keys: ids may be a client's choice
    (``x-request-id``), and one tenant's must neither read nor overwrite another's.
    The tenant hashed: a key's tenant may hold what a KV key may not (a space, '@')."""
    owner = hashlib.sha256(tenant.encode()).hexdigest()[:32]
    return f"r.{owner}.{response_id}"


class _Ended(Exception):
    """The request is over for the client; ``settled`` when the platform says so too."""

    def __init__(
        self, error: ApiError, settled: bool = True, answered: web.StreamResponse | None = None
    ) -> None:
        self.error = error
        self.settled = settled
        self.answered = answered
        """The stream it ended, already told so (an SSE error event and [DONE])."""


class GatewayService(Service[GatewaySettings]):
    name = "gateway"
    wiring = WIRING

    def __init__(self, settings: GatewaySettings, ctx: Context[GatewaySettings]) -> None:
        super().__init__(settings, ctx)
        self.gateway_id = subject_token(f"gw-{settings.instance_id}-{secrets.token_hex(3)}")
        # its replies under ib.reply.gw.<id>: the gateway's credentials read only those
        self.reply_owner = f"{GATEWAY_REPLY_OWNER}.{self.gateway_id}"
        self._reply_prefix = reply_subject(self.reply_owner, "")
        self.registry = ModelRegistry(
            stale_after_s=settings.worker_stale_s, started_at=time.monotonic()
        )
        self.load = LoadView()
        self.access = AccessControl(load_keys(settings.api_keys_file, settings.api_keys))
        self.gates = Gates(self.access, self.registry, self.load)
        self._pending: dict[str, asyncio.Queue[Any]] = {}
        self._submitted = 0
        """Requests this instance put on the bus (several gateways share a port)."""
        self._none_pending = asyncio.Event()
        """Set when the last request in flight ends: a drain waits for it."""
        self._draining = False
        self._lost: set[str] = set()
        self._streaming: dict[str, web.StreamResponse] = {}
        self._responses_kv: KeyValue | None = None
        self.tokenizers = TokenizerSet(parse_tokenizers(settings.tokenizers))
        self._loading: asyncio.Task[None] | None = None
        """SSE responses whose headers went out, by request."""
        """Requests whose replies a NATS outage cut: cancelled once the bus is back."""

    def routes(self) -> Sequence[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.post("/v1/responses", self.create_response),
            web.post("/v1/embeddings", self.embeddings),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/v1/responses/{id}", self.get_response),
            web.delete("/v1/responses/{id}", self.delete_response),
            web.get("/v1/models", self.list_models),
            web.get(r"/v1/models/{model:[\s\S]+}", self.model_card),
            web.get("/openapi.json", self.openapi),
            web.get("/health", self.health),
            web.get("/ping", self.health),
            web.post("/ping", self.health),
            web.get("/version", self.version),
        ]

    def subject_fields(self) -> dict[str, str]:
        return {**super().subject_fields(), "gateway_id": self.gateway_id}

    async def start(self) -> None:
        ctx = self.ctx
        ctx.connection.disconnected.append(self._on_bus_lost)
        ctx.connection.reconnected.append(self._on_bus_back)
        if self.access.open:
            log.warning(
                "open mode: no API keys are configured, so every request is served "
                "without authentication as tenant 'default'; set --api-keys-file "
                "or INFERBUS_API_KEYS to require keys"
            )
        else:
            log.info("API keys required", keys=len(self.access.by_digest))
        if self.tokenizers.folders:
            self._loading = asyncio.create_task(self.tokenizers.load_all(), name="tokenizers")

    def status(self) -> dict[str, Any]:
        return {
            "gateway_id": self.gateway_id,
            "inflight": len(self._pending),
            "submitted": self._submitted,
            "models": self.registry.models(time.monotonic()),
            "auth": "open" if self.access.open else "api-keys",
        }

    async def drain(self) -> None:
        self._draining = True
        deadline = time.monotonic() + max(0.0, self.settings.drain_timeout_s - 2.0)
        if self._pending:
            self._none_pending.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._none_pending.wait(), max(0.0, deadline - time.monotonic())
                )

    # -- NATS inputs --------------------------------------------------------------------

    async def _on_bus_lost(self) -> None:
        """Replies published while the connection is down are lost: every stream in
        flight ends now with a retryable error, instead of waiting for its timeout."""
        for rid, queue in self._pending.items():
            self._lost.add(rid)
            queue.put_nowait(
                RequestFailed(
                    request_id=rid,
                    code=FailureCode.BUS_UNAVAILABLE,
                    retryable=True,
                    reason="the gateway lost its connection to NATS mid-request; submit it again",
                )
            )

    async def _on_bus_back(self) -> None:
        """Stop the work nobody reads any more."""
        lost, self._lost = self._lost, set()
        for rid in lost:
            await self._cancel(rid, "its gateway lost the bus while it ran")

    async def _on_reply(self, event: ReplyDelivery, msg: Msg) -> None:
        if isinstance(event, ChunkBatch):  # chunks of several streams
            for item in event.chunks:
                queue = self._pending.get(item.subject.rsplit(".", 1)[-1])
                if queue is not None and item.subject.startswith(self._reply_prefix):
                    queue.put_nowait(item.chunk)
            return
        queue = self._pending.get(msg.subject.rsplit(".", 1)[-1])
        if queue is not None:  # else the client already went away
            queue.put_nowait(event)

    async def _on_scaling(self, status: ScalingStatus, msg: Msg) -> None:
        self.registry.on_scaling(status, time.monotonic())

    async def _on_load(self, load: SchedulerLoad, msg: Msg) -> None:
        self.load.on_load(load, time.monotonic())

    async def _on_heartbeat(self, hb: WorkerHeartbeat, msg: Msg) -> None:
        self.registry.on_heartbeat(hb, time.monotonic())

    # -- HTTP ---------------------------------------------------------------------------

    async def list_models(self, http: web.Request) -> web.Response:
        rid = _request_id(http)
        try:
            key = self._authenticate(http)
        except ApiError as err:
            return _error_response(err, rid)
        now, created = time.monotonic(), int(time.time())
        data = [
            self.registry.card(m, created)
            for m in sorted(self.registry.models(now))
            # a model the autoscaler holds at zero is served on request: listed
            if self.registry.listed(m, now) and key.allows(m)
        ]
        return web.json_response({"object": "list", "data": data}, headers={"x-request-id": rid})

    async def model_card(self, http: web.Request) -> web.Response:
        rid = _request_id(http)
        model = http.match_info["model"]
        try:
            key = self._authenticate(http)
            if not (self.registry.listed(model, time.monotonic()) and key.allows(model)):
                raise failure_error(
                    FailureCode.MODEL_NOT_FOUND,
                    f"the model {model!r} does not exist or no worker serves it",
                    param="model",
                )
        except ApiError as err:
            return _error_response(err, rid)
        card = self.registry.card(model, int(time.time()))
        return web.json_response(card, headers={"x-request-id": rid})

    async def health(self, _: web.Request) -> web.Response:
        """vLLM's /health (and SageMaker's /ping): 200 while the gateway serves, 503
        while it drains (the platform's own readiness is /readyz)."""
        return web.Response(status=503 if self._draining else 200)

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": inferbus_version()})

    async def openapi(self, _: web.Request) -> web.Response:
        # the document needs no key, so it names the live models only on an open gateway
        live = self.registry.models(time.monotonic()) if self.access.open else {}
        return web.json_response(openapi_document(tuple(sorted(m for m, n in live.items() if n))))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def tokenize(self, http: web.Request) -> web.Response:
        return await self._tokens(http, detokenizing=False)

    async def detokenize(self, http: web.Request) -> web.Response:
        return await self._tokens(http, detokenizing=True)

    async def _tokens(self, http: web.Request, detokenizing: bool) -> web.Response:
        """vLLM's /tokenize and /detokenize, with the tokenizer held for the model."""
        try:
            key = self._authenticate(http)
            body = await self._read_body(http)
            model = model_of(body)
            loaded = self.tokenizers.get(model) if key.allows(model) else None
            if loaded is None:
                raise failure_error(
                    FailureCode.MODEL_NOT_FOUND,
                    f"no tokenizer for {model!r} here (the gateway's --tokenizers)",
                    param="model",
                )
            tok, _ = loaded
            if detokenizing:
                answer = detokenize(tok, body)
            else:
                limit = self.registry.max_model_len(model) or None
                answer = tokenize(tok, read_tokenize(body), limit or 0)
        except ApiError as err:
            return _error_response(err, "")
        return web.json_response(answer)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "embeddings")

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "responses")

    async def get_response(self, http: web.Request) -> web.Response:
        try:
            key = self._authenticate(http)
            stored = await self._stored_response(http.match_info["id"], key.tenant_id)
        except ApiError as err:
            return _error_response(err, "")
        return web.json_response(stored.response)

    async def delete_response(self, http: web.Request) -> web.Response:
        try:
            key = self._authenticate(http)
            rid = http.match_info["id"]
            await self._stored_response(rid, key.tenant_id)
            await (await self._responses()).delete(_response_key(key.tenant_id, rid))
        except ApiError as err:
            return _error_response(err, "")
        return web.json_response({"id": rid, "object": "response", "deleted": True})

    async def _responses(self) -> KeyValue:
        """The stored responses' bucket (created by the first gateway that needs it)."""
        if self._responses_kv is None:
            js = self.ctx.js
            try:
                self._responses_kv = await js.key_value(RESPONSES)
            except (BucketNotFoundError, NotFoundError):
                self._responses_kv = await js.create_key_value(
                    KeyValueConfig(
                        bucket=RESPONSES,
                        history=1,
                        ttl=self.settings.responses_ttl_s or None,
                        max_bytes=self.settings.responses_max_bytes or -1,
                        storage=StorageType.FILE,
                    )
                )
        return self._responses_kv

    async def _stored_response(self, response_id: str, tenant: str) -> StoredResponse:
        unknown = ApiError(
            404,
            f"no stored response {response_id!r} (never stored, deleted, or expired)",
            type="invalid_request_error",
            param="previous_response_id",
            code="response_not_found",
        )
        if not _RESPONSE_ID.fullmatch(response_id):
            raise unknown
        try:
            entry = await (await self._responses()).get(_response_key(tenant, response_id))
        except (KeyNotFoundError, KeyDeletedError):
            raise unknown from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise failure_error(
                FailureCode.BUS_UNAVAILABLE,
                f"stored responses cannot be read now ({type(exc).__name__}); retry",
                retry_after=1.0,
            ) from None
        if entry.value is None:
            raise unknown
        return msgspec.json.decode(entry.value, type=StoredResponse)

    async def _earlier_turn(self, body: bytes, tenant: str) -> StoredResponse | None:
        """The stored turn a Responses body continues (its previous_response_id)."""
        try:
            earlier = msgspec.json.decode(body, type=_Continues).previous_response_id
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # read_turn says what is wrong with the body
        return None if earlier is None else await self._stored_response(earlier, tenant)

    async def _store(self, shapes: Presenter) -> None:
        """Keep the turn a next one may continue: before its end goes out, so that a
        client that continues at once finds it."""
        record = shapes.record()
        if record is None:
            return
        try:
            kv = await self._responses()
            await kv.put(_response_key(record.tenant, shapes.id), msgspec.json.encode(record))
        except (nats.errors.Error, TimeoutError) as exc:
            raise _Ended(
                failure_error(
                    FailureCode.BUS_UNAVAILABLE,
                    f"the response could not be stored ({type(exc).__name__}); retry it",
                    retry_after=1.0,
                )
            ) from None

    def authorize_metrics(self, request: web.Request) -> web.Response | None:
        """The API port is public: with keys on, /metrics takes a key marked metrics."""
        if self.access.open:
            return None
        try:
            key = self._authenticate(request)
        except ApiError as err:
            return _error_response(err, "")
        if not key.metrics:
            refusal = ApiError(
                403,
                "this API key may not read /metrics (keys new --metrics)",
                type="permission_error",
                code="metrics_not_allowed",
            )
            return _error_response(refusal, "")
        return None

    def _authenticate(self, http: web.Request) -> ApiKey:
        key = self.access.authenticate(
            http.headers.get("Authorization"), http.headers.get("x-api-key")
        )
        trust_connection(http)  # past the connection cap, anonymous ones go first
        return key

    async def _handle(self, http: web.Request, kind: str) -> web.StreamResponse:
        rid = _request_id(http)
        trace = http_trace(self.ctx.tracing, http.headers, rid, kind != "completions")
        try:
            resp = await self._serve(http, rid, kind, trace)
        except ApiError as err:
            if err.status != 499:
                metrics.GATEWAY_REFUSALS.labels(err.code or str(err.status)).inc()
            trace.end(err.status, f"{err.code or err.status}: {err.message}")
            if not trace.submitted:  # it ends here: its one line is written here
                log.info(
                    "request ended",
                    request_id=rid,
                    outcome="refused",
                    status=err.status,
                    code=err.code or "",
                )
            return _error_response(err, rid)
        except (asyncio.CancelledError, ConnectionResetError):  # the client hung up
            trace.end(499, "client_disconnected: the client closed the connection")
            raise
        except BaseException as exc:  # a fault: aiohttp answers 500; the trace keeps it
            trace.end(500, f"{type(exc).__name__}: {exc}")
            raise
        trace.end(resp.status, "")
        return resp

    async def _serve(
        self, http: web.Request, rid: str, kind: str, trace: HttpTrace | NoTrace
    ) -> web.StreamResponse:
        """``kind``: ``chat``, ``completions`` or ``responses`` (which runs as a chat)."""
        if self._draining:
            raise ApiError(
                503,
                "the gateway is shutting down",
                type="server_error",
                code="draining",
                retry_after=1.0,
            )
        if not _REQUEST_ID.fullmatch(rid):
            raise ApiError(
                400,
                "x-request-id must be 1 to 128 letters, digits, - or _",
                param="x-request-id",
                code="invalid_value",
            )
        key = self._authenticate(http)
        body = await self._read_body(http)
        # a request that names no max_tokens gets the default, within the key's cap
        default_max = min(self.settings.default_max_tokens, key.max_tokens or 2**31)
        asked = await self._asked(kind, body, default_max, key.tenant_id)
        sampling, prompts, messages = asked.sampling, asked.prompts, asked.messages
        timeout_s = request_timeout(http.headers.get("X-Request-Timeout"))
        now = time.monotonic()
        trace.describe(asked.model, sampling, key.tenant_id, asked.stream)
        chars = sum(prompt_chars(p, messages) for p in prompts)
        # a batch of prompts runs as a request apiece, under ids of the client's id
        ids = [rid] if len(prompts) == 1 else [f"{rid}_{i}" for i in range(len(prompts))]
        if "x-request-id" in http.headers and key is not OPEN_KEY:
            # the client's choice: its tenant's own id (an open gateway has one tenant)
            ids = [tenant_request_id(key.tenant_id, i) for i in ids]
        admission = self.gates.admit(
            key,
            request_id=rid,
            model=asked.model,
            max_tokens=sampling.max_tokens,
            choices=sampling.n * len(prompts),
            prompt_chars=chars,
            in_flight=any(i in self._pending for i in ids),
            now=now,
        )
        flow = _Flow()
        try:
            events = [
                submitted(
                    request_id=sub,
                    model=asked.model,
                    sampling=sampling,
                    reply_to=reply_subject(self.reply_owner, sub),
                    now=time.time(),
                    tenant=key.tenant_id,
                    priority=key.priority,
                    timeout_s=timeout_s,
                    prompt=prompt,
                    messages=messages,
                    chat_template=asked.template,
                    tools=asked.tools,
                    embed=asked.embed,
                    input_policy=key.input_policy,
                    data_policy=key.data_policy,
                    mask_pii=key.mask_pii,
                    tool_call_policy=key.tool_call_policy,
                )
                for sub, prompt in zip(ids, prompts, strict=True)
            ]
            shapes = asked.shapes(rid, int(time.time()))
            if len(events) == 1:
                readings = self._submit(
                    events[0], timeout_s, flow, trace, restartable=not asked.stream
                )
            else:
                readings = self._batch(events, timeout_s, flow, trace)
            ended = False
            try:
                if asked.stream:
                    resp = await self._stream(http, rid, readings, shapes, now)
                else:
                    resp = await self._complete(rid, readings, shapes, now)
                ended = True
                return resp
            except _Ended as e:
                ended = e.settled
                if e.answered is not None:  # mid-stream: the SSE stream says it
                    return e.answered
                raise e.error from None
            finally:
                for sub in ids:
                    self._pending.pop(sub, None)
                if not self._pending:
                    self._none_pending.set()
                if not ended:  # client gone, or we gave up waiting: stop the work
                    for sub in ids:
                        await self._cancel(sub, "client disconnected or timed out")
        finally:
            self.access.settle(admission, flow.used_tokens(chars), time.monotonic())

    async def _asked(self, kind: str, body: bytes, default_max: int, tenant: str) -> _Asked:
        """What the body asks for, by API (``responses`` runs as a chat, after the turn
        it continues), and the shapes its answer takes."""
        if kind == "embeddings":
            emb, embed, inputs = parse_embeddings(body)
            return _Asked(
                model=emb.model,
                stream=False,
                sampling=embedding_sampling(emb),
                prompts=list(inputs),
                embed=embed,
                shapes=lambda rid, created: EmbeddingShapes(
                    request_id=rid,
                    model=emb.model,
                    created=created,
                    base64=emb.encoding_format == "base64",
                ),
            )
        if kind == "completions":
            req, sampling, texts = parse_completion(body, default_max)
            return _Asked(
                model=req.model,
                stream=req.stream,
                sampling=sampling,
                prompts=list(texts),
                shapes=lambda rid, created: Shapes(
                    chat=False,
                    request_id=rid,
                    model=req.model,
                    created=created,
                    logprobs=sampling.logprobs is not None,
                    echo=echoed(req, list(texts), None, sampling.n),
                    include_usage=bool(req.stream_options and req.stream_options.include_usage),
                    prompt_logprobs=req.prompt_logprobs is not None,
                    score_only=req.echo and req.max_tokens == 0,
                ),
            )
        turn: Turn | None = None
        if kind == "responses":
            turn = read_turn(body, await self._earlier_turn(body, tenant))
            body = msgspec.json.encode(turn.chat)
        chat, csampling, messages = parse_chat(body, default_max)

        def shapes(rid: str, created: int) -> Presenter:
            if turn is not None:
                return ResponseShapes(
                    request_id=rid, model=chat.model, created=created, turn=turn, tenant=tenant
                )
            return Shapes(
                chat=True,
                request_id=rid,
                model=chat.model,
                created=created,
                logprobs=csampling.logprobs is not None,
                echo=echoed(chat, [None], messages, csampling.n),
                reasoning=chat.include_reasoning,
                include_usage=bool(chat.stream_options and chat.stream_options.include_usage),
                prompt_logprobs=chat.prompt_logprobs is not None,
            )

        return _Asked(
            model=chat.model,
            stream=turn.stream if turn is not None else chat.stream,
            sampling=csampling,
            prompts=[None],
            messages=messages,
            template=chat_template(chat),
            tools=tool_use(chat),
            shapes=shapes,
        )

    async def _batch(
        self,
        events: list[RequestSubmitted],
        timeout_s: float | None,
        flow: _Flow,
        trace: HttpTrace | NoTrace,
    ) -> AsyncIterator[Reading]:
        """A batch's requests read as one response's: prompt i's choice j is choice
        i × n + j, and the end comes once every request ended (a failure ends it at once,
        the others cancelled). A restart after text went out fails its request
        (``stream_interrupted``, retryable) even when the answer is buffered: the
        buffer cannot take back one prompt's text alone."""
        n = events[0].sampling.n
        got: asyncio.Queue[tuple[int, Reading | BaseException]] = asyncio.Queue()

        async def pump(i: int, readings: AsyncIterator[Reading]) -> None:
            try:
                async for reading in readings:
                    got.put_nowait((i, reading))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # _Ended and the like: the batch's end
                got.put_nowait((i, exc))

        tasks = [
            asyncio.create_task(pump(i, self._submit(ev, timeout_s, flow, trace, False)))
            for i, ev in enumerate(events)
        ]
        ends: dict[int, RequestFinished] = {}
        try:
            while len(ends) < len(events):
                i, reading = await got.get()
                if isinstance(reading, BaseException):
                    raise reading
                chunks = tuple(
                    msgspec.structs.replace(c, index=i * n + c.index) for c in reading.chunks
                )
                end = reading.end
                if end is not None and not isinstance(end, RequestFinished):
                    yield Reading(chunks=chunks, end=end)
                    return
                if end is not None:
                    ends[i] = end
                if chunks:
                    yield Reading(chunks=chunks)
            yield Reading(end=batch_finished([ends[i] for i in range(len(events))], n))
        finally:
            for task in tasks:
                task.cancel()
            for i, ev in enumerate(events):
                if i not in ends:
                    await self._cancel(ev.request_id, "another prompt of its batch ended it")

    def body_limit(self) -> int:
        """What a request body may weigh: the bus carries at most max_payload bytes a
        message, and the event wraps the body with its own fields."""
        bus = self.ctx.nc.max_payload - _EVENT_ROOM
        return min(self.settings.max_body_bytes or bus, bus)

    async def _read_body(self, http: web.Request) -> bytes:
        limit = self.body_limit()
        if http.content_length is not None and http.content_length > limit:
            raise _too_large(limit)
        parts: list[bytes] = []
        size = 0

        async def read() -> None:
            nonlocal size
            while chunk := await http.content.readany():
                size += len(chunk)
                if size > limit:  # chunked, or a Content-Length that lied
                    raise _too_large(limit)
                parts.append(chunk)

        try:
            await asyncio.wait_for(read(), self.settings.body_timeout_s)
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self.settings.body_timeout_s:g}s",
                code="request_timeout",
            ) from None
        return b"".join(parts)

    async def _submit(
        self,
        event: RequestSubmitted,
        timeout_s: float | None,
        flow: _Flow,
        trace: HttpTrace | NoTrace,
        restartable: bool,
    ) -> AsyncIterator[Reading]:
        """Register for replies, publish, then yield what the replies mean until the
        terminal event. ``restartable``: the caller buffers the text, so a newer
        attempt's restart is passed on rather than ending the request."""
        rid = event.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[rid] = queue
        self._submitted += 1
        try:
            ack = await publish_durable(
                self.ctx.js, SUBMIT, event, request_id=rid, msg_id=rid, trace=trace.headers
            )
        except (nats.errors.Error, TimeoutError) as exc:  # no JetStream answer: a node
            raise _Ended(
                failure_error(  # lost, a leader being elected, the bus away
                    FailureCode.BUS_UNAVAILABLE,
                    f"the request could not be recorded ({type(exc).__name__}); retry it",
                    retry_after=1.0,
                )
            ) from None
        if ack.duplicate:  # refused: the request under that id is another one
            raise _Ended(
                failure_error(
                    FailureCode.DUPLICATE_REQUEST,
                    f"request id {rid} was already submitted; use a new one",
                    param="x-request-id",
                )
            )
        trace.on_submitted()
        # the platform ends a request at its deadline; the grace covers the last hop
        limit = self.settings.request_timeout_s
        own = False
        if timeout_s is not None and timeout_s + _DEADLINE_GRACE_S < limit:
            limit, own = timeout_s + _DEADLINE_GRACE_S, True
        # one timer for the whole wait, its end a sentinel in the queue (wait_for made a
        # task a token, 10% of the gateway's CPU; a timeout per wait, a timer a token)
        timer = asyncio.get_running_loop().call_later(limit, queue.put_nowait, _TIMED_OUT)
        reader = ReplyReader(rid)
        try:
            while True:
                # under load, pass what piled up on as one chunk: fewer events, same text
                batch = [queue.get_nowait() if not queue.empty() else await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                timed_out = _TIMED_OUT in batch
                if timed_out:  # what came before the timer still goes out
                    batch = [ev for ev in batch if ev is not _TIMED_OUT]
                if batch:
                    reading = reader.read_all(batch)
                    if reading.restarted:
                        flow.completion_tokens = 0  # the older attempt's text is void
                    if reading.interrupts and not restartable:  # the text that went out
                        raise _Ended(error_for(reader.interrupted()), settled=False)
                    if reading.chunks:
                        flow.completion_tokens += sum(c.tokens for c in reading.chunks)
                        trace.on_first_token()
                    if isinstance(reading.end, RequestFinished):
                        flow.usage = (flow.usage or 0) + reading.end.usage.total_tokens
                        trace.on_finished(reading.end)
                    yield reading
                    if reading.end is not None:
                        return
                if not timed_out:
                    continue
                if own:
                    raise _Ended(
                        failure_error(
                            FailureCode.DEADLINE_EXCEEDED,
                            f"the request's {timeout_s:g}s timeout passed",
                        ),
                        settled=False,
                    )
                raise _Ended(
                    failure_error(FailureCode.TIMEOUT, f"no answer within {limit:g}s"),
                    settled=False,
                )
        finally:
            timer.cancel()

    async def _complete(
        self, rid: str, readings: AsyncIterator[Reading], shapes: Presenter, started: float
    ) -> web.Response:
        answer = Answer()
        async for reading in readings:
            if reading.restarted:
                answer.clear()
            for chunk in reading.chunks:
                answer.add(chunk)
            ev = reading.end
            if ev is None:
                continue
            if isinstance(ev, RequestFinished):
                body = shapes.complete(answer, ev)
                await self._store(shapes)
                self._observe(shapes.model, started, "request.finished")
                return web.json_response(body, headers={"x-request-id": rid})
            self._observe(shapes.model, started, str(ev.__struct_config__.tag))
            raise _Ended(error_for(ev))
        raise _Ended(
            ApiError(
                500,
                "the reply stream ended without a terminal event",
                type="server_error",
                code="internal_error",
            )
        )

    async def _stream(
        self,
        http: web.Request,
        rid: str,
        readings: AsyncIterator[Reading],
        shapes: Presenter,
        started: float,
    ) -> web.StreamResponse:
        try:
            return await self._stream_events(http, rid, readings, shapes, started)
        except _Ended as e:
            resp = e.answered or self._streaming.pop(rid, None)
            if resp is None:
                raise  # nothing went out yet: the error is the HTTP status
            # the headers went out with the first token: a second HTTP response would
            # break the chunked body, so the stream itself ends with the error
            self._observe(shapes.model, started, "request.failed")
            await resp.write(shapes.failed_events(e.error))
            await resp.write_eof()
            raise _Ended(e.error, settled=e.settled, answered=resp) from None
        finally:
            self._streaming.pop(rid, None)

    async def _stream_events(
        self,
        http: web.Request,
        rid: str,
        readings: AsyncIterator[Reading],
        shapes: Presenter,
        started: float,
    ) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        async for reading in readings:
            if reading.chunks:
                if resp is None:
                    # headers go out with the first token, so early failures keep their status
                    resp = web.StreamResponse(headers={**_SSE_HEADERS, "x-request-id": rid})
                    await resp.prepare(http)
                    self._streaming[rid] = resp
                    metrics.TTFT.labels(self.name, shapes.model).observe(time.monotonic() - started)
                    await resp.write(shapes.opening())
                # chunks that piled up go out in one write (a write is a system call)
                await resp.write(b"".join(shapes.chunk_event(c) for c in reading.chunks))
            ev = reading.end
            if ev is None:
                continue
            if resp is None and not isinstance(ev, RequestFinished):
                self._observe(shapes.model, started, str(ev.__struct_config__.tag))
                raise _Ended(error_for(ev))
            if isinstance(ev, RequestFinished):
                end = shapes.end_events(ev)
                await self._store(shapes)
            else:
                end = shapes.failed_events(error_for(ev))
            if resp is None:
                resp = web.StreamResponse(headers={**_SSE_HEADERS, "x-request-id": rid})
                await resp.prepare(http)
                await resp.write(shapes.opening())
            self._observe(shapes.model, started, str(ev.__struct_config__.tag))
            await resp.write(end)
            await resp.write_eof()
            return resp
        raise _Ended(
            ApiError(
                500,
                "the reply stream ended without a terminal event",
                type="server_error",
                code="internal_error",
            )
        )

    def _observe(self, model: str, started: float, outcome: str) -> None:
        metrics.REQUESTS.labels(self.name, model, outcome).inc()
        metrics.E2E.labels(self.name, model).observe(time.monotonic() - started)

    async def _cancel(self, rid: str, reason: str) -> None:
        try:
            await self.ctx.nc.publish(CANCEL, encode(CancelRequest(request_id=rid, reason=reason)))
        except Exception:
            log.exception("cancel publish failed", request_id=rid)


class _Flow:
    """What a request used, for settling its key's token budget."""

    __slots__ = ("completion_tokens", "usage")

    def __init__(self) -> None:
        self.completion_tokens = 0
        self.usage: int | None = None

    def used_tokens(self, prompt_chars: int) -> int | None:
        """The engine's count when it finished; else what was generated for the client
        (and its prompt); None when nothing was (the whole charge comes back)."""
        if self.usage is not None:
            return self.usage
        if self.completion_tokens:
            return estimate_prompt_tokens(prompt_chars) + self.completion_tokens
        return None


_DEADLINE_GRACE_S = 2.0
_TIMED_OUT = object()
"""Put in a request's reply queue when its wait is over."""
_EVENT_ROOM = 16 * 1024
"""Bytes of a submitted event besides the body's (ids, reply subject, sampling, headers)."""


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {limit} bytes, the most the platform carries",
        code="request_too_large",
    )


_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def inferbus_version() -> str:
    try:
        return importlib.metadata.version("inferbus")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def _request_id(http: web.Request) -> str:
    """The client's id (checked before use; an empty one is refused), or a new one."""
    rid = http.headers.get("x-request-id")
    return uuid.uuid4().hex if rid is None else rid


def _error_response(err: ApiError, rid: str) -> web.Response:
    headers = {"x-request-id": rid}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return web.json_response(err.body(), status=err.status, headers=headers)
