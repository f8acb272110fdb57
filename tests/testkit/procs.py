"""Run services as real processes, the way ``inferbus up`` and containers do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from inferbus.shared.natsserver import free_port


class ServiceProcess:
    def __init__(
        self,
        service: str,
        nats_url: str,
        log_dir: Path,
        *args: str,
        name: str | None = None,
        http_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.service = service
        self.env = {**os.environ, **env} if env else None
        self.name = name or service
        self.http_port = http_port or free_port()
        self.log_path = log_dir / f"{self.name}.log"
        self.argv = [
            sys.executable,
            "-m",
            f"inferbus.services.{service}",
            "--nats-url",
            nats_url,
            "--http-port",
            str(self.http_port),
            "--instance-id",
            self.name,
            *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> ServiceProcess:
        # the child has its own copy of the descriptor: ours closes at once
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        return self

    def wait_ready(self, timeout: float = 30.0) -> ServiceProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc and self.proc.poll() is None, f"{self.name} died:\n{self.logs()}"
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_all(procs: list[ServiceProcess], timeout: float = 30.0) -> list[ServiceProcess]:
    for p in procs:
        p.start()
    for p in procs:
        p.wait_ready(timeout)
    return procs


@contextmanager
def one_worker_platform(
    root: Path,
    prefix: str,
    model: str,
    scheduler_args: tuple[str, ...] = (),
    worker_args: tuple[str, ...] = (),
) -> Iterator[dict]:
    """A platform of its own (nats-server, sanitizer, scheduler, one sim worker serving
    ``model``, gateway), for tests that set the scheduler or the worker apart from the
    shared one; yields ``{"url", "gateway"}`` once the gateway lists ``model``."""
    import asyncio

    from inferbus.shared.natsserver import NatsServer
    from testkit.simplatform import gateway_lists

    server = NatsServer(root / "nats", log_file=root / "nats.log").start()
    url = server.url
    procs = [
        ServiceProcess("sanitizer", url, root, name=f"{prefix}-sanitizer"),
        ServiceProcess("scheduler", url, root, *scheduler_args, name=f"{prefix}-scheduler"),
        ServiceProcess(
            "worker",
            url,
            root,
            "--model",
            model,
            "--heartbeat-interval-s",
            "0.3",
            *worker_args,
            name=f"{prefix}-worker",
        ),
        ServiceProcess("gateway", url, root, name=f"{prefix}-gateway"),
    ]
    try:
        start_all(procs)
        asyncio.run(gateway_lists(procs[-1].base, model))
        yield {"url": url, "gateway": procs[-1]}
    finally:
        for p in reversed(procs):
            p.stop()
        server.stop()


def alive(pid: int) -> bool:
    """Whether a process of that id is still there."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
