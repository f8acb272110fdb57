"""The parts of a generation request and its answer beyond plain text, as vLLM's
OpenAI server takes and gives them: an output constraint, chat-template options,
per-token logprobs and each choice's end. Nested in the request-path events
(contracts/events.py); msgspec and the standard library only."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "STRUCTURED_KINDS",
    "ChatTemplateOptions",
    "ChoiceEnd",
    "StructuredOutput",
    "TokenLogprob",
    "ToolCall",
    "ToolCallFunction",
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
    logprob: float
    token_id: int = -1
    top: list[TopLogprob] = []


class ChoiceEnd(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How one of a request's choices ended (a request asks for ``n`` of them)."""

    index: int
    finish_reason: str
    """``stop`` or ``length``."""
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended it, when one did."""
    completion_tokens: int = 0


class ToolCallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str
    """The arguments as JSON text, as the model wrote them."""


class ToolCall(msgspec.Struct, kw_only=True):
    """A call the assistant made, in a conversation's history (OpenAI's shape)."""

    id: str
    function: ToolCallFunction
    type: str = "function"
