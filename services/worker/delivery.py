"""The worker's side of model delivery: fetch, verify, swap, report.

Deliveries are taken one at a time. A version is fetched to the worker's cache and
its signature verified against the operator's keys before any byte reaches the
engine; on any failure the worker keeps serving what it had and says why
(``ModelSwapped`` with ``ok=false``). The decisions (which mode, what is served
afterwards, residency) are swap.py's; this module does the I/O.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.aio.msg import Msg

from inferbus.contracts import (
    KvAllCleared,
    KvEvent,
    ModelDelivery,
    ModelResidency,
    ModelSwapped,
    ModelVersion,
    swapped_subject,
)
from inferbus.shared import logs, metrics, modelstore
from inferbus.shared.codec import encode
from inferbus.shared.runtime import Context
from inferbus.shared.signing import SignatureError, preload, verify_folder

from .engine import Engine, EngineError
from .swap import (
    CURRENT,
    Held,
    Holding,
    Plan,
    Skip,
    apply_residency,
    check_residency,
    plan,
    residency_at,
    with_path,
    worth_prefetching,
)

log = logs.get("inferbus.worker.delivery")

CURRENT_RETRY_S = (1.0, 2.0, 4.0)
"""Waits between reads of the registry's current version at start, when one timed out."""
ADAPTERS_RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Waits between reads of the registry's current adapters when one failed at start."""


def trusted_keys(spec: str) -> list[Path]:
    """``--trusted-keys``: public key files, or folders of them (``*.pub``, ``*.pem``),
    comma-separated."""
    keys: list[Path] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        path = Path(part)
        if path.is_dir():
            keys += sorted(p for p in path.iterdir() if p.suffix in (".pub", ".pem"))
        elif path.is_file():
            keys.append(path)
        else:
            raise FileNotFoundError(f"trusted key {part!r}: no such file or folder")
    return keys


class Verified(msgspec.Struct, kw_only=True, frozen=True):
    folder: str
    fetch_s: float
    verify_s: float


class SwapTarget(Protocol):
    """What delivery needs of the worker whose models it changes."""

    worker_id: str
    engine: Engine
    holding: Holding
    """What it serves now; delivery sets it when a swap is done."""
    origin: Holding
    """What it was started with: a rollback to version "" returns to it."""
    loading: str
    """What it is loading, for its heartbeats ("" when nothing)."""

    def held_back(self) -> AbstractAsyncContextManager[None]:
        """New requests wait while those in flight finish; the body runs idle."""
        ...

    async def replace_engine(self, after: Holding) -> None:
        """A cold swap: a new engine for ``after.model``."""
        ...

    async def send_heartbeat(self) -> None: ...

    async def publish_kv_events(self, events: list[KvEvent]) -> None:
        """Its KV events, numbered on and kept in its own picture of its cache."""
        ...

    def cannot_serve(self, quantization: str) -> str:
        """Why its engine cannot serve weights quantized so ("" when it can)."""
        ...

    def fail(self, reason: str) -> None:
        """Stop serving, saying why."""
        ...


class Deliveries:
    def __init__(
        self, worker: SwapTarget, ctx: Context[Any], cache_dir: Path, keys: list[Path]
    ) -> None:
        self.worker = worker
        self.ctx = ctx
        self.cache_dir = cache_dir
        self.keys = keys
        self.policies: dict[str, ModelResidency] = {}
        self.pinned: set[str] = set()
        """Adapters loaded in the engine now (by ref)."""
        self._lock = asyncio.Lock()
        self._residency_task: asyncio.Task[None] | None = None
        self._prefetches: set[asyncio.Task[None]] = set()
        self._fetching: dict[str, asyncio.Lock] = {}

    @property
    def js(self) -> Any:
        return self.ctx.js

    # -- start -----------------------------------------------------------------------------

    async def current_version(self, name: str) -> tuple[ModelVersion, Verified] | None:
        """The registry's current version of ``name``, fetched and verified, for a worker
        starting up; None when there is none (or it cannot be had: the worker then starts
        on its own ``--model``, and says why). A read that times out is tried again a
        few times first: a worker restarted on a loaded bus would otherwise serve
        another version than the rest until the next delivery."""
        for delay in (*CURRENT_RETRY_S, None):
            try:
                return await self._current_version(name)
            except (TimeoutError, nats.errors.Error) as exc:
                if delay is None:
                    await self._not_current(name, exc)
                    return None
                log.warning("registry read failed; reading again", model=name, error=str(exc))
                await asyncio.sleep(delay)
            except Exception as exc:
                await self._not_current(name, exc)
                return None
        return None

    async def _current_version(self, name: str) -> tuple[ModelVersion, Verified] | None:
        current = await modelstore.get_current(self.js, name)
        if current is None or not current.version:  # none, or rolled back to --model
            return None
        mv = await modelstore.get_version(self.js, name, current.version)
        if mv is None:
            raise modelstore.RegistryError(f"{name}@{current.version} is not in the registry")
        return mv, await self._fetch_verified(mv)

    async def _not_current(self, name: str, exc: BaseException) -> None:
        log.error(
            "the registry's current version cannot be loaded; starting on --model",
            model=name,
            error=str(exc),
        )
        await self._report(
            "startup", f"{name}", CURRENT, ok=False, code=_code(exc), reason=str(exc)
        )

    async def load_current_adapters(self) -> None:
        """A worker starting up serves the adapters whose current version is on its
        model, as those running already do (each verified; a refused one is reported
        and skipped). A registry it cannot read now (a timeout on a loaded bus) is read
        again in the background, so a restarted worker does not go on without them."""
        try:
            found = await self._current_adapters()
        except Exception as exc:
            log.warning("current adapters unknown; reading the registry again", error=str(exc))
            self._background(self._adapters_retry(), "adapters-retry")
            return
        for mv in found:
            await self._deliver_current(mv)

    async def _current_adapters(self) -> list[ModelVersion]:
        """The adapters on this worker's model whose current version the registry
        names (none without a registry); raises when it cannot be read."""
        try:
            keys = await modelstore.keys(self.js, "current.")
        except modelstore.RegistryError:
            return []
        base = self.worker.holding.model.name
        found = []
        for key in keys:
            current = await modelstore.get_current(self.js, key.removeprefix("current."))
            if current is None or not current.version:
                continue
            mv = await modelstore.get_version(self.js, current.name, current.version)
            if mv is None or mv.kind != "adapter" or mv.base_model != base:
                continue
            found.append(mv)
        return found

    async def _deliver_current(self, mv: ModelVersion) -> None:
        at_start = ModelDelivery(
            delivery_id="startup", model=mv, role=CURRENT, reason="current at start"
        )
        await self.deliver(at_start, time.perf_counter())

    async def _adapters_retry(self) -> None:
        for delay in ADAPTERS_RETRY_S:
            await asyncio.sleep(delay)
            try:
                found = await self._current_adapters()
            except Exception as exc:
                log.warning("current adapters unknown", error=str(exc), waited_s=delay)
                continue
            async with self._lock:
                for mv in found:
                    await self._deliver_current(mv)
            return
        log.error("current adapters unknown: serving without them until the next delivery")

    def _background(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._prefetches.add(task)
        task.add_done_callback(self._prefetches.discard)

    async def _adapters_again(self) -> None:
        async with self._lock:
            await self.load_current_adapters()

    async def start(self) -> None:
        await asyncio.to_thread(preload)
        self._residency_task = asyncio.create_task(self._residency_clock(), name="residency")

    async def stop(self) -> None:
        if self._residency_task:
            self._residency_task.cancel()
        for task in list(self._prefetches):
            task.cancel()

    # -- deliveries ------------------------------------------------------------------------

    async def _on_delivery(self, delivery: ModelDelivery, msg: Msg) -> None:
        await msg.ack()
        arrived = time.perf_counter()
        async with self._lock:
            await self.deliver(delivery, arrived)

    async def deliver(self, delivery: ModelDelivery, arrived: float) -> ModelSwapped | None:
        w = self.worker
        decision = plan(
            w.holding,
            delivery,
            w.worker_id,
            w.origin,
            cannot_serve=w.cannot_serve,
        )
        ref = delivery.model.ref
        if isinstance(decision, Skip):
            log.info("delivery not for this worker", model=ref, reason=decision.reason)
            if delivery.workers and worth_prefetching(w.holding, delivery.model):
                self._prefetch(delivery.model)
            if not decision.answer:
                return None
            return await self._report(
                delivery.delivery_id,
                ref,
                delivery.role,
                ok=False,
                code="incompatible",
                reason=decision.reason,
            )
        w.loading = f"{ref} {decision.mode}"
        await w.send_heartbeat()
        fetch_s = verify_s = 0.0
        try:
            if decision.load.path:
                folder = decision.load.path
            else:
                verified = await self._fetch_verified(delivery.model)
                folder, fetch_s, verify_s = verified.folder, verified.fetch_s, verified.verify_s
            p = with_path(decision, folder)
            swap_started = time.perf_counter()
            await self._swap(p)
            swap_s = time.perf_counter() - swap_started
        except Exception as exc:
            w.loading = ""
            await w.send_heartbeat()
            code = _code(exc)
            log.error(
                "delivery refused; still serving what it had",
                model=ref,
                code=code,
                error=str(exc),
                serving=w.holding.model.ref,
            )
            metrics.MODEL_SWAPS.labels(decision.mode, code).inc()
            return await self._report(
                delivery.delivery_id,
                ref,
                delivery.role,
                ok=False,
                mode=decision.mode,
                code=code,
                reason=str(exc),
                fetch_s=fetch_s,
                verify_s=verify_s,
            )
        w.loading = ""
        await w.send_heartbeat()
        if decision.mode == "cold" and decision.unload:
            # the adapters went with the old engine: the current ones come back
            self._background(self._adapters_again(), "adapters-again")
        total = time.perf_counter() - arrived
        metrics.MODEL_SWAPS.labels(decision.mode, "ok").inc()
        metrics.MODEL_SWAP_SECONDS.labels(decision.mode).observe(total)
        log.info(
            "swapped",
            model=ref,
            role=delivery.role,
            mode=decision.mode,
            total_s=round(total, 4),
            fetch_s=round(fetch_s, 4),
            verify_s=round(verify_s, 4),
            swap_s=round(swap_s, 4),
        )
        return await self._report(
            delivery.delivery_id,
            ref,
            delivery.role,
            ok=True,
            mode=decision.mode,
            fetch_s=fetch_s,
            verify_s=verify_s,
            swap_s=swap_s,
            total_s=total,
        )

    def _prefetch(self, mv: ModelVersion) -> None:
        """A canary elsewhere: fetch and verify it now, so that a promotion here reads no
        network (warm residency). Failures are only logged: the delivery that asks this
        worker to load it will report them."""

        async def run() -> None:
            try:
                await self._fetch_verified(mv)
                log.info("prefetched", model=mv.ref)
            except Exception as exc:
                log.warning("prefetch failed", model=mv.ref, error=str(exc))

        self._background(run(), f"prefetch-{mv.ref}")

    async def _fetch_verified(self, mv: ModelVersion) -> Verified:
        for attempt in (1, 2):
            # one fetch of a version at a time (a prefetch and a delivery may meet)
            async with self._fetching.setdefault(mv.ref, asyncio.Lock()):
                fetched = await modelstore.fetch(self.js, mv, self.cache_dir)
            try:
                # hashing every file is CPU work: off the event loop (heartbeats go on)
                key, verify_s = await asyncio.to_thread(
                    verify_folder, fetched.folder, fetched.signature, self.keys
                )
                break
            except SignatureError:
                # a bad copy is not kept; one from the cache may predate the version's
                # re-signing (another key): it is fetched again, once
                modelstore.evict(self.cache_dir, mv)
                if attempt == 2 or not fetched.cached:
                    metrics.MODEL_SIGNATURE_FAILURES.inc()
                    raise
        log.info(
            "signature verified", model=mv.ref, key=Path(key).name, verify_s=round(verify_s, 4)
        )
        return Verified(folder=str(fetched.folder), fetch_s=fetched.took_s, verify_s=verify_s)

    async def _swap(self, p: Plan) -> None:
        """Carry out the plan. The worker's holding changes at the moment the engine
        does, so each request's end names the version that really served it."""
        w = self.worker
        engine = w.engine
        if p.mode == "hot":
            residency = self._residency(p.load.name)
            await engine.add_adapter(p.load.ref, p.load.path, preload=residency == "hot")
            if residency == "hot":
                self.pinned.add(p.load.ref)
        elif p.mode == "warm":
            async with w.held_back():  # what runs finishes on the old weights
                try:
                    await engine.reload_weights(p.load.path)
                except Exception:
                    await self._restore_weights(engine, w.holding.model)
                    raise
                w.holding = p.after
            await self._kv_cleared()
        elif p.mode == "cold":
            await w.replace_engine(p.after)
            self.pinned.clear()
            await self._kv_cleared()
        for held in p.unload:
            if p.mode != "cold":
                await engine.remove_adapter(held.ref)
            self.pinned.discard(held.ref)
        w.holding = p.after

    async def _restore_weights(self, engine: Engine, old: Held) -> None:
        """A reload that failed part way leaves the engine's weights mixed: load the
        old ones back, or stop serving (a worker that cannot say what it serves must
        not serve)."""
        if not old.path:
            return
        try:
            await engine.reload_weights(old.path)
        except Exception as exc:
            log.error(
                "the old weights could not be restored; the worker stops serving", error=str(exc)
            )
            self.worker.fail(f"weights reload failed and could not be undone: {exc}")

    async def _kv_cleared(self) -> None:
        """Every prefix the scheduler saw on this worker was computed by the old weights."""
        await self.worker.publish_kv_events([KvAllCleared(worker_id=self.worker.worker_id)])

    async def _report(self, delivery_id: str, ref: str, role: str, **fields: Any) -> ModelSwapped:
        ctx = self.ctx
        ev = ModelSwapped(
            delivery_id=delivery_id,
            worker_id=self.worker.worker_id,
            model=ref,
            role=role,
            at=time.time(),
            **fields,
        )
        try:
            await ctx.js.publish(swapped_subject(self.worker.worker_id), encode(ev))
        except Exception as exc:
            log.error("could not report a swap", model=ref, error=str(exc))
        return ev

    # -- residency -------------------------------------------------------------------------

    def _residency(self, name: str) -> str:
        policy = self.policies.get(name)
        return residency_at(policy, time.time()) if policy else "hot"

    async def _on_residency(self, policy: ModelResidency, msg: Msg) -> None:
        ctx = self.ctx
        try:
            check_residency(policy)
        except ValueError as exc:
            await ctx.dead_letters.send(msg, f"residency policy refused: {exc}")
            await msg.ack()
            return
        await msg.ack()
        self.policies[policy.name] = policy
        async with self._lock:
            await self.apply_residency()

    async def _residency_clock(self) -> None:
        while True:  # schedules change with the time of day
            await asyncio.sleep(30.0)
            if any(p.schedule for p in self.policies.values()):
                async with self._lock:
                    await self.apply_residency()

    async def apply_residency(self) -> None:
        w = self.worker
        after, effects = apply_residency(
            w.holding, self.policies, time.time(), frozenset(self.pinned)
        )
        for a in effects.pin:
            await w.engine.add_adapter(a.ref, a.path, preload=True)
            self.pinned.add(a.ref)
        for a in (*effects.unpin, *effects.drop):
            await w.engine.unload_adapter(a.ref)
            self.pinned.discard(a.ref)
        for a in effects.drop:
            await w.engine.remove_adapter(a.ref)
            modelstore.evict(self.cache_dir, _as_version(a))
        if effects.pin or effects.unpin or effects.drop:
            log.info(
                "residency applied",
                pinned=sorted(self.pinned),
                dropped=[a.ref for a in effects.drop],
            )
        w.holding = after


def _as_version(h: Held) -> ModelVersion:
    return ModelVersion(name=h.name, version=h.version)


def _code(exc: BaseException) -> str:
    if isinstance(exc, SignatureError):
        return "signature"
    if isinstance(exc, modelstore.RegistryError | OSError | nats.errors.Error):
        return "fetch"
    if isinstance(exc, EngineError):
        return "incompatible"
    return "engine"
