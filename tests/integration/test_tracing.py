"""A request's trace across every service process, exported over OTLP to a receiver
in the test: every stage span under the request's root, with its attributes, and
tail sampling that keeps slow and failed requests and exactly the drawn share of
the rest (the draw comes from the trace id, so the test knows it in advance)."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import nats
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from testkit.otlp_sink import OtlpSink
from testkit.procs import ServiceProcess, start_all

from inferbus.contracts import TRACE_DECIDED, TraceDecided
from inferbus.shared.codec import decode
from inferbus.shared.natsserver import NatsServer
from inferbus.shared.tracing import TracePolicy, Tracing
from inferbus.shared.tracing.attributes import REQUEST_ID

pytestmark = [pytest.mark.integration]

FAST, SLOW = "traced-fast", "traced-slow"
STAGES = {
    "gateway receive": "inferbus-gateway",
    "first token": "inferbus-gateway",
    "stream out": "inferbus-gateway",
    "input sanitize": "inferbus-sanitizer",
    "output pii filter": "inferbus-sanitizer",
    "queue wait": "inferbus-scheduler",
    "schedule": "inferbus-scheduler",
    "engine queue": "inferbus-worker",
    "prefill": "inferbus-worker",
    "decode": "inferbus-worker",
}


@pytest.fixture
async def traced(tmp_path):
    """A platform of its own (its NATS too) with tracing on, exporting to ``sink``."""
    sink = await OtlpSink().start()
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "INFERBUS_TRACE_SLOW_S": "0.5",
        "INFERBUS_TRACE_KEEP_RATIO": "0.5",
    }
    procs = [
        ServiceProcess("sanitizer", server.url, tmp_path, name="tr-sanitizer", env=env),
        ServiceProcess("scheduler", server.url, tmp_path, name="tr-scheduler", env=env),
        ServiceProcess(
            "worker",
            server.url,
            tmp_path,
            "--model",
            FAST,
            "--heartbeat-interval-s",
            "0.3",
            name="tr-worker-fast",
            env=env,
        ),
        ServiceProcess(
            "worker",
            server.url,
            tmp_path,
            "--model",
            SLOW,
            "--heartbeat-interval-s",
            "0.3",
            "--sim-decode-s-per-step",
            "0.02",
            name="tr-worker-slow",
            env=env,
        ),
        ServiceProcess("gateway", server.url, tmp_path, name="tr-gateway", env=env),
    ]
    start_all(procs)
    gateway = procs[-1]
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the gateway learns models from heartbeats
            async with http.get(f"{gateway.base}/v1/models") as r:
                if {FAST, SLOW} <= {m["id"] for m in (await r.json())["data"]}:
                    break
            await asyncio.sleep(0.1)
        yield gateway.base, http, sink, procs
    for p in reversed(procs):
        p.stop()
    server.stop()
    await sink.stop()


ECHO_PHONE = "/echo call me at +1 415 555 0100 " + "and then some more words " * 6
"""Longer than 40 tokens of echo (3 characters a token): a 40-token answer ends by length."""


async def chat(
    http, base: str, model: str, trace_id: str, max_tokens: int, timeout: str | None = None
) -> int:
    headers = {"traceparent": f"00-{trace_id}-{random.getrandbits(64):016x}-01"}
    if timeout:
        headers["X-Request-Timeout"] = timeout
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        # echoed back by the sim engine: the phone number is in the output, to be masked
        "messages": [{"role": "user", "content": ECHO_PHONE}],
    }
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def wait_for(
    sink: OtlpSink, trace_ids: set[str], names: set[str], timeout: float = 15.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(names <= {s.name for s in sink.trace(t)} for t in trace_ids):
            return
        await asyncio.sleep(0.1)
    missing = {t: names - {s.name for s in sink.trace(t)} for t in trace_ids}
    raise AssertionError(f"spans missing: {missing}")


async def test_a_slow_request_has_every_stage_under_its_root_across_processes(traced):
    base, http, sink, _ = traced
    tid = f"{random.getrandbits(128):032x}"
    assert await chat(http, base, SLOW, tid, max_tokens=40) == 200  # 0.8 s: slow
    await wait_for(sink, {tid}, set(STAGES) | {f"chat {SLOW}"})
    spans = {s.name: s for s in sink.trace(tid)}
    root = spans[f"chat {SLOW}"]
    assert root.service == "inferbus-gateway"
    for name, service in STAGES.items():
        assert spans[name].service == service, name
        assert spans[name].parent_span_id == root.span_id, name  # the right parent
        assert root.start_ns <= spans[name].start_ns <= spans[name].end_ns <= root.end_ns, name
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == SLOW
    assert root.attributes["gen_ai.usage.output_tokens"] == 40
    assert root.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert root.attributes["http.response.status_code"] == 200
    decoding = spans["decode"].attributes
    assert decoding["gen_ai.usage.output_tokens"] == 40
    assert decoding["inferbus.worker_id"].startswith("tr-worker-slow")
    assert "inferbus.prefill_tokens" in spans["prefill"].attributes
    assert spans["queue wait"].attributes["inferbus.lane"] == "short"
    assert spans["schedule"].attributes["inferbus.worker_id"] == decoding["inferbus.worker_id"]
    assert spans["output pii filter"].attributes["inferbus.pii.masked"] >= 1  # the phone
    # the decode stage is where the 0.8 s went
    assert spans["decode"].end_ns - spans["decode"].start_ns > 0.5e9


async def test_failed_requests_are_kept_and_fast_ones_by_the_draw(traced):
    base, http, sink, _ = traced
    rng = random.Random(11)
    fast = [f"{rng.getrandbits(128):032x}" for _ in range(24)]
    # the kept share is 0.5: the traces whose id's low 64 bits fall under half their range
    drawn = {t for t in fast if int(t, 16) & (2**64 - 1) < 2**63}
    assert 0 < len(drawn) < len(fast)
    statuses = await asyncio.gather(*(chat(http, base, FAST, t, max_tokens=4) for t in fast))
    assert statuses == [200] * len(fast)
    failed = f"{rng.getrandbits(128):032x}"
    while int(failed, 16) & (2**64 - 1) < 2**63:  # one the draw alone would drop
        failed = f"{rng.getrandbits(128):032x}"
    # its deadline passes while the slow worker decodes: deadline_exceeded
    assert await chat(http, base, SLOW, failed, max_tokens=200, timeout="0.3") in (200, 504)
    await wait_for(sink, drawn, {"gateway receive", "input sanitize", "queue wait", "decode"})
    await wait_for(sink, {failed}, {"input sanitize", "queue wait", "schedule"})
    await asyncio.sleep(1.5)  # what was dropped would have come by now
    kept = {s.trace_id for s in sink.spans} & set(fast)
    assert drawn <= kept
    for extra in kept - drawn:  # kept as slow: a loaded machine took 0.5 s over it
        spans = sink.trace(extra)
        took_ns = max(s.end_ns for s in spans) - min(s.start_ns for s in spans)
        assert took_ns >= 0.4e9, (extra, [(s.name, s.end_ns - s.start_ns) for s in spans])
    failed_spans = sink.trace(failed)
    assert any(s.error.startswith("deadline_exceeded") for s in failed_spans), [
        (s.name, s.error) for s in failed_spans
    ]


def in_memory(service: str) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return (
        Tracing.with_exporter(
            service,
            TracePolicy(slow_s=1.0, keep_ratio=0.0),
            exporter,
            export=SimpleSpanProcessor(exporter),
        ),
        exporter,
    )


def names(exporter: InMemorySpanExporter) -> list[str]:
    return sorted(s.name for s in exporter.get_finished_spans())


async def test_decisions_reach_other_processes_in_batches(nats_url):
    """Two services' samplers joined by the real decision subject: the one that ends
    the request decides; the other exports or drops what it held."""
    worker, worker_out = in_memory("worker")
    gateway, gateway_out = in_memory("gateway")
    conns = [await nats.connect(nats_url) for _ in range(3)]
    seen = []

    async def count(msg):
        seen.append(msg)

    await conns[2].subscribe(TRACE_DECIDED, cb=count)
    await worker.listen(conns[0])
    await gateway.listen(conns[1])
    try:
        roots = [gateway.start(f"r{i}", attributes={REQUEST_ID: f"r{i}"}) for i in range(10)]
        contexts = [gateway.parent(gateway.headers(r)) for r in roots]
        for i, ctx in enumerate(contexts):
            gateway.record("gateway receive", ctx, 1, 2, {REQUEST_ID: f"r{i}"})
            worker.record("decode", ctx, 2, 3, {REQUEST_ID: f"r{i}"})
            # every third request is slow: kept; the rest are dropped
            worker.end_request(
                ctx, request_id=f"r{i}", failed=False, e2e_s=2.0 if i % 3 == 0 else 0.01
            )
        for _ in range(100):
            if gateway.sampler is not None and gateway.sampler.buffered_spans == 0:
                break
            await asyncio.sleep(0.02)
        for r in roots:
            r.end()
        assert names(gateway_out).count("gateway receive") == 4
        roots_kept = [
            s.name for s in gateway_out.get_finished_spans() if s.name != "gateway receive"
        ]
        assert sorted(roots_kept) == ["r0", "r3", "r6", "r9"]
        assert names(worker_out) == ["decode"] * 4
        # ten decisions, batched into one or two messages (not one each)
        assert 1 <= len(seen) <= 2
        decided = [decode(m.data, TraceDecided) for m in seen]
        kept = sorted(d.request_id for ev in decided for d in ev.kept)
        assert kept == ["r0", "r3", "r6", "r9"]
        assert len([d for ev in decided for d in ev.dropped]) == 6
    finally:
        await worker.close()
        await gateway.close()
        for c in conns:
            await c.close()
