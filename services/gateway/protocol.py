"""The OpenAI protocol, free of I/O: request bodies and their validation, the
contract's request built from them, and the response objects (whole or as SSE)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from inferbus.contracts import (
    ChatMessage,
    RequestFinished,
    RequestSubmitted,
    SamplingParams,
)
from inferbus.contracts.sampling import I32, SAMPLING_RANGES

from .errors import ApiError

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


_I32 = I32
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=_I32)]
_R = SAMPLING_RANGES  # one table with the sanitizer's check


class _Common(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, _R["temperature"].meta()] = 1.0
    top_p: Annotated[float, _R["top_p"].meta()] = 1.0
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    n: PositiveInt = 1
    user: str | None = None
    presence_penalty: Annotated[float, _R["presence_penalty"].meta()] = 0.0
    frequency_penalty: Annotated[float, _R["frequency_penalty"].meta()] = 0.0
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions, which its clients and benchmarks send
    top_k: Annotated[int, _R["top_k"].meta()] = 0
    repetition_penalty: Annotated[float, _R["repetition_penalty"].meta()] = 1.0
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
