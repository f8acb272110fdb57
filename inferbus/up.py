"""``inferbus up``: the whole platform on one machine, each service its own process.

Starts an embedded nats-server with JetStream (or uses NATS_URL), provisions the
streams, supervises every service (a crashed one is restarted with backoff), serves
one self-test request through the HTTP gateway, and on Ctrl-C stops everything in
order: gateway first (no new work), workers drain, then the rest and NATS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from inferbus.services.gateway.auth import ApiKey, digest, new_key
from inferbus.shared.bus import connect
from inferbus.shared.natsserver import NatsServer, free_port, port_open
from inferbus.shared.streams import ensure_streams

STOP_ORDER = ("gateway", "sanitizer", "worker", "scheduler")


TINY_MODEL = "tiny-llama"


@dataclass
class Options:
    engine: str = "vllm"
    model: str | None = None
    port: int = 8000
    host: str = "127.0.0.1"
    nats_url: str | None = None
    nats_port: int = 4222
    state_dir: Path = Path(".inferbus")
    workers: int = 1
    metrics_port_base: int = 9100
    selftest: bool = True
    check: bool = False
    worker_args: list[str] = field(default_factory=list)
    api_keys_file: Path | None = None
    probe_key: str = ""
    """With API keys on, up's own key for its readiness probe and self-test."""
    trace_slow_s: float = 1.0
    trace_keep_ratio: float = 0.001


@dataclass
class Supervised:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    log: IO[bytes] | None = None

    def start(self) -> None:
        self.log = self.log or open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.running():
            assert self.proc
            self.proc.send_signal(signal.SIGTERM)


def _say(text: str) -> None:
    print(text, flush=True)


def _specs(o: Options, nats_url: str, model: str) -> list[Supervised]:
    logs = o.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # every service: the same tail-sampling settings (tracing itself is switched by the
    # standard OTEL_* variables, which pass through)
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "PYTHONUNBUFFERED": "1",
        "INFERBUS_TRACE_SLOW_S": str(o.trace_slow_s),
        "INFERBUS_TRACE_KEEP_RATIO": str(o.trace_keep_ratio),
    }
    py = [sys.executable, "-m"]
    out = [
        Supervised(
            "sanitizer",
            py + ["inferbus.services.sanitizer", "--http-port", str(o.metrics_port_base + 1)],
            env,
            logs / "sanitizer.log",
        ),
        Supervised(
            "scheduler",
            py + ["inferbus.services.scheduler", "--http-port", str(o.metrics_port_base + 2)],
            env,
            logs / "scheduler.log",
        ),
    ]
    engine_args = ["--engine", o.engine, "--model", model, "--state-dir", str(o.state_dir)]
    if o.engine == "vllm" and o.model is None:
        # the tiny model: eager mode starts in seconds on a CPU, and 2k tokens is its context
        engine_args += ["--enforce-eager", "true", "--max-model-len", "2048"]
    for i in range(o.workers):
        out.append(
            Supervised(
                f"worker-{i}",
                py
                + [
                    "inferbus.services.worker",
                    *engine_args,
                    "--instance-id",
                    f"worker-{i}",
                    "--http-port",
                    str(o.metrics_port_base + 10 + i),
                    *o.worker_args,
                ],
                env,
                logs / f"worker-{i}.log",
            )
        )
    gateway = py + ["inferbus.services.gateway", "--http-host", o.host, "--http-port", str(o.port)]
    gateway_env = env
    if o.api_keys_file is not None:
        gateway += ["--api-keys-file", str(o.api_keys_file)]
        # up's own key: small and slow, only enough for its probe and self-test
        probe = ApiKey(
            name="inferbus-up", sha256=digest(o.probe_key), max_tokens=16, requests_per_s=5
        )
        gateway_env = {**env, "INFERBUS_API_KEYS": msgspec.json.encode([probe]).decode()}
    out.append(Supervised("gateway", gateway, gateway_env, logs / "gateway.log"))
    return out


def _http_json(
    url: str, body: dict[str, Any] | None = None, timeout: float = 5.0, key: str = ""
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait_ready(
    base: str, model: str, procs: list[Supervised], timeout: float, key: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                tail = p.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{tail}")
        try:
            models = _http_json(f"{base}/v1/models", key=key)
            if any(m["id"] == model for m in models["data"]):
                return
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the platform was not ready within {timeout:g}s; see the logs")


async def _provision(nats_url: str) -> None:
    nc = await connect(nats_url, "inferbus-up")
    try:
        await ensure_streams(nc.jetstream())
    finally:
        await nc.close()


def _selftest(base: str, model: str, key: str = "") -> str:
    reply = _http_json(
        f"{base}/v1/chat/completions",
        {
            "model": model,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Say hello to the operator."}],
        },
        timeout=120,
        key=key,
    )
    return reply["choices"][0]["message"]["content"]


def _model(o: Options) -> tuple[str, str]:
    """What the workers load, and the name clients ask for."""
    if o.engine == "sim":
        return o.model or "sim-model", o.model or "sim-model"
    if o.model:
        return o.model, Path(o.model.rstrip("/")).name
    path = o.state_dir / "models" / TINY_MODEL
    if not (path / "model.safetensors").exists():
        from inferbus.tinymodel import make_tiny

        _say(f"building the tiny local model in {path}")
        make_tiny(path)
    return str(path), TINY_MODEL


def run(o: Options) -> int:
    o.state_dir.mkdir(parents=True, exist_ok=True)
    o.port = o.port or free_port(o.host)
    o.nats_port = o.nats_port or free_port()
    model, served = _model(o)
    if o.api_keys_file is not None:
        o.api_keys_file = o.api_keys_file.resolve()
        o.probe_key = new_key()
    nats: NatsServer | None = None
    nats_url = o.nats_url or os.environ.get("NATS_URL")
    if not nats_url:
        if port_open("127.0.0.1", o.nats_port):
            raise SystemExit(
                f"port {o.nats_port} is in use: pass --nats-port, or --nats-url "
                "to use a running NATS server"
            )
        nats = NatsServer(
            o.state_dir / "nats", port=o.nats_port, log_file=o.state_dir / "nats.log"
        ).start()
        nats_url = nats.url
    asyncio.run(_provision(nats_url))

    procs = _specs(o, nats_url, model)
    model = served
    stopping = False

    def on_signal(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    base = f"http://{o.host}:{o.port}"
    code = 0
    try:
        for p in procs:
            p.start()
        _wait_ready(base, model, procs, timeout=600, key=o.probe_key)
        _say(f"inferbus is up ({o.engine} engine, model {model!r})")
        _say(f"  gateway   {base}/v1   (OpenAI API; metrics at {base}/metrics)")
        _say(
            f"  nats      {nats_url}   (JetStream; store {o.state_dir / 'nats'})"
            if nats
            else f"  nats      {nats_url}"
        )
        _say(
            f"  metrics   sanitizer :{o.metrics_port_base + 1}  scheduler "
            f":{o.metrics_port_base + 2}  workers :{o.metrics_port_base + 10}.."
        )
        _say(f"  logs      {o.state_dir / 'logs'}")
        _say(
            f"  auth      API keys from {o.api_keys_file}"
            if o.api_keys_file
            else "  auth      open: no API keys (pass --api-keys-file to require them)"
        )
        if o.selftest or o.check:
            _say(f"  self-test {_selftest(base, model, o.probe_key)!r}")
        if o.check:
            return 0
        _say("try:  inferbus generate --model " + model + ' "Hello"   (Ctrl-C stops everything)')
        while not stopping:
            now = time.monotonic()
            for p in procs:
                if p.running():
                    continue
                if p.proc is not None:  # it just exited: restart after a growing pause
                    p.restarts += 1
                    delay = min(30.0, 0.5 * 2 ** min(p.restarts, 6))
                    _say(f"{p.name} exited with {p.proc.returncode}; restarting in {delay:g}s")
                    p.proc, p.next_start = None, now + delay
                elif now >= p.next_start:
                    p.start()
            time.sleep(0.2)
    except (RuntimeError, TimeoutError) as exc:
        _say(f"inferbus up failed: {exc}")
        code = 1
    finally:
        _say("stopping")
        for name in STOP_ORDER:
            group = [p for p in procs if p.name.startswith(name)]
            for p in group:
                p.terminate()
            for p in group:
                if p.proc is not None:
                    try:
                        p.proc.wait(timeout=35)
                    except subprocess.TimeoutExpired:
                        p.proc.kill()
        if nats:
            nats.stop()
        _say("stopped")
    return code
