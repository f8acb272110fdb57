"""Gateway overhead: the OpenAI-compatible HTTP gateway against the NATS client on the
same path, in one run.

The platform (``inferbus up --engine sim``: zero-cost sim worker, API keys on, so the
HTTP side pays for authentication as in production) serves two loads through both
entries, in interleaved rounds so noise hits them alike:

- stream: C concurrent clients each streaming T tokens (tokens/s, TTFT);
- per request: C concurrent clients each asking for one token, not streamed
  (requests/s and latency p50/p99): what the gateway adds to every request.

    python bench/gateway_overhead.py [--concurrency 32] [--tokens 256] [--requests 128]

Prints both tables with the HTTP/NATS ratios; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
from platform_up import start_up
from stream_overhead import Result, http_one, nats_one, run_load

from inferbus.client import Client
from inferbus.services.gateway.auth import digest, new_key


async def nats_short(client: Client, i: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = await client.generate("sim-model", f"short {i}", max_tokens=1)
    assert r.outcome and r.outcome.usage.completion_tokens == 1
    return time.perf_counter() - t0, 1


async def http_short(http: aiohttp.ClientSession, i: int) -> tuple[float, int]:
    body = {
        "model": "sim-model",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": f"short {i}"}],
    }
    t0 = time.perf_counter()
    async with http.post("/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        reply = await r.json()
    assert reply["usage"]["completion_tokens"] == 1
    return time.perf_counter() - t0, 1


async def measure(
    a: argparse.Namespace, nats_url: str, gateway: str, key: str
) -> dict[str, dict[str, Result]]:
    c, t, n = a.concurrency, a.tokens, a.requests
    client = await Client.connect(nats_url)
    conn = aiohttp.TCPConnector(limit=0)
    out: dict[str, dict[str, Result]] = {"stream": {}, "request": {}}
    async with aiohttp.ClientSession(
        gateway, connector=conn, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        loads = {
            ("stream", "NATS client"): lambda i: nats_one(client, t, i),
            ("stream", "HTTP gateway"): lambda i: http_one(http, t, i),
            ("request", "NATS client"): lambda i: nats_short(client, i),
            ("request", "HTTP gateway"): lambda i: http_short(http, i),
        }
        for one in loads.values():
            await run_load(one, c, max(c, n // 8))  # warm-up
        for _ in range(a.rounds):
            for (kind, name), one in loads.items():
                res = await run_load(one, c, n)
                best = out[kind].get(name)
                if best is None or res.tokens / res.seconds > best.tokens / best.seconds:
                    out[kind][name] = res
    await client.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    key = new_key()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.toml"
        keys.write_text(f'[[keys]]\nname = "bench"\nsha256 = "{digest(key)}"\n')
        up, nats_url, gateway = start_up(
            Path(tmp) / "state", "--engine", "sim", "--api-keys-file", str(keys)
        )
        try:
            results = asyncio.run(measure(a, nats_url, gateway, key))
        finally:
            up.send_signal(2)
            up.wait(60)

    s_nats, s_http = results["stream"]["NATS client"], results["stream"]["HTTP gateway"]
    r_nats, r_http = results["request"]["NATS client"], results["request"]["HTTP gateway"]
    stream_ratio = s_http.tokens_per_s / s_nats.tokens_per_s
    request_ratio = r_http.tokens_per_s / r_nats.tokens_per_s
    added_ms = r_http.pct(0.5) - r_nats.pct(0.5)
    print(f"\nconcurrency {a.concurrency}, {a.requests} requests per round, best of {a.rounds}")
    print(f"\nstream ({a.tokens} tokens each)")
    print(f"{'entry':<16}{'tokens/s':>12}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}")
    for name, res in results["stream"].items():
        print(f"{name:<16}{res.tokens_per_s:>12,.0f}{res.pct(0.5):>14.2f}{res.pct(0.99):>14.2f}")
    print(f"HTTP/NATS throughput ratio: {stream_ratio:.2f}")
    print("\nper request (1 token, not streamed)")
    print(f"{'entry':<16}{'requests/s':>12}{'latency p50 ms':>16}{'latency p99 ms':>16}")
    for name, res in results["request"].items():
        print(f"{name:<16}{res.tokens_per_s:>12,.0f}{res.pct(0.5):>16.2f}{res.pct(0.99):>16.2f}")
    print(f"HTTP/NATS requests/s ratio: {request_ratio:.2f}; HTTP adds {added_ms:.2f} ms p50")
    print(
        json.dumps(
            {
                "bench": "gateway_overhead",
                "concurrency": a.concurrency,
                "tokens": a.tokens,
                "stream": {
                    "nats_tokens_per_s": round(s_nats.tokens_per_s),
                    "http_tokens_per_s": round(s_http.tokens_per_s),
                    "ratio": round(stream_ratio, 3),
                    "nats_ttft_p50_ms": round(s_nats.pct(0.5), 3),
                    "http_ttft_p50_ms": round(s_http.pct(0.5), 3),
                },
                "request": {
                    "nats_rps": round(r_nats.tokens_per_s),
                    "http_rps": round(r_http.tokens_per_s),
                    "ratio": round(request_ratio, 3),
                    "nats_p50_ms": round(r_nats.pct(0.5), 3),
                    "http_p50_ms": round(r_http.pct(0.5), 3),
                    "added_p50_ms": round(added_ms, 3),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
