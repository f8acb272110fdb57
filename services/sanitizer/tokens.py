"""The served models' tokenizers, so every prompt is tokenized once, where it is first
read: the ids travel on with the accepted request and the scheduler hashes them into
the engine's own prefix block hashes (exact KV routing for every client)."""

from __future__ import annotations

import asyncio

import msgspec

from inferbus.contracts import RequestSubmitted
from inferbus.shared.prompttokens import TemplateError, prompt_token_ids
from inferbus.shared.tokenizers import TokenizerSet, parse_tokenizers

__all__ = ["Tokenizers", "parse_tokenizers"]

_INLINE_CHARS = 4096
"""Prompts up to this long are tokenized on the event loop (well under a millisecond);
longer ones in a thread, so other requests' checks and streams go on meanwhile."""


class Tokenizers(TokenizerSet):
    """The sanitizer's: a token prompt read as text, and every prompt's ids."""

    def text_of(self, request: RequestSubmitted) -> str | None:
        """A token prompt's text, read with its model's tokenizer (None: no prompt of
        token ids, or no tokenizer to read it, or ids it does not have)."""
        tok, _ = self._loaded.get(request.model, (None, ""))
        if request.token_prompt is None or tok is None:
            return None
        if max(request.token_prompt, default=0) >= len(tok):
            return None
        return str(tok.decode(request.token_prompt))

    async def tokenized(self, request: RequestSubmitted) -> RequestSubmitted:
        """``request`` with ``prompt_token_ids`` (and ``prompt_tokens``, and the
        tokenizer's fingerprint) from its model's tokenizer; with none, or a template
        that refuses it (the worker says why), with no ids: what a client put there is
        never passed on, or the worker would run ids other than the text checked. Nor
        is a client's ``prompt_tokens``: lanes, fair share and admission count by it,
        and a tenant claiming -1e9 took twice its share (the scheduler estimates from
        the text instead)."""
        tok, fingerprint = self._loaded.get(request.model, (None, ""))
        ids: list[int] = []
        if request.token_prompt is not None:  # the ids themselves: exact routing
            ids = list(request.token_prompt) if tok is not None else []
        elif tok is not None:
            chars = len(request.prompt or "") + sum(len(m.content) for m in request.messages or ())
            try:
                if chars <= _INLINE_CHARS:
                    ids = prompt_token_ids(
                        tok, request.prompt, request.messages, request.chat_template, request.tools
                    )
                else:
                    ids = await asyncio.to_thread(
                        prompt_token_ids,
                        tok,
                        request.prompt,
                        request.messages,
                        request.chat_template,
                        request.tools,
                    )
            except TemplateError:
                ids = []
        if not ids:
            if not (request.prompt_token_ids or request.prompt_tokenizer or request.prompt_tokens):
                return request
            return msgspec.structs.replace(
                request, prompt_token_ids=[], prompt_tokenizer="", prompt_tokens=0
            )
        return msgspec.structs.replace(
            request,
            prompt_token_ids=ids,
            prompt_tokens=len(ids),
            prompt_tokenizer=fingerprint,
        )
