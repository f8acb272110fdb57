"""vLLM's /tokenize and /detokenize, free of I/O: a prompt (or chat messages through the
model's chat template, tools included) as its token ids, and ids back as text, with
the tokenizer the gateway holds for the model (``--tokenizers``, as the sanitizer's)."""

from __future__ import annotations

from typing import Any

import msgspec

from inferbus.contracts import ChatTemplateOptions, ToolUse
from inferbus.shared.prompttokens import TemplateError, prompt_token_ids

from .errors import ApiError
from .protocol import ChatMessageIn, TokenId, decode_body, unsupported
from .torequest import chat_message, function_tools


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """vLLM's tokenize body: a ``prompt``, or ``messages`` as a chat request has them."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_special_tokens: bool | None = None
    """None: vLLM's default (true for a prompt, false for messages: the template adds
    what the model wants)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False
    chat_template: Any = None
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    tokens: list[TokenId]


def read_tokenize(body: bytes) -> TokenizeRequest:
    req: TokenizeRequest = decode_body(body, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(
            400, "give a prompt or messages (one of them)", param="prompt", code="invalid_value"
        )
    for name in ("chat_template", "mm_processor_kwargs", "media_io_kwargs"):
        if getattr(req, name) is not None:
            raise unsupported(name, name)
    return req


def tokenize(tok: Any, req: TokenizeRequest, max_model_len: int) -> dict[str, Any]:
    if req.prompt is not None:
        special = req.add_special_tokens is not False
        ids = list(tok.encode(req.prompt, add_special_tokens=special))
    else:
        template = ChatTemplateOptions(
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            kwargs=dict(req.chat_template_kwargs or {}),
            add_special_tokens=bool(req.add_special_tokens),
        )
        tools = ToolUse(tools=function_tools(req.tools)) if req.tools else None
        messages = [chat_message(m) for m in req.messages or ()]
        try:
            ids = prompt_token_ids(tok, None, messages, template, tools)
        except TemplateError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_value") from None
    out: dict[str, Any] = {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}
    out["token_strs"] = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return out


def detokenize(tok: Any, body: bytes) -> dict[str, Any]:
    req: DetokenizeRequest = decode_body(body, DetokenizeRequest)
    if any(t >= len(tok) for t in req.tokens):
        raise ApiError(
            400,
            f"a token id is outside the vocabulary ({len(tok)} tokens)",
            param="tokens",
            code="invalid_value",
        )
    return {"prompt": tok.decode(req.tokens)}


class _Model(msgspec.Struct):
    model: str


def model_of(body: bytes) -> str:
    """The body's model, before the rest is read (its tokenizer reads the rest)."""
    return str(decode_body(body, _Model).model)
