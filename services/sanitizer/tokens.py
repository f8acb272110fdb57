"""The served models' tokenizers, so every prompt is tokenized once, where it is first
read: the ids travel on with the accepted request and the scheduler hashes them into
the engine's own prefix block hashes (exact KV routing for every client)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import msgspec

from inferbus.contracts import RequestSubmitted
from inferbus.shared import logs
from inferbus.shared.errors import ConfigError
from inferbus.shared.prompttokens import (
    TemplateError,
    load_tokenizer,
    prompt_token_ids,
    tokenizer_fingerprint,
)

log = logs.get("inferbus.sanitizer")

_INLINE_CHARS = 4096
"""Prompts up to this long are tokenized on the event loop (well under a millisecond);
longer ones in a thread, so other requests' checks and streams go on meanwhile."""


def parse_tokenizers(spec: str) -> dict[str, str]:
    """``model=folder,...`` as a mapping; ConfigError naming a malformed item."""
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        model, sep, folder = item.partition("=")
        if not sep or not model.strip() or not folder.strip():
            raise ConfigError(f"--tokenizers: {item!r} is not model=folder")
        out[model.strip()] = folder.strip()
    return out


class Tokenizers:
    """Per model, the tokenizer its prompts are read with, loaded once in the background
    (a request that comes before its model's is loaded goes on without ids)."""

    def __init__(self, folders: dict[str, str], load: Callable[[str], Any] = load_tokenizer):
        self.folders = folders
        self._load = load
        self._loaded: dict[str, tuple[Any, str]] = {}
        """Per model, its tokenizer and that tokenizer's fingerprint."""
        self.failed: dict[str, str] = {}

    async def load_all(self) -> None:
        for model, folder in self.folders.items():
            try:
                tok = await asyncio.to_thread(self._load, folder)
                self._loaded[model] = tok, await asyncio.to_thread(tokenizer_fingerprint, tok)
            except Exception as exc:  # a missing folder or no transformers: route on text
                self.failed[model] = f"{type(exc).__name__}: {exc}"
                log.error("tokenizer not loaded", model=model, folder=folder, error=str(exc))
            else:
                log.info("tokenizer loaded", model=model, folder=folder)
        if self._loaded:
            # transformers brings torch: some 300k long-lived objects that every full
            # collection would walk (over 100 ms, a pause in every stream this filters)
            gc.freeze()

    def loaded(self) -> list[str]:
        return sorted(self._loaded)

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
        never passed on, or the worker would run ids other than the text checked."""
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
            if not request.prompt_token_ids and not request.prompt_tokenizer:
                return request
            return msgspec.structs.replace(request, prompt_token_ids=[], prompt_tokenizer="")
        return msgspec.structs.replace(
            request,
            prompt_token_ids=ids,
            prompt_tokens=len(ids),
            prompt_tokenizer=fingerprint,
        )
