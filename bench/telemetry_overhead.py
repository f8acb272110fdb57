"""Telemetry overhead: the stream path with tracing and metrics on against off, in one run.

The platform (``inferbus up --engine sim``: zero-cost sim worker, so the platform's
own work is all there is to measure) is started alternately in two configurations,
round after round, and the same load is run against each:

- off: ``INFERBUS_METRICS=off`` (every metric call a no-op) and no OTLP endpoint;
- on: metrics, and tracing exported over OTLP to a receiver in this process, with
  the default tail sampling (keep >1 s and failed requests, 0.1% of the rest).

    python bench/telemetry_overhead.py [--concurrency 32] [--tokens 64] [--requests 1024]
        [--rounds 5] [--sim-decode-ms 0] [--split]

Each configuration's figure is the median over the rounds (this machine's noise
between two runs of the same configuration is as large as what is measured). Besides
tokens/s and TTFT p50/p99 it reports the CPU time the platform's processes (the
services and nats-server, from /proc) spent per request: on a saturated machine,
throughput is its inverse, and it is steadier than throughput. The last line is the
same as one JSON object. Goal: at most 5% throughput lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import testkit_path  # noqa: F401  (before testkit)
from platform_up import start_up
from stream_overhead import Result, http_one, nats_one, run_load
from testkit.otlp_sink import OtlpSink

from inferbus.client import Client


class Run:
    def __init__(self, result: Result, cpu_s: float, requests: int) -> None:
        self.result = result
        self.cpu_us_per_request = cpu_s / requests * 1e6


def platform_cpu_s(up_pid: int) -> float:
    """User and system CPU seconds of ``inferbus up``'s children (services, nats-server)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    ps = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    for line in ps.splitlines():
        pid, ppid = (int(x) for x in line.split())
        if ppid == up_pid:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def measure_once(env: dict[str, str], a: argparse.Namespace) -> dict[str, Run]:
    with tempfile.TemporaryDirectory() as tmp:
        engine = ["--engine", "sim"]
        if a.sim_decode_ms:
            engine.append(f"--worker-arg=--sim-decode-s-per-step={a.sim_decode_ms / 1000}")
        up, nats_url, gateway = start_up(Path(tmp), *engine, env=env)
        try:
            client = await Client.connect(nats_url)
            out: dict[str, Run] = {}
            async with aiohttp.ClientSession(
                gateway, connector=aiohttp.TCPConnector(limit=0)
            ) as http:
                loads = {
                    "HTTP SSE": lambda i: http_one(http, a.tokens, i),
                    "NATS client": lambda i: nats_one(client, a.tokens, i),
                }
                for name, one in loads.items():
                    await run_load(one, a.concurrency, a.concurrency * 4)  # warm-up
                    cpu0 = platform_cpu_s(up.pid)
                    res = await run_load(one, a.concurrency, a.requests)
                    out[name] = Run(res, platform_cpu_s(up.pid) - cpu0, a.requests)
            await client.close()
            return out
        finally:
            up.send_signal(2)
            await asyncio.get_running_loop().run_in_executor(None, up.wait, 60)


async def measure(a: argparse.Namespace) -> tuple[dict[str, dict[str, list[Run]]], OtlpSink]:
    sink = await OtlpSink().start()
    configs = {
        "off": {"INFERBUS_METRICS": "off", "OTEL_SDK_DISABLED": "true"},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "INFERBUS_METRICS": "on"},
    }
    if a.split:  # each half alone
        configs["metrics"] = {"INFERBUS_METRICS": "on", "OTEL_SDK_DISABLED": "true"}
        configs["traces"] = {
            "INFERBUS_METRICS": "off",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        }
    runs: dict[str, dict[str, list[Run]]] = {c: {} for c in configs}
    order = list(configs)
    for i in range(a.rounds):
        # alternate, each round starting with the next configuration: drift and the
        # first-after-a-restart position hit every configuration alike
        for config in order[i % len(order) :] + order[: i % len(order)]:
            for path, run in (await measure_once(configs[config], a)).items():
                runs[config].setdefault(path, []).append(run)
    await sink.stop()
    return runs, sink


def median_run(runs: list[Run]) -> tuple[float, float, float, float]:
    """Medians over the rounds: tokens/s, TTFT p50 and p99 (ms), CPU µs per request."""
    return (
        statistics.median(r.result.tokens_per_s for r in runs),
        statistics.median(r.result.pct(0.5) for r in runs),
        statistics.median(r.result.pct(0.99) for r in runs),
        statistics.median(r.cpu_us_per_request for r in runs),
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--sim-decode-ms",
        type=float,
        default=0.0,
        help="the sim engine's time per decode step (0: zero cost, the "
        "platform's own work is all there is; 10: an engine-bound load)",
    )
    p.add_argument("--split", action="store_true", help="also run metrics alone and traces alone")
    a = p.parse_args()
    runs, sink = asyncio.run(measure(a))
    print(
        f"\nconcurrency {a.concurrency}, {a.tokens} tokens per request, {a.requests} "
        f"requests per run, sim decode {a.sim_decode_ms:g} ms a step, median of "
        f"{a.rounds} runs per configuration"
    )
    print(
        f"{'path':<14}{'telemetry':<11}{'tokens/s':>12}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}"
        f"{'CPU us/req':>12}"
    )
    summary: dict[str, dict[str, float]] = {}
    for path in runs["off"]:
        off, on = median_run(runs["off"][path]), median_run(runs["on"][path])
        extra = [(c, median_run(runs[c][path])) for c in ("metrics", "traces") if c in runs]
        for config, m in (("off", off), *extra, ("on", on)):
            print(f"{path:<14}{config:<11}{m[0]:>12,.0f}{m[1]:>13.2f}{m[2]:>13.2f}{m[3]:>12,.0f}")
        ratio, cpu_ratio = on[0] / off[0], on[3] / off[3]
        print(
            f"{path:<14}{'on/off':<11}{ratio:>12.3f}{on[1] - off[1]:>+13.2f}"
            f"{on[2] - off[2]:>+13.2f}{cpu_ratio:>12.3f}"
        )
        summary[path] = {
            "throughput_ratio": round(ratio, 3),
            "lost_pct": round(100 * (1 - ratio), 1),
            "cpu_per_request_ratio": round(cpu_ratio, 3),
            "ttft_p50_ms_off": round(off[1], 3),
            "ttft_p50_ms_on": round(on[1], 3),
            "ttft_p99_ms_off": round(off[2], 3),
            "ttft_p99_ms_on": round(on[2], 3),
        }
    print(
        f"spans received over OTLP while on: {len(sink.spans)} "
        f"(in {sink.requests} exports; tail sampling keeps slow, failed and 0.1%)"
    )
    print(
        json.dumps(
            {
                "bench": "telemetry_overhead",
                "concurrency": a.concurrency,
                "tokens": a.tokens,
                "spans_exported": len(sink.spans),
                "results": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
