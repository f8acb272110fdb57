"""What the worker needs from an inference engine (sim now, vLLM in its own module)."""

from __future__ import annotations

from typing import AsyncIterator, Protocol

import msgspec

from inferbus.contracts import ChatMessage, SamplingParams


class EngineRequest(msgspec.Struct, kw_only=True):
    request_id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)


class EngineOutput(msgspec.Struct, kw_only=True):
    """New text since the previous output; counts are cumulative."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None


class EngineStats(msgspec.Struct, kw_only=True):
    running: int = 0
    waiting: int = 0


class Engine(Protocol):
    name: str
    models: list[str]
    max_num_seqs: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream outputs; closing the iterator early aborts the request in the engine."""
        ...

    def stats(self) -> EngineStats: ...
