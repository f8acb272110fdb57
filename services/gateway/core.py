"""The gateway's decisions, free of I/O: OpenAI request validation, response shapes,
error mapping and the live-model registry built from worker heartbeats."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from inferbus.contracts import (
    ChatMessage,
    FailureCode,
    ModelLoad,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestRejected,
    RequestSubmitted,
    SamplingParams,
    ScalingStatus,
    SchedulerLoad,
    WorkerHeartbeat,
    http_status,
)

# -- OpenAI request bodies ---------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """Text only: other part types (images, audio) are refused by name."""

    type: Literal["text"]
    text: str


class ChatMessageIn(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
_I32 = 2**31 - 1
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=_I32)]


class _Common(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    n: PositiveInt = 1
    user: str | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions, which its clients and benchmarks send
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=_I32)] = 0
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, msgspec.Meta(ge=0, le=_I32)]] = []


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessageIn], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]
    """One prompt per request (a list of exactly one is taken too)."""
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


def _unsupported(param: str, what: str) -> ApiError:
    return ApiError(
        400, f"{what} is not supported by this server", param=param, code="unsupported_parameter"
    )


def _refuse_unsupported(req: _Common) -> None:
    """Fields clients send that would change the answer's meaning: refused, not ignored."""
    if req.logit_bias:
        raise _unsupported("logit_bias", "logit_bias")
    if req.logprobs not in (None, False, 0):
        raise _unsupported("logprobs", "logprobs")
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs:
            raise _unsupported("top_logprobs", "top_logprobs")
        for name in ("tools", "functions"):
            if getattr(req, name):
                raise _unsupported(name, "tool and function calling")
        for name in ("tool_choice", "function_call"):
            if getattr(req, name) not in (None, "none", "auto"):
                raise _unsupported(name, "tool and function calling")
        fmt = req.response_format
        if fmt is not None and fmt.get("type", "text") != "text":
            raise _unsupported("response_format", f"response_format {fmt.get('type')!r}")
    elif isinstance(req, CompletionRequest):
        if req.echo:
            raise _unsupported("echo", "echo")
        if req.best_of not in (None, 1):
            raise _unsupported("best_of", "best_of other than 1")
        if req.suffix:
            raise _unsupported("suffix", "suffix")


class ApiError(Exception):
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.retry_after = param, code, retry_after

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_AT = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param(error: str) -> str | None:
    """The field a msgspec error is about, as OpenAI's ``param`` (``messages[0].role``)."""
    at, missing = _AT.search(error), _MISSING.search(error)
    parts = [m.group(1) for m in (at, missing) if m and m.group(1)]
    return ".".join(parts) or None


def _decode(body: bytes, cls: type[Any]) -> Any:
    if not body.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        return msgspec.json.decode(body, type=cls)
    except msgspec.ValidationError as exc:
        error = exc
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # even unknown fields are walked: a deep one is refused here
        raise _too_deep() from None
    if "got `float`" in str(error):
        # JSON has one number type: 16.0 is an integer to JSON Schema and to OpenAI's
        # servers, so take it as one (off the hot path: only after a failed decode)
        try:
            return msgspec.convert(_integral(msgspec.json.decode(body)), cls)
        except msgspec.ValidationError as exc:
            error = exc
        except RecursionError:
            raise _too_deep() from None
    raise ApiError(
        400, f"invalid request: {error}", param=_param(str(error)), code="invalid_value"
    ) from None


def _too_deep() -> ApiError:
    return ApiError(400, "the JSON body is nested too deeply", code="invalid_json")


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _sampling(req: _Common, max_tokens: int | None, default_max_tokens: int) -> SamplingParams:
    """Ranges are checked by the request Structs' constraints; what is left is support."""
    if req.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n", code="unsupported_value")
    _refuse_unsupported(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=max(0, req.top_k),
        stop=stop,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        ignore_eos=req.ignore_eos,
        stop_token_ids=list(req.stop_token_ids),
    )


def _content(msg: ChatMessageIn) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    return "".join(part.text for part in msg.content)


def parse_chat(
    body: bytes, default_max_tokens: int
) -> tuple[ChatCompletionRequest, SamplingParams, list[ChatMessage]]:
    req: ChatCompletionRequest = _decode(body, ChatCompletionRequest)
    messages = [ChatMessage(role=m.role, content=_content(m), name=m.name) for m in req.messages]
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return req, _sampling(req, limit, default_max_tokens), messages


def parse_completion(
    body: bytes, default_max_tokens: int
) -> tuple[CompletionRequest, SamplingParams, str]:
    req: CompletionRequest = _decode(body, CompletionRequest)
    prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    return req, _sampling(req, req.max_tokens, default_max_tokens), prompt


def submitted(
    *,
    request_id: str,
    model: str,
    reply_to: str,
    sampling: SamplingParams,
    now: float,
    tenant: str = "default",
    priority: str = "standard",
    timeout_s: float | None = None,
    prompt: str | None = None,
    messages: list[ChatMessage] | None = None,
    input_policy: str = "",
    mask_pii: bool | None = None,
) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=request_id,
        model=model,
        reply_to=reply_to,
        prompt=prompt,
        messages=messages,
        sampling=sampling,
        tenant=tenant,
        priority=priority,
        created_at=now,
        deadline=now + timeout_s if timeout_s else 0.0,
        input_policy=input_policy,
        mask_pii=mask_pii,
    )


def request_timeout(header: str | None) -> float | None:
    """The request's own time limit in seconds, from the ``X-Request-Timeout`` header
    (a header, so clients set it without touching the OpenAI body)."""
    if header is None:
        return None
    try:
        value = float(header)
    except ValueError:
        value = -1.0
    if not 0 < value <= 24 * 3600:
        raise ApiError(
            400,
            "X-Request-Timeout must be seconds between 0 and 86400",
            param="X-Request-Timeout",
            code="invalid_value",
        )
    return value


def prompt_chars(prompt: str | None, messages: list[ChatMessage] | None) -> int:
    if messages is not None:
        return sum(len(m.content) for m in messages)
    return len(prompt or "")


# -- terminal events → HTTP ------------------------------------------------------------

_ERROR_TYPE = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}


def failure_error(
    code: str,
    message: str,
    *,
    param: str | None = None,
    retry_after: float | None = None,
    default_status: int = 500,
) -> ApiError:
    """The HTTP error for a failure code of the contract: status from its table
    (``default_status`` for a code the table lacks), OpenAI error type by status."""
    status = http_status(code, default_status)
    return ApiError(
        status,
        message,
        type=_ERROR_TYPE.get(status, "server_error"),
        param=param,
        code=code,
        retry_after=retry_after,
    )


def error_for(event: RequestFailed | RequestRejected | RequestCancelled) -> ApiError:
    if isinstance(event, RequestRejected):  # the request's own fault: 400 unless known
        return failure_error(event.code, event.reason, param=event.param, default_status=400)
    if isinstance(event, RequestCancelled):
        code = FailureCode.CANCELLED
        return ApiError(http_status(code), event.reason, type="cancelled", code=code)
    return failure_error(event.code, event.reason, retry_after=1.0 if event.retryable else None)


# -- OpenAI response shapes --------------------------------------------------------------


def usage_dict(fin: RequestFinished) -> dict[str, int]:
    u = fin.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


class Shapes:
    """Builds the chat or text-completion objects of one response."""

    def __init__(self, *, chat: bool, request_id: str, model: str, created: int) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.created = created
        self._role_sent = False
        self._event_parts: tuple[bytes, bytes] | None = None

    def _choice(self, text: str | None, finish: str | None, stream: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if stream:
            delta: dict[str, Any] = {}
            if not self._role_sent:
                delta["role"] = "assistant"
                self._role_sent = True
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }

    def _envelope(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        obj = "chat.completion" if self.chat else "text_completion"
        if stream and self.chat:
            obj += ".chunk"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, text: str) -> dict[str, Any]:
        return self._envelope([self._choice(text, None, True)], True)

    def chunk_event(self, text: str) -> bytes:
        """``chunk`` as a ready SSE event; after the first, only the text is encoded."""
        if self.chat and not self._role_sent:
            return sse(self.chunk(text))
        if self._event_parts is None:
            head = msgspec.json.encode(self._envelope([], True))[: -len(b'"choices":[]}')]
            field = b'"delta":{"content":' if self.chat else b'"text":'
            tail = b"}" if self.chat else b""
            self._event_parts = (
                b"data: " + head + b'"choices":[{"index":0,' + field,
                tail + b',"logprobs":null,"finish_reason":null}]}\n\n',
            )
        prefix, suffix = self._event_parts
        return prefix + msgspec.json.encode(text) + suffix

    def final_chunk(self, fin: RequestFinished) -> dict[str, Any]:
        return self._envelope(
            [self._choice(None if self.chat else "", fin.finish_reason, True)], True
        )

    def usage_chunk(self, fin: RequestFinished) -> dict[str, Any]:
        env = self._envelope([], True)
        env["usage"] = usage_dict(fin)
        return env

    def complete(self, text: str, fin: RequestFinished) -> dict[str, Any]:
        env = self._envelope([self._choice(text, fin.finish_reason, False)], False)
        env["usage"] = usage_dict(fin)
        return env


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


# -- models served right now ----------------------------------------------------------


class ModelRegistry:
    """Which models live workers serve, from their heartbeats."""

    def __init__(
        self, stale_after_s: float = 3.0, started_at: float = 0.0, remember_s: float = 600.0
    ) -> None:
        self.stale_after_s = stale_after_s
        self.started_at = started_at
        """Until ``stale_after_s`` past this, no model can be said not to exist: the
        heartbeats have not all come yet."""
        self.remember_s = remember_s
        """A model served this recently is known: without a live worker (all lost, or
        their heartbeats held up by a NATS outage) it is 503, retryable, not 404."""
        self._workers: dict[str, tuple[WorkerHeartbeat, float]] = {}
        self._known: dict[str, float] = {}
        self._scaled: dict[str, float] = {}
        """Models the autoscaler sizes → until when its word holds."""

    def on_scaling(self, status: ScalingStatus, now: float) -> None:
        for model in status.targets:
            self._scaled[model] = now + 3 * status.interval_s

    def scaled(self, model: str, now: float) -> bool:
        """The autoscaler sizes it: with no worker ready, one is being started."""
        return now < self._scaled.get(model, 0.0)

    def on_heartbeat(self, hb: WorkerHeartbeat, now: float) -> None:
        for m in hb.models:
            self._known[m] = now
        if hb.state in ("stopped", "failed"):
            self._workers.pop(hb.worker_id, None)
        else:
            self._workers[hb.worker_id] = (hb, now)

    def known(self, model: str, now: float) -> bool:
        """Whether ``model`` may exist: served lately, or too early to tell."""
        seen = self._known.get(model)
        if seen is not None and now - seen <= self.remember_s:
            return True
        return now - self.started_at < self.stale_after_s

    def admit(self, model: str, now: float, max_tokens: int = 0) -> None:
        """Raise the HTTP error for a model no live worker can serve right now."""
        ready = self.models(now).get(model)
        if not ready and self.scaled(model, now):
            return  # it waits in the scheduler's queue while a worker starts (bounded)
        if ready is None and self.known(model, now):
            ready = 0
        if ready is None:
            raise failure_error(
                FailureCode.MODEL_NOT_FOUND,
                f"the model {model!r} does not exist or no worker serves it",
                param="model",
            )
        if ready == 0:
            raise failure_error(
                FailureCode.NO_WORKER, f"no worker for {model!r} is ready", retry_after=1.0
            )
        limit = self.max_model_len(model)
        if limit and max_tokens >= limit:
            raise failure_error(
                FailureCode.CONTEXT_LENGTH_EXCEEDED,
                f"max_tokens ({max_tokens}) leaves no room for the prompt in "
                f"{model!r}'s {limit}-token context",
                param="max_tokens",
            )

    def max_model_len(self, model: str) -> int:
        """The smallest context of the workers serving ``model`` (0 when unknown)."""
        lens = [
            hb.max_model_len
            for hb, _ in self._workers.values()
            if model in hb.models and hb.max_model_len
        ]
        return min(lens, default=0)

    def models(self, now: float) -> dict[str, int]:
        """Model → number of ready workers (0 when all are draining or starting, or
        when the autoscaler has it at zero: it is served on request)."""
        out: dict[str, int] = {m: 0 for m in self._scaled if self.scaled(m, now)}
        for wid, (hb, seen) in list(self._workers.items()):
            if now - seen > self.stale_after_s:
                del self._workers[wid]
                continue
            for m in hb.models:
                out[m] = out.get(m, 0) + (hb.state == "ready")
        return out


# -- backpressure from the scheduler's queues ---------------------------------------------


class LoadView:
    """The schedulers' last word on their queues; requests for a model whose queue is
    full get 429 here instead of waiting in a queue without bound."""

    def __init__(self, min_stale_s: float = 2.0) -> None:
        self.min_stale_s = min_stale_s
        self._reports: dict[str, tuple[SchedulerLoad, float]] = {}

    def on_load(self, load: SchedulerLoad, now: float) -> None:
        self._reports[load.scheduler_id] = (load, now)

    def model(self, model: str, now: float) -> ModelLoad | None:
        """The model's load summed over the schedulers heard from recently (replicas
        share the accepted requests, each with a queue and limit of its own)."""
        total: ModelLoad | None = None
        for sid, (load, seen) in list(self._reports.items()):
            if now - seen > max(self.min_stale_s, 4 * load.interval_s):
                del self._reports[sid]  # gone quiet: the scheduler enforces its own limit
                continue
            m = load.models.get(model)
            if m is None:
                continue
            if total is None:
                total = ModelLoad(**msgspec.structs.asdict(m))
                continue
            total.queued += m.queued
            total.queue_limit += m.queue_limit
            total.free_slots += m.free_slots
            total.dispatch_per_s += m.dispatch_per_s
            total.oldest_wait_s = max(total.oldest_wait_s, m.oldest_wait_s)
            total.ready_workers = max(total.ready_workers, m.ready_workers)
        return total

    def admit(self, model: str, now: float) -> None:
        m = self.model(model, now)
        if m is None or not m.queue_limit or m.queued < m.queue_limit:
            return
        if not m.ready_workers:
            raise failure_error(
                FailureCode.NO_WORKER,
                f"{m.queued} requests for {model!r} are waiting and no worker "
                "serves it now; retry later",
                retry_after=5.0,
            )
        raise failure_error(
            FailureCode.QUEUE_FULL,
            f"{m.queued} requests for {model!r} are waiting, the most this "
            "platform queues; retry later",
            retry_after=retry_after(m),
        )


def retry_after(m: ModelLoad) -> float:
    """When a slot in the queue should be free: the requests over the limit at the
    recent dispatch rate, kept within 1..60 s."""
    over = m.queued - m.queue_limit + 1
    if m.dispatch_per_s <= 0:
        return 5.0
    return min(60.0, max(1.0, over / m.dispatch_per_s))
