"""Bring the compose stack up, serve a request through the gateway container, check its
trace and the services' metrics arrive, check the bus is closed, tear it all down.

    python scripts/compose_check.py [--keep] [--image inferbus:cpu]

Run from the repository with a Docker engine and Compose v2 (scripts/docker-setup.sh)
and the image built (`docker compose build init`, or scripts/docker-build.sh where
nothing can be pulled). It runs the platform's services only, under their own compose
project (``inferbus-check``, volumes removed at the end), so it needs no image but
inferbus's and leaves a stack of yours alone:
- traces go to an OTLP/HTTP receiver this script runs on the host, reached from the
  containers as host.docker.internal (compose's collector and Jaeger stand in for it in
  a full stack), with every trace kept;
- metrics are scraped by the host's Prometheus (Debian's prometheus package) from each
  container, and read back through Prometheus's query API; without it, from /metrics.
Exits non-zero, saying what failed, with the services' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferbus.shared.natsserver import free_port  # noqa: E402
from tests.testkit.otlp_sink import OtlpSink  # noqa: E402

SERVICES = [
    "nats",
    "gateway",
    "sanitizer",
    "scheduler",
    "worker",
    "kvspill",
    "autoscaler",
    "delivery",
]
TRACED = {"inferbus-gateway", "inferbus-sanitizer", "inferbus-scheduler", "inferbus-worker"}
"""The services a request passes through: each must export its part of the trace."""
MODEL = "tiny-llama"


class CheckFailed(Exception):
    pass


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Stack:
    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project = project
        self.env = env

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        cmd = ["docker", "compose", "-p", self.project, *args]
        done = subprocess.run(
            cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise CheckFailed(
                f"{' '.join(cmd[3:])} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return done.stdout

    def addresses(self) -> dict[str, str]:
        """Each running service's address on the project's network."""
        out: dict[str, str] = {}
        for cid in self.compose("ps", "-q").split():
            info = json.loads(subprocess.check_output(["docker", "inspect", cid]))[0]
            service = info["Config"]["Labels"]["com.docker.compose.service"]
            nets = info["NetworkSettings"]["Networks"]
            out[service] = next(iter(nets.values()))["IPAddress"]
        return out


def chat(base: str, trace_id: str) -> tuple[str, str]:
    """One streamed chat completion with our trace id: (text, request id)."""
    prompt = "Say hello to the compose stack."
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": prompt}],
    }
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        json.dumps(body).encode(),
        {
            "Content-Type": "application/json",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        },
    )
    text, finish = [], None
    with urllib.request.urlopen(req, timeout=120) as resp:
        request_id = resp.headers.get("x-request-id", "")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice["delta"].get("content") or "")
            finish = choice.get("finish_reason") or finish
    if finish not in ("length", "stop") or not "".join(text):
        raise CheckFailed(f"the stream ended badly: finish {finish!r}, text {text!r}")
    return "".join(text), request_id


async def wait_for_trace(sink: OtlpSink, trace_id: str, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        by_service: dict[str, int] = {}
        for span in sink.trace(trace_id):
            by_service[span.service] = by_service.get(span.service, 0) + 1
        if TRACED <= set(by_service):
            return by_service
        if time.monotonic() > deadline:
            raise CheckFailed(
                f"trace {trace_id}: spans from {sorted(by_service)} only, "
                f"{len(sink.spans)} spans in all; want {sorted(TRACED)}"
            )
        await asyncio.sleep(0.5)


def prometheus_config(addresses: dict[str, str], ports: dict[str, int]) -> str:
    jobs = [
        {
            "job_name": f"inferbus-{name}",
            "scrape_interval": "1s",
            "static_configs": [{"targets": [f"{ip}:{ports.get(name, 9100)}"]}],
        }
        for name, ip in sorted(addresses.items())
        if name != "nats"
    ]
    return json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs})


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]


def check_metrics(addresses: dict[str, str], timeout: float) -> str:
    """Every service is scraped and the request is counted: through the host's
    Prometheus where it is installed, else from each /metrics directly."""
    ports = {"gateway": 8000}
    want = f'inferbus_requests_total{{model="{MODEL}"}}'
    binary = shutil.which("prometheus")
    if binary is None:
        for name, ip in addresses.items():
            if name == "nats":
                continue
            with urllib.request.urlopen(
                f"http://{ip}:{ports.get(name, 9100)}/metrics", timeout=5
            ) as resp:
                body = resp.read().decode()
            if "inferbus_" not in body:
                raise CheckFailed(f"{name}'s /metrics has no inferbus_ series")
        return "read from each /metrics (no prometheus binary here)"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(prometheus_config(addresses, ports))
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    up = query(base, "up")
                    counted = query(base, f"sum({want})")
                except OSError:
                    up, counted = [], []
                healthy = {r["metric"]["job"] for r in up if r["value"][1] == "1"}
                jobs = {f"inferbus-{n}" for n in addresses if n != "nats"}
                total = float(counted[0]["value"][1]) if counted else 0.0
                if healthy >= jobs and total >= 1:
                    return f"Prometheus scraped {len(jobs)} services; {want} = {total:g}"
                if time.monotonic() > deadline:
                    raise CheckFailed(
                        f"Prometheus: up for {sorted(healthy)} of "
                        f"{sorted(jobs)}; {want} = {total:g}"
                    )
                time.sleep(1)
        finally:
            proc.terminate()
            proc.wait(10)


def check_closed_bus(stack: Stack) -> None:
    """A connection without credentials is refused (from inside the stack's network)."""
    probe = (
        "import asyncio, nats\n"
        "async def main():\n"
        "    try:\n"
        "        nc = await nats.connect('nats://nats:4222', allow_reconnect=False,"
        " connect_timeout=3, max_reconnect_attempts=0)\n"
        "    except Exception as exc:\n"
        "        print('refused', type(exc).__name__); return\n"
        "    print('accepted'); await nc.close()\n"
        "asyncio.run(main())\n"
    )
    out = stack.compose("exec", "-T", "gateway", "python3", "-c", probe, timeout=60)
    if "refused" not in out:
        raise CheckFailed(f"the bus took a connection without credentials: {out.strip()}")


async def run(args: argparse.Namespace) -> None:
    sink = await OtlpSink(host="0.0.0.0").start()
    port = args.port or free_port()
    env = {
        **os.environ,
        "INFERBUS_IMAGE": args.image,
        "INFERBUS_PORT": str(port),
        "INFERBUS_OTLP_ENDPOINT": f"http://host.docker.internal:{sink.port}",
        "INFERBUS_TRACE_KEEP_RATIO": "1",
    }
    stack = Stack(args.project, env)
    started = time.monotonic()
    try:
        say(f"up: {' '.join(SERVICES)} (project {args.project}, gateway on :{port})")
        stack.compose(
            "up",
            "-d",
            "--wait",
            "--wait-timeout",
            str(args.timeout),
            *SERVICES,
            timeout=args.timeout + 120,
        )
        say(f"healthy in {time.monotonic() - started:.0f} s")
        trace_id = secrets.token_hex(16)
        t0 = time.monotonic()
        text, request_id = await asyncio.to_thread(chat, f"http://127.0.0.1:{port}", trace_id)
        say(f"served {request_id} in {time.monotonic() - t0:.2f} s: {text!r}")
        spans = await wait_for_trace(sink, trace_id, timeout=60)
        say(f"trace {trace_id}: spans by service {spans}")
        addresses = stack.addresses()
        say(await asyncio.to_thread(check_metrics, addresses, 60))
        await asyncio.to_thread(check_closed_bus, stack)
        say("the bus refuses a connection without credentials")
        say(f"compose check passed in {time.monotonic() - started:.0f} s")
    except Exception:
        logs = stack.compose("logs", "--no-color", "--tail", "40", check=False, timeout=60)
        print(logs[-12000:], file=sys.stderr)
        raise
    finally:
        await sink.stop()
        if not args.keep:
            stack.compose("down", "-v", "--timeout", "40", check=False, timeout=300)
            say("torn down")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=os.environ.get("INFERBUS_IMAGE", "inferbus:cpu"))
    p.add_argument("--project", default="inferbus-check")
    p.add_argument("--port", type=int, default=0, help="The gateway's port (default: free).")
    p.add_argument("--timeout", type=int, default=600, help="Seconds to become healthy.")
    p.add_argument("--keep", action="store_true", help="Leave the stack running.")
    args = p.parse_args()
    try:
        asyncio.run(run(args))
    except CheckFailed as exc:
        print(f"compose check FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
