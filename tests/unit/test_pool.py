"""The scheduler's pools: decisions that read an index instead of scanning the fleet
choose what a scan would, and the books they keep equal a recount."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferbus.contracts import (
    KvBlocksRemoved,
    KvBlocksStored,
    RequestSubmitted,
    SamplingParams,
    WorkerHeartbeat,
)
from inferbus.services.scheduler import routing
from inferbus.services.scheduler.core import Assign, SchedulerCore, SchedulerPolicy, Worker
from inferbus.services.scheduler.kvindex import KvIndex
from inferbus.services.scheduler.pool import Pool, load_of
from inferbus.services.scheduler.routing import Fits, KvRouter


class ScanKvRouter(KvRouter):
    """The kv strategy as a scan of every worker: the reference the indexed one must
    equal, decision for decision."""

    def choose(
        self, model: str, blocks: list[int], pool: Pool, fits: Fits
    ) -> tuple[Worker, int] | None:
        p = self.policy
        free = [w for w in pool.workers if fits(w)]
        if not free:
            return None
        ceiling = (1 + p.max_load_skew) * pool.mean_load + 1 / pool.min_slots
        allowed = [w for w in free if load_of(w) <= ceiling] or free
        overlap = self.kv.overlaps(blocks, [w.worker_id for w in allowed])
        restore = self.kv.restorable(blocks, overlap)
        n = max(1, len(blocks))

        def cost(w: Worker) -> tuple[float, str]:
            spill = p.spill_weight if w.spill_weight is None else w.spill_weight
            worth = overlap[w.worker_id] + spill * restore[w.worker_id]
            return p.load_weight * load_of(w) - p.overlap_weight * worth / n, w.worker_id

        best = min(allowed, key=cost)
        return best, overlap[best.worker_id] + restore[best.worker_id]


def _prefix(k: int) -> list[int]:
    shared = [7, 8][: k % 3]  # a system prompt of 0 to 2 blocks many workers hold
    return shared + [k * 100 + i for i in range(1 + k % 4)]


_request = st.tuples(st.just("req"), st.integers(0, 5), st.integers(1, 2), st.integers(1, 3000))
_op = st.one_of(
    st.tuples(st.just("hb"), st.integers(0, 9), st.integers(1, 4), st.booleans()),
    _request,
    _request,
    st.tuples(st.just("end"), st.integers(0, 50), st.just(0), st.just(0)),
    st.tuples(st.just("start"), st.integers(0, 50), st.just(0), st.just(0)),
    # c: 0 removed, 1 stored, in the engine's cache; 2 removed, 3 stored, in a spill tier
    st.tuples(st.just("kv"), st.integers(0, 9), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("lose"), st.integers(0, 9), st.just(0), st.just(0)),
    # time passes (tenths of a second): silent streams move, silent workers are lost
    st.tuples(st.just("tick"), st.integers(1, 40), st.just(0), st.just(0)),
)


def _check_books(core: SchedulerCore) -> None:
    for model, pool in core._pools.items():
        ready = [w for w in core.workers.values() if model in w.models and w.state == "ready"]
        assert sorted(w.worker_id for w in pool.workers) == sorted(w.worker_id for w in ready)
        assert all(core.workers[w.worker_id] is w for w in pool.workers)
        fresh = Pool(pool.workers)
        assert (pool.pending, pool.slots, pool.free_seqs, pool.holding_long) == (
            fresh.pending,
            fresh.slots,
            fresh.free_seqs,
            fresh.holding_long,
        ), model
        assert pool.least_pending == fresh.least_pending
        assert abs(pool.mean_load - fresh.mean_load) < 1e-9
        assert pool.rates_measured == fresh.rates_measured
        assert abs(pool.rate_sum - fresh.rate_sum) < 1e-6 * max(1.0, fresh.rate_sum)


@settings(max_examples=200, deadline=None, database=None)
@given(
    fleet=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=10),
    ops=st.lists(_op, min_size=20, max_size=80),
    lanes=st.booleans(),
    few=st.sampled_from([0, 1, 2, routing.FEW_HOLDERS]),
)
def test_the_indexed_kv_router_chooses_what_a_scan_of_every_worker_would(fleet, ops, lanes, few):
    """``few``: how many holders a block may have to be looked at one by one (small
    values take the search by load on these small fleets)."""
    kept, routing.FEW_HOLDERS = routing.FEW_HOLDERS, few
    try:
        _run_both(fleet, ops, lanes)
    finally:
        routing.FEW_HOLDERS = kept


def _run_both(
    fleet: list[tuple[int, bool]], ops: list[tuple[str, int, int, int | bool]], lanes: bool
) -> None:
    policy = SchedulerPolicy(lanes=lanes, short_prompt_tokens=1000, admit_by_slo=False)
    indexed, scan = SchedulerCore(policy), SchedulerCore(policy)
    scan.router = ScanKvRouter(policy, scan.kv)
    seqs: dict[int, int] = {}
    now = 0.0
    joins = [("hb", a, b, c) for a, (b, c) in enumerate(fleet)]
    for i, (kind, a, b, c) in enumerate(joins + ops):
        now += a / 10 if kind == "tick" else 0.01
        out: list[list[object]] = []
        for core in (indexed, scan):
            if kind == "hb":
                seqs[a] = b
                hb = WorkerHeartbeat(
                    worker_id=f"w{a}",
                    models=["m"],
                    engine="sim",
                    max_num_seqs=b,
                    kv_capacity_tokens=4000 if c else 0,
                )
                out.append(list(core.on_heartbeat(hb, now)))
            elif kind == "req":
                request = RequestSubmitted(
                    request_id=f"r{i}",
                    model="m",
                    reply_to=f"r.{i}",
                    prompt="p",
                    prefix_hashes=_prefix(a),
                    prompt_tokens=c,
                    sampling=SamplingParams(n=b, max_tokens=16),
                )
                out.append(list(core.on_accepted(request, now)))
            elif kind in ("end", "start"):
                running = sorted(core.inflight)
                if running:
                    rid = running[a % len(running)]
                    if kind == "end":
                        out.append(list(core.on_ended(rid, now)))
                    else:
                        f = core.inflight[rid]
                        core.on_started(rid, f.attempt, f.worker_id, migratable=a % 2 == 0, now=now)
            elif kind == "tick":
                out.append(list(core.tick(now)))
            elif kind == "kv":
                cls = KvBlocksStored if c % 2 else KvBlocksRemoved
                medium = "CPU" if c >= 2 else None
                core.on_kv_event(cls(worker_id=f"w{a}", block_hashes=_prefix(b), medium=medium))
            else:
                stopped = WorkerHeartbeat(
                    worker_id=f"w{a}", models=["m"], engine="sim", state="stopped"
                )
                out.append(list(core.on_heartbeat(stopped, now)))
        if out:
            mine, theirs = out
            assert [(type(e).__name__, getattr(e, "worker_id", "")) for e in mine] == [
                (type(e).__name__, getattr(e, "worker_id", "")) for e in theirs
            ], (i, kind)
        _check_books(indexed)


def test_a_placement_on_a_big_fleet_looks_at_few_workers():
    """At 2,048 workers a request is placed after looking at the least loaded one
    and at the holders of its first block: ``can_take`` runs a handful of times, not
    once per worker."""
    core = SchedulerCore(SchedulerPolicy())
    for i in range(2048):
        hb = WorkerHeartbeat(worker_id=f"w{i:04d}", models=["m"], engine="sim", max_num_seqs=8)
        core.on_heartbeat(hb, 0.0)
    core.on_kv_event(KvBlocksStored(worker_id="w1000", block_hashes=[7, 8]))
    first = RequestSubmitted(
        request_id="warm", model="m", reply_to="r.warm", prompt="p", prefix_hashes=[1]
    )
    core.on_accepted(first, 0.0)  # builds the pool (once per change of who is in it)
    calls = 0
    take = Worker.can_take

    def counted(self: Worker, tokens: int = 0, seqs: int = 1) -> bool:
        nonlocal calls
        calls += 1
        return take(self, tokens, seqs)

    Worker.can_take = counted  # type: ignore[method-assign]
    try:
        request = RequestSubmitted(
            request_id="r", model="m", reply_to="r.r", prompt="p", prefix_hashes=[7, 8, 9]
        )
        [placed] = core.on_accepted(request, 0.0)
    finally:
        Worker.can_take = take  # type: ignore[method-assign]
    assert isinstance(placed, Assign) and placed.worker_id == "w1000"
    assert calls <= 4


def test_a_block_held_by_one_worker_is_kept_without_a_set():
    """A set per block was most of the index's memory and of the collector's work;
    the holders of each block still come out right as they come and go."""
    kv = KvIndex()
    kv.on_event(KvBlocksStored(worker_id="a", block_hashes=[1, 2]))
    kv.on_event(KvBlocksStored(worker_id="b", block_hashes=[1]))
    exact = kv._exact
    assert exact.by_block == {1: {"a", "b"}, 2: "a"}
    assert kv.overlaps([1, 2], ["a", "b", "c"]) == {"a": 2, "b": 1, "c": 0}
    kv.on_event(KvBlocksRemoved(worker_id="a", block_hashes=[1]))
    assert exact.by_block == {1: "b", 2: "a"}
    assert kv.holders(1) == {"b"} and kv.holder_count(2) == 1
    kv.drop_worker("b")
    assert exact.by_block == {2: "a"}
    assert kv.overlaps([1, 2], ["a"]) == {"a": 0}  # its first block is gone
