"""The platform's CPU per 1,000 output tokens, by process, on the sim engine paced as a
GPU produces tokens (issue 40's last part: the token path).

    python bench/token_path.py [--streams 100] [--decode-s 0.02] [--tokens 200] \\
        [--window-s 10] [--path http|nats] [--census]

``inferbus up --engine sim`` with two workers, each engine step ``--decode-s`` (one
token per stream per step: 50 tokens a second a stream at 0.02), serves
``--streams`` concurrent streaming chat requests of ``--tokens`` tokens, each client
starting the next as one ends, over HTTP SSE (``http``: gateway, sanitizer, worker)
or the NATS client (``nats``: no gateway). After a warm-up, every process's CPU
seconds (psutil: user + system) are read over ``--window-s`` seconds and divided by
the tokens the clients received in that window. Printed: tokens a second, CPU
seconds per 1,000 tokens for each kind of process (gateway, sanitizer, worker,
scheduler, nats-server, the rest) and in all; the last line is one JSON object.
The clients run in this process, which is not counted.

``--census``: also count every message on the bus in the window by its kind of
subject (ids folded to ``*``), per 1,000 tokens: which hops a token and a request
cost. The census's own subscription doubles nats-server's deliveries, so read CPU
from a run without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import nats
import psutil
from platform_up import chunk_messages, nats_auth, new_tenant, start_up

from inferbus.client import Client

MODEL = "sim-model"


def kind(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    if "nats-server" in cmd:
        return "nats-server"
    for name in ("gateway", "sanitizer", "worker", "scheduler"):
        if f"inferbus.services.{name}" in cmd:
            return name
    return "other"


def subject_kind(subject: str) -> str:
    """A subject with its ids folded: ``ib.progress.worker-0.3bb7fa`` →
    ``ib.progress.*.*``; an inbox by its owner, a JetStream ack by its consumer."""
    parts = subject.split(".")
    if parts[0] == "_INBOX":
        return ".".join(parts[:2]) if parts[1].startswith("svc-") else "_INBOX (clients)"
    if parts[:2] == ["$JS", "ACK"]:
        return ".".join(parts[:4])
    return ".".join(p if not any(c.isdigit() for c in p) else "*" for p in parts[:5])


async def census(nats_url: str, counts: dict[str, int]) -> nats.NATS:
    """Counts every message on the bus into ``counts`` by ``subject_kind``."""
    nc = await nats.connect(nats_url, **nats_auth())

    async def on(msg) -> None:
        k = subject_kind(msg.subject)
        counts[k] = counts.get(k, 0) + 1

    await nc.subscribe(">", cb=on, pending_msgs_limit=1_000_000)
    return nc


def cpu_by_kind(root: psutil.Process) -> dict[str, float]:
    out: dict[str, float] = {}
    for proc in root.children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        k = kind(proc)
        out[k] = out.get(k, 0.0) + t.user + t.system
    return out


async def http_stream(http: aiohttp.ClientSession, tokens: int, counted: list[int]) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "stream_options": {"include_usage": True},
    }
    async with http.post("/v1/chat/completions", json=body) as r:
        async for line in r.content:
            # tokens, not events: a worker's chunk_window_s puts several in an event
            if line.startswith(b'data: {"') and b'"completion_tokens"' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                counted[0] += usage.get("completion_tokens", 0)


async def nats_stream(client: Client, tokens: int, counted: list[int]) -> None:
    async for chunk in client.stream(MODEL, "tell me a long story", max_tokens=tokens):
        counted[0] += max(1, len(getattr(chunk, "token_ids", ()) or ()))


async def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        up, nats_url, http_base = start_up(
            state,
            "--engine",
            "sim",
            "--model",
            MODEL,
            "--workers",
            "2",
            f"--worker-arg=--sim-decode-s-per-step={args.decode_s}",
            "--worker-arg=--max-num-seqs=512",
        )
        root = psutil.Process(up.pid)
        counted = [0]
        stop = asyncio.Event()
        try:
            if args.path == "http":
                session = aiohttp.ClientSession(http_base, connector=aiohttp.TCPConnector(limit=0))

                def one() -> asyncio.Future:
                    return http_stream(session, args.tokens, counted)
            else:
                client = await Client.connect(
                    nats_url, "bench-token-path", creds=new_tenant(state, nats_url)
                )

                def one() -> asyncio.Future:
                    return nats_stream(client, args.tokens, counted)

            async def loop() -> None:
                while not stop.is_set():
                    try:
                        await one()
                    except Exception:
                        await asyncio.sleep(0.1)

            loops = [asyncio.create_task(loop()) for _ in range(args.streams)]
            await asyncio.sleep(args.warmup_s)
            counts: dict[str, int] = {}
            watch = await census(nats_url, counts) if args.census else None
            c0, n0, t0 = cpu_by_kind(root), counted[0], time.monotonic()
            await asyncio.sleep(args.window_s)
            c1, n1, t1 = cpu_by_kind(root), counted[0], time.monotonic()
            if watch is not None:
                await watch.close()
            sent = await chunk_messages(nats_url)
            stop.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if args.path == "http":
                await session.close()
            else:
                await client.close()
        finally:
            up.send_signal(2)
            up.wait(120)
    tokens = n1 - n0
    per_k = {k: (c1.get(k, 0.0) - c0.get(k, 0.0)) / tokens * 1000 for k in c1} if tokens else {}
    return {
        "path": args.path,
        "streams": args.streams,
        "tokens_per_s": round(tokens / (t1 - t0), 1),
        "cpu_s_per_1k_tokens": {k: round(v, 4) for k, v in sorted(per_k.items())},
        "total_cpu_s_per_1k_tokens": round(sum(per_k.values()), 4),
        "chunks_per_message": {
            k: round(v["chunks"] / v["messages"], 2) for k, v in sent.items() if v["messages"]
        },
        "messages_per_1k_tokens": {
            k: round(v / tokens * 1000, 1)
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
            if tokens
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--decode-s", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--path", choices=("http", "nats"), default="http")
    p.add_argument("--census", action="store_true", help="count the bus's messages by subject")
    args = p.parse_args()
    r = asyncio.run(measure(args))
    print(f"{r['path']}: {r['tokens_per_s']} tokens/s over {r['streams']} streams")
    for k, v in r["cpu_s_per_1k_tokens"].items():
        print(f"  {k:12s} {v:.4f} CPU s per 1,000 tokens")
    print(f"  {'all':12s} {r['total_cpu_s_per_1k_tokens']:.4f}")
    for k, v in r["chunks_per_message"].items():
        print(f"  {k} sent {v} chunks a message")
    if r["messages_per_1k_tokens"]:
        print("messages on the bus per 1,000 tokens, by subject:")
        for k, v in r["messages_per_1k_tokens"].items():
            print(f"  {v:8.1f}  {k}")
    print(json.dumps({"bench": "token_path", **r}))


if __name__ == "__main__":
    main()
