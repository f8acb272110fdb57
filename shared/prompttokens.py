"""A request's prompt as the served model's tokenizer reads it: one definition for the
worker (which feeds the ids to its engine) and the sanitizer (which reads every prompt
first and hands the ids on, for exact prefix routing), so the two cannot drift; and a
fingerprint of a tokenizer, by which the worker knows the ids it is handed are the ones
its own tokenizer would make (a canary may bring another)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from inferbus.contracts import ChatMessage, ChatTemplateOptions, ToolUse


class TemplateError(ValueError):
    """The model's chat template refused these messages."""


def prompt_token_ids(
    tokenizer: Any,
    prompt: str | None,
    messages: Sequence[ChatMessage] | None,
    template: ChatTemplateOptions | None = None,
    tools: ToolUse | None = None,
    chat_template: str | None = None,
) -> list[int]:
    """The ids of a completion ``prompt``, or of chat ``messages`` through the
    tokenizer's chat template (the assistant's turn opened, unless ``template`` says
    otherwise; ``tools`` offered, even under ``tool_choice`` none), as vLLM's server
    renders them (``chat_template`` replaces the tokenizer's own)."""
    if messages is None:
        return list(tokenizer.encode(prompt or ""))
    t = template or _DEFAULT_TEMPLATE
    if t.add_generation_prompt and t.continue_final_message:
        raise TemplateError("continue_final_message and add_generation_prompt cannot both be true")
    msgs = [m.template_dict() for m in messages]
    extra = dict(t.kwargs)
    if tools is not None and tools.tools:
        extra["tools"] = tools.template_tools()
    if chat_template is not None:
        extra["chat_template"] = chat_template
    try:
        ids = tokenizer.apply_chat_template(
            msgs,
            tokenize=True,
            add_generation_prompt=t.add_generation_prompt,
            continue_final_message=t.continue_final_message,
            **extra,
        )
    except Exception as exc:  # a template that rejects these roles, say
        raise TemplateError(f"chat template failed: {exc}") from None
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = list(ids)
    if t.add_special_tokens:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
    return ids


_DEFAULT_TEMPLATE = ChatTemplateOptions()
_PROBE_TEXT = "Hello, world! 12 +  x\n\tdéjà vu 日本 <b>"
_PROBE_CHAT = (
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Hi there"),
)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What tokenizing depends on, hashed: the vocabulary and its rules (a fast
    tokenizer's whole definition), the chat template, the library versions, and the
    ids of a probe text and chat (which catch how special tokens are added). Equal
    fingerprints tokenize alike; any doubt gives another fingerprint (and the worker
    then tokenizes the prompt itself)."""
    import tokenizers
    import transformers

    h = hashlib.sha256()

    def part(value: object) -> None:
        data = value if isinstance(value, bytes) else str(value).encode()
        h.update(len(data).to_bytes(8, "big") + data)

    backend = getattr(tokenizer, "backend_tokenizer", None)
    part(backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()))
    part(getattr(tokenizer, "chat_template", None) or "")
    part(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    part(prompt_token_ids(tokenizer, _PROBE_TEXT, None))
    try:
        part(prompt_token_ids(tokenizer, None, _PROBE_CHAT))
    except TemplateError:
        part("no chat template")
    return h.hexdigest()[:32]


def load_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer of the model folder ``path`` (what vLLM loads)."""
    from transformers import AutoTokenizer  # seconds to import: only where one is used

    return AutoTokenizer.from_pretrained(path)
