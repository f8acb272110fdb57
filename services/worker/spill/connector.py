"""The worker's vLLM KV connector: saves every block the engine computes to the spill
tiers, and restores a new request's prefix from them instead of computing it.

vLLM makes two instances: a scheduler-side one (in the engine core, beside vLLM's
scheduler) that decides what to load and save (``plan.SpillPlanner``), and a
worker-side one (beside the model) that moves the bytes between the paged KV cache
and ``store.TieredStore``. The worker side reports what the tiers gained and lost
after each step; the scheduler side turns that into what is restorable, and into KV
events (medium ``CPU`` for host memory, ``STORAGE`` for disk) that the worker relays
to the platform's scheduler. A block that fails to load (absent, damaged, the disk
failing) is reported to vLLM, which computes it instead (``kv_load_failure_policy``
``recompute``): a fault costs time, never a request.

Loads are synchronous, before the step's forward pass: up to four blocks at a time,
each read and checked in place and copied once into its pages. Saves copy each block
the step filled once into a host buffer after the forward pass; disk and shared
writes happen in the store's background thread.

Loaded by vLLM from ``kv_connector_module_path``; settings come in
``kv_connector_extra_config`` (``extra_config``); each request names its weights in
``kv_transfer_params`` (``{"kv_namespace": ...}``).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from inferbus.shared.kvblocks import block_path, stored_on_disk

from .names import NAMESPACE_PARAM, RESTORE_PARAM
from .plan import Restore, SpillPlanner, StepPlan, Transfer, hash_of, namespace_of
from .store import DISK, HOST, SHARED, StoreConfig, TieredStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

MEDIUM = {HOST: "CPU", DISK: "STORAGE"}
"""KV event media of the worker's own tiers (the shared tier is any worker's)."""


@dataclass(frozen=True)
class _Layer:
    """One layer's paged KV cache and how a block sits in it."""

    tensor: torch.Tensor
    dim: int
    """The block dimension."""
    shape: tuple[int, ...]
    """One block's shape."""
    width: int
    """One block's bytes."""


@dataclass
class SpillMeta(KVConnectorMetadata):
    plan: StepPlan = field(default_factory=StepPlan)


@dataclass
class SpillWorkerMeta(KVConnectorWorkerMetadata):
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    restores: dict[str, Restore] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, SpillWorkerMeta)
        merged = SpillWorkerMeta(self.events + other.events, dict(self.restores))
        for rid, r in other.restores.items():
            merged.restores.setdefault(rid, Restore()).merge(r)
        return merged


@dataclass
class SpillStats(KVConnectorStats):
    """Counter deltas since the last report, plus each tier's usage now (gauges)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            if name.endswith(("_used", "_capacity", "_failing")):
                self.data[name] = value
            else:
                self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not self.data


def _per_rank(folder: str, tp: int, rank: int) -> str:
    return str(Path(folder) / f"rank-{rank}") if folder and tp > 1 else folder


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError):  # no parallel state: one rank
        return 0


class InferbusSpillConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        cache = vllm_config.cache_config
        self._block_size = int(cache.block_size)
        self._num_blocks = int(kv_cache_config.num_blocks)
        # blocks of other dtypes or block sizes never match this engine's (the
        # weights come with each request)
        self._base_namespace = "|".join(
            map(str, (cache.cache_dtype, vllm_config.model_config.dtype, self._block_size))
        )
        self._namespaces: dict[str, str] = {}
        # with tensor parallelism each rank holds its own heads of every block: a
        # folder per rank (the scheduler side looks at rank 0's, whose blocks every
        # rank saves in the same step)
        rank = _tp_rank() if role == KVConnectorRole.WORKER else 0
        tp = vllm_config.parallel_config.tensor_parallel_size
        shared_dir = _per_rank(str(extra.get("shared_dir", "")), tp, rank)
        disk_dir = _per_rank(str(extra.get("disk_dir", "")), tp, rank)
        shared_root = Path(shared_dir) if shared_dir else None
        self._planner = SpillPlanner(
            self._block_size,
            shared=None
            if shared_root is None
            else lambda key: block_path(shared_root, key).exists(),
        )
        self._requests: dict[str, Request] = {}
        self._events: list[KVCacheEvent] = []
        self._store: TieredStore | None = None
        self._layers: list[_Layer] = []
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kv-spill-io")
        self._block_bytes = 0
        self._load_errors: set[int] = set()
        self._load_failures = 0
        self._restores: dict[str, Restore] = {}
        self._last: dict[str, float] = {}
        if role == KVConnectorRole.SCHEDULER and disk_dir and Path(disk_dir).is_dir():
            # what an earlier run left on disk is restorable from the first request
            # (the worker side indexes the same files and keeps the newest that fit)
            on_disk = stored_on_disk(Path(disk_dir))
            capacity, kept = int(extra.get("disk_bytes", 0)), []
            for key, size in reversed(on_disk):
                capacity -= size
                if capacity < 0:
                    break
                kept.append((key, DISK, True))
            self._planner.reported(kept, {})
        if role == KVConnectorRole.WORKER:
            self._store = TieredStore(
                StoreConfig(
                    host_bytes=int(extra.get("host_bytes", 1 << 30)),
                    disk_dir=disk_dir,
                    shared_dir=shared_dir,
                    disk_bytes=int(extra.get("disk_bytes", 0)),
                )
            )

    # -- scheduler side -----------------------------------------------------------------

    def _namespace(self, request: Request) -> str:
        params = request.kv_transfer_params or {}
        # the worker names the weights on every request; a request that does not is
        # keyed by the folder the engine started from
        weights = str(params.get(NAMESPACE_PARAM) or self._vllm_config.model_config.model)
        ns = self._namespaces.get(weights)
        if ns is None:
            ns = self._namespaces[weights] = namespace_of(self._base_namespace, weights)
        return ns

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._requests[request.request_id] = request
        n = self._planner.match(
            request.request_id,
            self._namespace(request),
            request.block_hashes,
            request.num_tokens,
            num_computed_tokens,
        )
        return n, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._planner.allocated(
            request.request_id,
            request.block_hashes,
            blocks.get_block_ids()[0],
            num_external_tokens,
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        scheduled = []
        counts = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            req = self._requests.get(new.req_id)
            if req is not None:
                computed = new.num_computed_tokens + counts.get(new.req_id, 0)
                scheduled.append((new.req_id, req.block_hashes, new.block_ids[0], computed))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            req = self._requests.get(rid)
            if req is not None and self._kv_cache_manager is not None:
                block_ids = self._kv_cache_manager.get_block_ids(rid)[0]
                computed = cached.num_computed_tokens[i] + counts.get(rid, 0)
                scheduled.append((rid, req.block_hashes, block_ids, computed))
        return SpillMeta(plan=self._planner.step(scheduled))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if not isinstance(meta, SpillWorkerMeta):
            return
        changes = self._planner.reported(meta.events, meta.restores)
        self._events += self._kv_events(changes)

    def _kv_events(self, changes: list[tuple[str, str, bool]]) -> list[KVCacheEvent]:
        """One event per run of changes of the same kind (a step saves many blocks)."""
        out: list[KVCacheEvent] = []
        for (tier, stored), run in itertools.groupby(changes, key=lambda c: (c[1], c[2])):
            hashes: list[bytes | int] = [hash_of(key) for key, _, _ in run]
            if stored:
                out.append(
                    BlockStored(
                        block_hashes=hashes,
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=self._block_size,
                        lora_id=None,
                        medium=MEDIUM[tier],
                        lora_name=None,
                    )
                )
            else:
                out.append(BlockRemoved(block_hashes=hashes, medium=MEDIUM[tier]))
        return out

    def take_events(self) -> Iterable[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._requests.pop(request.request_id, None)
        restore = self._planner.finished(request.request_id)
        if restore is None:
            return False, None
        return False, {RESTORE_PARAM: restore.as_dict()}

    def reset_cache(self) -> bool | None:
        self._events += self._kv_events(self._planner.forget_all())
        return True

    # -- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = []
        for tensor in kv_caches.values():
            # the block dimension is the one as long as the cache has blocks (first on
            # CPU; second on GPU backends that keep K and V apart in the first)
            dims = [d for d, n in enumerate(tensor.shape) if n == self._num_blocks]
            if not dims:
                raise ValueError(
                    f"KV spill: no dimension of {self._num_blocks} blocks in a KV cache "
                    f"of shape {tuple(tensor.shape)}"
                )
            block = tensor.select(dims[0], 0)
            width = block.numel() * tensor.element_size()
            self._layers.append(_Layer(tensor, dims[0], tuple(block.shape), width))
        self._block_bytes = sum(layer.width for layer in self._layers)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpillMeta) and self._store is not None
        if not meta.plan.loads:
            return
        # blocks read and copied in side by side: file reads, checksums and copies
        # release the GIL, and a disk serves several reads at once faster than one
        start = time.perf_counter()
        done = list(self._pool.map(self._load_one, meta.plan.loads))
        # each request's share of the wall time (the loads overlapped)
        share = (time.perf_counter() - start) / len(done)
        for load, tier, size in done:
            restore = self._restores.setdefault(load.request_id, Restore())
            restore.seconds += share
            if tier is None:
                self._load_errors.add(load.block_id)
                self._load_failures += 1
                restore.failed += 1
                continue
            restore.blocks += 1
            restore.bytes += size
            restore.tiers[tier] = restore.tiers.get(tier, 0) + 1

    def _load_one(self, load: Transfer) -> tuple[Transfer, str | None, int]:
        assert self._store is not None
        got = self._store.get(load.key, self._block_bytes)
        if got is None:
            return load, None, 0
        payload, tier = got
        with warnings.catch_warnings():  # read-only bytes: only ever read here
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(payload, dtype=torch.uint8)
        offset = 0
        for layer in self._layers:
            part = src[offset : offset + layer.width].view(layer.tensor.dtype)
            layer.tensor.select(layer.dim, load.block_id).copy_(part.view(layer.shape))
            offset += layer.width
        return load, tier, len(payload)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # saved whole after the forward pass (wait_for_save)

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpillMeta) and self._store is not None
        saves = meta.plan.saves
        if not saves:
            return
        for save, payload in zip(saves, self._pool.map(self._copy_out, saves), strict=True):
            self._store.put(save.key, payload)

    def _copy_out(self, save: Transfer) -> memoryview:
        """A block's bytes (every layer's, in layer order) in one host buffer."""
        buf = torch.empty(self._block_bytes, dtype=torch.uint8)
        offset = 0
        for layer in self._layers:
            part = buf[offset : offset + layer.width].view(layer.tensor.dtype)
            part.view(layer.shape).copy_(layer.tensor.select(layer.dim, save.block_id))
            offset += layer.width
        return memoryview(buf.numpy().data)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._store is None:
            return None
        events = [(e.key, e.tier, e.stored) for e in self._store.drain_events()]
        restores, self._restores = self._restores, {}
        if not events and not restores:
            return None
        return SpillWorkerMeta(events=events, restores=restores)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._store is None:
            return None
        now: dict[str, float] = {}
        for tier, s in self._store.stats.items():
            for name in ("saves", "save_bytes", "restores", "restore_bytes", "restore_s", "misses"):
                now[f"{tier}_{name}"] = getattr(s, name)
        for tier in (DISK, SHARED):
            t = self._store.stats[tier]
            now |= {
                f"{tier}_errors": t.errors,
                f"{tier}_corrupt": t.corrupt,
                f"{tier}_dropped": t.dropped,
            }
        now["load_failures"] = self._load_failures
        data = {k: v - self._last.get(k, 0) for k, v in now.items() if v != self._last.get(k, 0)}
        self._last = now
        for tier, (used, capacity) in self._store.usage().items():
            data[f"{tier}_used"] = used
            data[f"{tier}_capacity"] = capacity
        data["disk_failing"] = int(self._store.disk_failing(DISK))
        data["shared_failing"] = int(self._store.disk_failing(SHARED))
        return SpillStats(data=data)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        if self._store is not None:
            self._store.close()
