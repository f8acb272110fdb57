"""The served models' tokenizers a service holds (``--tokenizers model=folder,...``),
loaded once in the background: the sanitizer reads and tokenizes every prompt with
them, the gateway answers /tokenize and /detokenize."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

from inferbus.shared import logs
from inferbus.shared.errors import ConfigError
from inferbus.shared.prompttokens import load_tokenizer, tokenizer_fingerprint

log = logs.get("inferbus.tokenizers")


def parse_tokenizers(spec: str) -> dict[str, str]:
    """``model=folder,...`` as a mapping; ConfigError naming a malformed item."""
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        model, sep, folder = item.partition("=")
        if not sep or not model.strip() or not folder.strip():
            raise ConfigError(f"--tokenizers: {item!r} is not model=folder")
        out[model.strip()] = folder.strip()
    return out


class TokenizerSet:
    """Per model, its tokenizer and that tokenizer's fingerprint (a model asked for
    before its tokenizer is loaded has none yet)."""

    def __init__(self, folders: dict[str, str], load: Callable[[str], Any] = load_tokenizer):
        self.folders = folders
        self._load = load
        self._loaded: dict[str, tuple[Any, str]] = {}
        self.failed: dict[str, str] = {}

    async def load_all(self) -> None:
        for model, folder in self.folders.items():
            try:
                tok = await asyncio.to_thread(self._load, folder)
                self._loaded[model] = tok, await asyncio.to_thread(tokenizer_fingerprint, tok)
            except Exception as exc:  # a missing folder or no transformers: go on without
                self.failed[model] = f"{type(exc).__name__}: {exc}"
                log.error("tokenizer not loaded", model=model, folder=folder, error=str(exc))
            else:
                log.info("tokenizer loaded", model=model, folder=folder)
        if self._loaded:
            # transformers brings torch: some 300k long-lived objects that every full
            # collection would walk (over 100 ms, a pause in every stream this serves)
            gc.freeze()

    def loaded(self) -> list[str]:
        return sorted(self._loaded)

    def get(self, model: str) -> tuple[Any, str] | None:
        """The model's tokenizer and its fingerprint, once loaded."""
        return self._loaded.get(model)
