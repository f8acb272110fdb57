"""Model delivery against a running platform: a steady load that records which version
answered each request, the operator's CLI, and a slow worker on demand.

Shared by tests/integration/test_delivery*.py and bench/delivery.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferbus.client import Client, RequestError


@dataclass
class Answer:
    request_id: str
    sent: float
    ended: float
    kind: str
    """ok, error (with ``detail``) or hung."""
    served_model: str = ""
    detail: str = ""
    first_token: float = 0.0


@dataclass
class SteadyLoad:
    """``clients`` callers, each sending a request as soon as its last one ended."""

    nats_url: str
    creds: str
    model: str
    clients: int = 3
    tokens: int = 8
    timeout_s: float = 60.0
    answers: list[Answer] = field(default_factory=list)

    async def __aenter__(self) -> SteadyLoad:
        self._client = await Client.connect(self.nats_url, "delivery-load", creds=self.creds)
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._caller(i)) for i in range(self.clients)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.timeout_s + 5)
        await self._client.close()

    async def _caller(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.answers.append(await self.one(f"caller {i} request {n}"))

    async def one(self, prompt: str) -> Answer:
        rid = uuid.uuid4().hex
        sent = time.monotonic()
        first = 0.0
        try:
            stream = self._client.stream(
                self.model,
                prompt,
                max_tokens=self.tokens,
                request_id=rid,
                timeout=self.timeout_s,
                ignore_eos=True,
            )
            async for _ in stream:
                first = first or time.monotonic()
            out = stream.outcome
            assert out is not None
            ok = out.usage.completion_tokens == self.tokens
            return Answer(
                rid,
                sent,
                time.monotonic(),
                "ok" if ok else "error",
                out.served_model,
                "" if ok else "short",
                first,
            )
        except RequestError as exc:
            hung = exc.event is None and exc.code == "timeout"
            return Answer(
                rid,
                sent,
                time.monotonic(),
                "hung" if hung else "error",
                detail=f"{exc.code}: {exc}",
            )

    def count(self, kind: str) -> int:
        return sum(a.kind == kind for a in self.answers)

    def versions(self, since: float = 0.0) -> Counter[str]:
        return Counter(a.served_model for a in self.answers if a.kind == "ok" and a.sent >= since)

    def failures(self) -> list[str]:
        return [f"{a.request_id}: {a.kind} {a.detail}" for a in self.answers if a.kind != "ok"]


def cli(nats_url: str, operator: Path, *args: str, timeout: float = 120, rc: int = 0) -> str:
    """``inferbus ARGS`` as the operator; its output (it must exit ``rc``)."""
    done = subprocess.run(
        [sys.executable, "-m", "inferbus.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NATS_URL": nats_url, "INFERBUS_NATS_CREDS": str(operator)},
    )
    if done.returncode != rc:
        raise AssertionError(
            f"inferbus {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def deploy(p: Any, ref: str, *args: str, rc: int = 0) -> str:
    """``inferbus model deploy REF --wait`` as the operator of ``p`` (a testkit.faults
    Platform), its output."""
    return cli(
        p.nats_url,
        p.operator,
        "model",
        "deploy",
        ref,
        "--wait",
        "--timeout",
        "240s",
        *args,
        timeout=300,
        rc=rc,
    )


def trail(nats_url: str, operator: Path, model: str) -> list[dict]:
    """The model's rollout decisions (its audit trail), oldest first."""
    out = cli(nats_url, operator, "model", "status", model, "--json", "--last", "0")
    decisions: list[dict] = json.loads(out)["decisions"]
    return decisions


async def canary_instance(
    nats_url: str, operator: Path, model: str, version: str, action: str = "step"
) -> str:
    """The ``inferbus up`` instance (``worker-N``) holding the canary of ``version``, once
    the rollout has decided ``action``."""
    while True:
        for d in await asyncio.to_thread(trail, nats_url, operator, model):
            if d["version"] != version:
                continue
            if d["action"] == action and d["workers"]:
                return str(d["workers"][0]).split(".")[0]
            if d["action"] in ("failed", "rollback"):  # over before it got there
                raise AssertionError(f"the rollout of {version} ended: {d['reason']}")
        await asyncio.sleep(0.3)


async def ready_workers(
    nats_url: str, operator: Path, model: str, n: int, timeout: float = 300.0
) -> None:
    """Wait until ``n`` workers serving ``model`` say they are ready (``inferbus up``
    is up once one of them is)."""
    from inferbus.contracts import HEARTBEATS, WorkerHeartbeat
    from inferbus.shared.bus import connect
    from inferbus.shared.buscreds import load_credentials
    from inferbus.shared.codec import decode_or_none

    ready: set[str] = set()
    enough = asyncio.Event()

    async def on(msg: Any) -> None:
        hb = decode_or_none(msg.data, WorkerHeartbeat)
        if hb is not None and hb.state == "ready" and model in hb.models:
            ready.add(hb.worker_id)
            if len(ready) >= n:
                enough.set()

    nc = await connect(nats_url, "ready-workers", load_credentials(operator))
    try:
        await nc.subscribe(HEARTBEATS, cb=on)
        await asyncio.wait_for(enough.wait(), timeout)
    finally:
        await nc.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a vLLM worker's engine core is a child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


async def throttle(pid: int, stop_s: float, run_s: float, until: asyncio.Event) -> None:
    """Make a process slow: stopped ``stop_s`` of every ``stop_s + run_s`` seconds (a
    worker starved of CPU), until ``until`` is set; it always ends running."""
    pids = process_tree(pid)
    try:
        while not until.is_set():
            for p in pids:
                os.kill(p, signal.SIGSTOP)
            await asyncio.sleep(stop_s)
            for p in pids:
                os.kill(p, signal.SIGCONT)
            await asyncio.sleep(run_s)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
