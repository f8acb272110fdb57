"""A request's prompt as the served model's tokenizer reads it: one definition for the
worker (which feeds the ids to its engine) and the sanitizer (which reads every prompt
first and hands the ids on, for exact prefix routing), so the two cannot drift."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferbus.contracts import ChatMessage


class TemplateError(ValueError):
    """The model's chat template refused these messages."""


def prompt_token_ids(
    tokenizer: Any, prompt: str | None, messages: Sequence[ChatMessage] | None
) -> list[int]:
    """The ids of a completion ``prompt``, or of chat ``messages`` through the
    tokenizer's chat template with the assistant's turn opened."""
    if messages is not None:
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        try:
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # a template that rejects these roles, say
            raise TemplateError(f"chat template failed: {exc}") from None
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(prompt or ""))


def load_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer of the model folder ``path`` (what vLLM loads)."""
    from transformers import AutoTokenizer  # seconds to import: only where one is used

    return AutoTokenizer.from_pretrained(path)
