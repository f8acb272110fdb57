"""What the worker needs from an inference engine (sim now, vLLM in its own module)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from inferbus.contracts import ChatMessage, SamplingParams, StageTimings


class EngineRequest(msgspec.Struct, kw_only=True):
    request_id: str
    model: str = ""
    """The served name the client asked for: the base model or a LoRA adapter."""
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)


class EngineError(Exception):
    """The engine refused the request itself (bad parameters, prompt too long)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class EngineOutput(msgspec.Struct, kw_only=True):
    """New text since the previous output; counts are cumulative."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    cached_tokens: int = 0
    timings: StageTimings | None = None
    """Set on the last output when the engine knows them."""


class EngineStats(msgspec.Struct, kw_only=True):
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0


class Engine(Protocol):
    name: str
    models: list[str]
    """Served names: the base model first, then any LoRA adapters."""
    adapters: list[str]
    max_num_seqs: int
    max_model_len: int
    """Longest prompt + output in tokens (known once the engine has started)."""
    kv_capacity_tokens: int
    """Tokens the KV cache holds (0: unknown)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream outputs; closing the iterator early aborts the request in the engine."""
        ...

    def stats(self) -> EngineStats: ...
