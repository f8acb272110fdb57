"""A chat answer taken apart as vLLM's server does it: tool calls and reasoning out of
the text, by vLLM's own parsers (the worker's ``--tool-call-parser`` and
``--reasoning-parser``), one parser per choice since each keeps its stream's state.
``tool_choice`` ``required`` and a named function are decoded under the constraint
the parser asks for (the tools' JSON schemas, or the model's structural tag).
vLLM is imported only inside these functions (the worker runs without it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from inferbus.contracts import FailureCode, ToolCallDelta, ToolUse

from .engine import EngineError, EngineOptions, EngineRequest


class ParsedDelta(NamedTuple):
    text: str
    reasoning: str
    tool_calls: list[ToolCallDelta]


def refuse_tools(tools: ToolUse | None, o: EngineOptions) -> None:
    """vLLM's server's rule: a request that may call tools needs a tool-call parser
    (``auto`` also needs auto tool choice enabled); ``none`` needs neither."""
    if tools is None or tools.choice == "none":
        return
    if not o.tool_call_parser:
        what = f'function "{tools.function}"' if tools.choice == "function" else tools.choice
        raise EngineError(
            FailureCode.UNSUPPORTED_BY_ENGINE,
            f"tool_choice {what} needs a worker started with --tool-call-parser",
        )
    if tools.choice == "auto" and not o.enable_auto_tool_choice:
        raise EngineError(
            FailureCode.UNSUPPORTED_BY_ENGINE,
            'tool_choice "auto" needs a worker started with --enable-auto-tool-choice '
            "and --tool-call-parser",
        )


def parser_class(o: EngineOptions, tokenizer: Any) -> Any:
    """vLLM's parser for this worker's options (None: it parses nothing), checked
    against the tokenizer now rather than at the first request."""
    if o.enable_auto_tool_choice and not o.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
    if not (o.tool_call_parser or o.reasoning_parser):
        return None
    from vllm.parser import ParserManager

    # vLLM loads a tool parser only with auto tool choice on; whether ``auto`` is
    # served is refuse_tools' to say, so required and named need the parser alone
    return ParserManager.get_parser(
        tool_parser_name=o.tool_call_parser or None,
        reasoning_parser_name=o.reasoning_parser or None,
        enable_auto_tools=bool(o.tool_call_parser),
        model_name=o.served_name,
        tokenizer=tokenizer,
    )


def _tool_choice(tools: ToolUse) -> Any:
    if tools.choice == "function":
        return {"type": "function", "function": {"name": tools.function}}
    return tools.choice


def vllm_chat_request(request: EngineRequest) -> Any:
    """The request as vLLM's server's chat request: what its parsers read."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from .vllm_params import structured_params

    tools = request.tools
    template = request.chat_template
    fields: dict[str, Any] = {
        "model": request.model or "model",
        "messages": [m.template_dict() for m in request.messages or ()],
        "stream": True,
        "skip_special_tokens": request.sampling.skip_special_tokens,
        "chat_template_kwargs": dict(template.kwargs) if template is not None else None,
    }
    if tools is not None and tools.tools:
        fields["tools"] = tools.template_tools()
        fields["tool_choice"] = _tool_choice(tools)
        fields["parallel_tool_calls"] = tools.parallel
    vreq = ChatCompletionRequest(**fields)
    constraint = structured_params(request.sampling.structured)
    if constraint is not None:
        vreq.structured_outputs = constraint
    return vreq


def _capped_whitespace(node: Any) -> Any:
    """A structural tag whose JSON contents may hold no free whitespace."""
    if isinstance(node, dict):
        out = {k: _capped_whitespace(v) for k, v in node.items()}
        if out.get("type") == "json_schema" and out.get("max_whitespace_cnt") is None:
            out["max_whitespace_cnt"] = 1
        return out
    if isinstance(node, list):
        return [_capped_whitespace(v) for v in node]
    return node


class ChatParsing:
    """One chat request's answer through vLLM's parser: what the engine must be asked
    (the constraint and special-token setting the parser adjusted), then each choice's
    new text as text, reasoning and tool-call pieces."""

    def __init__(
        self,
        parser_cls: Any,
        tokenizer: Any,
        request: EngineRequest,
        prompt_ids: list[int],
        no_free_whitespace: bool = False,
    ) -> None:
        self.tools = request.tools
        template = request.chat_template
        kwargs = dict(template.kwargs) if template is not None else {}
        self.request = vllm_chat_request(request)
        self._new: Callable[[], Any] = lambda: parser_cls(
            tokenizer, self.request.tools, chat_template_kwargs=kwargs
        )
        first = self._new()
        self.request = first.adjust_request(self.request)
        tag = self.request.structured_outputs
        if no_free_whitespace and tag is not None and tag.structural_tag:
            # the engine's --structured-outputs-disable-any-whitespace covers JSON
            # constraints; the parser's structural tag (strict tool calling) carries its
            # own whitespace cap, which vLLM leaves unset: set to the engine's choice
            tag.structural_tag = json.dumps(_capped_whitespace(json.loads(tag.structural_tag)))
        self._parsers: dict[int, Any] = {0: first}
        self._prompt_ids = prompt_ids
        self._called: set[int] = set()

    @property
    def constraint(self) -> Any:
        """vLLM's StructuredOutputsParams for the engine (None: unconstrained)."""
        return self.request.structured_outputs

    @property
    def skip_special_tokens(self) -> bool:
        return bool(self.request.skip_special_tokens)

    def feed(self, index: int, text: str, token_ids: list[int], finished: bool) -> ParsedDelta:
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self._new()
        delta = parser.parse_delta(
            text, token_ids, self.request, self._prompt_ids, finished=finished
        )
        if delta is None:
            return ParsedDelta("", "", [])
        calls = [
            ToolCallDelta(
                index=c.index,
                id=c.id,
                name=c.function.name if c.function is not None else None,
                arguments=(c.function.arguments or "") if c.function is not None else "",
            )
            for c in delta.tool_calls or ()
        ]
        if calls:
            self._called.add(index)
        return ParsedDelta(delta.content or "", delta.reasoning or "", calls)

    def finish_reason(self, index: int, engine_reason: str) -> str:
        """OpenAI's rule: a choice that ended calling tools under ``auto`` or
        ``required`` ends ``tool_calls``; a named function's call ends ``stop``."""
        if (
            engine_reason == "stop"
            and index in self._called
            and self.tools is not None
            and self.tools.choice in ("auto", "required")
        ):
            return "tool_calls"
        return engine_reason
