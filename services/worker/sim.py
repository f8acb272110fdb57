"""``sim``: a timing model of a continuous-batching LLM engine, for scale and policy tests.

Each engine step admits waiting sequences (prefill costs ``prefill_s_per_token`` per
prompt token), then decodes one token for every running sequence (a step costs
``decode_s_per_step + decode_s_per_seq * batch``). Output is deterministic in the
prompt and seed. It is never a stand-in where the real engine can run.

A prompt (or last message) that starts with ``/echo `` is answered with the rest of
it, three characters a token, then ends ("stop"): a way to put known text (PII, stop
strings) into an output stream in tests.

It runs ``n`` choices (the prompt's prefill paid once) and makes up logprobs (the
token's, and alternatives from its vocabulary), so the token path carries what the
real engine's would; it refuses what would change the text's meaning (an output
constraint), which only a real engine can honour.
"""

from __future__ import annotations

import asyncio
import json
import re
import zlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from inferbus.contracts import FailureCode, TokenLogprob, ToolCallDelta, TopLogprob

from .engine import EngineError, EngineOutput, EngineRequest, EngineStats

_WORD = re.compile(r"\w+|[^\w\s]")
VOCAB = (
    "the a of to and in is it that for on with as was at by an be this from or are not "
    "model token stream worker queue request engine cache prefix batch decode prefill "
    "latency budget signal event subject fleet route lane tenant swap block spill"
).split()


class SimTiming(msgspec.Struct, kw_only=True, frozen=True):
    prefill_s_per_token: float = 0.0
    """Seconds the sim spends per prompt token before the first token."""
    decode_s_per_step: float = 0.0
    """Seconds per decode step, whatever the batch."""
    decode_s_per_seq: float = 0.0
    """Seconds more per decode step for each sequence in the batch."""

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return self.prefill_s_per_token * prompt_tokens

    def decode_step_seconds(self, batch: int) -> float:
        return self.decode_s_per_step + self.decode_s_per_seq * batch


ECHO = "/echo "


def prompt_text(request: EngineRequest) -> str:
    if request.token_prompt is not None:
        return " ".join(map(str, request.token_prompt))
    if request.messages is not None:
        return "".join(f"<|{m.role}|>{m.content}\n" for m in request.messages) + "<|assistant|>"
    return request.prompt or ""


def count_tokens(text: str) -> int:
    return max(1, len(_WORD.findall(text)))


def token_id(prompt_hash: int, index: int) -> int:
    return zlib.crc32(index.to_bytes(4, "little"), prompt_hash) % len(VOCAB)


def logprob_of(tid: int, index: int, top: int, token: str) -> TokenLogprob:
    """A made-up but deterministic logprob for the token ``token`` (id ``tid``), with
    ``top`` alternatives (the token first: it was the most likely)."""
    lp = -0.25 * (1 + (tid + index) % 7)
    return TokenLogprob(
        token=token,
        logprob=lp,
        token_id=tid,
        top=[
            TopLogprob(
                token=token if j == 0 else VOCAB[(tid + j) % len(VOCAB)] + " ",
                logprob=lp - j,
                token_id=(tid + j) % len(VOCAB),
            )
            for j in range(top)
        ],
    )


def instance_of(schema: Any) -> Any:
    """A small value valid against a JSON schema (the common keywords): what the sim
    writes as a tool call's arguments."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return instance_of(schema[key][0])
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance_of(props[k]) for k in schema.get("required", list(props)) if k in props}
    if kind == "array":
        return [instance_of(schema.get("items"))] * int(schema.get("minItems", 0))
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "sim"[: schema.get("maxLength", 3)].ljust(schema.get("minLength", 0), "x")


class _Sequence:
    __slots__ = (
        "aborted",
        "call",
        "echo",
        "emitted",
        "generated",
        "holdback",
        "index",
        "limit",
        "outputs",
        "prefill_tokens",
        "prompt_hash",
        "prompt_tokens",
        "request",
        "text",
    )

    def __init__(
        self,
        request: EngineRequest,
        weights: str = "",
        index: int = 0,
        outputs: asyncio.Queue[EngineOutput] | None = None,
    ) -> None:
        text = prompt_text(request)
        self.request = request
        self.index = index
        self.prompt_tokens = count_tokens(text)
        self.prefill_tokens = 0 if index else self.prompt_tokens
        """What admitting it costs: a request's choices share their prompt's prefill."""
        seed = request.sampling.seed or 0
        # the weights (and adapter) change the output, as they would a real model's
        salt = f"{weights}\x00{request.adapter}\x00" if weights or request.adapter else ""
        choice = f"{index}\x00" if index else ""
        self.prompt_hash = zlib.crc32(f"{seed}\x00{salt}{choice}{text}".encode())
        self.outputs: asyncio.Queue[EngineOutput] = outputs or asyncio.Queue()
        self.generated = 0
        self.limit = request.sampling.max_tokens
        self.text = ""
        self.emitted = 0
        # hold back what could still become a stop string, as vLLM does
        self.holdback = max((len(s) for s in request.sampling.stop), default=1) - 1
        self.aborted = False
        last = request.messages[-1].content if request.messages else request.prompt or ""
        self.echo = last[len(ECHO) :] if last.startswith(ECHO) else None
        self.call: tuple[str, str] | None = None
        """(id, function name) of the call it writes (tool_choice required or named):
        its arguments, a value of the function's schema, stream as the text would."""
        tools = request.tools
        if tools is not None and tools.choice in ("required", "function"):
            fn = next((t for t in tools.tools if t.name == tools.function), tools.tools[0])
            self.call = (f"call_{self.prompt_hash:08x}", fn.name)
            self.echo = json.dumps(instance_of(fn.parameters or {}))

    def skip(self, tokens: int) -> None:
        """Go on from ``tokens`` already generated (a continuation): their prefill is
        paid, their text not sent again."""
        self.limit += tokens  # the first attempt's, as its text depends on it
        for _ in range(tokens):
            self.step()
        self.prompt_tokens += tokens
        self.prefill_tokens += tokens

    def step(self) -> EngineOutput:
        tid = token_id(self.prompt_hash, self.generated)
        self.generated += 1
        before = len(self.text)
        finish = None
        if self.echo is not None:
            token = self.echo[before : before + 3]
            if before + 3 >= len(self.echo):
                finish = "stop"
        else:
            token = VOCAB[tid] + " "
        self.text += token
        cuts = [
            c
            for stop in self.request.sampling.stop
            if stop
            for c in (self.text.find(stop, max(0, before - len(stop) + 1)),)
            if c >= 0
        ]
        if cuts:  # the earliest match wins, whichever stop string it is
            self.text = self.text[: min(cuts)]
            finish = "stop"
        if finish is None and self.generated >= self.limit:
            finish = "length"
        end = len(self.text) if finish else max(self.emitted, len(self.text) - self.holdback)
        piece = self.text[self.emitted : end]
        self.emitted = end
        top = self.request.sampling.logprobs
        calls: list[ToolCallDelta] = []
        if self.call is not None:
            first = before == 0
            call_id, name = self.call
            calls = [
                ToolCallDelta(
                    index=0,
                    id=call_id if first else None,
                    name=name if first else None,
                    arguments=piece,
                )
            ]
            piece = ""
            if finish == "stop" and self.request.tools and self.request.tools.choice == "required":
                finish = "tool_calls"
        return EngineOutput(
            text=piece,
            token_ids=[tid],
            index=self.index,
            logprobs=[] if top is None else [logprob_of(tid, self.index, top, token)],
            tool_calls=calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.generated,
            choice_finish_reason=finish,
        )


def merge(outputs: list[EngineOutput]) -> list[EngineOutput]:
    """Coalesce outputs a slow reader let pile up into one delta per run of a choice."""
    merged: list[EngineOutput] = []
    for o in outputs:
        last = merged[-1] if merged else None
        if last is None or last.index != o.index or last.choice_finish_reason is not None:
            merged.append(o)
            continue
        merged[-1] = EngineOutput(
            text=last.text + o.text,
            token_ids=last.token_ids + o.token_ids,
            index=o.index,
            logprobs=last.logprobs + o.logprobs,
            tool_calls=last.tool_calls + o.tool_calls,
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            choice_finish_reason=o.choice_finish_reason,
        )
    return merged


class SimEngine:
    name = "sim"

    def __init__(
        self,
        model: str,
        timing: SimTiming,
        max_num_seqs: int = 256,
        max_model_len: int = 8192,
        kv_capacity_tokens: int = 0,
    ) -> None:
        self.weights = ""
        """What the sim's output depends on besides the prompt: "" at start, then the
        folder of each reload."""
        self._adapters: dict[str, str] = {}
        self.timing = timing
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens
        self.kv_block_size = 0  # no prefix cache
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._idle = asyncio.Event()
        """Set while no sequence runs: a weights reload waits for it."""
        self._idle.set()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._paused = False

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        self._idle.set()  # nothing runs any more: a reload waiting on it goes on

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=len(self._waiting))

    def resumes(self, request: EngineRequest) -> bool:
        return True  # its output is a function of the prompt and the position

    @property
    def adapters(self) -> list[str]:
        return list(self._adapters)

    async def add_adapter(self, name: str, path: str, preload: bool = True) -> None:
        self._adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        pass  # nothing is held in the sim's memory

    async def remove_adapter(self, name: str) -> None:
        self._adapters.pop(name, None)

    def yield_cpu(self, yielding: bool) -> None:
        pass  # the sim does no heavy work

    async def reload_weights(self, path: str) -> None:
        # as vLLM's pause(mode="wait"): nothing new is scheduled, what runs finishes on
        # the old weights, then the rest runs on the new
        self._paused = True
        try:
            await self._idle.wait()
            self.weights = path
        finally:
            self._paused = False
            self._wake.set()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("sim engine is not running")
        if request.adapter and request.adapter not in self._adapters:
            raise EngineError(
                FailureCode.MODEL_NOT_FOUND, f"this worker has no adapter {request.adapter!r}"
            )
        if request.sampling.structured is not None:
            raise EngineError(
                FailureCode.UNSUPPORTED_BY_ENGINE,
                "the sim engine cannot constrain its output (structured outputs): "
                "serve this model with the vllm engine",
            )
        if request.embed is not None:
            raise EngineError(
                FailureCode.UNSUPPORTED_BY_ENGINE,
                "the sim engine makes no embeddings: serve an embedding model with the "
                "vllm engine and --runner pooling",
            )
        outputs: asyncio.Queue[EngineOutput] = asyncio.Queue()
        seqs = [_Sequence(request, self.weights, i, outputs) for i in range(request.sampling.n)]
        first = seqs[0]
        if request.resume_ids:
            first.skip(len(request.resume_ids))
        if first.prompt_tokens + request.sampling.max_tokens > self.max_model_len:
            raise EngineError(
                FailureCode.CONTEXT_LENGTH_EXCEEDED,
                f"the prompt ({first.prompt_tokens} tokens) plus max_tokens "
                f"({request.sampling.max_tokens}) exceeds the model's "
                f"{self.max_model_len}-token context",
            )
        self._waiting.extend(seqs)
        self._wake.set()
        running = len(seqs)
        completion = 0
        try:
            while running:
                batch = [await outputs.get()]
                while not outputs.empty():
                    batch.append(outputs.get_nowait())
                for out in merge(batch):
                    completion += len(out.token_ids)
                    out.completion_tokens = completion
                    if out.choice_finish_reason is not None:
                        running -= 1
                        if not running:  # the request's end: every choice has ended
                            out.finish_reason = out.choice_finish_reason
                    yield out
        finally:
            for seq in seqs:
                seq.aborted = True  # frees the slots if the reader left early

    async def _run(self) -> None:
        sleep = asyncio.sleep
        while True:
            if not self._running and (not self._waiting or self._paused):
                self._wake.clear()
                await self._wake.wait()
            admitted: list[_Sequence] = []
            while (
                self._waiting
                and not self._paused
                and len(self._running) + len(admitted) < self.max_num_seqs
            ):
                seq = self._waiting.popleft()
                if not seq.aborted:
                    admitted.append(seq)
            if admitted:
                self._idle.clear()
                await sleep(self.timing.prefill_seconds(sum(s.prefill_tokens for s in admitted)))
                self._running.extend(admitted)
            await sleep(self.timing.decode_step_seconds(len(self._running)))
            still = []
            for seq in self._running:
                if seq.aborted:
                    continue
                out = seq.step()
                seq.outputs.put_nowait(out)
                if out.choice_finish_reason is None:
                    still.append(seq)
            self._running = still
            if not still:
                self._idle.set()
