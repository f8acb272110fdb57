"""The OpenAI response objects of one request, whole or as SSE events, free of I/O:
choices by index, logprobs in the chat or the completions form, usage."""

from __future__ import annotations

import base64
import struct
from typing import Any, Protocol

import msgspec

from inferbus.contracts import RequestFinished, TokenChunk, TokenLogprob, ToolCallDelta, Usage

from .errors import ApiError


class Presenter(Protocol):
    """What the gateway's reply path asks of an API's shapes: the whole answer, or the
    stream's bytes (an opening, each chunk's, the end's or a failure's)."""

    id: str
    model: str

    def complete(self, answer: Answer, fin: RequestFinished) -> dict[str, Any]: ...

    def opening(self) -> bytes: ...

    def chunk_event(self, chunk: TokenChunk) -> bytes: ...

    def end_events(self, fin: RequestFinished) -> bytes: ...

    def failed_events(self, error: ApiError) -> bytes: ...

    def record(self) -> Any:
        """What to store of the answer once it ended (None: nothing)."""
        ...


def usage_dict(fin: RequestFinished) -> dict[str, Any]:
    u = fin.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


def batch_finished(ends: list[RequestFinished], n: int) -> RequestFinished:
    """The end of a batch of prompts (``ends`` in prompt order) as one request's: prompt
    i's choice j as choice i × n + j, usage summed."""
    first = ends[0]
    return msgspec.structs.replace(
        first,
        usage=Usage(
            prompt_tokens=sum(e.usage.prompt_tokens for e in ends),
            completion_tokens=sum(e.usage.completion_tokens for e in ends),
            cached_prompt_tokens=sum(e.usage.cached_prompt_tokens for e in ends),
        ),
        chunks=sum(e.chunks for e in ends),
        choices=[
            msgspec.structs.replace(c, index=i * n + c.index)
            for i, e in enumerate(ends)
            for c in e.choice_ends()
        ],
    )


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(lps: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat form: each token with its bytes and its alternatives."""
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": _bytes(lp.token),
                "top_logprobs": [
                    {"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token)}
                    for t in lp.top
                ],
            }
            for lp in lps
        ]
    }


def completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """OpenAI's legacy completions form; ``offset``: the first token's place in the
    choice's text. Each position's alternatives include the token itself, as vLLM's; a
    prompt's first token (echo) has no logprob and no alternatives (null)."""
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in lps],
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [
            None
            if lp.logprob is None
            else {**{t.token: t.logprob for t in lp.top}, lp.token: lp.logprob}
            for lp in lps
        ],
        "text_offset": offsets,
    }


def vllm_prompt_logprobs(lps: list[TokenLogprob]) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, null for the first, else its id's
    and each alternative's logprob and text."""
    out: list[dict[str, Any] | None] = []
    for lp in lps:
        if lp.logprob is None:
            out.append(None)
            continue
        entry = {str(t.token_id): {"logprob": t.logprob, "decoded_token": t.token} for t in lp.top}
        entry[str(lp.token_id)] = {"logprob": lp.logprob, "decoded_token": lp.token}
        out.append(entry)
    return out


def tool_call_deltas(calls: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """OpenAI's streamed tool-call pieces: a call's first carries its id and name."""
    out = []
    for c in calls:
        function: dict[str, Any] = {"arguments": c.arguments}
        d: dict[str, Any] = {"index": c.index}
        if c.id is not None:
            d["id"], d["type"] = c.id, "function"
        if c.name is not None:
            function["name"] = c.name
        d["function"] = function
        out.append(d)
    return out


class _Call:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class Answer:
    """A whole response's choices as their chunks arrive (for a non-streamed reply)."""

    __slots__ = ("calls", "logprobs", "reasoning", "texts")

    def __init__(self) -> None:
        self.texts: dict[int, list[str]] = {}
        self.logprobs: dict[int, list[TokenLogprob]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.calls: dict[int, dict[int, _Call]] = {}
        """Each choice's tool calls, by the call's index, as their pieces join."""

    def add(self, chunk: TokenChunk) -> None:
        self.texts.setdefault(chunk.index, []).append(chunk.text)
        if chunk.logprobs:
            self.logprobs.setdefault(chunk.index, []).extend(chunk.logprobs)
        if chunk.reasoning:
            self.reasoning.setdefault(chunk.index, []).append(chunk.reasoning)
        for piece in chunk.tool_calls:
            call = self.calls.setdefault(chunk.index, {}).setdefault(piece.index, _Call())
            call.id = call.id or piece.id or ""
            call.name = call.name or piece.name or ""
            call.arguments.append(piece.arguments)

    def clear(self) -> None:
        self.texts.clear()
        self.logprobs.clear()
        self.reasoning.clear()
        self.calls.clear()

    def text(self, index: int) -> str:
        return "".join(self.texts.get(index, ()))

    def tool_calls(self, index: int) -> list[dict[str, Any]]:
        """A choice's calls in OpenAI's message form."""
        calls = self.calls.get(index, {})
        return [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": "".join(c.arguments)},
            }
            for _, c in sorted(calls.items())
        ]


class Shapes:
    """Builds the chat or text-completion objects of one response. ``logprobs``: the
    request asked for them (each choice then carries its own, else null)."""

    def __init__(
        self,
        *,
        chat: bool,
        request_id: str,
        model: str,
        created: int,
        logprobs: bool = False,
        echo: dict[int, str] | None = None,
        reasoning: bool = True,
        include_usage: bool = False,
        prompt_logprobs: bool = False,
        score_only: bool = False,
    ) -> None:
        self.chat = chat
        self.reasoning = reasoning
        """Show the reasoning (``include_reasoning``)."""
        self.include_usage = include_usage
        """A stream ends with a usage chunk (``stream_options.include_usage``)."""
        self.prompt_logprobs = prompt_logprobs
        """vLLM's ``prompt_logprobs`` asked for: shown (each choice's, or the chat's)."""
        self.score_only = score_only
        """``echo`` with ``max_tokens`` 0: the prompt and its logprobs, nothing generated."""
        self._echo = dict(echo or {})
        """Text each choice starts with (``echo``), by index, until it went out."""
        self._echoed = dict(self._echo)
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.created = created
        self.logprobs = logprobs
        self._role_sent: set[int] = set()
        self._offsets: dict[int, int] = {}
        """Each choice's text so far, in characters (completions' ``text_offset``)."""
        self._event_parts: tuple[bytes, bytes] | None = None

    def _logprobs(self, index: int, lps: list[TokenLogprob], text: str) -> Any:
        if not self.logprobs:
            return None
        if self.chat:
            return chat_logprobs(lps)
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(text)
        return completion_logprobs(lps, offset)

    def _stream_choice(
        self,
        index: int,
        text: str | None,
        lps: list[TokenLogprob],
        chunk: TokenChunk | None = None,
    ) -> dict[str, Any]:
        if index in self._echo:
            text = self._echo.pop(index) + (text or "")
        logprobs = self._logprobs(index, lps, text or "")
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": None}
        delta: dict[str, Any] = {}
        if index not in self._role_sent:
            delta["role"] = "assistant"
            self._role_sent.add(index)
        if chunk is not None and chunk.reasoning and self.reasoning:
            delta["reasoning"] = chunk.reasoning
        if text is not None and (text or chunk is None or not chunk.tool_calls):
            delta["content"] = text
        if chunk is not None and chunk.tool_calls:
            delta["tool_calls"] = tool_call_deltas(chunk.tool_calls)
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}

    def _envelope(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        obj = "chat.completion" if self.chat else "text_completion"
        if stream and self.chat:
            obj += ".chunk"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, chunk: TokenChunk) -> dict[str, Any]:
        choice = self._stream_choice(chunk.index, chunk.text, chunk.logprobs, chunk)
        return self._envelope([choice], True)

    def chunk_event(self, chunk: TokenChunk) -> bytes:
        """``chunk`` as a ready SSE event. The common one (choice 0, no logprobs, the
        role sent) is built from cached bytes: only the text is encoded."""
        if (
            chunk.index
            or self.logprobs
            or (self.chat and 0 not in self._role_sent)
            or 0 in self._echo
            or chunk.tool_calls
            or chunk.reasoning
        ):
            return sse(self.chunk(chunk))
        if self._event_parts is None:
            head = msgspec.json.encode(self._envelope([], True))[: -len(b'"choices":[]}')]
            field = b'"delta":{"content":' if self.chat else b'"text":'
            tail = b"}" if self.chat else b""
            self._event_parts = (
                b"data: " + head + b'"choices":[{"index":0,' + field,
                tail + b',"logprobs":null,"finish_reason":null}]}\n\n',
            )
        prefix, suffix = self._event_parts
        return prefix + msgspec.json.encode(chunk.text) + suffix

    def final_chunks(self, fin: RequestFinished) -> list[dict[str, Any]]:
        """One closing chunk a choice, with its finish reason."""
        out = []
        for end in fin.choice_ends():
            choice = self._stream_choice(end.index, None if self.chat else "", [])
            if self.chat and "content" in choice["delta"] and not choice["delta"]["content"]:
                del choice["delta"]["content"]
            choice["logprobs"] = None  # every token's went with its text
            choice["finish_reason"] = end.finish_reason
            choice["stop_reason"] = end.stop_reason
            env = self._envelope([choice], True)
            if self.prompt_logprobs:  # known at the end: they go with each choice's end
                prompt = vllm_prompt_logprobs(end.prompt_logprobs)
                if self.chat:
                    env["prompt_logprobs"] = prompt
                else:
                    choice["prompt_logprobs"] = prompt
            out.append(env)
        return out

    def opening(self) -> bytes:
        return b""

    def end_events(self, fin: RequestFinished) -> bytes:
        events = [sse(final) for final in self.final_chunks(fin)]
        if self.include_usage:
            events.append(sse(self.usage_chunk(fin)))
        return b"".join(events) + b"data: [DONE]\n\n"

    def failed_events(self, error: ApiError) -> bytes:
        return sse(error.body()) + b"data: [DONE]\n\n"

    def record(self) -> None:
        return None

    def usage_chunk(self, fin: RequestFinished) -> dict[str, Any]:
        env = self._envelope([], True)
        env["usage"] = usage_dict(fin)
        return env

    def complete(self, answer: Answer, fin: RequestFinished) -> dict[str, Any]:
        choices = []
        for end in fin.choice_ends():
            i = end.index
            echo = self._echoed.get(i, "")
            text = echo if self.score_only else echo + answer.text(i)
            lps = [] if self.score_only else answer.logprobs.get(i, [])
            if echo and not self.chat:  # the echoed prompt's logprobs come first
                lps = [*end.prompt_logprobs, *lps]
            logprobs = None
            if self.logprobs:
                logprobs = chat_logprobs(lps) if self.chat else completion_logprobs(lps, 0)
            choice: dict[str, Any] = {"index": i}
            if self.chat:
                calls = answer.tool_calls(i)
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": text if text or not calls else None,
                }
                if calls:
                    message["tool_calls"] = calls
                if i in answer.reasoning and self.reasoning:
                    message["reasoning"] = "".join(answer.reasoning[i])
                choice["message"] = message
            else:
                choice["text"] = text
            choice.update(
                logprobs=logprobs, finish_reason=end.finish_reason, stop_reason=end.stop_reason
            )
            if self.prompt_logprobs and not self.chat:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(end.prompt_logprobs)
            choices.append(choice)
        env = self._envelope(choices, False)
        if self.prompt_logprobs and self.chat:  # vLLM's chat has them once, at the top
            env["prompt_logprobs"] = vllm_prompt_logprobs(fin.choice_ends()[0].prompt_logprobs)
        env["usage"] = usage_dict(fin)
        return env


class EmbeddingShapes:
    """An embeddings answer: each input's vector by index (a batch's prompt order), as
    floats or as base64 of little-endian float32 (OpenAI's two encodings). Never
    streamed."""

    def __init__(self, *, request_id: str, model: str, created: int, base64: bool) -> None:
        self.id = f"embd-{request_id}"
        self.model = model
        self.created = created
        self.base64 = base64

    def _vector(self, values: list[float]) -> list[float] | str:
        if not self.base64:
            return values
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()

    def complete(self, answer: Answer, fin: RequestFinished) -> dict[str, Any]:
        data = [
            {"object": "embedding", "index": end.index, "embedding": self._vector(end.embedding)}
            for end in fin.choice_ends()
        ]
        used = fin.usage.prompt_tokens
        return {
            "id": self.id,
            "object": "list",
            "created": self.created,
            "model": self.model,
            "data": data,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }

    def opening(self) -> bytes:
        return b""

    def chunk_event(self, chunk: TokenChunk) -> bytes:
        return b""

    def end_events(self, fin: RequestFinished) -> bytes:
        return msgspec.json.encode(self.complete(Answer(), fin))

    def failed_events(self, error: ApiError) -> bytes:
        return msgspec.json.encode(error.body())

    def record(self) -> None:
        return None


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
