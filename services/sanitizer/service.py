"""Sanitizer adapter: submitted requests in, accepted ones on, rejections to the client."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import msgspec
from nats.aio.msg import Msg

from inferbus.contracts import (
    CANCEL,
    ENDED,
    FILTER_PREFIX,
    SUBMIT,
    CancelRequest,
    ChunkBatch,
    FailureCode,
    LLMServiceSettings,
    ReplyDelivery,
    ReplyEvent,
    RequestAccepted,
    RequestFailed,
    RequestRejected,
    RequestSubmitted,
    SchedulerLoad,
    TenantPolicy,
    TokenChunk,
    accepted_subject,
    subject_token,
    tenant_of_subject,
    tenant_reply_prefix,
    tenant_request_id,
)
from inferbus.shared import logs, metrics
from inferbus.shared.bus import (
    Background,
    publish_durable,
    record_end,
    request_headers,
)
from inferbus.shared.chunksender import ChunkSender
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.config import ServiceSettings
from inferbus.shared.errors import ConfigError
from inferbus.shared.partitions import PartitionView
from inferbus.shared.runtime import Context, Service
from inferbus.shared.tracing import attributes as t
from inferbus.shared.tracing import valid_context

from .core import (
    TOOL_CALL_POLICIES,
    FilteredStream,
    InputLimits,
    InputRules,
    InputVerdict,
    PassedEnds,
    given_pii,
    json_output,
    model_settings,
    parse_policies,
    through_filter,
    with_models,
)
from .quota import ByteQuota
from .tenants import own_reply
from .tokens import Tokenizers, parse_tokenizers
from .wiring import WIRING

log = logs.get("inferbus.sanitizer")


class SanitizerSettings(ServiceSettings, kw_only=True):
    """inferbus sanitizer: checks every submitted request before it is scheduled, and
    masks PII in the output streams that pass through it."""

    tenant_bytes_per_minute: int = 64 * 1024 * 1024
    """What a tenant's submits over NATS may weigh in a minute (bursts up to a minute's
    worth), unless its record says (``inferbus creds new --max-bytes-per-minute``); past
    it they end ``rate_limited``. 0: no quota."""
    max_prompt_chars: int = 32_768
    """The largest prompt taken, in characters (all messages together): ``prompt_too_long`` past
    it."""
    max_tokens: int = 32_768
    """The largest max_tokens a request may ask for."""
    input_policy: str = "block"
    """Injection findings: block (HTTP 400 naming the rule), flag (let through, logged
    and recorded on the accepted event) or off; an API key's policy wins."""
    model_input_policies: str = ""
    """Per-model policies, e.g. "code-model=flag,chat-model=block"."""
    data_policy: str = "block"
    """Instructions found in data an agent sends back (tool results): block (HTTP 400
    naming the rule and the message), flag (let through, recorded on the accepted
    event), spotlight (the tool results are delimited and datamarked for the model, and
    the request runs; recorded as flag) or off; an API key's or tenant's policy wins."""
    model_data_policies: str = ""
    """Per-model data policies, e.g. "agent-model=spotlight"."""
    mask_output_pii: bool = True
    """Mask PII in every output stream unless the request (its API key) says not to."""
    tool_call_policy: str = "mask"
    """PII in a tool call's arguments: mask it as in text, or refuse the call (the
    request ends output_blocked and the worker is told to stop) when the request's own
    messages never gave that value; an API key's or tenant's policy wins."""
    passed_end_memory_s: float = 60.0
    """How long a stream's end, once passed on, is remembered: a worker asking again
    whether it went on (it heard no answer) is answered, the client told once. Longer
    than the workers' ``filter_backup_s``, which is how long they go on asking."""
    filter_idle_s: float = 900.0
    """A filtered stream silent this long is forgotten (its worker and scheduler died);
    one past its request's deadline sooner (its end was lost on the way)."""
    drain_quiet_s: float = 10.0
    """When it stops, the sanitizer lets the streams it filters end, but does not wait
    for one silent this long: its end was lost, or it waits in a queue (a decoding
    stream sends every few milliseconds); an instance with the same id filters what
    comes later."""
    tokenizers: str = ""
    """Per model, the folder of the tokenizer its prompts are read with, e.g.
    "tiny-llama=/models/tiny-llama": accepted requests carry their token ids, and the
    scheduler routes them on the engine's own prefix block hashes."""
    scheduler_partitions: int = 1
    """The scheduler's partitions (its setting of the same name, one
    ``INFERBUS_SCHEDULER_PARTITIONS``): each accepted request goes to one's subject,
    chosen from the instances' reports (shared/partitions.py). 1: ``ib.req.accepted``."""

    @property
    def partitioned(self) -> bool:
        return self.scheduler_partitions > 1


class _Addressed(msgspec.Struct):
    """What a malformed request still has to be answered: its id and reply subject."""

    request_id: str
    reply_to: str


_FIELD = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*"([^"\\]{1,256})"')
    for name in ("request_id", "reply_to")
}


def _addressed(data: bytes) -> _Addressed | None:
    """Its id and reply subject, from JSON that is not a request; JSON nested too deeply
    to parse at all is searched for them, so its sender still gets an answer."""
    try:
        return decode(data, _Addressed)
    except DecodeError as exc:
        if "nested too deeply" not in str(exc):
            return None
    found = {name: pattern.search(data) for name, pattern in _FIELD.items()}
    if not all(found.values()):
        return None
    return _Addressed(**{k: m.group(1).decode() for k, m in found.items() if m is not None})


class _FilterTrace:
    """One output stream's filter span, recorded when the stream ends."""

    __slots__ = ("parent", "start_ns")

    def __init__(self, parent: Any) -> None:
        self.parent = parent
        self.start_ns = 0


class SanitizerService(Service[SanitizerSettings]):
    name = "sanitizer"
    wiring = WIRING

    def __init__(self, settings: SanitizerSettings, ctx: Context[SanitizerSettings]) -> None:
        super().__init__(settings, ctx)
        self.partitions = PartitionView(settings.scheduler_partitions)
        if settings.tool_call_policy not in TOOL_CALL_POLICIES:
            raise ConfigError(
                f"tool call policy {settings.tool_call_policy!r} (choose mask or refuse)"
            )
        self.flag_policies = parse_policies(
            settings.input_policy,
            settings.model_input_policies,
            settings.data_policy,
            settings.model_data_policies,
        )
        self.rules = InputRules(
            limits=InputLimits(
                max_prompt_chars=settings.max_prompt_chars, max_tokens=settings.max_tokens
            ),
            policies=self.flag_policies,
            mask_output_default=settings.mask_output_pii,
            tool_call_default=settings.tool_call_policy,
        )
        """What every input decision depends on; tenants' and LLMServices' records
        (IB_CONFIG ``ib.cfg.tenant.*``, ``ib.cfg.llmservice.*``) update it."""
        self.quota = ByteQuota()
        self._work = Background()
        self._counts = {"accepted": 0, "rejected": 0, "invalid": 0, "blocked": 0, "flagged": 0}
        self.filter_id = subject_token(settings.instance_id)
        self._filter_prefix = f"{FILTER_PREFIX}.{self.filter_id}."
        self._chunks = ChunkSender(ctx.nc, batching=settings.chunk_batching)
        self._streams: dict[str, FilteredStream] = {}
        self._passed = PassedEnds(settings.passed_end_memory_s)
        self._filter_traces: dict[str, _FilterTrace] = {}
        """Traced output streams, by client subject."""
        self._sweeper: asyncio.Task[None] | None = None
        self.tokenizers = Tokenizers(parse_tokenizers(settings.tokenizers))
        self._loading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loading = asyncio.create_task(self.tokenizers.load_all(), name="tokenizers")
        self._sweeper = asyncio.create_task(self._sweep(), name="filter-sweep")

    async def drain(self) -> None:
        # the requests stop; the streams in flight still pass through the filter
        await self.ctx.subscriptions.close(keep={"_on_output"}, drain=True)
        await self._work.wait()
        # streams in flight still pass through here: let them end
        deadline = time.monotonic() + max(0.0, self.settings.drain_timeout_s - 2.0)
        quiet_s = self.settings.drain_quiet_s
        # liveness is silence over time: no event marks it, so it is looked at again
        while time.monotonic() < deadline and any(  # noqa: ASYNC110
            s.live(time.monotonic(), time.time(), quiet_s) for s in self._streams.values()
        ):
            await asyncio.sleep(0.05)
        if self._sweeper:
            self._sweeper.cancel()
        if self._loading:
            self._loading.cancel()

    def status(self) -> dict[str, Any]:
        return {
            **self._counts,
            "filtering": len(self._streams),
            "input_policy": self.rules.policies.default,
            "tokenizers": self.tokenizers.loaded(),
            **self._chunks.stats(),
        }

    # -- output: the PII filter -----------------------------------------------------------

    async def _on_output(self, event: ReplyDelivery, msg: Msg) -> None:
        """A stream's chunk or end, or a batch of chunks of several streams: each
        filtered, and what comes out sent before the next message is read (a
        stream's end never overtakes its chunks)."""
        if isinstance(event, ChunkBatch):
            prefix = len(self._filter_prefix)
            for item in event.chunks:
                if item.subject.startswith(self._filter_prefix):
                    await self._filter(item.chunk, item.subject[prefix:], None)
        else:
            await self._filter(event, msg.subject[len(self._filter_prefix) :], msg.reply)
        await self._chunks.flush()

    async def _filter(self, event: ReplyEvent, client: str, reply: str | None) -> None:
        rid = event.request_id
        if (client, rid) in self._passed:  # ended: a late chunk, or the worker asking again
            if reply:
                await self.ctx.nc.publish(reply, b"", headers=request_headers(rid))
            return
        stream = self._streams.get(client)
        if stream is None:  # accepted by this instance before a restart: filter from here
            stream = self._streams[client] = FilteredStream(rid, client, time.monotonic())
        t0 = time.perf_counter()
        before = len(stream.entities)
        out, over = stream.on_event(event, time.monotonic())
        stream.busy_s += time.perf_counter() - t0
        for e in stream.entities[before:]:
            metrics.PII_MASKED.labels(e.type).inc()
        traced = self._filter_traces.get(client)
        if traced is not None and not traced.start_ns:
            traced.start_ns = time.time_ns()
        if over:
            # once per stream, not per chunk: the filter's cost per request
            metrics.FILTER_SECONDS.observe(stream.busy_s)
            if traced is not None:
                self._trace_filter(self._filter_traces.pop(client), stream)
        headers = request_headers(rid)
        if stream.lost and over:
            log.warning("output chunks lost before the filter", request_id=rid, lost=stream.lost)
        for ev in out:
            if isinstance(ev, TokenChunk):
                await self._chunks.send(client, ev, headers)
            else:
                await self._chunks.flush()
                await self.ctx.nc.publish(client, encode(ev), headers=headers)
        if stream.to_cancel:  # a refused tool call: the worker need not go on
            stream.to_cancel = False
            log.warning("tool call refused", request_id=rid)
            await self.ctx.nc.publish(
                CANCEL,
                encode(CancelRequest(request_id=rid, reason="tool call refused by policy")),
                headers=headers,
            )
        if over:
            self._streams.pop(client, None)
            self._passed.passed((client, rid), time.monotonic())
            if reply:  # the worker asked: the end is passed on, no backup end needed
                await self.ctx.nc.publish(reply, b"", headers=headers)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.settings.filter_idle_s / 2))
            now, wall = time.monotonic(), time.time()
            for key, s in list(self._streams.items()):
                if not s.live(now, wall, self.settings.filter_idle_s):
                    del self._streams[key]
                    self._filter_traces.pop(key, None)
                    log.warning(
                        "filtered stream forgotten: its end never came",
                        request_id=s.request_id,
                        silent_s=round(now - s.last_seen, 1),
                        past_deadline_s=round(wall - s.deadline, 1) if s.deadline else None,
                    )

    def _over_quota(self, request: RequestSubmitted, tenant: str, size: int) -> InputVerdict | None:
        """A tenant past its bytes per minute is refused before any check (answered only
        on a reply subject of its own)."""
        if not own_reply(request, tenant):
            return None
        record = self.rules.tenants.get(tenant)
        per_minute = (record.max_bytes_per_minute if record else 0) or (
            self.settings.tenant_bytes_per_minute
        )
        wait = self.quota.take(tenant, size, per_minute, time.monotonic())
        if not wait:
            return None
        metrics.TENANT_RATE_LIMITED.labels(tenant).inc()
        refusal = RequestRejected(
            request_id=request.request_id,
            code=FailureCode.RATE_LIMITED,
            reason=f"tenant {tenant!r} sent more than {per_minute} bytes of requests in a "
            f"minute; retry in {wait:.1f}s",
            retry_after_s=round(wait, 3),
        )
        return InputVerdict(request=request, rejection=refusal)

    async def _on_submitted(self, _: bytes, msg: Msg) -> None:
        # requests are independent: check many at once rather than one ack round trip apiece
        await self._work.spawn(self._check(msg))

    def _trace_filter(self, traced: _FilterTrace, stream: FilteredStream) -> None:
        by_type: dict[str, int] = {}
        for e in stream.entities:
            by_type[e.type] = by_type.get(e.type, 0) + 1
        attrs: dict[str, Any] = {
            t.REQUEST_ID: stream.request_id,
            "inferbus.pii.masked": sum(by_type.values()),
            "inferbus.filter.busy_s": round(stream.busy_s, 6),
        }
        for kind, n in by_type.items():
            attrs[f"inferbus.pii.masked.{kind.lower()}"] = n
        self.ctx.tracing.record(
            "output pii filter",
            traced.parent,
            traced.start_ns or time.time_ns(),
            time.time_ns(),
            attrs,
            error=f"lost: {stream.lost} chunks" if stream.lost else "",
        )

    async def _on_tenant_policy(self, policy: TenantPolicy, msg: Msg) -> None:
        self.rules = msgspec.structs.replace(
            self.rules, tenants={**self.rules.tenants, policy.tenant: policy}
        )
        log.info("tenant record", tenant=policy.tenant, revoked=policy.revoked)

    async def _on_scheduler_load(self, load: SchedulerLoad, msg: Msg) -> None:
        self.partitions.on_load(load, time.monotonic())

    async def _on_model_record(self, record: LLMServiceSettings, msg: Msg) -> None:
        try:
            ms = model_settings(record)
        except ValueError as exc:
            log.error("llmservice record refused", model=record.model, error=str(exc))
            return
        models = {m: v for m, v in self.rules.models.items() if m != record.model}
        if ms is not None:
            models[record.model] = ms
        self.rules = msgspec.structs.replace(
            self.rules, models=models, policies=with_models(self.flag_policies, models)
        )
        log.info(
            "llmservice record",
            model=record.model,
            service=record.service,
            input_policy=ms.input_policy if ms else None,
            data_policy=ms.data_policy if ms else None,
            mask_output_pii=ms.mask_output_pii if ms else None,
            tool_call_policy=ms.tool_call_policy if ms else None,
        )

    async def _check(self, msg: Msg) -> None:
        js, nc = self.ctx.js, self.ctx.nc
        try:
            request = decode(msg.data, RequestSubmitted)
        except DecodeError as exc:
            await self._invalid(msg, str(exc))
            return
        tenant = tenant_of_subject(msg.subject, SUBMIT)
        if tenant:  # its id is the platform's from here on, every event included
            request.request_id = tenant_request_id(tenant, request.request_id)
        rid = request.request_id
        over = self._over_quota(request, tenant, len(msg.data)) if tenant else None
        verdict = over or self.rules.decide(request, tenant, self.tokenizers.text_of(request))
        request, rejection, found = verdict.request, verdict.rejection, verdict.findings
        tracing = self.ctx.tracing
        trace = valid_context(msg.headers or {})
        span = None
        if tracing.enabled:
            # a client that sent no (valid) trace context gets a trace starting here
            span = tracing.start(
                "input sanitize",
                tracing.parent(trace),
                {
                    t.REQUEST_ID: rid,
                    t.GEN_AI_REQUEST_MODEL: request.model,
                    t.TENANT: request.tenant,
                },
            )
            if not trace:
                trace = tracing.headers(span)
        parent = tracing.parent(trace)
        for f in found:
            metrics.INPUT_FINDINGS.labels(f.type, f.rule, verdict.decision).inc()
        if verdict.decision in ("block", "flag"):
            self._counts["blocked" if verdict.decision == "block" else "flagged"] += 1
        if verdict.decision == "flag":
            log.warning(
                "input flagged",
                request_id=rid,
                data_policy=verdict.data_decision,
                findings=[msgspec.to_builtins(f) for f in found],
            )
        if rejection is None:
            request = await self.tokenizers.tokenized(request)
            if verdict.mask_output:
                # the output comes back through this instance's filter, then to the client
                request = through_filter(request, self._filter_prefix)
                client = request.client_reply_to
                self._passed.forget((client, rid))
                # keyed by the client's subject: another request reusing the id (or a
                # redelivery of this one) never shares or resets this stream
                self._streams.setdefault(
                    client,
                    FilteredStream(
                        rid,
                        client,
                        time.monotonic(),
                        request.deadline,
                        json_output=json_output(request),
                        given=given_pii(request) if verdict.refuse_tool_pii else None,
                    ),
                )
                if parent is not None:
                    self._filter_traces.setdefault(client, _FilterTrace(parent))
            accepted = RequestAccepted(request=request, accepted_at=time.time(), findings=found)
            try:
                partition = self.partitions.choose(request, time.monotonic())
                await publish_durable(
                    js,
                    accepted_subject(partition),
                    accepted,
                    request_id=rid,
                    msg_id=accepted_id(rid, msg),
                    trace=trace,
                )
            except BaseException as exc:
                # the filter's state stays: a publish whose ack was lost may have been
                # stored, and its stream then comes through here with the settings
                # above; a redelivered submit finds it (setdefault), and one never
                # stored is forgotten by the idle sweep
                if span is not None:
                    span.end(f"publish_failed: {exc!r}")
                raise
            self._counts["accepted"] += 1
        else:
            # recorded first: told only once, a redelivered submit's rejection not again
            told = await record_end(
                js, ENDED, rejection, request_id=rid, msg_id=rejected_id(rid, msg)
            )
            if rejection.param == "reply_to":  # nowhere to answer: keep it with the reason
                await self.ctx.dead_letters.send(msg, rejection.reason)
            elif told:
                await nc.publish(request.reply_to, encode(rejection), headers=request_headers(rid))
            self._counts["rejected"] += 1
            metrics.REQUESTS.labels(self.name, request.model, "request.rejected").inc()
        if span is not None:
            span.set_attribute("inferbus.input.findings", len(found))
            if found:
                span.set_attribute("inferbus.input.rules", sorted({f.rule for f in found}))
            span.end(f"{rejection.code}: {rejection.reason}" if rejection else "")
        if rejection is not None:  # it ends here: its trace is decided here
            e2e = time.time() - request.created_at if request.created_at else 0.0
            # a refusal is the client's doing, not a failure: kept as any request is
            # (a flood of payloads must not flood the traces; the metrics count them)
            trace_decision = tracing.end_request(parent, request_id=rid, failed=False, e2e_s=e2e)
            log.info(
                "request ended",
                request_id=rid,
                model=request.model,
                tenant=request.tenant,
                outcome="request.rejected",
                code=rejection.code,
                reason=rejection.reason,
                e2e_s=round(e2e, 6),
                rules=sorted({f.rule for f in found}),
                **tracing.log_fields(parent, trace_decision),
            )
        await msg.ack()

    async def _invalid(self, msg: Msg, error: str) -> None:
        """Dead-letter an undecodable request, and answer its sender when we can."""
        self._counts["invalid"] += 1
        await self.ctx.dead_letters.send(msg, f"undecodable RequestSubmitted: {error}")
        addr = _addressed(msg.data)
        tenant = tenant_of_subject(msg.subject, SUBMIT)
        if addr is not None and addr.reply_to:
            rid = addr.request_id
            if tenant:  # its own replies only (another's may be named), by the platform's id
                rid = tenant_request_id(tenant, rid)
                if not addr.reply_to.startswith(tenant_reply_prefix(tenant)):
                    await msg.ack()
                    return
            failed = RequestFailed(
                request_id=rid,
                code=FailureCode.INVALID_REQUEST,
                reason=f"invalid request: {error}",
            )
            await self.ctx.nc.publish(addr.reply_to, encode(failed))
        await msg.ack()


def accepted_id(request_id: str, submit: Msg) -> str:
    """The accepted event's Nats-Msg-Id: the request id and where the submit is stored
    (its stream and sequence). A redelivered submit (a sanitizer that died before its
    ack, a NATS restart that forgot the consumer's delivery count) dedupes to the first
    accepted event; another copy of it stored again (a client's resend: tenants' submits
    dedupe for 0.1 s only) or another submit reusing the id does not, and the scheduler,
    which knows the id, answers it: a resend of a request that ended, or a reuse,
    ``duplicate_request`` (issue 42 item 11: one deduplicated here was never answered)."""
    where = submit.metadata
    return f"{request_id}:{where.stream}:{where.sequence.stream}:accepted"


def rejected_id(request_id: str, submit: Msg) -> str:
    """A rejection's record on ``ib.req.ended``, per stored submit: a redelivered one
    is not told twice, a client's resend (after ``rate_limited``, say) is told."""
    where = submit.metadata
    return f"{request_id}:{where.stream}:{where.sequence.stream}:rejected"
