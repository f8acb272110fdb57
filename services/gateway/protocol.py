"""The OpenAI request bodies, free of I/O: their Structs (with the ranges the
sanitizer also holds requests to), the vLLM fields refused by name, and decoding with
errors that name the field. torequest.py makes the contract's request of them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from inferbus.contracts.sampling import I32, SAMPLING_RANGES

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


class CommonFields(_Refusable, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    """The prompt (chat: the last message, when it is the assistant's) before the
    answer's text."""
    max_tokens: PositiveInt | None = None
    prompt_logprobs: Annotated[int, _R["prompt_logprobs"].meta()] | None = None
    """vLLM's: each prompt token's log probability, with this many alternatives."""
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


class ChatCompletionRequest(CommonFields, kw_only=True):
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
    """Show the reasoning the worker's reasoning parser took apart (``reasoning`` in
    deltas and messages); false: the answer alone, as vLLM's server."""
    chat_template: Any = None
    media_io_kwargs: Any = None
    mm_processor_kwargs: Any = None
    return_prompt_text: Any = None


MAX_BATCH = 256
"""Prompts one /v1/completions request may carry (each runs as a request of its own)."""


class CompletionRequest(CommonFields, kw_only=True):
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
    max_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """0 with ``echo``: nothing is generated, the prompt is scored (its logprobs)."""
    best_of: int | None = None
    suffix: str | None = None
    prompt_embeds: Any = None


class EmbeddingRequest(_Refusable, kw_only=True):
    """OpenAI's (and vLLM's) embeddings body."""

    model: str
    input: (
        str
        | Annotated[
            list[str | TokenId | list[TokenId]], msgspec.Meta(min_length=1, max_length=MAX_BATCH)
        ]
    )
    """A text (or token ids), or a batch of them: one vector each, in order."""
    encoding_format: Literal["float", "base64"] = "float"
    """``base64``: each vector's float32 values, little-endian, as base64 (what the
    OpenAI SDK asks for by default)."""
    dimensions: PositiveInt | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, _R["truncate_prompt_tokens"].meta()] | None = None
    truncation_side: Literal["left", "right"] | None = None
    use_activation: bool | None = None
    """Normalize the vectors (vLLM's name); None: the model's default."""
    add_special_tokens: bool = True
    embed_dtype: Literal["float32"] = "float32"
    endianness: Literal["native", "little"] = "native"
    padding: Any = None
    mm_processor_kwargs: Any = None


REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "use_beam_search": ("beam search", (None, False)),
    "length_penalty": ("length_penalty (beam search)", (None, 1, 1.0)),
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


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(
        400, f"{what} is not supported by this server", param=param, code="unsupported_parameter"
    )


def refuse_named(req: _Refusable) -> None:
    """vLLM's fields this server refuses (``REFUSED``), when set to other than a no-op."""
    for name, (what, no_ops) in REFUSED.items():
        value = getattr(req, name, None)
        if not any((value == v and type(value) is type(v)) or value is v for v in no_ops):
            raise unsupported(name, what)


def refuse_unsupported(req: CommonFields) -> None:
    """Fields clients send that would change the answer's meaning: refused, not ignored."""
    refuse_named(req)
    if req.echo and logprobs_asked(req) is not None:
        if isinstance(req, ChatCompletionRequest):
            raise unsupported("echo", "echo with logprobs in a chat (use prompt_logprobs)")
        if req.stream:
            raise unsupported("echo", "echo with logprobs in a stream")
    if req.max_tokens == 0 and not req.echo:
        raise ApiError(
            400,
            "max_tokens 0 scores the prompt: it needs echo",
            param="max_tokens",
            code="invalid_value",
        )
    if req.truncation_side == "right":
        raise unsupported("truncation_side", 'truncation_side "right"')
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        raise unsupported("stream_options.continuous_usage_stats", "continuous_usage_stats")
    if isinstance(req, ChatCompletionRequest):
        if req.functions:
            raise unsupported("functions", "functions (deprecated: send them as tools)")
        if req.function_call not in (None, "none", "auto"):
            raise unsupported("function_call", "function_call (deprecated: use tool_choice)")
        if req.top_logprobs and not req.logprobs:
            raise ApiError(
                400,
                "top_logprobs needs logprobs set to true",
                param="top_logprobs",
                code="invalid_value",
            )
    elif isinstance(req, CompletionRequest):
        if req.best_of not in (None, req.n):
            raise unsupported("best_of", "best_of other than n")
        if req.suffix:
            raise unsupported("suffix", "suffix")
        if req.add_special_tokens is False:
            raise unsupported("add_special_tokens", "add_special_tokens false for a prompt")


_AT = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param(error: str) -> str | None:
    """The field a msgspec error is about, as OpenAI's ``param`` (``messages[0].role``)."""
    at, missing = _AT.search(error), _MISSING.search(error)
    parts = [m.group(1) for m in (at, missing) if m and m.group(1)]
    return ".".join(parts) or None


def decode_body(body: bytes, cls: type[Any]) -> Any:
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


def logprobs_asked(req: CommonFields) -> int | None:
    """The logprobs count asked for, in vLLM's sense (None: none), by either API's field."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    assert isinstance(req, CompletionRequest)
    return req.logprobs


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
