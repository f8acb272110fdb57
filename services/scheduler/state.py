"""The scheduler's policy and the records its core keeps: workers, queued and
in-flight requests. Data, so the routing strategies and lanes can name them without
importing the core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from inferbus.contracts import RequestSubmitted, Resume, Terminal
from inferbus.shared.prefixhash import DEFAULT_SEED

from .goodput import WorkerRates
from .migration import Progress


class SchedulerPolicy(msgspec.Struct, kw_only=True, frozen=True):
    worker_timeout_s: float = 3.0
    """A worker silent this long is lost (at least three heartbeat intervals)."""
    queue_timeout_s: float = 30.0
    """A request no worker could take for this long fails with ``no_worker``."""
    cold_start_wait_s: float = 180.0
    """For a model the autoscaler is starting a worker for (none ready yet), requests
    wait up to this long instead (and never past their deadline)."""
    max_attempts: int = 3
    """Times a request is assigned before a lost worker fails it ``worker_lost``
    (continuations after a migration count)."""
    migrate: bool = True
    """A request streaming on a worker that is lost continues on another (prompt plus
    the tokens sent, ``max_tokens`` less them; see ``migration.py`` for what cannot
    move). Off: it ends ``worker_lost`` and the client submits it again."""
    stream_silence_s: float = 1.5
    """A worker streaming migratable requests that has sent neither a chunk's copy nor
    a heartbeat for this long is taken as lost (sooner than ``worker_timeout_s``): a
    dead worker's streams stop at once, a live one's copies come every few tokens, and
    each second waited is a second its clients see no token. 0: off."""
    engine_stall_s: float = 30.0
    """A worker whose heartbeats say its engine produced nothing for this long while
    requests stream on it is lost (its streams move), alive as the process may be. 0:
    off."""
    migration_wait_s: float = 10.0
    """A continuation no worker takes within this long ends ``worker_lost``: its
    client has waited without tokens since the worker went."""
    remember_ended: int = 100_000
    """Ended request ids kept, so a resend of one is refused ``duplicate_request``."""
    max_queue_per_model: int = 1000
    """Past this many queued requests for a model, new ones end ``queue_full`` (HTTP 429);
    the gateways see the depth in SchedulerLoad and push back before that."""
    routing: Literal["kv", "round_robin", "dynamo"] = "kv"
    """kv: weigh each worker's cached share of the request's prefix against its load,
    within ``max_load_skew``. dynamo: NVIDIA Dynamo's KV router cost (blocks still to
    prefill, times ``overlap_weight``, plus the worker's active blocks), for
    comparison. round_robin: ignore caches."""
    overlap_weight: float = 1.0
    """Worth of the request's share of cached prefix blocks, against ``load_weight``
    times the worker's share of busy slots."""
    spill_weight: float = 0.5
    """Worth of a prefix block a worker would restore from its KV spill tiers, against
    one in its engine's cache (1), until the worker has measured it: then 1 minus its
    restore cost over its prefill cost per token (``restore_worth``)."""
    load_weight: float = 1.0
    """Worth of a worker's share of busy slots against its cached prefix (``overlap_weight``)."""
    max_load_skew: float = 0.2
    """Never route above (1 + this) times the mean load plus one request, whatever the
    cache says: hit rate may not buy imbalance."""
    kv_block_chars: int = 256
    """Characters of text a prefix block covers when the prompt has no token ids."""
    block_tokens: int = 64
    """Tokens a prefix block stands for (about ``kv_block_chars`` / 4 for text blocks;
    the engine's block size for hashes the client sends)."""
    approx_cache_blocks: int = 4096
    """Prefix blocks remembered per worker for text prompts (no KV events name them)."""
    kv_hash_seed: str = DEFAULT_SEED
    """The seed of the engines' prefix block hashes: vLLM's default, or the
    ``PYTHONHASHSEED`` the workers run with when one is set."""
    lanes: bool = True
    """Short prompts before long ones (within the bound), tenants by fair share."""
    short_prompt_tokens: int = 2048
    """Prompts up to this many tokens go in the short lane."""
    long_wait_bound_s: float = 10.0
    """A long request waits at most this long for short ones: past it, it goes first,
    to any worker with room."""
    short_reserve: float = 0.25
    """Share of the workers kept free of long prompts (at least one, with two or more
    workers), so short requests never wait behind a long prefill."""
    long_per_worker: int = 1
    """Long prompts a worker prefills at once, whatever their size..."""
    long_prefill_tokens: int = 12288
    """...or, when set, more while the long prompts it prefills, a new one included,
    come to at most this many tokens (a worker with none takes any one): the prefill a
    short request landing there can wait behind is bounded in work, not in count, so
    prompts of a few engine steps do not hold a worker to one at a time."""
    reserve_release_s: float = 4.0
    """The reserved share is kept only while no long prompt has waited this long: a
    backlog of long prompts needs every worker's prefill (short ones still go first,
    and wait at most one long prefill's chunks)."""
    reserve_above_tokens: int = 8192
    """Only prompts at least this long stay off the reserved workers: a shorter long
    prompt prefills in a few engine steps, about what a short request behind it can
    wait, and keeping it off would idle the reserved share under load."""
    ttft_slo_s: float = 2.0
    """A request's time-to-first-token objective is this plus its prompt at
    ``slo_prefill_tokens_per_s`` (``batch`` requests have none): what goodput counts,
    what admission holds to and what the queue orders by (``goodput.py``). 0: none.
    A model whose LLMService sets ``ttftSloSeconds`` has that instead."""
    slo_prefill_tokens_per_s: float = 10_000.0
    """The prefill rate the objective grants a prompt."""
    admit_by_slo: bool = True
    """Refuse at once (``overloaded``, HTTP 429 with Retry-After) a request that the
    measured rates say would not start within its objective or its deadline, instead
    of queueing it to be served late or timed out; a request with nothing ahead of it
    is always taken."""
    order_by_slack: bool = True
    """Between the short and the long lane, the request whose objective's deadline
    comes first goes first (the long lane's wait bound still holds); off: short first."""


@dataclass(frozen=True, slots=True)
class RecordedEnd:
    """A request's end as its stream holds it, with when it was stored (Unix seconds)."""

    end: Terminal
    at: float


@dataclass(frozen=True, slots=True)
class UntoldEnd:
    """A request's end as recorded by its worker, and when the scheduler read it."""

    request: RequestSubmitted
    end: Terminal
    read_at: float
    restored: bool = False
    """Kept from the records at a restore, not read live (``Retell.restored``)."""


@dataclass
class Worker:
    worker_id: str
    models: list[str]
    max_num_seqs: int
    state: str
    last_seen: float
    engine: str = ""
    kv_capacity_tokens: int = 0
    assigned: set[str] = field(default_factory=set)
    assigned_tokens: int = 0
    """Prompt + max output tokens of what it holds: against ``kv_capacity_tokens``."""
    assigned_seqs: int = 0
    """Sequences the engine runs for what it holds: a request for ``n`` choices runs
    ``n`` of them, each one of the engine's ``max_num_seqs``."""
    prefilling_long: dict[str, int] = field(default_factory=dict)
    """Long prompts assigned here whose first token has not come yet, and their tokens."""
    foreign: set[str] = field(default_factory=set)
    """Requests its heartbeat lists that this scheduler did not place (placed by a
    scheduler before a restart): they take slots all the same."""
    spill_weight: float | None = None
    """What a block it would restore from its KV spill tiers is worth against one in
    its engine's cache, from its measured costs (None: not measured yet)."""
    last_progress: float = 0.0
    """When it last sent a copy of a migratable request's chunk (0: never)."""
    interval_s: float = 1.0
    """Its heartbeat interval."""
    rates: WorkerRates = field(default_factory=WorkerRates)
    """Its measured prefill rate and slot hold time (``goodput.py``)."""
    pending_prefill: int = 0
    """Prompt tokens (less its expected cache hits) of what it holds and has not
    started: the prefill a request placed there waits behind."""
    untold: dict[str, UntoldEnd] = field(default_factory=dict)
    """Ends it recorded that no heartbeat since has said were sent to their readers:
    told again should it be lost (``Retell``)."""

    def can_take(self, tokens: int = 0, seqs: int = 1) -> bool:
        """Room for a request of ``tokens`` running ``seqs`` sequences (its ``n``); an
        idle worker takes one whatever its ``n`` (the engine queues the rest)."""
        used = self.assigned_seqs + len(self.foreign)
        if self.state != "ready" or used + (seqs if used else 1) > self.max_num_seqs:
            return False
        # a request bigger than the whole cache still goes to an idle worker
        return (
            not self.kv_capacity_tokens
            or not self.assigned
            or self.assigned_tokens + tokens <= self.kv_capacity_tokens
        )


def restore_worth(prefill_s_per_token: float, restore_s_per_token: float) -> float | None:
    """A restorable block's worth against a cached one: the share of its prefill a
    restore saves (within 0.05 to 0.95: a restore is never free nor useless)."""
    if prefill_s_per_token <= 0.0 or restore_s_per_token <= 0.0:
        return None
    return min(0.95, max(0.05, 1.0 - restore_s_per_token / prefill_s_per_token))


@dataclass
class Queued:
    request: RequestSubmitted
    since: float
    order: int
    """Arrival order, kept across reassignment so re-queued work stays FIFO."""
    attempt: int = 1
    deadline: float = float("inf")
    """The request's deadline on the core's clock."""
    blocks: list[int] | None = None
    """Its prefix block hashes, computed once."""
    exact_blocks: bool = False
    """``blocks`` are the engine's hashes (KV events will name them), not text blocks."""
    block_tokens: int = 0
    """Tokens each of ``blocks`` stands for."""
    target: str | None = None
    """The model name it runs on (its own, or a canary's), chosen once and kept."""
    cached_blocks: int = 0
    """Prefix blocks the worker it was last routed to held."""
    resume: Resume | None = None
    """A continuation: where the lost attempt's stream stopped."""
    cause: str = ""
    """Why it was moved (``lost``: heartbeats stopped; ``stopped``, ``failed``: its
    worker said so)."""
    quiet_since: float = 0.0
    """A continuation: when its stream last moved (its client's wait starts there)."""
    due: float = float("inf")
    """When its TTFT objective runs out, on the core's clock (-inf: re-queued work,
    pushed to the front of its tenant's line, never "urgent")."""


@dataclass
class Inflight:
    request: RequestSubmitted
    worker_id: str
    attempt: int
    assigned_at: float
    order: int
    started: bool = False
    deadline: float = float("inf")
    tokens: int = 0
    long: bool = False
    target: str = ""
    """The model name it was routed under (its own, or a canary's version)."""
    unmovable: str = ""
    """Why it cannot move to another worker mid-stream ("": it can, once its worker
    says it sends progress)."""
    resume: Resume | None = None
    """Set on a continuation: where it was assigned to pick up."""
    quiet_since: float = 0.0
    """A continuation: when its stream last moved before the move."""
    progress: Progress | None = None
    """What it streamed, from its worker's copies (None: its worker sends none)."""
    prefill: int = 0
    """Its prompt tokens less the cache hits expected where it was placed (counted in
    its worker's ``pending_prefill`` until it starts)."""
