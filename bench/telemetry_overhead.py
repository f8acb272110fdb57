"""Telemetry overhead: the stream path with tracing and metrics on against off, in one run.

The platform (``inferbus up --engine sim``: zero-cost sim worker, so the platform's
own work is all there is to measure) is started alternately in two configurations,
round after round, and the same load is run against each:

- off: ``INFERBUS_METRICS=off`` (every metric call a no-op) and no OTLP endpoint;
- on: metrics, and tracing exported over OTLP to a receiver in this process, with
  the default tail sampling (keep >1 s and failed requests, 0.1% of the rest).

    python bench/telemetry_overhead.py [--concurrency 32] [--tokens 64] [--requests 256]

Prints tokens/s and TTFT p50/p99 per path and configuration, and on/off ratios; the
last line is the same as one JSON object. Goal: at most 5% throughput lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import aiohttp

from inferbus.client import Client
from inferbus.otlp_sink import OtlpSink
from platform_up import start_up
from stream_overhead import Result, http_one, nats_one, run_load


async def measure_once(env: dict[str, str], a: argparse.Namespace) -> dict[str, Result]:
    with tempfile.TemporaryDirectory() as tmp:
        up, nats_url, gateway = start_up(Path(tmp), "--engine", "sim", env=env)
        try:
            client = await Client.connect(nats_url)
            out: dict[str, Result] = {}
            async with aiohttp.ClientSession(gateway,
                                             connector=aiohttp.TCPConnector(limit=0)) as http:
                loads = {"HTTP SSE": lambda i: http_one(http, a.tokens, i),
                         "NATS client": lambda i: nats_one(client, a.tokens, i)}
                for name, one in loads.items():
                    await run_load(one, a.concurrency, a.concurrency)  # warm-up
                    out[name] = await run_load(one, a.concurrency, a.requests)
            await client.close()
            return out
        finally:
            up.send_signal(2)
            await asyncio.get_running_loop().run_in_executor(None, up.wait, 60)


async def measure(a: argparse.Namespace) -> tuple[dict[str, dict[str, Result]], OtlpSink]:
    sink = await OtlpSink().start()
    configs = {
        "off": {"INFERBUS_METRICS": "off", "OTEL_SDK_DISABLED": "true"},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "INFERBUS_METRICS": "on"},
    }
    best: dict[str, dict[str, Result]] = {c: {} for c in configs}
    for _ in range(a.rounds):  # alternate: drift on a noisy machine hits both alike
        for config, env in configs.items():
            for path, res in (await measure_once(env, a)).items():
                held = best[config].get(path)
                if held is None or res.tokens_per_s > held.tokens_per_s:
                    best[config][path] = res
    await sink.stop()
    return best, sink


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    best, sink = asyncio.run(measure(a))
    print(f"\nconcurrency {a.concurrency}, {a.tokens} tokens per request, {a.requests} "
          f"requests per run, best of {a.rounds} runs per configuration")
    print(f"{'path':<14}{'telemetry':<11}{'tokens/s':>12}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
    summary: dict[str, dict[str, float]] = {}
    for path in best["off"]:
        for config in ("off", "on"):
            r = best[config][path]
            print(f"{path:<14}{config:<11}{r.tokens_per_s:>12,.0f}{r.pct(0.5):>13.2f}"
                  f"{r.pct(0.99):>13.2f}")
        on, off = best["on"][path], best["off"][path]
        ratio = on.tokens_per_s / off.tokens_per_s
        print(f"{path:<14}{'on/off':<11}{ratio:>12.3f}{on.pct(0.5) - off.pct(0.5):>+13.2f}"
              f"{on.pct(0.99) - off.pct(0.99):>+13.2f}")
        summary[path] = {"throughput_ratio": round(ratio, 3),
                         "lost_pct": round(100 * (1 - ratio), 1),
                         "ttft_p50_ms_off": round(off.pct(0.5), 3),
                         "ttft_p50_ms_on": round(on.pct(0.5), 3),
                         "ttft_p99_ms_off": round(off.pct(0.99), 3),
                         "ttft_p99_ms_on": round(on.pct(0.99), 3)}
    print(f"spans received over OTLP while on: {len(sink.spans)} "
          f"(in {sink.requests} exports; tail sampling keeps slow, failed and 0.1%)")
    print(json.dumps({"bench": "telemetry_overhead", "concurrency": a.concurrency,
                      "tokens": a.tokens, "spans_exported": len(sink.spans),
                      "results": summary}))


if __name__ == "__main__":
    main()
