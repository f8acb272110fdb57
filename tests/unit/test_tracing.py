"""Tail sampling: the decision at a request's end, and spans held until it comes."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferbus.shared import metrics
from inferbus.shared.tracing import (
    TracePolicy,
    Tracing,
    enabled_by_env,
    valid_context,
    verdict,
)
from inferbus.shared.tracing.attributes import REQUEST_ID

POLICY = TracePolicy(slow_s=1.0, keep_ratio=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def traced(
    policy: TracePolicy = POLICY, service: str = "svc", clock: Clock | None = None
) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    t = Tracing.with_exporter(service, policy, exporter, export=SimpleSpanProcessor(exporter))
    if clock is not None:
        assert t.sampler is not None
        t.sampler._clock = clock
        t.sampler._last_sweep = clock()
    return t, exporter


def names(exporter: InMemorySpanExporter) -> list[str]:
    return sorted(s.name for s in exporter.get_finished_spans())


def test_verdict_keeps_failed_slow_and_over_slo_and_drops_the_rest():
    p = TracePolicy(slow_s=1.0, keep_ratio=0.0, slo_ttft_s=0.2)
    assert verdict(failed=True, e2e_s=0.01, ttft_s=0.001, trace_id=5, policy=p) == (True, "failed")
    assert verdict(failed=False, e2e_s=0.3, ttft_s=0.25, trace_id=5, policy=p) == (True, "slo")
    assert verdict(failed=False, e2e_s=1.5, ttft_s=0.1, trace_id=5, policy=p) == (True, "slow")
    assert verdict(failed=False, e2e_s=0.3, ttft_s=0.1, trace_id=5, policy=p) == (False, "fast")
    everything = TracePolicy(keep_ratio=1.0)
    assert verdict(
        failed=False, e2e_s=0.0, ttft_s=None, trace_id=2**128 - 1, policy=everything
    ) == (True, "sampled")


def test_the_kept_share_is_drawn_from_the_trace_id():
    import random

    rng = random.Random(7)
    p = TracePolicy(slow_s=10.0, keep_ratio=0.1)
    ids = [rng.getrandbits(128) for _ in range(20_000)]
    kept = [
        i for i in ids if verdict(failed=False, e2e_s=0.1, ttft_s=None, trace_id=i, policy=p)[0]
    ]
    assert 0.09 < len(kept) / len(ids) < 0.11
    # every process draws alike: the same ids again give the same answer
    assert kept == [
        i for i in ids if verdict(failed=False, e2e_s=0.2, ttft_s=0.0, trace_id=i, policy=p)[0]
    ]


async def test_spans_wait_for_the_decision_then_go_or_vanish():
    t, exporter = traced()
    for rid, keep in (("slow", True), ("fast", False)):
        before = len(exporter.get_finished_spans())
        root = t.start(f"request {rid}", attributes={REQUEST_ID: rid})
        ctx = t.parent(t.headers(root))
        t.record("input sanitize", ctx, 1, 2, {REQUEST_ID: rid})
        t.record("prefill", ctx, 2, 3, {REQUEST_ID: rid})
        assert len(exporter.get_finished_spans()) == before  # held: nobody decided yet
        root.end()
        decision = t.end_request(ctx, request_id=rid, failed=False, e2e_s=2.0 if keep else 0.01)
        assert decision == ((True, "slow") if keep else (False, "fast"))
    assert names(exporter) == ["input sanitize", "prefill", "request slow"]
    assert t.sampler is not None and t.sampler.buffered_spans == 0


async def test_spans_ending_after_the_decision_follow_it():
    clock = Clock()
    t, exporter = traced(clock=clock)
    kept_root = t.start("kept", attributes={REQUEST_ID: "a"})
    dropped_root = t.start("dropped", attributes={REQUEST_ID: "b"})
    kept, dropped = (t.parent(t.headers(r)) for r in (kept_root, dropped_root))
    t.end_request(kept, request_id="a", failed=True, e2e_s=0.01)
    t.end_request(dropped, request_id="b", failed=False, e2e_s=0.01)
    t.record("stream out", kept, 1, 2, {REQUEST_ID: "a"})
    t.record("stream out", dropped, 1, 2, {REQUEST_ID: "b"})
    kept_root.end()
    dropped_root.end()
    assert names(exporter) == ["kept", "stream out"]
    clock.now = 3.0  # past the drop's grace: what was dropped is gone
    assert t.sampler is not None
    t.sampler.sweep()
    t.sampler.decide((t.trace_id(dropped), "b"), True)
    assert names(exporter) == ["kept", "stream out"]


async def test_a_later_keep_overrides_a_drop_and_a_later_drop_changes_nothing():
    t, exporter = traced()
    root = t.start("r", attributes={REQUEST_ID: "r"})
    ctx = t.parent(t.headers(root))
    t.record("decode", ctx, 1, 2, {REQUEST_ID: "r"})
    key = (t.trace_id(ctx), "r")
    assert t.sampler is not None
    t.sampler.decide(key, False)  # the worker: fast, drop
    t.sampler.decide(key, True)  # the gateway saw a slow stream out, within the grace
    t.sampler.decide(key, False)
    root.end()
    assert names(exporter) == ["decode", "r"]


async def test_requests_of_one_trace_are_decided_one_by_one():
    """A caller's trace (an agent's) holds many requests: a fast one's drop must not
    take a failing one's spans with it."""
    t, exporter = traced()
    caller = t.parent({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    for rid in ("call-1", "call-2"):
        t.record(f"queue wait {rid}", caller, 1, 2, {REQUEST_ID: rid})
    t.end_request(caller, request_id="call-1", failed=False, e2e_s=0.01)
    t.record("decode call-2", caller, 2, 3, {REQUEST_ID: "call-2"})
    t.end_request(caller, request_id="call-2", failed=True, e2e_s=0.01)
    assert names(exporter) == ["decode call-2", "queue wait call-2"]


async def test_decisions_about_requests_held_elsewhere_are_only_briefly_kept():
    clock = Clock()
    t, exporter = traced(clock=clock)
    assert t.sampler is not None
    before = metrics.TRACES.labels("svc", "dropped")._value.get()
    for i in range(100):
        t.sampler.decide((i + 1, "elsewhere"), False)
    assert t.sampler.decision((1, "elsewhere")) is None
    assert metrics.TRACES.labels("svc", "dropped")._value.get() == before
    # a span of one of them ends here just after (recorded once a publish was
    # acknowledged, while the request ended elsewhere): it follows the decision
    t.sampler.decide((7, "late"), True)
    t.record(
        "schedule",
        t.parent({"traceparent": f"00-{7:032x}-{1:016x}-01"}),
        1,
        2,
        {REQUEST_ID: "late"},
    )
    assert names(exporter) == ["schedule"] and t.sampler.buffered_spans == 0
    clock.now = 6.0  # past the hearsay window: forgotten
    t.sampler.sweep()
    t.record(
        "orphan",
        t.parent({"traceparent": f"00-{8:032x}-{1:016x}-01"}),
        1,
        2,
        {REQUEST_ID: "elsewhere"},
    )
    assert t.sampler.buffered_spans == 1


async def test_undecided_traces_are_exported_after_the_wait_and_memory_is_bounded():
    clock = Clock()
    t, exporter = traced(
        TracePolicy(keep_ratio=0.0, decision_wait_s=30.0, buffer_spans=5), clock=clock
    )
    t.record("orphan", None, 1, 2)  # its request's end was never heard of
    clock.now = 31.0
    t.record("later", None, 1, 2)  # any activity sweeps
    assert names(exporter) == ["orphan"]
    before = metrics.TRACE_SPANS_DROPPED.labels("svc")._value.get()
    for i in range(7):
        t.record(f"s{i}", None, 1, 2)  # seven traces of one span, five may wait
    assert t.sampler is not None and t.sampler.buffered_spans == 5
    assert metrics.TRACE_SPANS_DROPPED.labels("svc")._value.get() - before == 3


async def test_shutdown_exports_what_is_still_undecided():
    t, exporter = traced()
    t.record("waiting", None, 1, 2)
    await t.close()
    assert names(exporter) == ["waiting"]


def test_disabled_tracing_records_nothing_and_passes_no_context():
    t = Tracing.disabled("svc")
    assert (
        t.parent({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}) is None
    )
    assert t.record("x", None, 1, 2) is None


@pytest.mark.parametrize(
    "env,on",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_tracing_is_switched_by_the_standard_variables(env, on):
    assert enabled_by_env(env) is on


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
    ],
)
def test_a_bad_traceparent_is_no_parent(header):
    t, _ = traced()
    assert t.parent({"traceparent": header}) is None


def test_only_a_valid_context_is_passed_on():
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert valid_context({"traceparent": good, "tracestate": "a=1"}) == {
        "traceparent": good,
        "tracestate": "a=1",
    }
    assert valid_context({"traceparent": good, "tracestate": "a=\udcff"}) == {"traceparent": good}
    assert valid_context({"traceparent": good, "tracestate": "x" * 600}) == {"traceparent": good}
    assert valid_context({"traceparent": good + "-garbage"}) == {}
    # a later version's extra fields are not passed on as sent: rebuilt as version 00
    later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-\udcff"
    assert valid_context({"traceparent": later}) == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    }
    assert valid_context({"tracestate": "a=1"}) == {}


def test_context_round_trips_through_headers_with_its_tracestate():
    t, _ = traced()
    incoming = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=1",
    }
    parent = t.parent(incoming)
    assert parent is not None and t.trace_id(parent) == 0x0AF7651916CD43DD8448EB211C80319C
    span = t.start("stage", parent)
    out = t.headers(span)
    assert out["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
    assert out["traceparent"] != incoming["traceparent"] and out["tracestate"] == "vendor=1"


async def test_a_drop_waits_while_a_span_of_the_request_is_open_here():
    """The gateway's root is open until the response is written: the worker's drop
    must not take its earlier spans before the gateway has had its say."""
    clock = Clock()
    t, exporter = traced(clock=clock)
    assert t.sampler is not None
    root = t.start("chat m", attributes={REQUEST_ID: "r"})
    ctx = t.parent(t.headers(root))
    t.record("gateway receive", ctx, 1, 2, {REQUEST_ID: "r"})
    key = (t.trace_id(ctx), "r")
    t.sampler.decide(key, False)  # the worker: fast, drop
    clock.now = 10.0  # a slow client: the stream out takes long
    t.sampler.sweep()
    t.record("stream out", ctx, 2, 3, {REQUEST_ID: "r"})
    root.end()
    t.end_request(ctx, request_id="r", failed=False, e2e_s=10.0, tell="keeps")
    assert names(exporter) == ["chat m", "gateway receive", "stream out"]


async def test_a_drop_is_final_once_nothing_is_open_and_the_grace_is_over():
    clock = Clock()
    t, exporter = traced(clock=clock)
    assert t.sampler is not None
    root = t.start("chat m", attributes={REQUEST_ID: "r"})
    ctx = t.parent(t.headers(root))
    key = (t.trace_id(ctx), "r")
    t.sampler.decide(key, False)
    root.end()
    assert t.sampler.buffered_spans == 0
    clock.now = 3.0
    t.sampler.sweep()
    t.sampler.decide(key, True)
    assert names(exporter) == []


async def test_a_restored_prefix_is_a_kv_restore_span_at_the_start_of_the_prefill():
    from inferbus.contracts import RequestSubmitted, StageTimings, WorkAssigned
    from inferbus.services.worker.core import RequestStream
    from inferbus.services.worker.engine import EngineOutput, KvRestore
    from inferbus.services.worker.report import report_end

    t, exporter = traced(TracePolicy(keep_ratio=1.0))
    root = t.start("request r1", attributes={REQUEST_ID: "r1"})
    ctx = t.parent(t.headers(root))
    request = RequestSubmitted(request_id="r1", model="m", reply_to="r.r1", prompt="p")
    stream = RequestStream(WorkAssigned(request=request, worker_id="w1", attempt=1), "w1", 100.0)
    stream.started(100.1)
    stream.restored = KvRestore(
        blocks=4, tokens=512, bytes=4096, seconds=0.02, tiers={"disk": 3, "host": 1}
    )
    timings = StageTimings(queued_s=0.01, prefill_s=0.09, first_token_s=0.1, decode_s=0.2)
    out = EngineOutput(
        text="x",
        token_ids=[1],
        prompt_tokens=600,
        completion_tokens=3,
        finish_reason="stop",
        cached_tokens=512,
        timings=timings,
    )
    report_end(t, "worker", stream, stream.finished(out, 100.3), ctx, 1000.0, 100.3)
    root.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    restore, prefill = spans["kv restore"], spans["prefill"]
    assert restore.start_time == prefill.start_time  # the first thing the prefill did
    assert restore.end_time - restore.start_time == 20_000_000
    assert restore.attributes["inferbus.kv.restored_tokens"] == 512
    assert list(restore.attributes["inferbus.kv.restored_tiers"]) == ["disk", "host"]
    assert restore.attributes["inferbus.kv.restore_timed"] is True
