"""An OpenAI request body as the contract's request, free of I/O: sampling and output
constraints, messages and chat-template options, prompts (text, token ids, batches),
and what ``echo`` puts before each choice."""

from __future__ import annotations

from typing import Any

import msgspec

from inferbus.contracts import (
    ChatMessage,
    ChatTemplateOptions,
    EmbedParams,
    FunctionTool,
    RequestSubmitted,
    SamplingParams,
    StructuredOutput,
    ToolCall,
    ToolCallFunction,
    ToolUse,
)
from inferbus.contracts.sampling import out_of_range

from .errors import ApiError
from .protocol import (
    ChatCompletionRequest,
    ChatMessageIn,
    CommonFields,
    CompletionRequest,
    EmbeddingRequest,
    ResponseFormat,
    decode_body,
    logprobs_asked,
    refuse_named,
    refuse_unsupported,
    unsupported,
)


def _structured(req: CommonFields) -> StructuredOutput | None:
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


def _logit_bias(req: CommonFields) -> dict[int, float]:
    return {int(token): bias for token, bias in (req.logit_bias or {}).items()}


def _sampling(req: CommonFields, max_tokens: int | None, default_max_tokens: int) -> SamplingParams:
    """Ranges are checked by the request Structs' constraints; what is left is support."""
    refuse_unsupported(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    # echo's max_tokens 0 runs one step, shown as nothing (vLLM's rule)
    limit = default_max_tokens if max_tokens is None else max(1, max_tokens)
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo and isinstance(req, CompletionRequest):
        prompt_logprobs = req.logprobs  # the echoed prompt's logprobs come first
    sampling = SamplingParams(
        max_tokens=limit,
        prompt_logprobs=prompt_logprobs,
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
        logprobs=logprobs_asked(req),
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


def chat_message(m: ChatMessageIn) -> ChatMessage:
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


def _tool(entry: dict[str, Any], at: int) -> FunctionTool:
    if entry.get("type", "function") != "function":
        raise unsupported(f"tools[{at}].type", f"tools of type {entry.get('type')!r}")
    try:
        return msgspec.convert(entry.get("function"), FunctionTool)
    except msgspec.ValidationError as exc:
        raise ApiError(
            400, f"invalid tool: {exc}", param=f"tools[{at}].function", code="invalid_value"
        ) from None


def function_tools(tools: list[dict[str, Any]] | None) -> list[FunctionTool]:
    """OpenAI's ``tools`` (function tools only: others are refused by name)."""
    return [_tool(t, i) for i, t in enumerate(tools or ())]


def _tool_choice(choice: str | dict[str, Any] | None) -> tuple[str, str | None]:
    if choice is None or isinstance(choice, str):
        return choice or "auto", None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise ApiError(
            400,
            'tool_choice names a function as {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
            code="invalid_value",
        )
    return "function", name


def tool_use(req: ChatCompletionRequest) -> ToolUse | None:
    """The tools offered and how they may be called (``tool_choice`` ``auto`` when
    unset, as OpenAI's and vLLM's); None: none offered."""
    if not req.tools:
        if req.tool_choice not in (None, "none"):
            raise ApiError(
                400, "tool_choice needs tools", param="tool_choice", code="invalid_value"
            )
        return None
    choice, function = _tool_choice(req.tool_choice)
    tools = ToolUse(
        tools=function_tools(req.tools),
        choice=choice,
        function=function,
        parallel=req.parallel_tool_calls is not False,
    )
    wrong = tools.problem()
    if wrong is not None:
        param, why = wrong
        raise ApiError(400, why, param=param, code="invalid_value")
    return tools


def parse_chat(
    body: bytes, default_max_tokens: int
) -> tuple[ChatCompletionRequest, SamplingParams, list[ChatMessage]]:
    req: ChatCompletionRequest = decode_body(body, ChatCompletionRequest)
    messages = [chat_message(m) for m in req.messages]
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
    req: CompletionRequest = decode_body(body, CompletionRequest)
    prompts = _prompts(req.prompt)
    if req.echo and any(isinstance(p, list) for p in prompts):
        raise unsupported("echo", "echo of a prompt of token ids")
    return req, _sampling(req, req.max_tokens, default_max_tokens), prompts


def parse_embeddings(body: bytes) -> tuple[EmbeddingRequest, EmbedParams, list[Prompt]]:
    """The request, what its vectors are asked to be, and its inputs (one, or a batch)."""
    req: EmbeddingRequest = decode_body(body, EmbeddingRequest)
    refuse_named(req)
    if req.truncation_side == "right":
        raise unsupported("truncation_side", 'truncation_side "right"')
    if not req.add_special_tokens:
        raise unsupported("add_special_tokens", "add_special_tokens false")
    for name in ("padding", "mm_processor_kwargs"):
        if getattr(req, name) is not None:
            raise unsupported(name, name)
    try:
        inputs = _prompts(req.input)
    except ApiError as err:
        raise ApiError(400, err.message, param="input", code=err.code) from None
    if any(p == "" for p in inputs):
        raise ApiError(400, "an input is empty", param="input", code="invalid_value")
    return req, EmbedParams(dimensions=req.dimensions, normalize=req.use_activation), inputs


def embedding_sampling(req: EmbeddingRequest) -> SamplingParams:
    """What the platform budgets an embedding by: its prompt, and one step."""
    return SamplingParams(max_tokens=1, truncate_prompt_tokens=req.truncate_prompt_tokens)


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
    tools: ToolUse | None = None,
    embed: EmbedParams | None = None,
    input_policy: str = "",
    data_policy: str = "",
    mask_pii: bool | None = None,
    tool_call_policy: str = "",
) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=request_id,
        model=model,
        reply_to=reply_to,
        prompt=prompt if isinstance(prompt, str) else None,
        token_prompt=prompt if isinstance(prompt, list) else None,
        messages=messages,
        chat_template=chat_template,
        tools=tools,
        embed=embed,
        sampling=sampling,
        tenant=tenant,
        priority=priority,
        created_at=now,
        deadline=now + timeout_s if timeout_s else 0.0,
        input_policy=input_policy,
        data_policy=data_policy,
        mask_pii=mask_pii,
        tool_call_policy=tool_call_policy,
    )


def prompt_chars(prompt: Prompt | None, messages: list[ChatMessage] | None) -> int:
    """The prompt's size in characters (token ids at about 4 a token)."""
    if messages is not None:
        return sum(len(m.content) for m in messages)
    if isinstance(prompt, list):
        return 4 * len(prompt)
    return len(prompt or "")
