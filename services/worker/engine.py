"""What the worker needs from an inference engine (sim now, vLLM in its own module)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated, Protocol

import msgspec

from inferbus.contracts import (
    ChatMessage,
    ChatTemplateOptions,
    EmbedParams,
    SamplingParams,
    StageTimings,
    TokenLogprob,
    ToolCallDelta,
    ToolUse,
)


class EngineRequest(msgspec.Struct, kw_only=True):
    request_id: str
    model: str = ""
    """The served name the client asked for (for logs; the worker resolves it)."""
    adapter: str = ""
    """The engine's adapter that answers it (``add_adapter``'s name); empty: the base."""
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    token_prompt: list[int] | None = None
    chat_template: ChatTemplateOptions | None = None
    tools: ToolUse | None = None
    embed: EmbedParams | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    weights: str = ""
    """The model's registry version that serves it (``name@version``); empty: the
    engine's own folder. KV saved under other weights is never restored for it."""
    adapter_weights: str = ""
    """The adapter's registry version, or its folder."""
    prompt_token_ids: list[int] = []
    prompt_tokenizer: str = ""
    """The prompt's ids as the sanitizer tokenized it, and its tokenizer's fingerprint:
    an engine whose tokenizer has that fingerprint runs the ids as they are."""
    resume_ids: list[int] = []
    """A continuation: the output's token ids an earlier attempt streamed. The engine
    generates on from the prompt followed by these (``sampling`` already counts them
    off ``max_tokens``); its outputs hold only what it generates."""


class EngineError(Exception):
    """The engine refused the request itself (bad parameters, prompt too long)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class KvRestore(msgspec.Struct, kw_only=True, frozen=True):
    blocks: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    tiers: dict[str, int] = {}
    failed: int = 0
    """Blocks that would not load (recomputed instead)."""
    timed: bool = True
    """False: it ended in the step that restored it, before the restore's report; the
    blocks are those planned and the time unknown (the tier metrics have it)."""


class EngineOutput(msgspec.Struct, kw_only=True):
    """New text of one choice since its previous output; counts are cumulative over
    all the request's choices."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    """Set on the request's last output: every choice has ended."""
    index: int = 0
    """The choice (of the request's ``n``) this output belongs to."""
    logprobs: list[TokenLogprob] = []
    """One per token of ``token_ids``, when the request asked for logprobs."""
    choice_finish_reason: str | None = None
    """Set on a choice's last output (with ``n`` = 1, when ``finish_reason`` is)."""
    stop_reason: str | int | None = None
    """The stop string or token id that ended the choice, when one did."""
    cached_tokens: int = 0
    timings: StageTimings | None = None
    """Set on the last output when the engine knows them."""
    restored: KvRestore | None = None
    """On the last output: what the request's prefix restored from a KV spill tier."""
    tool_calls: list[ToolCallDelta] = []
    """Pieces of tool calls its tokens spell (taken out of ``text``)."""
    embedding: list[float] = []
    """An embedding request's vector (on its one output)."""
    prompt_logprobs: list[TokenLogprob] = []
    """The prompt's tokens' logprobs, when asked for (on the first output that has them)."""
    reasoning: str = ""
    """Reasoning its tokens spell (taken out of ``text``)."""
    prompt_ids_given: bool = False
    """The engine ran the prompt's ids as the request carried them (the sanitizer's,
    by a tokenizer alike) rather than tokenizing the prompt itself."""


class EngineStats(msgspec.Struct, kw_only=True):
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0


class Engine(Protocol):
    """The worker only reads an engine's attributes: an implementation may make them
    plain attributes or read-only properties (vLLM's limits are known once it runs)."""

    @property
    def name(self) -> str: ...

    @property
    def adapters(self) -> list[str]:
        """Adapters it can serve (loaded now or on their next request)."""
        ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output in tokens (known once the engine has started)."""
        ...

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds (0: unknown)."""
        ...

    @property
    def kv_block_size(self) -> int:
        """Tokens per prefix-cache block (0: unknown, or no prefix cache)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream outputs; closing the generator early (``aclose``) aborts the request
        in the engine."""
        ...

    def stats(self) -> EngineStats: ...

    def resumes(self, request: EngineRequest) -> bool:
        """Whether a continuation of ``request`` (``resume_ids``) would generate what
        this engine would have: no state of its own beside the ids (a parser's)."""
        ...

    async def add_adapter(self, name: str, path: str, preload: bool = True) -> None:
        """Serve the LoRA adapter at ``path`` as ``name``, loaded now (``preload``) or on
        its first request."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Free its engine memory; it stays servable (loaded again on demand)."""
        ...

    async def remove_adapter(self, name: str) -> None: ...

    def yield_cpu(self, yielding: bool) -> None:
        """Give way to another engine of this worker that is starting (a cold swap), or
        stop giving way (it failed to start)."""
        ...

    async def reload_weights(self, path: str) -> None:
        """Load new weights of the same shapes in place: requests in flight finish on
        the old ones, later ones run on the new, and the prefix cache is emptied (its
        KV was computed by the old weights)."""
        ...


class EngineOptions(msgspec.Struct, kw_only=True, frozen=True):
    """What the worker's engine serves and how: every field is a worker setting of the
    same name (``--model``, ``--max-num-seqs``...). The sim engine reads the model, its
    served name, ``max_num_seqs`` and ``max_model_len``; vLLM all of them."""

    model: str = "sim-model"
    """sim: any name. vllm: the model's folder (or a name vLLM resolves offline)."""
    served_model_name: str = ""
    """Name clients ask for; defaults to the model folder's name."""
    dtype: str = "auto"
    """vLLM's --dtype (auto, bfloat16, float16, float32)."""
    max_model_len: int = 0
    """0: the model's own limit (sim: 8192)."""
    max_num_seqs: int = 256
    """Sequences the engine runs at once (vLLM's --max-num-seqs); the scheduler fills up to it."""
    stream_interval: Annotated[int, msgspec.Meta(ge=1)] = 1
    """vLLM's ``--stream-interval``: a stream's output every this many tokens (1: each
    token as it is made), so chunks come that many tokens apart: fewer, bigger chunks
    cut the CPU a token of vLLM's own server and of the platform's token path
    (bench/README.md, vs_vllm_server.py ``--stream-interval``, which sets both alike).
    The sim ignores it."""
    enforce_eager: bool = False
    """vLLM's --enforce-eager: no CUDA graphs or compilation (faster start, slower steps)."""
    enable_prefix_caching: bool = True
    """vLLM's automatic prefix caching (what prefix routing routes on)."""
    gpu_memory_utilization: float = 0.9
    """vLLM's share of GPU memory for weights and KV cache."""
    tensor_parallel_size: int = 1
    """GPUs one engine spans (vLLM's --tensor-parallel-size)."""
    distributed_executor_backend: str = ""
    """vLLM's executor: "uni" runs the model in the engine-core process (one device),
    "mp" in worker processes; empty lets vLLM choose."""
    enable_lora: bool = False
    """Serve LoRA adapters (needed for adapters delivered at run time)."""
    max_loras: int = 1
    """Adapters loaded at once (vLLM's --max-loras)."""
    max_lora_rank: int = 16
    """The largest adapter rank taken (vLLM's --max-lora-rank)."""
    lora_modules: dict[str, str] = {}
    """Adapter name → path, each served as a model of that name (as a flag:
    ``name=path,name=path``)."""
    cpu_nice: Annotated[int, msgspec.Meta(ge=0, le=19)] = 19
    """vllm on a CPU: the niceness (0 to 19) of the engine's processes. Every hop of the
    request path and of the token stream is a short burst of work in a service; above
    the engine those run the moment they have work instead of waiting out the engine's
    time slice (on two cores, TTFT p50 128 to 155 ms at 0 against 51 to 61 ms at 19
    under vs_vllm_server's load, bench/README.md), and the engine still gets every cycle
    they leave. 0: level
    with the services. Not applied on GPUs, where the engine's CPU work is what keeps
    the device fed."""
    runner: str = "generate"
    """vLLM's ``--runner``: ``generate`` (text) or ``pooling`` (embeddings: the worker
    then serves ``/v1/embeddings`` requests for its model, and no text)."""
    convert: str = "auto"
    """vLLM's ``--convert``: ``embed`` makes a generative model's checkpoint an embedding
    model (last-token pooling); ``auto`` takes an embedding model as it is."""
    tool_call_parser: str = ""
    """vLLM's tool-call parser for the model's call format (``hermes``, ``llama3_json``,
    ``mistral``...): with one, requests may carry tools (``tool_choice`` ``required``
    or a named function); with ``enable_auto_tool_choice`` too, ``auto``. Without one,
    only ``tool_choice`` ``none`` is served, as on vLLM's server."""
    enable_auto_tool_choice: bool = False
    """Let the model decide whether to call tools (``tool_choice`` ``auto``); needs
    ``tool_call_parser``."""
    chat_template: str = ""
    """vLLM's ``--chat-template``: a Jinja file, or the template itself, used instead of
    the tokenizer's own to render chat requests (the sanitizer, reading the model's own,
    then finds another tokenizer fingerprint, and the worker renders the prompt)."""
    reasoning_parser: str = ""
    """vLLM's reasoning parser (``deepseek_r1``, ``qwen3``...): the model's reasoning
    streams apart from its answer (``reasoning`` on chunks and messages)."""
    structured_outputs_backend: str = "auto"
    """vLLM's structured-output backend (``auto``, ``xgrammar``, ``guidance``,
    ``outlines``, ``lm-format-enforcer``)."""
    structured_outputs_disable_any_whitespace: bool = False
    """JSON constrained outputs without free whitespace between tokens (vLLM reads this
    per engine, not per request): a model that has not learnt JSON cannot then spend its
    tokens on blank space."""
    structured_outputs_disable_additional_properties: bool = False
    """JSON schemas read as if ``additionalProperties: false`` (guidance backend)."""
    kv_events: bool = True
    """Republish vLLM's KV cache events onto ib.kv.<worker_id> (JetStream)."""
    kv_cache_blocks: int = 0
    """vLLM's ``num_gpu_blocks_override``: this many KV blocks instead of what the
    memory allows (0), to bound the prefix cache (benchmarks, eviction tests)."""
    kv_spill: bool = True
    """Save computed KV blocks to host memory and disk and restore prefixes from there
    (``--kv-spill false``: off). Needs the prefix cache."""
    kv_spill_host_mb: int = 1024
    """Host memory for spilled KV blocks, MiB."""
    kv_spill_disk_dir: str = ""
    """Disk tier folder (default: ``<state_dir>/kv-spill/<instance>``; no state dir and
    no folder: no disk tier)."""
    kv_spill_disk_mb: int = 8192
    """Disk tier bound, MiB (0: no disk tier)."""
    kv_spill_shared_dir: str = ""
    """The shared tier: a folder every worker of the model reads and writes (one host's,
    or a network volume), bounded and evicted by the kvspill service. ``inferbus up``
    sets it; empty: none."""

    @property
    def served_name(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name
