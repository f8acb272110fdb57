"""The OpenAI protocol, free of I/O: request bodies and their validation, the
contract's request built from them, and the response objects (whole or as SSE)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from inferbus.contracts import (
    ChatMessage,
    ChatTemplateOptions,
    RequestSubmitted,
    SamplingParams,
    StructuredOutput,
    ToolCall,
    ToolCallFunction,
)
from inferbus.contracts.sampling import I32, SAMPLING_RANGES, out_of_range

from .errors import ApiError

# -- OpenAI request bodies ---------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """Text only: other part types (images, audio) are refused by name."""

    type: Literal["text"]
    text: str


class FunctionCallIn(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCallIn(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCallIn
    type: Literal["function"] = "function"


class ChatMessageIn(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    """vLLM's older name of ``reasoning``."""


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str = "response"
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's ``response_format``; a structural tag's own fields are kept whole."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` (``extra_body``)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


_I32 = I32
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=_I32)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=_I32)]
TokenKey = Annotated[str, msgspec.Meta(pattern="^[0-9]{1,9}$")]
"""A token id as a JSON object's key (``logit_bias``)."""
_R = SAMPLING_RANGES  # one table with the sanitizer's check


class _Refusable(msgspec.Struct, kw_only=True):
    """Fields of vLLM's request models this server refuses when set (``REFUSED`` says
    why): declared, so that they are refused by name rather than dropped in silence."""

    use_beam_search: Any = None
    length_penalty: Any = None
    prompt_logprobs: Any = None
    logprob_token_ids: Any = None
    return_token_ids: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_offsets: Any = None
    priority: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    mm_payload: Any = None
    return_mm_kwargs: Any = None
    repetition_detection: Any = None
    routed_experts_prompt_start: Any = None
    session_id: Any = None
    stream_interval: Any = None
    thinking_token_budget: Any = None
    vllm_xargs: Any = None
    watermarking: Any = None
    request_id: Any = None


class _Common(_Refusable, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    """The prompt (chat: the last message, when it is the assistant's) before the
    answer's text."""
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, _R["temperature"].meta()] = 1.0
    top_p: Annotated[float, _R["top_p"].meta()] = 1.0
    stop: str | Annotated[list[str], msgspec.Meta(max_length=64)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    n: Annotated[int, _R["n"].meta()] = 1
    user: str | None = None
    presence_penalty: Annotated[float, _R["presence_penalty"].meta()] = 0.0
    frequency_penalty: Annotated[float, _R["frequency_penalty"].meta()] = 0.0
    logit_bias: dict[TokenKey, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's extensions, which its clients and benchmarks send
    top_k: Annotated[int, _R["top_k"].meta()] = 0
    min_p: Annotated[float, _R["min_p"].meta()] = 0.0
    repetition_penalty: Annotated[float, _R["repetition_penalty"].meta()] = 1.0
    ignore_eos: bool = False
    min_tokens: Annotated[int, _R["min_tokens"].meta()] = 0
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, _R["truncate_prompt_tokens"].meta()] | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsIn | None = None
    add_special_tokens: bool | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessageIn], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, _R["logprobs"].meta()] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    include_reasoning: bool = True
    """Without a reasoning parser (none is configured yet) nothing is taken apart as
    reasoning, so either value gives the same answer, as on vLLM without one."""
    chat_template: Any = None
    media_io_kwargs: Any = None
    mm_processor_kwargs: Any = None
    return_prompt_text: Any = None


MAX_BATCH = 256
"""Prompts one /v1/completions request may carry (each runs as a request of its own)."""


class CompletionRequest(_Common, kw_only=True):
    prompt: (
        str
        | Annotated[
            list[str | TokenId | list[TokenId]], msgspec.Meta(min_length=1, max_length=MAX_BATCH)
        ]
    )
    """A prompt (text, or token ids), or a batch of them: each runs as a request of its
    own, and the answer numbers their choices prompt by prompt (``index`` = prompt × n
    + choice)."""
    logprobs: Annotated[int, _R["logprobs"].meta()] | None = None
    best_of: int | None = None
    suffix: str | None = None
    prompt_embeds: Any = None


REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "use_beam_search": ("beam search", (None, False)),
    "length_penalty": ("length_penalty (beam search)", (None, 1, 1.0)),
    "prompt_logprobs": ("prompt_logprobs", (None,)),
    "logprob_token_ids": ("logprob_token_ids", (None, [])),
    "return_token_ids": ("return_token_ids", (None, False)),
    "return_tokens_as_token_ids": ("return_tokens_as_token_ids", (None, False)),
    "return_token_offsets": ("return_token_offsets", (None, False)),
    "priority": (
        "a request's own priority (it comes from its API key's priority class)",
        (None, 0),
    ),
    "cache_salt": ("cache_salt", (None, "")),
    "kv_transfer_params": ("kv_transfer_params (the platform moves KV itself)", (None, {})),
    "ec_transfer_params": ("ec_transfer_params", (None, {})),
    "mm_payload": ("multimodal input", (None,)),
    "return_mm_kwargs": ("multimodal input", (None, False)),
    "media_io_kwargs": ("multimodal input", (None, {})),
    "mm_processor_kwargs": ("multimodal input", (None, {})),
    "prompt_embeds": ("prompt embeddings", (None,)),
    "repetition_detection": ("repetition_detection", (None,)),
    "routed_experts_prompt_start": ("routed_experts_prompt_start", (None, 0)),
    "session_id": ("session_id", (None,)),
    "stream_interval": ("stream_interval", (None, 1)),
    "thinking_token_budget": ("thinking_token_budget (it needs a reasoning parser)", (None,)),
    "vllm_xargs": ("vllm_xargs", (None, {})),
    "watermarking": ("watermarking", (None, False)),
    "chat_template": (
        "a request's own chat template (vLLM refuses it too unless trusted)",
        (None,),
    ),
    "return_prompt_text": ("return_prompt_text", (None, False)),
    "request_id": ("request_id in the body (send it as the x-request-id header)", (None,)),
}
"""vLLM request fields this server refuses when set to anything but these no-op values:
what each is, and the values that change nothing."""


def _unsupported(param: str, what: str) -> ApiError:
    return ApiError(
        400, f"{what} is not supported by this server", param=param, code="unsupported_parameter"
    )


def _refuse_unsupported(req: _Common) -> None:
    """Fields clients send that would change the answer's meaning: refused, not ignored."""
    for name, (what, no_ops) in REFUSED.items():
        value = getattr(req, name, None)
        if not any((value == v and type(value) is type(v)) or value is v for v in no_ops):
            raise _unsupported(name, what)
    if req.echo and _logprobs(req) is not None:
        raise _unsupported("echo", "echo with logprobs (the prompt's logprobs)")
    if req.truncation_side == "right":
        raise _unsupported("truncation_side", 'truncation_side "right"')
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        raise _unsupported("stream_options.continuous_usage_stats", "continuous_usage_stats")
    if isinstance(req, ChatCompletionRequest):
        for name in ("tools", "functions"):
            if getattr(req, name):
                raise _unsupported(name, "tool and function calling")
        for name in ("tool_choice", "function_call"):
            if getattr(req, name) not in (None, "none", "auto"):
                raise _unsupported(name, "tool and function calling")
        if req.top_logprobs and not req.logprobs:
            raise ApiError(
                400,
                "top_logprobs needs logprobs set to true",
                param="top_logprobs",
                code="invalid_value",
            )
    elif isinstance(req, CompletionRequest):
        if req.best_of not in (None, req.n):
            raise _unsupported("best_of", "best_of other than n")
        if req.suffix:
            raise _unsupported("suffix", "suffix")
        if req.add_special_tokens is False:
            raise _unsupported("add_special_tokens", "add_special_tokens false for a prompt")


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


def _structured(req: _Common) -> StructuredOutput | None:
    """``response_format`` over ``structured_outputs``, as vLLM's server merges them."""
    base = req.structured_outputs
    out: StructuredOutput | None = None
    if base is not None:
        schema = base.json
        if isinstance(schema, str):
            try:
                schema = msgspec.json.decode(schema)
            except msgspec.DecodeError as exc:
                raise ApiError(
                    400,
                    f"structured_outputs.json is not JSON: {exc}",
                    param="structured_outputs.json",
                    code="invalid_value",
                ) from None
            if not isinstance(schema, dict):
                raise ApiError(
                    400,
                    "structured_outputs.json must be a JSON Schema object",
                    param="structured_outputs.json",
                    code="invalid_value",
                )
        out = StructuredOutput(
            json_schema=schema,
            json_object=bool(base.json_object),
            regex=base.regex,
            choice=base.choice,
            grammar=base.grammar,
            structural_tag=base.structural_tag,
            disable_any_whitespace=base.disable_any_whitespace,
            disable_additional_properties=base.disable_additional_properties,
            whitespace_pattern=base.whitespace_pattern,
        )
    fmt = req.response_format
    if fmt is None:
        return out
    try:
        parsed = msgspec.convert(fmt, ResponseFormat)
    except msgspec.ValidationError as exc:
        raise ApiError(
            400, f"invalid response_format: {exc}", param="response_format", code="invalid_value"
        ) from None
    if parsed.type == "text":
        return out
    override: dict[str, Any]
    if parsed.type == "json_object":
        override = {"json_object": True}
    elif parsed.type == "json_schema":
        if parsed.json_schema is None or parsed.json_schema.schema is None:
            raise ApiError(
                400,
                "response_format json_schema needs json_schema.schema",
                param="response_format.json_schema",
                code="invalid_value",
            )
        override = {"json_schema": parsed.json_schema.schema}
    else:  # a structural tag goes to the engine whole, as vLLM's server sends it
        override = {"structural_tag": msgspec.json.encode(fmt).decode()}
    cleared = {k: None for k in ("json_schema", "regex", "choice", "grammar", "structural_tag")}
    base_out = out or StructuredOutput()
    return msgspec.structs.replace(base_out, **{**cleared, "json_object": False, **override})


def _logit_bias(req: _Common) -> dict[int, float]:
    return {int(token): bias for token, bias in (req.logit_bias or {}).items()}


def _logprobs(req: _Common) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    assert isinstance(req, CompletionRequest)
    return req.logprobs


def _sampling(req: _Common, max_tokens: int | None, default_max_tokens: int) -> SamplingParams:
    """Ranges are checked by the request Structs' constraints; what is left is support."""
    _refuse_unsupported(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    sampling = SamplingParams(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=max(0, req.top_k),
        min_p=req.min_p,
        stop=stop,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        ignore_eos=req.ignore_eos,
        stop_token_ids=list(req.stop_token_ids or ()),
        n=req.n,
        min_tokens=req.min_tokens,
        logprobs=_logprobs(req),
        logit_bias=_logit_bias(req),
        allowed_token_ids=list(req.allowed_token_ids or ()),
        bad_words=list(req.bad_words or ()),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        structured=_structured(req),
    )
    wrong = out_of_range(sampling)  # what spans fields: min_tokens, one constraint
    if wrong is not None:
        param, why = wrong
        raise ApiError(400, why, param=param, code="invalid_value")
    return sampling


def _content(msg: ChatMessageIn) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    return "".join(part.text for part in msg.content)


def _message(m: ChatMessageIn) -> ChatMessage:
    return ChatMessage(
        role=m.role,
        content=_content(m),
        name=m.name,
        tool_calls=[
            ToolCall(
                id=c.id,
                type=c.type,
                function=ToolCallFunction(name=c.function.name, arguments=c.function.arguments),
            )
            for c in m.tool_calls or ()
        ],
        tool_call_id=m.tool_call_id,
        reasoning=m.reasoning if m.reasoning is not None else m.reasoning_content,
    )


def chat_template(req: ChatCompletionRequest) -> ChatTemplateOptions | None:
    """How the messages become the prompt, as vLLM's server builds its chat params
    (``documents`` and ``reasoning_effort`` go to the template as variables); None:
    the default (the assistant's turn opened)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.documents is not None:
        kwargs["documents"] = req.documents
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
        kwargs.setdefault("enable_thinking", req.reasoning_effort != "none")
    options = ChatTemplateOptions(
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        kwargs=kwargs,
        add_special_tokens=bool(req.add_special_tokens),
    )
    if options.add_generation_prompt and options.continue_final_message:
        raise ApiError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
            code="invalid_value",
        )
    return None if options == ChatTemplateOptions() else options


def parse_chat(
    body: bytes, default_max_tokens: int
) -> tuple[ChatCompletionRequest, SamplingParams, list[ChatMessage]]:
    req: ChatCompletionRequest = _decode(body, ChatCompletionRequest)
    messages = [_message(m) for m in req.messages]
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return req, _sampling(req, limit, default_max_tokens), messages


Prompt = str | list[int]
"""A completions prompt: text, or token ids of the model's tokenizer."""


def _prompts(prompt: str | list[str | int | list[int]]) -> list[Prompt]:
    """OpenAI's prompt forms as a batch: a string, token ids, or a list of either."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [[p for p in prompt if isinstance(p, int)]]
    if any(isinstance(p, int) for p in prompt):
        raise ApiError(
            400,
            "a prompt is a string, a list of token ids, or a list of either; not both kinds",
            param="prompt",
            code="invalid_value",
        )
    out: list[Prompt] = [p for p in prompt if not isinstance(p, int)]
    if any(not p for p in out if isinstance(p, list)):
        raise ApiError(400, "a prompt of token ids is empty", param="prompt", code="invalid_value")
    return out


def parse_completion(
    body: bytes, default_max_tokens: int
) -> tuple[CompletionRequest, SamplingParams, list[Prompt]]:
    """The request, its sampling, and its prompts (one, or a batch)."""
    req: CompletionRequest = _decode(body, CompletionRequest)
    prompts = _prompts(req.prompt)
    if req.echo and any(isinstance(p, list) for p in prompts):
        raise _unsupported("echo", "echo of a prompt of token ids")
    return req, _sampling(req, req.max_tokens, default_max_tokens), prompts


def echoed(
    req: ChatCompletionRequest | CompletionRequest,
    prompts: list[Prompt | None],
    messages: list[ChatMessage] | None,
    n: int,
) -> dict[int, str]:
    """What ``echo`` puts before each choice's text, by choice index (vLLM's rule:
    a completion's prompt; in a chat, the last message when it is the assistant's)."""
    if not req.echo:
        return {}
    if messages is not None:
        last = messages[-1]
        if last.role != "assistant" or not last.content:
            return {}
        return {j: last.content for j in range(n)}
    return {i * n + j: p for i, p in enumerate(prompts) if isinstance(p, str) for j in range(n)}


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
    prompt: Prompt | None = None,
    messages: list[ChatMessage] | None = None,
    chat_template: ChatTemplateOptions | None = None,
    input_policy: str = "",
    mask_pii: bool | None = None,
) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=request_id,
        model=model,
        reply_to=reply_to,
        prompt=prompt if isinstance(prompt, str) else None,
        token_prompt=prompt if isinstance(prompt, list) else None,
        messages=messages,
        chat_template=chat_template,
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


def prompt_chars(prompt: Prompt | None, messages: list[ChatMessage] | None) -> int:
    """The prompt's size in characters (token ids at about 4 a token)."""
    if messages is not None:
        return sum(len(m.content) for m in messages)
    if isinstance(prompt, list):
        return 4 * len(prompt)
    return len(prompt or "")
