"""Request-path events as msgspec tagged Structs.

Every event is JSON on the wire with a ``type`` tag, so clients in any language can
produce and read them (``inferbus contracts schema`` prints the JSON Schema).
Compatible changes add a field with a default; breaking ones get a new tag.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .generation import (
    ChatTemplateOptions,
    ChoiceEnd,
    EmbedParams,
    StructuredOutput,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolUse,
)

__all__ = [
    "ALL_EVENTS",
    "HANDOVER_FRESH_S",
    "KV_SPILL_MEDIA",
    "TERMINAL_TYPES",
    "CanaryWeights",
    "CancelRequest",
    "ChatMessage",
    "ChunkBatch",
    "ChunkTo",
    "DeadLetter",
    "DecidedRequest",
    "Event",
    "FinishReason",
    "InputFinding",
    "KvAllCleared",
    "KvBlocksRemoved",
    "KvBlocksStored",
    "KvEvent",
    "KvEventBatch",
    "KvIndexPart",
    "KvResync",
    "KvSpillNamespace",
    "ModelLoad",
    "Progress",
    "ProgressBatch",
    "ReplyDelivery",
    "ReplyEvent",
    "RequestAccepted",
    "RequestCancelled",
    "RequestFailed",
    "RequestFinished",
    "RequestProgress",
    "RequestRejected",
    "RequestStarted",
    "RequestSubmitted",
    "Resume",
    "SamplingParams",
    "ScaleDecision",
    "ScalingStatus",
    "SchedulerLoad",
    "StageTimings",
    "TenantPolicy",
    "Terminal",
    "TokenChunk",
    "TraceDecided",
    "Usage",
    "WorkAssigned",
    "WorkerHeartbeat",
    "WorkerState",
]


class Event(msgspec.Struct, kw_only=True, tag_field="type", omit_defaults=False):
    """Base of every event; the subclass's tag goes into the ``type`` field."""


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str
    """The text (a message's text parts joined); empty for an assistant's turn that
    only called tools."""
    name: str | None = None
    tool_calls: list[ToolCall] = []
    """An assistant's calls, as the chat template renders them into the prompt."""
    tool_call_id: str | None = None
    """A ``tool`` message: the call it answers."""
    reasoning: str | None = None
    """An assistant's reasoning, for templates that render it."""

    def template_dict(self) -> dict[str, object]:
        """The message as chat templates read it (OpenAI's shape)."""
        out: dict[str, object] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [msgspec.to_builtins(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = self.reasoning
        return out


class SamplingParams(msgspec.Struct, kw_only=True):
    """How to generate, as vLLM's ``SamplingParams`` (same names, same meaning)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k cut."""
    stop: list[str] = []
    stop_token_ids: list[int] = []
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    n: int = 1
    """Choices to generate from the one prompt (they share its KV, on one worker)."""
    min_p: float = 0.0
    min_tokens: int = 0
    """Tokens generated before an end-of-sequence or stop token may end a choice."""
    logprobs: int | None = None
    """Return each output token's log probability and this many alternatives at its
    position (0: the token's alone); None: no logprobs."""
    prompt_logprobs: int | None = None
    """Return each prompt token's log probability (and this many alternatives), on
    each choice's end; None: none. Scores a text (loglikelihood)."""
    logit_bias: dict[int, float] = {}
    """Added to these token ids' logits."""
    allowed_token_ids: list[int] = []
    """Only these tokens may be generated (empty: any)."""
    bad_words: list[str] = []
    """Words never generated."""
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    """Keep only the prompt's last this many tokens (-1: as many as the context
    takes); None: the whole prompt, refused if too long."""
    structured: StructuredOutput | None = None
    """A constraint the output must match (JSON schema, regex, choice, grammar...)."""

    @property
    def output_tokens(self) -> int:
        """The most tokens the request may generate, all choices together."""
        return self.max_tokens * self.n


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens served from the engine's prefix cache."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class RequestSubmitted(Event, tag="request.submitted"):
    """A client asks for a completion. One of ``prompt``, ``messages`` and
    ``token_prompt`` is set.

    ``reply_to`` is the core NATS subject the token chunks and the terminal event
    are published to; the client subscribes to it before submitting.
    """

    request_id: str
    model: str
    reply_to: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    token_prompt: list[int] | None = None
    """The prompt as token ids of the served model's tokenizer (a completions prompt
    given as integers), run as they are."""
    chat_template: ChatTemplateOptions | None = None
    """How ``messages`` become the prompt; None: the assistant's turn opened after them."""
    tools: ToolUse | None = None
    """Functions the model may call (chat requests only), and how."""
    embed: EmbedParams | None = None
    """Set for an embedding request: the prompt's vector is the answer (on its end's
    choice 0), no text is generated, and ``sampling`` is not read."""
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    tenant: str = "default"
    created_at: float = 0.0
    """Unix seconds when the client created the request."""
    deadline: float = 0.0
    """Unix seconds after which the request is abandoned and ends ``deadline_exceeded``
    wherever it is (queue or engine); 0 means none."""
    priority: str = "standard"
    """Priority class from the API key (``interactive``, ``standard``, ``batch``)."""
    input_policy: str = ""
    """What the sanitizer does with injection findings: ``block``, ``flag`` or ``off``;
    empty means the deployment's policy for the model."""
    data_policy: str = ""
    """What the sanitizer does with instructions found in data (tool results): ``block``,
    ``flag``, ``spotlight`` (the data is delimited and marked, and the request runs) or
    ``off``; empty means the deployment's policy for the model."""
    mask_pii: bool | None = None
    """Mask PII in the output stream; None means the deployment's default (on)."""
    tool_call_policy: str = ""
    """What the output filter does with PII in a tool call's arguments: ``mask`` it, or
    ``refuse`` the call (the request ends ``output_blocked``) when the request's own
    messages never gave that value; empty means the deployment's (``mask``)."""
    client_reply_to: str = ""
    """Set by the sanitizer when it filters the output: the client's own reply subject
    (``reply_to`` then names the sanitizer's filter)."""
    prefix_hashes: list[int] = []
    """Chained hashes of the prompt's leading blocks, for KV-aware routing, when the
    client knows them; otherwise the scheduler hashes the prompt text itself."""
    prompt_tokens: int = 0
    """The prompt's length in tokens, for lanes, fair share and token budgets: set by
    the sanitizer from the model's tokenizer (a client's value is dropped: it would be
    trusted for accounting); 0: the scheduler estimates it from the text."""
    prompt_token_ids: list[int] = []
    """The prompt as the served model's tokenizer reads it (chat template applied),
    set by the sanitizer when it has that tokenizer (a client's value is dropped): the
    scheduler hashes it into the engine's own block hashes, for exact prefix routing."""
    prompt_tokenizer: str = ""
    """The fingerprint of the tokenizer that made ``prompt_token_ids``
    (``shared.prompttokens.tokenizer_fingerprint``), set with them: a worker whose own
    tokenizer has this fingerprint runs the ids as they are instead of tokenizing the
    prompt again."""

    @property
    def estimated_prompt_tokens(self) -> int:
        """``prompt_tokens`` when the sanitizer counted it, else about 4 characters a
        token (a count under 1 is never taken: a request is at least one token)."""
        if self.prompt_tokens > 0:
            return self.prompt_tokens
        if self.token_prompt is not None:
            return len(self.token_prompt)
        if self.prompt is not None:
            return len(self.prompt) // 4 + 1
        return sum(len(m.content) for m in self.messages or ()) // 4 + 1


class RequestAccepted(Event, tag="request.accepted"):
    request: RequestSubmitted
    accepted_at: float
    findings: list[InputFinding] = []
    """Input findings let through under the ``flag`` policy."""


class Resume(msgspec.Struct, kw_only=True):
    """Where a continuation picks up: what an earlier attempt streamed before its
    worker was lost. The new worker generates on from the prompt plus ``output_ids``
    (``max_tokens`` less what was sent), sends ``last_chunk`` again (a reader that has
    it drops it by its ``seq``), then numbers its own chunks from ``next_seq``."""

    from_attempt: int
    output_ids: list[int] = []
    """The output's token ids streamed so far."""
    next_seq: int = 0
    last_chunk: TokenChunk | None = None
    migrations: int = 1
    """Continuations of this request so far, this one included."""
    finish_reason: str = ""
    """The earlier attempt streamed its last chunk (and was lost before its end): the
    continuation only ends the stream, so."""


class WorkAssigned(Event, tag="work.assigned"):
    request: RequestSubmitted
    worker_id: str
    attempt: int = 1
    assigned_at: float = 0.0
    served_model: str = ""
    """The model the worker runs it on when not ``request.model``: a canary version."""
    expected_cached_tokens: int = 0
    """Prompt tokens the scheduler routed it expecting the worker's prefix cache to
    hold (exact for token-hashed prompts, about for text blocks), against which the
    engine's ``cached_prompt_tokens`` tells how well routing saw the caches."""
    migratable: bool = False
    """The scheduler can move it to another worker mid-stream: the worker sends a copy
    of each chunk to ``ib.progress.<worker_id>`` before the chunk itself."""
    resume: Resume | None = None
    """Set on a continuation: the attempt streams on from there."""
    lease_s: float = 0.0
    """The scheduler acts on this request once its worker has said nothing (no
    heartbeat, no chunk's copy) for this long (a migratable one moves elsewhere, any
    other ends ``worker_lost``): a worker that finds it was silent longer (stopped, its
    loop stalled) checks with the bus for a stop before it streams on or ends it.
    0: never checks (a scheduler from before this field)."""
    partition: int | None = None
    """The scheduler partition that placed it: the worker records its start and end on
    that partition's subjects (``started_subject``, ``ended_subject``). None: an
    unpartitioned scheduler's."""


class RequestStarted(Event, tag="request.started"):
    """A worker is about to stream the request's first token."""

    request_id: str
    worker_id: str
    attempt: int = 1
    resumed: bool = False
    """A continuation's start: the request had streamed on another worker."""
    migratable: bool = False
    """The worker sends the scheduler a copy of each chunk (``RequestProgress``), so
    the stream can move to another worker if this one is lost."""


class RequestProgress(Event, tag="request.progress"):
    """A copy of a migratable request's chunk, for the scheduler (core NATS,
    ``ib.progress.<worker_id>``), sent before the chunk goes to the reader."""

    worker_id: str
    chunk: TokenChunk
    finish_reason: str = ""
    """The engine's finish reason when this chunk is the stream's last (its ids may end
    with the end-of-sequence token): a continuation then only ends it."""


class ProgressBatch(Event, tag="request.progress.batch"):
    """Copies of chunks of several of a worker's migratable requests in one message on
    its ``ib.progress.<worker_id>`` (those of one engine step), each before the
    readers' copies of the same chunks."""

    worker_id: str
    progress: list[RequestProgress] = []


HANDOVER_FRESH_S = 1.0
"""The scheduler moves a draining worker's handed-over streams only on a heartbeat sent
this recently: the worker holds them still for longer than that, then streams on."""


class TokenChunk(Event, tag="token.chunk", omit_defaults=True):
    """One or more tokens of output. ``seq`` counts chunks from 0 without gaps."""

    request_id: str
    seq: int
    text: str
    token_ids: list[int] = []
    attempt: int = 1
    n_tokens: int = 0
    """Tokens in this chunk when ``token_ids`` is left out (a filtered stream: the
    ids would carry the text that was masked)."""
    index: int = 0
    """The choice it belongs to (a request for ``n`` choices numbers them from 0);
    ``seq`` counts a request's chunks across all its choices."""
    logprobs: list[TokenLogprob] = []
    """Each token's log probability, when the request asked for them."""
    tool_calls: list[ToolCallDelta] = []
    """Pieces of the tool calls these tokens spell (the worker's tool-call parser took
    them out of the text, which then holds what is left, if anything)."""
    reasoning: str = ""
    """Reasoning these tokens spell, taken apart from the text by the worker's
    reasoning parser."""
    resumed: bool = False
    """Of a continuation (``attempt`` > 1 on another worker after the first was lost):
    ``seq`` goes on from the earlier attempt's, and the text with it. A reader keeps
    what it has and drops a chunk whose ``seq`` it has seen."""
    resumed_from: int | None = None
    """Of a continuation: the ``seq`` it goes on from, the earlier attempts' chunks the
    scheduler had copies of. A reader that holds more got chunks the scheduler never
    saw (a worker cut off from the bus sends what it buffered when it is back, after
    its stream moved): their tokens and the continuation's overlap, cut into chunks
    otherwise, so the reader takes the continuation as a restart, not a join. None:
    not a continuation, or from a worker that does not say."""

    @property
    def tokens(self) -> int:
        return len(self.token_ids) or self.n_tokens


FinishReason = Literal["stop", "length"]


class StageTimings(msgspec.Struct, kw_only=True):
    """Where a request's time went inside the worker, in seconds (0 when unknown)."""

    queued_s: float = 0.0
    """From the worker receiving the assignment to the engine scheduling it."""
    prefill_s: float = 0.0
    """From scheduling to the first token (prompt processing)."""
    first_token_s: float = 0.0
    """From the worker receiving the assignment to the first token."""
    decode_s: float = 0.0
    """From the first token to the last."""


class RequestFinished(Event, tag="request.finished"):
    request_id: str
    finish_reason: FinishReason
    usage: Usage
    chunks: int
    """How many TokenChunks were sent before this event, so a reader can spot a gap."""
    worker_id: str = ""
    attempt: int = 1
    timings: StageTimings = msgspec.field(default_factory=StageTimings)
    served_model: str = ""
    """The version that answered, ``name@version`` (``name`` alone when the worker's
    model has no registry version): what a rollout compares."""
    choices: list[ChoiceEnd] = []
    """How each choice ended, by index; ``finish_reason`` is choice 0's. Empty from
    producers older than ``n``: one choice, ended as ``finish_reason`` says."""
    resumed: bool = False
    """The end of a continuation: ``chunks`` and ``usage`` count the earlier
    attempts' chunks and tokens too."""
    resumed_from: int | None = None
    """A continuation's: where it went on from, as on its chunks (a reader that sees
    the end first checks it the same way)."""

    def choice_ends(self) -> list[ChoiceEnd]:
        """Each choice's end, with the single choice of an older producer filled in."""
        if self.choices:
            return sorted(self.choices, key=lambda c: c.index)
        return [
            ChoiceEnd(
                index=0,
                finish_reason=self.finish_reason,
                completion_tokens=self.usage.completion_tokens,
            )
        ]


class RequestFailed(Event, tag="request.failed"):
    request_id: str
    code: str
    """Machine-readable reason, e.g. ``worker_lost``, ``no_worker``, ``invalid_request``:
    producers write a ``FailureCode`` (``contracts/failures.py``, which gives each its
    HTTP status, retryability and meaning). Typed ``str`` on purpose: a reader must take
    a code it does not know yet (status 500; ``retryable`` says whether to retry)."""
    reason: str
    retryable: bool = False
    served_model: str = ""
    """Set when a worker's engine failed it: the version it ran on (``name@version``)."""
    attempt: int = 0
    """The attempt a worker failed (0: not tied to one, as the scheduler's and the
    sanitizer's failures are): a reader ignores a failure of an attempt older than
    the newest it has seen (contracts/replies.py)."""
    retry_after_s: float = 0.0
    """When a retry may succeed, where its author can tell (``overloaded``: the wait
    the queue needs to come back within the objective); 0: not said."""


class InputFinding(msgspec.Struct, kw_only=True):
    """What an input check found: the rule, its type (``sql_injection``, ``xss``,
    ``prompt_injection``), and where (``field``, character offsets in it)."""

    rule: str
    type: str
    field: str
    start: int
    end: int


class RequestRejected(Event, tag="request.rejected"):
    """The sanitizer refused the request before it reached a worker."""

    request_id: str
    code: str
    reason: str
    param: str | None = None
    findings: list[InputFinding] = []
    retry_after_s: float = 0.0
    """When a retry may succeed (``rate_limited``: when the tenant's quota has room for
    it again); 0: not said."""


class RequestCancelled(Event, tag="request.cancelled"):
    request_id: str
    reason: str = "cancelled by client"
    attempt: int = 0
    """The attempt a worker stopped (0: the scheduler's, before any worker)."""


class CancelRequest(Event, tag="request.cancel"):
    """Asks whoever holds the request to stop it; answered by RequestCancelled."""

    request_id: str
    reason: str = "cancelled by client"
    attempt: int = 0
    """0: the request, whatever runs it. Else only that attempt: the scheduler stops
    one it gave up on (its worker was presumed lost, and the request moved on), so a
    worker that was only stalled does not run it twice when it wakes."""


WorkerState = Literal["starting", "ready", "draining", "stopped", "failed"]


class WorkerHeartbeat(Event, tag="worker.heartbeat"):
    worker_id: str
    models: list[str]
    engine: str
    state: WorkerState = "ready"
    reason: str = ""
    max_num_seqs: int = 256
    running: int = 0
    waiting: int = 0
    inflight: list[str] = []
    interval_s: float = 1.0
    sent_at: float = 0.0
    kv_cache_usage: float = 0.0
    """Fraction of the engine's KV cache in use, 0..1."""
    prefix_cache_hits: int = 0
    """Prompt tokens found in the prefix cache since the worker started."""
    prefix_cache_queries: int = 0
    adapters: list[str] = []
    """LoRA adapters loaded; each is also listed in ``models``."""
    max_model_len: int = 0
    """Longest sequence (prompt + output tokens) the engine takes; 0 when unknown."""
    kv_capacity_tokens: int = 0
    """Tokens the engine's KV cache holds in all; 0 when unknown (then only
    ``max_num_seqs`` bounds what the scheduler sends)."""
    kv_block_size: int = 0
    """Tokens per block of the engine's prefix cache (its KV events hash blocks of
    this size); 0 when unknown."""
    versions: dict[str, str] = {}
    """Each served name's registry version (``{"llama": "v2", "llama@v2": "v2"}``);
    names without one are absent."""
    prefill_s_per_token: float = 0.0
    """Measured: engine prefill seconds per prompt token computed (recent requests'
    average); 0 until measured."""
    kv_restore_s_per_token: float = 0.0
    """Measured: seconds per prompt token restored from a KV spill tier instead; 0 until
    one was. With ``prefill_s_per_token``, what a restorable block is worth to route to."""
    loading: str = ""
    """What the worker is loading now (``llama@v3 warm``), empty when nothing; it keeps
    serving ``models`` meanwhile (a field, not a ``state``: older readers ignore it)."""
    stalled_s: float = 0.0
    """How long its engine has produced nothing while requests stream on it (0: it
    progresses, or streams nothing): past the scheduler's ``engine_stall_s`` its
    streams move elsewhere, as from a lost worker."""
    handover: list[str] = []
    """Requests a draining worker asks the scheduler to move to other workers (its
    long-running streams, after a grace period): each that can move continues
    elsewhere and this worker is told to stop it; the others it runs to the end."""
    telling: list[str] = []
    """Requests whose end the worker has recorded on ``ib.req.ended`` and not yet sent
    to their reader. Should the worker fall silent before it does, the scheduler sends
    the recorded end itself (a reader never told waits out its timeout)."""


class ModelLoad(msgspec.Struct, kw_only=True):
    queued: int = 0
    queue_limit: int = 0
    """Past this many queued requests the scheduler refuses new ones (``queue_full``)."""
    ready_workers: int = 0
    free_slots: int = 0
    oldest_wait_s: float = 0.0
    dispatch_per_s: float = 0.0
    """Recent rate at which queued requests went to workers."""
    wait_s: float = 0.0
    """How long a new request would wait for its prefill to begin, from the rates the
    scheduler measures (``services/scheduler/goodput.py``); 0: none, or not measured."""
    ttft_slo_s: float = 0.0
    """The TTFT objective (before a prompt's own share) the scheduler refuses a
    request past (``overloaded``); 0: it refuses none by it."""


class CanaryWeights(Event, tag="canary.weights"):
    """Send this share of ``model``'s requests to workers serving another model name
    (a new version), e.g. ``{"m-v2": 0.1}``; the rest stays on ``model``. Empty
    weights end the canary."""

    model: str
    weights: dict[str, float] = {}
    set_at: float = 0.0


class TenantPolicy(Event, tag="tenant.policy"):
    """What a tenant's requests over NATS may do, keyed by its credentials: the
    sanitizer applies it to everything on the tenant's submit subject, whatever the
    payload says (as an API key does over HTTP)."""

    tenant: str
    priority: str = "standard"
    """``interactive``, ``standard`` or ``batch``."""
    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Models it may use (``*``: all)."""
    max_tokens: int = 0
    """Per request; 0: no cap."""
    input_policy: str = ""
    """``block``, ``flag`` or ``off``; empty: the deployment's policy for the model."""
    data_policy: str = ""
    """For instructions in data (tool results): ``block``, ``flag``, ``spotlight`` or
    ``off``; empty: the deployment's policy for the model."""
    mask_pii: bool | None = None
    """None: the deployment's default (on)."""
    tool_call_policy: str = ""
    """``mask`` or ``refuse`` PII in tool-call arguments; empty: the deployment's."""
    max_bytes_per_minute: int = 0
    """What its submits may weigh in a minute (bursts up to a minute's worth); past
    it they end ``rate_limited``. 0: the deployment's (the sanitizer's
    ``--tenant-bytes-per-minute``)."""
    revoked: bool = False
    """Its requests are refused (its credentials should also be removed)."""
    set_at: float = 0.0


class SchedulerLoad(Event, tag="scheduler.load"):
    """The scheduler's queues, published a few times a second for the gateways'
    backpressure (core NATS, ``ib.sched.load``)."""

    scheduler_id: str
    models: dict[str, ModelLoad] = {}
    sent_at: float = 0.0
    interval_s: float = 0.25
    """How often this scheduler reports; a reader treats silence past a few as gone."""
    partitions: list[int] = []
    """The partitions it owns (a partitioned scheduler): its ``models`` count their
    workers and queues only; empty: unpartitioned, it books every worker."""


class DeadLetter(Event, tag="dead_letter"):
    """An event a service could not decode or handle, kept with the reason."""

    service: str
    subject: str
    reason: str
    payload: bytes
    headers: dict[str, str] = {}
    received_at: float = 0.0


class KvBlocksStored(Event, tag="kv.stored"):
    """The worker's engine cached these blocks (a chain: each block's parent is the previous)."""

    worker_id: str
    block_hashes: list[int]
    parent_block_hash: int | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_name: str | None = None
    medium: str | None = None
    """Where: the engine's cache (``GPU``, or none), or the worker's KV spill tiers
    (``CPU``: host memory, ``STORAGE``: its disk), from which it restores blocks."""
    seq: int = 0
    """The worker's count of its KV events, from 1 (its worker id is new at each
    start): a reader that sees one skipped knows it missed an event (they are published
    without waiting for JetStream's ack) and drops what it believed of that worker. 0:
    not numbered (a worker from before this field)."""


KV_SPILL_MEDIA = ("CPU", "STORAGE")
"""KV event media of a worker's spill tiers; any other (vLLM's ``GPU``, or none) is the
engine's own cache, which ``kv.cleared`` empties."""


class KvBlocksRemoved(Event, tag="kv.removed"):
    worker_id: str
    block_hashes: list[int]
    medium: str | None = None
    seq: int = 0
    """As KvBlocksStored's."""


class KvAllCleared(Event, tag="kv.cleared"):
    worker_id: str
    seq: int = 0
    """As KvBlocksStored's."""


class KvResync(Event, tag="kv.resync"):
    """The scheduler missed some of a worker's KV events (``seq`` skipped past
    ``seen_seq``): the worker answers on its ``ib.kv.<worker_id>`` with its whole state,
    one batch numbered on from both counts: ``kv.cleared``, then what each medium holds."""

    worker_id: str
    seen_seq: int = 0
    """The highest event number the scheduler has from this worker."""


class KvIndexPart(msgspec.Struct, kw_only=True):
    """Some of one worker's blocks in one medium, as the scheduler's index held them
    after IB_KV's message ``stream_seq`` (the KV bucket ``ib-kv-index``)."""

    worker_id: str
    stream_seq: int
    """The last IB_KV message applied: a loader reads on from the next."""
    seq: int = 0
    """The worker's last KV event applied (its numbering)."""
    block_size: int = 0
    medium: str = ""
    """Empty for the engine's cache, else the spill tier (``CPU``, ``STORAGE``)."""
    part: int = 0
    parts: int = 1
    hashes: bytes = b""
    """Block hashes, unsigned 64-bit little-endian each."""


class KvSpillNamespace(msgspec.Struct, kw_only=True):
    """What the shared KV spill tier holds of one model's weights (at one KV dtype and
    block size): the kvspill service's entry ``ns.<namespace>`` in KV_SPILL_INDEX."""

    namespace: str
    blocks: int = 0
    bytes: int = 0
    updated_at: float = 0.0


class DecidedRequest(msgspec.Struct, kw_only=True):
    trace_id: str
    """32 lowercase hex digits, as in ``traceparent``."""
    request_id: str


class TraceDecided(Event, tag="trace.decided"):
    """Requests whose spans to keep or drop, decided once per request when it ends
    (tail sampling), in batches. Services hold a request's spans until they hear.
    Keyed by request as well as trace: one caller's trace may hold many requests."""

    kept: list[DecidedRequest] = []
    dropped: list[DecidedRequest] = []
    service: str = ""
    """Who decided."""


KvEvent = KvBlocksStored | KvBlocksRemoved | KvAllCleared


class KvEventBatch(Event, tag="kv.batch"):
    """One engine step's KV events from one worker, in one message on its
    ``ib.kv.<worker_id>``: the bus and the scheduler pay per message (about 20 µs
    decoded and handled) whatever it holds, and a 1k-token prompt made 64 to 190 events.
    Each event keeps its own ``seq`` and names the same worker."""

    worker_id: str
    events: list[KvEvent] = []


class ChunkTo(msgspec.Struct, kw_only=True):
    """A chunk in a ``ChunkBatch`` and the subject it would have had alone."""

    subject: str
    chunk: TokenChunk


class ChunkBatch(Event, tag="chunk.batch"):
    """Token chunks of several streams for one of the platform's own readers, in one
    message on ``<reader>.batch`` (``batch_subject``): what one engine step (or one
    filtered batch) produced for a sanitizer's filter or a gateway. Each message costs
    its sender, the bus and its reader about as much as the tokens in it, so chunks of
    streams stepping together travel together. Ends never come in one: a stream's end
    follows its last chunks on the chunk's own subject. Never sent to a tenant or a
    client's inbox."""

    chunks: list[ChunkTo] = []


Terminal = RequestFinished | RequestFailed | RequestCancelled | RequestRejected
ReplyEvent = TokenChunk | RequestFinished | RequestFailed | RequestCancelled | RequestRejected
ReplyDelivery = ReplyEvent | ChunkBatch
Progress = RequestProgress | ProgressBatch
"""What a platform reader of replies (a sanitizer's filter, a gateway) is sent."""
TERMINAL_TYPES = (RequestFinished, RequestFailed, RequestCancelled, RequestRejected)

ALL_EVENTS: tuple[type[Event], ...] = (
    RequestSubmitted,
    RequestAccepted,
    RequestRejected,
    WorkAssigned,
    RequestStarted,
    RequestProgress,
    ProgressBatch,
    TokenChunk,
    RequestFinished,
    RequestFailed,
    RequestCancelled,
    CancelRequest,
    WorkerHeartbeat,
    DeadLetter,
    KvBlocksStored,
    KvBlocksRemoved,
    KvAllCleared,
    KvEventBatch,
    KvResync,
    SchedulerLoad,
    ChunkBatch,
    CanaryWeights,
    TenantPolicy,
    TraceDecided,
)


class ScaleDecision(Event, tag="scale.decision"):
    """The autoscaler changed how many workers ``model`` should have, and why
    (JetStream ``ib.scale.decided.<model>``, kept for audit). The gateway and the
    scheduler also read it: a model being scaled from zero is one to wait for."""

    model: str
    desired: int
    """Workers the model should have from now on."""
    previous: int
    """The target before this decision."""
    ready: int = 0
    """Ready workers when it was decided."""
    reason: str = ""
    """Why, in words: ``forecast``, ``panic``, ``scale from zero``, ``cooldown
    passed``, ``idle``, with the figures behind it."""
    forecast: float = 0.0
    """Load expected ``lead_time_s`` ahead, in work tokens per second (prompt tokens
    weighted by the model's prefill weight, plus output tokens)."""
    observed: float = 0.0
    """Load of the last stable window, same unit."""
    capacity: float = 0.0
    """Work tokens per second one worker is taken to sustain within the SLO."""
    lead_time_s: float = 0.0
    """How long a new worker for this model takes to be ready, as measured."""
    panic: bool = False
    stop_first: list[str] = []
    """Scaling down: the workers to drain first (the least busy)."""
    decided_at: float = 0.0
    """Unix time."""


class ScalingStatus(Event, tag="scale.status"):
    """The autoscaler's models and their targets, a few times a minute (core NATS,
    ``ib.scaling.status``). While it is heard, a model in it with no ready worker is
    one being started: the gateway lets its requests in and the scheduler holds them
    up to its ``cold_start_wait_s`` (and their deadline) instead of refusing them."""

    autoscaler_id: str
    targets: dict[str, int] = {}
    sent_at: float = 0.0
    interval_s: float = 5.0
    """How often it is sent; a reader treats silence past three as the autoscaler gone."""
