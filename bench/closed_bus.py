"""The cost of the closed bus: the platform with NATS users and permissions against
the same platform with an open bus, in one run.

Two ``inferbus up --engine sim`` platforms run side by side, one closed (the default:
every service its own NATS user, the client a tenant whose requests arrive on its own
subject and pass the sanitizer's tenant check) and one ``--open-bus``. The same load
(C concurrent streams of T tokens) goes through the NATS client and through the HTTP
gateway of each, in interleaved rounds (the best round of each path kept), so machine
noise hits both alike.

    python bench/closed_bus.py [--concurrency 16] [--tokens 256] [--requests 64] [--rounds 3]

Prints tokens/s and TTFT p50 per path and platform, and closed/open ratios; the last
line is the same as one JSON object. Goal: closed at least 0.95x open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

import aiohttp
from platform_up import new_tenant, start_up
from stream_overhead import Result, http_one, nats_one, run_load

from inferbus.client import Client
from inferbus.shared.buscreds import CREDS_ENV


async def measure(args: argparse.Namespace, platforms: dict[str, tuple[str, str, str]]) -> dict:
    c, t, r = args.concurrency, args.tokens, args.requests
    clients, sessions, loads = [], [], {}
    for name, (nats_url, gateway, creds) in platforms.items():
        client = await Client.connect(nats_url, creds=creds or None)
        http = aiohttp.ClientSession(gateway, connector=aiohttp.TCPConnector(limit=0))
        clients.append(client)
        sessions.append(http)
        loads[f"{name} NATS client"] = lambda i, cl=client: nats_one(cl, t, i)
        loads[f"{name} HTTP SSE"] = lambda i, h=http: http_one(h, t, i)
    out: dict[str, Result] = {}
    try:
        for one in loads.values():
            await run_load(one, c, max(c, r // 8))  # warm-up
        for _ in range(args.rounds):
            for name, one in loads.items():
                res = await run_load(one, c, r)
                if name not in out or res.tokens_per_s > out[name].tokens_per_s:
                    out[name] = res
    finally:
        for client in clients:
            await client.close()
        for http in sessions:
            await http.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        closed_state, open_state = Path(tmp) / "closed", Path(tmp) / "open"
        closed, closed_nats, closed_http = start_up(closed_state, "--engine", "sim")
        tenant = new_tenant(closed_state, closed_nats)
        os.environ.pop(CREDS_ENV, None)  # each client below says who it is
        opened, open_nats, open_http = start_up(open_state, "--engine", "sim", "--open-bus")
        try:
            results = asyncio.run(
                measure(
                    args,
                    {
                        "closed": (closed_nats, closed_http, tenant),
                        "open": (open_nats, open_http, ""),
                    },
                )
            )
        finally:
            for proc in (closed, opened):
                proc.send_signal(2)
            for proc in (closed, opened):
                proc.wait(60)

    print(
        f"\nconcurrency {args.concurrency}, {args.tokens} tokens per request, "
        f"{args.requests} requests per round, best of {args.rounds} rounds"
    )
    print(f"{'path':<24}{'tokens/s':>10}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
    for name, res in results.items():
        print(f"{name:<24}{res.tokens_per_s:>10,.0f}{res.pct(0.5):>13.2f}{res.pct(0.99):>13.2f}")
    ratios = {}
    for path in ("NATS client", "HTTP SSE"):
        closed_r, open_r = results[f"closed {path}"], results[f"open {path}"]
        ratios[path] = {
            "throughput": round(closed_r.tokens_per_s / open_r.tokens_per_s, 3),
            "ttft_p50_added_ms": round(closed_r.pct(0.5) - open_r.pct(0.5), 3),
        }
        print(
            f"closed/open {path:<12} throughput {ratios[path]['throughput']:.3f}x, "
            f"TTFT p50 {ratios[path]['ttft_p50_added_ms']:+.2f} ms"
        )
    print(
        json.dumps(
            {
                "bench": "closed_bus",
                "concurrency": args.concurrency,
                "tokens": args.tokens,
                "results": {
                    k: {"tokens_per_s": round(v.tokens_per_s), "ttft_p50_ms": round(v.pct(0.5), 3)}
                    for k, v in results.items()
                },
                "closed_over_open": ratios,
            }
        )
    )


if __name__ == "__main__":
    main()
