"""Stream overhead: the full inferbus path against a bare nats-py stream, in one run.

The platform (``inferbus up``: embedded nats-server, sanitizer, scheduler, one sim
worker at zero cost, gateway) streams T tokens to C concurrent clients, read
through the NATS client and through HTTP SSE. The reference is the least any NATS
streaming design must do: a publisher process that, on a trigger, publishes the
same msgspec TokenChunk messages to the client's inbox, one per token, and a
terminal event. Both are read by the same decoding client in this process.

    python bench/stream_overhead.py [--concurrency 16] [--tokens 256] [--requests 64]

Prints tokens/s and time-to-first-token (p50/p99) for each path and the ratios
against the bare stream; the last line is the same as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import nats
from platform_up import nats_auth, start_up

from inferbus.client import Client
from inferbus.contracts import ReplyEvent, RequestFinished, TokenChunk, Usage
from inferbus.shared.codec import decode, encode

TRIGGER = "bench.bare.trigger"


class Trigger(msgspec.Struct):
    reply_to: str
    request_id: str
    tokens: int


# -- the bare reference: a separate process, as the worker is ---------------------------


async def bare_publisher(url: str) -> None:
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024, **nats_auth())
    stop = asyncio.Event()

    async def on_trigger(msg) -> None:
        t = msgspec.json.decode(msg.data, type=Trigger)
        asyncio.create_task(serve(t))

    async def serve(t: Trigger) -> None:
        for i in range(t.tokens):
            await nc.publish(
                t.reply_to,
                encode(
                    TokenChunk(request_id=t.request_id, seq=i, text="token ", token_ids=[i % 50])
                ),
            )
            if i % 16 == 15:
                await asyncio.sleep(0)  # as an engine step yields between tokens
        await nc.publish(
            t.reply_to,
            encode(
                RequestFinished(
                    request_id=t.request_id,
                    finish_reason="length",
                    chunks=t.tokens,
                    usage=Usage(prompt_tokens=4, completion_tokens=t.tokens),
                )
            ),
        )

    await nc.subscribe(TRIGGER, cb=on_trigger)
    await nc.flush()
    print("ready", flush=True)
    await stop.wait()


# -- clients -------------------------------------------------------------------------------


class Result(msgspec.Struct):
    tokens: int
    seconds: float
    ttft: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


async def run_load(one, concurrency: int, requests: int) -> Result:
    sem = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    tokens = 0

    async def task(i: int) -> None:
        nonlocal tokens
        async with sem:
            t, n = await one(i)
            ttfts.append(t)
            tokens += n

    start = time.perf_counter()
    await asyncio.gather(*[task(i) for i in range(requests)])
    return Result(tokens=tokens, seconds=time.perf_counter() - start, ttft=ttfts)


async def bare_one(nc, tokens: int, i: int) -> tuple[float, int]:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_msgs_limit=1_000_000)
    t0 = time.perf_counter()
    await nc.publish(
        TRIGGER, msgspec.json.encode(Trigger(reply_to=inbox, request_id=f"b{i}", tokens=tokens))
    )
    ttft, n = 0.0, 0
    while True:
        ev = decode((await sub.next_msg(timeout=30)).data, ReplyEvent)
        if isinstance(ev, TokenChunk):
            if n == 0:
                ttft = time.perf_counter() - t0
            n += len(ev.token_ids)
        else:
            break
    await sub.unsubscribe()
    return ttft, n


async def nats_one(client: Client, tokens: int, i: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    stream = client.stream("sim-model", f"bench prompt {i}", max_tokens=tokens)
    ttft, n = 0.0, 0
    async for chunk in stream:
        if n == 0:
            ttft = time.perf_counter() - t0
        n += chunk.tokens
    assert stream.outcome and stream.outcome.usage.completion_tokens == tokens
    return ttft, n


async def http_one(http: aiohttp.ClientSession, tokens: int, i: int) -> tuple[float, int]:
    body = {
        "model": "sim-model",
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"bench prompt {i}"}],
    }
    t0 = time.perf_counter()
    ttft, n = 0.0, 0
    async with http.post("/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
            elif obj["choices"] and obj["choices"][0]["delta"].get("content") and ttft == 0.0:
                ttft = time.perf_counter() - t0
    assert n == tokens
    return ttft, n


# -- orchestration ---------------------------------------------------------------------------


def start_platform(state: Path) -> tuple[subprocess.Popen[str], str, str]:
    return start_up(state, "--engine", "sim")


async def measure(args: argparse.Namespace, nats_url: str, gateway: str) -> dict[str, Result]:
    c, t, r = args.concurrency, args.tokens, args.requests
    out: dict[str, Result] = {}
    nc = await nats.connect(nats_url, pending_size=64 * 1024 * 1024, **nats_auth())
    client = await Client.connect(nats_url)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(gateway, connector=conn) as http:
        loads = {
            "bare nats-py": lambda i: bare_one(nc, t, i),
            "inferbus NATS client": lambda i: nats_one(client, t, i),
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
        assert bare.stdout and bare.stdout.readline().strip() == "ready"
        try:
            results = asyncio.run(measure(args, nats_url, gateway))
        finally:
            bare.terminate()
            up.send_signal(2)
            up.wait(60)

    ref = results["bare nats-py"]
    print(
        f"\nconcurrency {args.concurrency}, {args.tokens} tokens per request, "
        f"{args.requests} requests per round, best of {args.rounds} rounds"
    )
    print(
        f"{'path':<24}{'tokens/s':>12}{'ratio':>8}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}"
        f"{'added p50 ms':>14}"
    )
    summary = {}
    for name, res in results.items():
        ratio = res.tokens_per_s / ref.tokens_per_s
        added = res.pct(0.5) - ref.pct(0.5)
        print(
            f"{name:<24}{res.tokens_per_s:>12,.0f}{ratio:>8.2f}{res.pct(0.5):>14.2f}"
            f"{res.pct(0.99):>14.2f}{added:>14.2f}"
        )
        summary[name] = {
            "tokens_per_s": round(res.tokens_per_s),
            "ratio": round(ratio, 3),
            "ttft_p50_ms": round(res.pct(0.5), 3),
            "ttft_p99_ms": round(res.pct(0.99), 3),
            "added_ttft_p50_ms": round(added, 3),
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
