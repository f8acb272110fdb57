"""Stream overhead: the full inferbus path against the same engine streamed bare over NATS.

The platform (``inferbus up``: embedded nats-server, sanitizer, scheduler, one sim
worker at zero cost, gateway) streams T tokens to C concurrent clients, read
through the NATS client and through HTTP SSE. The reference is the least any NATS
streaming design must do with the same engine: a publisher process that, on a
trigger, runs the same sim engine (zero cost, the worker's defaults) and publishes
each output it yields as a msgspec TokenChunk to the client's inbox, then a terminal
event. Engine, tokens, coalescing (outputs a slow reader let pile up are merged, as
in the worker and in vLLM's output collector) and message format are the platform's;
what the reference leaves out is exactly the platform: JetStream submit, sanitizer,
scheduler, the worker's bookkeeping and the gateway. Every path is read by the same
decoding client in this process.

    python bench/stream_overhead.py [--concurrency 16] [--tokens 256] [--requests 64]

Prints tokens/s and time-to-first-token (p50/p99) for each path and the ratios
against the bare stream; the last line is the same as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import nats
from aiohttp import web
from platform_up import nats_auth, start_up

from inferbus.client import Client
from inferbus.contracts import (
    ChatMessage,
    ReplyEvent,
    RequestFinished,
    SamplingParams,
    TokenChunk,
    Usage,
)
from inferbus.shared.codec import decode, encode
from inferbus.shared.natsserver import free_port

TRIGGER = "bench.bare.trigger"
BARE_NATS = "bare engine → NATS"
BARE_HTTP = "bare engine → SSE"
REFERENCE = {"inferbus NATS client": BARE_NATS, "inferbus HTTP SSE": BARE_HTTP}
"""Each platform path against the bare path of the same transport."""


class Trigger(msgspec.Struct):
    reply_to: str
    request_id: str
    prompt: str
    tokens: int


# -- the bare reference: a separate process, as the worker is ---------------------------


async def bare_publisher(url: str) -> None:
    from inferbus.services.worker.engine import EngineOptions, EngineRequest
    from inferbus.services.worker.sim import SimEngine, SimTiming

    opts = EngineOptions()  # the worker's defaults, as `inferbus up --engine sim` runs it
    engine = SimEngine("sim-model", SimTiming(), max_num_seqs=opts.max_num_seqs)
    await engine.start()
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024, **nats_auth())
    stop = asyncio.Event()

    serving: set[asyncio.Task[None]] = set()

    async def on_trigger(msg) -> None:
        t = msgspec.json.decode(msg.data, type=Trigger)
        task = asyncio.create_task(serve(t))
        serving.add(task)
        task.add_done_callback(serving.discard)

    async def serve(t: Trigger) -> None:
        request = EngineRequest(
            request_id=t.request_id,
            model="sim-model",
            prompt=t.prompt,  # as the NATS client sends it
            sampling=SamplingParams(max_tokens=t.tokens),
        )
        seq = 0
        async for out in engine.generate(request):
            if out.text or out.token_ids:
                await nc.publish(
                    t.reply_to,
                    encode(
                        TokenChunk(
                            request_id=t.request_id, seq=seq, text=out.text, token_ids=out.token_ids
                        )
                    ),
                )
                seq += 1
            if out.finish_reason is not None:
                await nc.publish(
                    t.reply_to,
                    encode(
                        RequestFinished(
                            request_id=t.request_id,
                            finish_reason=out.finish_reason,
                            chunks=seq,
                            usage=Usage(
                                prompt_tokens=out.prompt_tokens,
                                completion_tokens=out.completion_tokens,
                            ),
                        )
                    ),
                )
                return

    async def chat(request: web.Request) -> web.StreamResponse:
        """The same engine behind the least an OpenAI-style SSE server does: one event per
        engine output (outputs that piled up while a write waited come merged), usage, done."""
        body = await request.json()
        rid = f"bare-{next(ids)}"
        engine_request = EngineRequest(
            request_id=rid,
            model="sim-model",
            messages=[ChatMessage(**m) for m in body["messages"]],
            sampling=SamplingParams(max_tokens=body["max_tokens"]),
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async for out in engine.generate(engine_request):
            if out.text:
                delta = {"choices": [{"index": 0, "delta": {"content": out.text}}]}
                await resp.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
            if out.finish_reason is not None:
                usage = {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": out.prompt_tokens,
                        "completion_tokens": out.completion_tokens,
                    },
                }
                await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
                break
        await resp.write(b"data: [DONE]\n\n")
        return resp

    ids = itertools.count()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    await nc.subscribe(TRIGGER, cb=on_trigger)
    await nc.flush()
    print(f"ready http://127.0.0.1:{port}", flush=True)
    await stop.wait()


# -- clients -------------------------------------------------------------------------------


class Result(msgspec.Struct):
    tokens: int
    seconds: float
    ttft: list[float]
    messages: int
    """Token messages (or SSE events) the client read: tokens/messages is the coalescing."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


async def run_load(one, concurrency: int, requests: int) -> Result:
    sem = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    tokens = messages = 0

    async def task(i: int) -> None:
        nonlocal tokens, messages
        async with sem:
            t, n, m = await one(i)
            ttfts.append(t)
            tokens += n
            messages += m

    start = time.perf_counter()
    await asyncio.gather(*[task(i) for i in range(requests)])
    return Result(tokens=tokens, seconds=time.perf_counter() - start, ttft=ttfts, messages=messages)


async def bare_one(nc, tokens: int, i: int) -> tuple[float, int, int]:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_msgs_limit=1_000_000)
    t0 = time.perf_counter()
    await nc.publish(
        TRIGGER,
        msgspec.json.encode(
            Trigger(reply_to=inbox, request_id=f"b{i}", prompt=f"bench prompt {i}", tokens=tokens)
        ),
    )
    ttft, n, m = 0.0, 0, 0
    while True:
        ev = decode((await sub.next_msg(timeout=30)).data, ReplyEvent)
        if isinstance(ev, TokenChunk):
            if n == 0:
                ttft = time.perf_counter() - t0
            n += len(ev.token_ids)
            m += 1
        else:
            assert isinstance(ev, RequestFinished), ev
            break
    await sub.unsubscribe()
    assert n == tokens
    return ttft, n, m


async def nats_one(client: Client, tokens: int, i: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    stream = client.stream("sim-model", f"bench prompt {i}", max_tokens=tokens)
    ttft, n, m = 0.0, 0, 0
    async for chunk in stream:
        if n == 0:
            ttft = time.perf_counter() - t0
        n += chunk.tokens
        m += 1
    assert stream.outcome and stream.outcome.usage.completion_tokens == tokens
    return ttft, n, m


async def http_one(http: aiohttp.ClientSession, tokens: int, i: int) -> tuple[float, int, int]:
    body = {
        "model": "sim-model",
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"bench prompt {i}"}],
    }
    t0 = time.perf_counter()
    ttft, n, m = 0.0, 0, 0
    async with http.post("/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
            elif obj["choices"] and obj["choices"][0]["delta"].get("content"):
                m += 1
                if ttft == 0.0:
                    ttft = time.perf_counter() - t0
    assert n == tokens
    return ttft, n, m


# -- orchestration ---------------------------------------------------------------------------


def start_platform(state: Path) -> tuple[subprocess.Popen[str], str, str]:
    return start_up(state, "--engine", "sim")


async def measure(
    args: argparse.Namespace, nats_url: str, gateway: str, bare_http: str
) -> dict[str, Result]:
    c, t, r = args.concurrency, args.tokens, args.requests
    out: dict[str, Result] = {}
    nc = await nats.connect(nats_url, pending_size=64 * 1024 * 1024, **nats_auth())
    client = await Client.connect(nats_url)
    conn = aiohttp.TCPConnector(limit=0)
    bare_conn = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(gateway, connector=conn) as http,
        aiohttp.ClientSession(bare_http, connector=bare_conn) as bare_http_session,
    ):
        loads = {
            BARE_NATS: lambda i: bare_one(nc, t, i),
            "inferbus NATS client": lambda i: nats_one(client, t, i),
            BARE_HTTP: lambda i: http_one(bare_http_session, t, i),
            "inferbus HTTP SSE": lambda i: http_one(http, t, i),
        }
        for one in loads.values():
            await run_load(one, c, max(c, r // 8))  # warm-up
        for _ in range(args.rounds):  # interleaved rounds: noise hits every path alike
            for name, one in loads.items():
                res = await run_load(one, c, r)
                best = out.get(name)
                if best is None or res.tokens_per_s > best.tokens_per_s:
                    out[name] = res
    await client.close()
    await nc.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bare-publisher", metavar="NATS_URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_publisher:
        asyncio.run(bare_publisher(args.bare_publisher))
        return

    with tempfile.TemporaryDirectory() as tmp:
        up, nats_url, gateway = start_platform(Path(tmp))
        bare = subprocess.Popen(
            [sys.executable, __file__, "--bare-publisher", nats_url],
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = bare.stdout.readline().split() if bare.stdout else []
        assert ready[:1] == ["ready"], ready
        try:
            results = asyncio.run(measure(args, nats_url, gateway, ready[1]))
        finally:
            bare.terminate()
            up.send_signal(2)
            up.wait(60)

    print(
        f"\nconcurrency {args.concurrency}, {args.tokens} tokens per request, "
        f"{args.requests} requests per round, best of {args.rounds} rounds"
    )
    print(
        f"{'path':<24}{'tokens/s':>12}{'ratio':>8}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}"
        f"{'added p50 ms':>14}{'tokens/msg':>12}"
    )
    summary = {}
    for name, res in results.items():
        ref = results[REFERENCE.get(name, name)]
        ratio = res.tokens_per_s / ref.tokens_per_s
        added = res.pct(0.5) - ref.pct(0.5)
        print(
            f"{name:<24}{res.tokens_per_s:>12,.0f}{ratio:>8.2f}{res.pct(0.5):>14.2f}"
            f"{res.pct(0.99):>14.2f}{added:>14.2f}{res.tokens / res.messages:>12.1f}"
        )
        summary[name] = {
            "tokens_per_s": round(res.tokens_per_s),
            "ratio": round(ratio, 3),
            "ttft_p50_ms": round(res.pct(0.5), 3),
            "ttft_p99_ms": round(res.pct(0.99), 3),
            "added_ttft_p50_ms": round(added, 3),
            "tokens_per_message": round(res.tokens / res.messages, 2),
        }
    print(
        json.dumps(
            {
                "bench": "stream_overhead",
                "concurrency": args.concurrency,
                "tokens": args.tokens,
                "results": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
