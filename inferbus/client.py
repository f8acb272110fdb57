"""Python client for the NATS entry: submit a request, iterate its token chunks.

    async with await Client.connect("nats://127.0.0.1:4222") as client:
        stream = client.stream("sim-model", prompt="Hello")
        async for chunk in stream:
            print(chunk.text, end="")
        print(stream.outcome.usage)

Any NATS client can do the same: subscribe to a reply subject, publish a
``RequestSubmitted`` (JSON) to ``ib.req.submitted`` on JetStream with the header
``Nats-Msg-Id: <request_id>``, then read TokenChunks until a terminal event.

On a closed bus a tenant's credentials (``creds=`` or ``INFERBUS_NATS_CREDS``) send it
to its own subjects: it submits on ``ib.req.submitted.<tenant>``, reads replies under
``ib.reply.tenant.<tenant>.``, cancels on ``ib.ctl.cancel.<tenant>``; its tenant,
priority and policies come from its record, whatever the request says.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NatsClient

from inferbus.contracts import (
    CANCEL,
    SUBMIT,
    CancelRequest,
    ChatMessage,
    ChatTemplateOptions,
    EmbedParams,
    FailureCode,
    ReplyEvent,
    ReplyReader,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestRejected,
    RequestSubmitted,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallFunction,
    ToolUse,
    request_failed,
    tenant_cancel_subject,
    tenant_reply_prefix,
    tenant_request_id,
    tenant_submit_subject,
)
from inferbus.shared.bus import ConnectionWatch, connect, publish_durable
from inferbus.shared.buscreds import BusCredentials, credentials_from_env, load_credentials
from inferbus.shared.codec import decode, encode
from inferbus.shared.config import DEFAULT_NATS_URL

__all__ = ["Client", "RequestError", "Stream"]


class RequestError(Exception):
    """The request ended without finishing: rejected, failed, cancelled or timed out."""

    def __init__(
        self,
        event: RequestFailed | RequestRejected | RequestCancelled | None,
        message: str,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.event = event
        if not code:
            if isinstance(event, RequestFailed | RequestRejected):
                code = event.code
            else:
                code = FailureCode.CANCELLED if event else FailureCode.TIMEOUT
        self.code: str = code

    @property
    def retryable(self) -> bool:
        """The platform says the same request may succeed later (with a new id)."""
        return bool(getattr(self.event, "retryable", False))

    @property
    def retry_after_s(self) -> float:
        """How long to wait before sending it again, as the platform estimates it (the
        gateway's Retry-After); 0: it says nothing."""
        return float(getattr(self.event, "retry_after_s", 0.0) or 0.0)


class Stream:
    """Async iterator over a request's TokenChunks; ``outcome`` holds the RequestFinished."""

    def __init__(
        self,
        client: Client,
        request: RequestSubmitted,
        timeout: float,
        trace: dict[str, str] | None = None,
    ) -> None:
        self.request = request
        self._trace = trace
        self.request_id = request.request_id
        self.outcome: RequestFinished | None = None
        self.chunks: list[TokenChunk] = []
        self._client = client
        self._timeout = timeout
        self._sub: Any = None
        self._replies: asyncio.Queue[Any] = asyncio.Queue()
        """The reply subject's messages, or a failure the client itself puts here (the
        bus was lost: what came meanwhile is gone)."""
        self._reader = ReplyReader(request.request_id)
        self._done = False
        self.submitted_at = 0.0
        self.first_token_at: float | None = None

    @property
    def text(self) -> str:
        """Choice 0's text (the only one unless ``n`` > 1)."""
        return self.choice_text(0)

    def choice_text(self, index: int) -> str:
        return "".join(c.text for c in self.chunks if c.index == index)

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """Choice 0's token logprobs, when the request asked for them."""
        return [lp for c in self.chunks if c.index == 0 for lp in c.logprobs]

    def reasoning(self, index: int = 0) -> str:
        """A choice's reasoning (with a worker's reasoning parser)."""
        return "".join(c.reasoning for c in self.chunks if c.index == index)

    def tool_calls(self, index: int = 0) -> list[ToolCall]:
        """The tool calls a choice made, their streamed pieces joined."""
        calls: dict[int, ToolCall] = {}
        for piece in (p for c in self.chunks if c.index == index for p in c.tool_calls):
            call = calls.get(piece.index)
            if call is None:
                function = ToolCallFunction(name=piece.name or "", arguments="")
                call = calls[piece.index] = ToolCall(id=piece.id or "", function=function)
            call.function.arguments += piece.arguments
        return [calls[i] for i in sorted(calls)]

    @property
    def embedding(self) -> list[float]:
        """An embedding request's vector."""
        ends = self.outcome.choice_ends() if self.outcome is not None else []
        return ends[0].embedding if ends else []

    async def _open(self) -> None:
        nc = self._client.nc
        self._client.streams.add(self)
        self._sub = await nc.subscribe(
            self.request.reply_to, cb=self._on_reply, pending_msgs_limit=1_000_000
        )
        self.submitted_at = time.monotonic()
        now = time.time()  # the clock starts at submission, not when the stream was made
        self.request = msgspec.structs.replace(
            self.request, created_at=now, deadline=now + self._timeout
        )
        try:
            ack = await publish_durable(
                self._client.js,
                self._client.submit_subject,
                self.request,
                request_id=self.request_id,
                msg_id=self.request_id,
                trace=self._trace,
            )
        except (nats.errors.Error, TimeoutError) as exc:  # no JetStream answer
            await self._close()
            failed = request_failed(
                self.request_id,
                FailureCode.BUS_UNAVAILABLE,
                f"the request could not be recorded ({type(exc).__name__}); submit it again",
            )
            raise RequestError(failed, failed.reason) from None
        if ack.duplicate:
            await self._close()
            raise RequestError(
                None,
                f"request id {self.request_id} was already submitted",
                code=FailureCode.DUPLICATE_REQUEST,
            )

    async def _on_reply(self, msg: Any) -> None:
        self._replies.put_nowait(msg.data)

    def lost(self) -> None:
        """The connection dropped while this stream was open."""
        self._replies.put_nowait(
            RequestFailed(
                request_id=self.request_id,
                code=FailureCode.BUS_UNAVAILABLE,
                retryable=True,
                reason="the connection to NATS dropped while the request ran; submit it again",
            )
        )

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> TokenChunk:
        if self._done:
            raise StopAsyncIteration
        if self._sub is None:
            await self._open()
        deadline = self.submitted_at + self._timeout
        while True:
            try:
                got = await asyncio.wait_for(
                    self._replies.get(), max(0.001, deadline - time.monotonic())
                )
            except TimeoutError:
                await self.cancel("client timed out")
                raise RequestError(None, f"no answer within {self._timeout:g}s") from None
            except BaseException:
                await self._close()
                raise
            ev = got if isinstance(got, RequestFailed) else decode(got, ReplyEvent)
            reading = self._reader.read(ev)
            if reading.interrupts:  # the chunks handed out are void: they can't be taken back
                await self.cancel("the output restarted")
                failed = self._reader.interrupted()
                raise RequestError(failed, failed.reason)
            if reading.chunks:  # one event read: one chunk
                chunk = reading.chunks[0]
                if self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                self.chunks.append(chunk)
                return chunk
            end = reading.end
            if end is None:
                continue
            await self._close()
            if isinstance(end, RequestFinished):
                self.outcome = end
                raise StopAsyncIteration
            raise RequestError(end, f"{end.__struct_config__.tag}: {getattr(end, 'reason', '')}")

    async def cancel(self, reason: str = "cancelled by client") -> None:
        await self._client.nc.publish(
            self._client.cancel_subject,
            encode(CancelRequest(request_id=self.request_id, reason=reason)),
        )
        await self._close()

    async def _close(self) -> None:
        self._done = True
        self._client.streams.discard(self)
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception:
                pass


class Client:
    def __init__(self, nc: NatsClient, creds: BusCredentials | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.tenant = creds.tenant if creds is not None else ""
        """Set when connected with a tenant's credentials."""
        self.submit_subject = tenant_submit_subject(self.tenant) if self.tenant else SUBMIT
        self.streams: set[Stream] = set()
        """Streams waiting for replies: a lost connection ends each with a retryable
        error instead of leaving it to its timeout."""
        self.cancel_subject = tenant_cancel_subject(self.tenant) if self.tenant else CANCEL

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        name: str = "inferbus-client",
        creds: str | BusCredentials | None = None,
        tls_ca: str = "",
    ) -> Client:
        """``creds``: a credentials file or its contents (default: the file named by
        ``INFERBUS_NATS_CREDS``, if any)."""
        found = load_credentials(creds) if isinstance(creds, str) else creds
        found = found or credentials_from_env()
        url = url or os.environ.get("NATS_URL", DEFAULT_NATS_URL)
        watch = ConnectionWatch()
        client = cls(await connect(url, name, found, tls_ca, watch), found)
        watch.disconnected.append(client._on_lost)
        return client

    async def _on_lost(self) -> None:
        for stream in list(self.streams):
            stream.lost()

    def reply_subject(self, request_id: str) -> str:
        if self.tenant:  # the only replies a tenant's credentials may read
            return tenant_reply_prefix(self.tenant) + request_id
        return self.nc.new_inbox()

    async def close(self) -> None:
        await self.nc.drain()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stream(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: list[ChatMessage] | list[dict[str, Any]] | None = None,
        chat_template: ChatTemplateOptions | None = None,
        token_prompt: list[int] | None = None,
        tools: ToolUse | None = None,
        embed: EmbedParams | None = None,
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: list[str] | None = None,
        seed: int | None = None,
        request_id: str | None = None,
        tenant: str = "default",
        timeout: float = 600.0,
        input_policy: str = "",
        data_policy: str = "",
        mask_pii: bool | None = None,
        tool_call_policy: str = "",
        traceparent: str | None = None,
        **sampling: Any,
    ) -> Stream:
        """Prepare a request; iterating the stream submits it.

        ``timeout`` is also the request's deadline: past it the platform stops the work.
        ``input_policy`` (block, flag, off), ``data_policy`` (for tool results: block,
        flag, spotlight, off), ``mask_pii`` and ``tool_call_policy`` (mask, refuse)
        override the deployment's sanitizer defaults. ``traceparent`` (W3C) makes the
        request's trace a part of the caller's. ``sampling`` takes the other
        SamplingParams fields (``n``, ``logprobs``, ``min_tokens``, ``structured``...;
        docs/nats-api.md lists them);
        ``messages`` may be dicts in OpenAI's shape, tool calls included; ``tools``
        offers functions to call (the stream's ``tool_calls()`` joins the calls made);
        ``embed`` asks a pooling model for the prompt's vector (``embedding``).
        """
        msgs = None
        if messages is not None:
            msgs = [
                m
                if isinstance(m, ChatMessage)
                else msgspec.convert({**m, "content": m.get("content") or ""}, ChatMessage)
                for m in messages
            ]
        request_id = request_id or uuid.uuid4().hex
        if self.tenant:  # the platform's id for it, which its events carry
            request_id = tenant_request_id(self.tenant, request_id)
        request = RequestSubmitted(
            request_id=request_id,
            model=model,
            reply_to=self.reply_subject(request_id),
            prompt=prompt,
            messages=msgs,
            token_prompt=token_prompt,
            chat_template=chat_template,
            tools=tools,
            embed=embed,
            sampling=SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                stop=stop or [],
                seed=seed,
                **sampling,
            ),
            tenant=tenant,
            input_policy=input_policy,
            data_policy=data_policy,
            mask_pii=mask_pii,
            tool_call_policy=tool_call_policy,
        )
        return Stream(self, request, timeout, {"traceparent": traceparent} if traceparent else None)

    async def embed(self, model: str, text: str, **kwargs: Any) -> list[float]:
        """The vector a pooling model gives ``text`` (``kwargs`` as ``stream``'s)."""
        params = kwargs.pop("embed", None) or EmbedParams()
        done = await self.generate(model, text, embed=params, max_tokens=1, **kwargs)
        return done.embedding

    async def generate(self, model: str, prompt: str | None = None, **kwargs: Any) -> Stream:
        """Run a request to its end; the returned stream holds the text and the outcome."""
        stream = self.stream(model, prompt, **kwargs)
        async for _ in stream:
            pass
        return stream
