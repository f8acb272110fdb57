"""The parts of a generation request and its answer beyond plain text, as vLLM's
OpenAI server takes and gives them: an output constraint, chat-template options,
per-token logprobs and each choice's end. Nested in the request-path events
(contracts/events.py); msgspec and the standard library only."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "STRUCTURED_KINDS",
    "TOOL_CHOICES",
    "ChatTemplateOptions",
    "ChoiceEnd",
    "EmbedParams",
    "FunctionTool",
    "StructuredOutput",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFunction",
    "ToolUse",
    "TopLogprob",
]

STRUCTURED_KINDS = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
)
"""The constraint kinds of ``StructuredOutput``: a request sets exactly one."""


class StructuredOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the output must match, decoded under that constraint (vLLM's
    ``StructuredOutputsParams``; ``json_schema`` is its ``json``). OpenAI's
    ``response_format`` becomes one of these, as does vLLM's ``structured_outputs``."""

    json_schema: dict[str, Any] | None = None
    """A JSON Schema the output is a document of."""
    json_object: bool = False
    """Any JSON object."""
    regex: str | None = None
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """An EBNF (or Lark) grammar, as the engine's structured-output backend reads it."""
    structural_tag: str | None = None
    """vLLM's structural tag, as JSON text."""
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def kinds(self) -> list[str]:
        """The constraint kinds set (a valid one has exactly one)."""
        return [
            k
            for k in STRUCTURED_KINDS
            if (getattr(self, k) is not False and getattr(self, k) is not None)
        ]


class ChatTemplateOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How chat messages become the prompt (vLLM's chat-request fields of these names)."""

    add_generation_prompt: bool = True
    """Open the assistant's turn after the messages."""
    continue_final_message: bool = False
    """Leave the last message (an assistant's) open, for the model to go on with it;
    exclusive with ``add_generation_prompt``."""
    kwargs: dict[str, Any] = {}
    """More variables for the template (``chat_template_kwargs``: ``enable_thinking``...)."""
    add_special_tokens: bool = False
    """Add the tokenizer's special tokens (BOS) on top of the template's."""


class TopLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    token: str
    logprob: float
    token_id: int = -1


class TokenLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One output token with its log probability and the most likely alternatives at
    its position (``top``, most likely first; the token itself may be among them)."""

    token: str
    logprob: float | None
    """None for a prompt's first token only (nothing comes before it)."""
    token_id: int = -1
    top: list[TopLogprob] = []


class ChoiceEnd(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How one of a request's choices ended (a request asks for ``n`` of them)."""

    index: int
    finish_reason: str
    """``stop``, ``length``, or ``tool_calls`` (the choice ended calling tools: under
    ``tool_choice`` ``auto`` when calls were found, or ``required``)."""
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended it, when one did."""
    completion_tokens: int = 0
    embedding: list[float] = []
    """An embedding request's vector (its one choice)."""
    prompt_logprobs: list[TokenLogprob] = []
    """Each prompt token with its log probability, when the request asked for them
    (the first token's is None: nothing comes before it); the same for every choice."""


class ToolCallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str
    """The arguments as JSON text, as the model wrote them."""


class ToolCall(msgspec.Struct, kw_only=True):
    """A call the assistant made, in a conversation's history (OpenAI's shape)."""

    id: str
    function: ToolCallFunction
    type: str = "function"


TOOL_CHOICES = ("auto", "none", "required", "function")
"""``ToolUse.choice``: the model may call tools, may not, must call at least one, or
must call ``ToolUse.function``."""


class FunctionTool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A function the model may call (OpenAI's ``tools[].function``)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema of the arguments (an object)."""
    strict: bool | None = None


class ToolUse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The tools a chat request offers the model and how it may call them. The chat
    template renders ``tools`` into the prompt; ``required`` and ``function`` are
    decoded under a constraint of the tools' schemas; the worker's tool-call parser
    (the model's own format) takes the calls out of the text."""

    tools: list[FunctionTool]
    choice: str = "auto"
    """One of ``TOOL_CHOICES``."""
    function: str | None = None
    """The function ``choice`` ``function`` names (one of ``tools``)."""
    parallel: bool = True
    """More than one call in a turn (OpenAI's ``parallel_tool_calls``)."""

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as chat templates read them (OpenAI's shape, as vLLM passes them)."""
        return [{"type": "function", "function": msgspec.to_builtins(t)} for t in self.tools]

    def problem(self) -> tuple[str, str] | None:
        """(param, why) when the choice does not fit the tools; None when it does."""
        if self.choice not in TOOL_CHOICES:
            return "tool_choice", f"tool_choice must be one of {', '.join(TOOL_CHOICES)}"
        names = [t.name for t in self.tools]
        if self.choice == "function" and self.function not in names:
            return "tool_choice", f"tool_choice names {self.function!r}, which is not in tools"
        if self.choice != "function" and self.function is not None:
            return "tool_choice", "a function is named only with tool_choice function"
        return None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A piece of one tool call in a choice's stream: the first piece of a call has its
    ``id`` and ``name``; ``arguments`` pieces join into the call's JSON arguments."""

    index: int
    """The call, counted from 0 within its choice."""
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class EmbedParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An embedding request (vLLM's ``PoolingParams`` for the ``embed`` task): the
    prompt's vector instead of generated text, from a worker whose engine runs a pooling
    model (``--runner pooling``)."""

    dimensions: int | None = None
    """Keep the vector's first this many dimensions (models trained for it only)."""
    normalize: bool | None = None
    """Normalize the vector (vLLM's ``use_activation``); None: the model's default."""
