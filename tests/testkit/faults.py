"""The fault suite: the real platform under load, one process killed (-9) at a time.

``inferbus up --engine sim`` (closed bus, two sim workers at 10 ms a token) serves a
steady load: clients on the NATS client (as a tenant) and on the HTTP gateway, each
sending requests one after another. Once the load runs, a process is killed with
SIGKILL; the supervisor restarts it. Every request sent is counted by how it ended:
served in full, a retryable error, another error, or hung (no end within its
timeout). Duplicates are requests that ran on two workers (two ``request.started``
from different workers, a continuation's aside) or ended twice (two different
terminal events of one attempt on ``ib.req.ended``). A NATS request served in full
must also hold the very text an uninterrupted run gives (the sim's output is a
function of the prompt): a token repeated or lost across a migration is an error.
Moved are requests that continued on another worker (a ``resumed`` start); their
gap is the longest time the client waited between two chunks.
Recovery is the time from the kill to the first request sent after it that was
served in full. ``worker-0-hang`` stops the worker with SIGSTOP instead (a hung
process: its heartbeats stop, its connection stays) and lets it go on after the load.
Shared by tests/integration/test_faults.py and bench/faults.py.
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
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from inferbus.client import Client, RequestError
from inferbus.contracts import (
    ENDED,
    ENDED_PARTITIONS,
    REPLY_PREFIX,
    SCHEDULER_LEASES,
    STARTED,
    STARTED_PARTITIONS,
    RequestStarted,
    Terminal,
)
from inferbus.contracts.control import SupervisorQuery, SupervisorState, supervisor_subject
from inferbus.services.worker.sim import VOCAB, token_id
from inferbus.shared.bus import connect, request_patiently
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, decode_or_none, encode
from inferbus.shared.natsserver import free_ports
from testkit.ports import metrics_port_base
from testkit.procs import alive

MODEL = "sim-model"
HANG = "-hang"
"""A fault name ending so stops the process (SIGSTOP) rather than killing it."""
FAULTS = ("sanitizer", "scheduler", "worker-0", "worker-0-hang", "gateway", "nats")
WHOLE = ("up", "disk")
"""Faults of the whole platform: ``up`` killed with SIGKILL (its children with it) and
started again on the same state; ``disk``, the state's disk filled for FULL_S, then
freed (the state must be on a disk of its own: a small tmpfs). For these, recovery is
counted from the moment ``up`` was started again or the space came back."""
FULL_S = 3.0


@dataclass
class Outcome:
    request_id: str
    sent_at: float
    ended_at: float
    kind: str
    """ok, retryable, error or hung."""
    detail: str = ""
    gap_s: float = 0.0
    """The longest wait between two of its chunks."""


@dataclass
class FaultResult:
    fault: str
    outcomes: list[Outcome] = field(default_factory=list)
    duplicates: int = 0
    duplicate_detail: list[str] = field(default_factory=list)
    recover_s: float | None = None
    takeover_s: float | None = None
    """A scheduler instance's fault (several, partitioned): from the kill until no
    partition's lease names it any more."""
    moved: set[str] = field(default_factory=set)
    """Requests that continued on another worker."""
    killed_at: float = 0.0

    def hung(self) -> list[str]:
        """The hung requests, each with when it was sent (from the kill) and how far
        it got: what a failing run needs to be read without its logs."""
        return [
            f"{o.request_id[:8]} sent {o.sent_at - self.killed_at:+.2f}s: {o.detail}"
            for o in self.outcomes
            if o.kind == "hung"
        ]

    def count(self, kind: str) -> int:
        return sum(o.kind == kind for o in self.outcomes)

    def failing(self) -> list[str]:
        """The ids of the requests that hung, failed or ended twice."""
        bad = [o.request_id for o in self.outcomes if o.kind in ("hung", "error")]
        return bad + [d.split()[0] for d in self.duplicate_detail]

    def check(self, p: Platform, what: str = "the kill") -> None:
        """None hung, none ended twice, none failed but retryably, and served again
        after ``what``; a failure's message carries the failing requests' log lines."""
        errors = [o for o in self.outcomes if o.kind == "error"]
        failed = []
        if self.count("hung"):
            failed.append(f"hung: {self.hung()}")
        if self.duplicates:
            failed.append(f"duplicates: {self.duplicate_detail}")
        if errors:
            failed.append(f"errors: {errors}")
        if self.recover_s is None:
            failed.append(f"nothing was served after {what}")
        if failed:
            logs = p.log_lines(self.failing())
            raise AssertionError("\n".join(failed) + (f"\nlogs:\n{logs}" if logs else ""))

    def gaps(self) -> list[float]:
        """The client-visible gaps of the moved requests, sorted."""
        return sorted(o.gap_s for o in self.outcomes if o.request_id in self.moved)

    def row(self) -> dict[str, object]:
        gaps = self.gaps()

        def pct(q: float) -> float | None:
            return round(gaps[min(len(gaps) - 1, int(q * len(gaps)))], 2) if gaps else None

        return {
            "fault": self.fault,
            "sent": len(self.outcomes),
            "ok": self.count("ok"),
            "retryable": self.count("retryable"),
            "errors": self.count("error"),
            "hung": self.count("hung"),
            "duplicates": self.duplicates,
            "moved": len(self.moved & {o.request_id for o in self.outcomes}),
            "gap_p50": pct(0.5),
            "gap_p99": pct(0.99),
            "recover_s": None if self.recover_s is None else round(self.recover_s, 2),
            "takeover_s": None if self.takeover_s is None else round(self.takeover_s, 2),
        }


class Platform:
    """``inferbus up`` for the suite, with a tenant for the load and the operator's
    credentials for watching and killing."""

    def __init__(
        self,
        state: Path,
        workers: int = 2,
        decode_s: float = 0.01,
        nats_cluster: int = 1,
        extra: tuple[str, ...] = (),
        engine: str = "sim",
    ) -> None:
        self.state = state
        self.workers = tuple(f"worker-{i}" for i in range(workers))
        self.port, nats_port = free_ports(2)
        self.nats_url = f"nats://127.0.0.1:{nats_port}"
        """Every node's URL, comma-separated (from up's banner)."""
        self.http = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable,
            "-m",
            "inferbus.cli",
            "up",
            "--engine",
            engine,
            "--no-selftest",
            "--port",
            str(self.port),
            "--nats-port",
            str(nats_port),
            "--state-dir",
            str(state),
            "--workers",
            str(workers),
            "--metrics-port-base",
            str(metrics_port_base()),
            *([f"--worker-arg=--sim-decode-s-per-step={decode_s}"] if engine == "sim" else []),
            "--nats-cluster",
            str(nats_cluster),
            *extra,
        ]
        self.start(90 if engine == "sim" else 300)
        self.operator = state / "auth" / "creds" / "operator.json"
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "inferbus.cli",
                "creds",
                "new",
                "--tenant",
                "faults",
                "--state-dir",
                str(state),
                "--nats-url",
                self.nats_url,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "INFERBUS_NATS_CREDS": str(self.operator)},
        )
        if made.returncode:
            self.stop()  # a platform the caller never gets must not outlive this
            raise RuntimeError(made.stderr)
        self.tenant = made.stdout.strip()

    def start(self, timeout: float = 90.0) -> None:
        """``inferbus up`` (again, after a kill: the same ports and state folder)."""
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "NATS_URL": ""},
        )
        assert self.proc.stdout is not None
        lines = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("inferbus up exited:\n" + "".join(lines))
            lines.append(line)
            if line.startswith("  nats "):  # every node's URL, for failover
                self.nats_url = line.split()[1]
            if line.startswith("try:"):
                return
        raise RuntimeError("inferbus up was not ready:\n" + "".join(lines))

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=120)
        return out

    async def pids(self) -> dict[str, int]:
        nc = await connect(self.nats_url, "faults-ps", load_credentials(self.operator))
        try:  # a supervisor busy under load answers late
            reply = await request_patiently(nc, supervisor_subject(), encode(SupervisorQuery()))
        finally:
            await nc.close()
        state = decode(reply.data, SupervisorState)
        return {p.name: p.pid for p in state.processes if p.pid}

    def log_lines(self, request_ids: Iterable[str], limit: int = 80) -> str:
        """Every service's log lines naming one of ``request_ids``, for a failed check's
        message: a rare failure in CI is read from them, the state folder goes with the
        run (three sessions chased such failures with no logs)."""
        ids = [r for r in request_ids if r]
        if not ids:
            return ""
        found = []
        for path in sorted((self.state / "logs").glob("*.log")):
            with path.open(errors="replace") as f:
                found += [
                    f"{path.stem}: {line.rstrip()[:400]}"
                    for line in f
                    if any(r in line for r in ids)
                ]
        more = f"\n... {len(found) - limit} more" if len(found) > limit else ""
        return "\n".join(found[:limit]) + more

    async def wait_running(self, names: tuple[str, ...], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if set(names) <= (await self.pids()).keys():
                    return
            except Exception:
                pass  # NATS itself may be coming back
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{names} not all running")


class Starts:
    """Requests starting afresh on the bus (a continuation's start aside): which worker
    instance serves a request, the one a test kills."""

    def __init__(self) -> None:
        self._started: asyncio.Queue[RequestStarted] = asyncio.Queue()

    async def open(self, p: Platform, name: str) -> Starts:
        self.nc = await connect(p.nats_url, name, load_credentials(p.operator))
        await self.nc.subscribe(STARTED, cb=self._on_started)
        return self

    async def _on_started(self, msg) -> None:
        ev = decode_or_none(msg.data, RequestStarted)
        if ev is not None and not ev.resumed:
            self._started.put_nowait(ev)

    async def instance(self, request_id: str, timeout: float = 60.0) -> str:
        """The instance (``worker-0``) of the worker that started ``request_id``."""
        while True:
            ev = await asyncio.wait_for(self._started.get(), timeout)
            if ev.request_id == request_id:
                return ev.worker_id.split(".")[0]

    async def close(self) -> None:
        await self.nc.close()


class Watch:
    """Duplicates, seen from the operator's seat: starts by worker and terminal events
    per request on the bus."""

    def __init__(self) -> None:
        self.started: dict[str, dict[str, int]] = defaultdict(dict)
        """Workers that started each request afresh (a continuation's start aside), and
        the attempt each started."""
        self.moved: set[str] = set()
        self.streaming: dict[str, tuple[str, float]] = {}
        """Requests started and not ended yet → the instance (``worker-0``) serving them,
        and when the start was seen."""
        self.ended: dict[tuple[str, int], set[bytes]] = defaultdict(set)
        """Distinct terminal events per request and attempt: a publish retried after a
        lost ack is the same event (JetStream keeps it once), two different ones are a
        duplicate. An attempt given up on and its successor may each record an end
        (docs/nats-api.md: the newer attempt is the outcome); that is not one."""
        self.replied: dict[str, list[str]] = defaultdict(list)
        """Terminal events per request on its client's reply subject, whatever their
        attempt: a client must see exactly one (issue 42 items 6 and 7)."""

    async def open(self, p: Platform) -> None:
        self.nc = await connect(p.nats_url, "faults-watch", load_credentials(p.operator))
        for started in (STARTED, STARTED_PARTITIONS):  # a partitioned scheduler's too
            await self.nc.subscribe(started, cb=self._on_started)
        for ended in (ENDED, ENDED_PARTITIONS):
            await self.nc.subscribe(ended, cb=self._on_ended)
        await self.nc.subscribe(f"{REPLY_PREFIX}.>", cb=self._on_reply)

    async def _on_reply(self, msg) -> None:
        ev = decode_or_none(msg.data, Terminal)
        if ev is not None:
            self.replied[ev.request_id].append(msg.data.decode()[:120])

    async def _on_started(self, msg) -> None:
        ev = decode_or_none(msg.data, RequestStarted)
        if ev is not None and ev.resumed:
            self.moved.add(ev.request_id)
        elif ev is not None:
            self.started[ev.request_id][ev.worker_id] = ev.attempt
            self.streaming[ev.request_id] = (ev.worker_id.split(".")[0], time.monotonic())

    async def _on_ended(self, msg) -> None:
        ev = decode_or_none(msg.data, Terminal)
        if ev is not None:  # a rejection or the scheduler's end names no attempt: 0
            self.ended[ev.request_id, getattr(ev, "attempt", 0)].add(msg.data)
            self.streaming.pop(ev.request_id, None)

    async def serving(self, instance: str, timeout: float = 15.0) -> None:
        """Once ``instance`` has streamed a request for a moment (its chunks flowing):
        a worker fault then hits streams. Killed at a fixed moment, a worker that
        happened to be between requests moved none (CI, once)."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if any(w == instance and now - t >= 0.03 for w, t in self.streaming.values()):
                return
            if now > deadline:
                raise AssertionError(f"{instance} streamed nothing in {timeout:.0f}s")
            await asyncio.sleep(0.005)

    def duplicates(self, ids: list[str]) -> list[str]:
        """Each duplicate, said plainly."""
        out = []
        for r in ids:
            # a worker that was only stalled may start an attempt the scheduler gave up
            # on before it reads the stop: run twice only if both were served
            served = [w for w, a in self.started[r].items() if self._finished(r, a)]
            if len(served) > 1:
                out.append(f"{r} ran on {sorted(served)}")
            for (rid, attempt), ends in self.ended.items():
                if rid == r and len(ends) > 1:
                    out.append(f"{r} attempt {attempt} ended {[e.decode()[:120] for e in ends]}")
            if len(self.replied.get(r, ())) > 1:
                out.append(
                    f"{r} ended {len(self.replied[r])} times to its client: {self.replied[r]}"
                )
        return out

    def _finished(self, request_id: str, attempt: int) -> bool:
        ends = self.ended.get((request_id, attempt), set())
        return any(b'"request.finished"' in e for e in ends)

    async def close(self) -> None:
        await self.nc.close()


def sim_text(prompt: str, tokens: int) -> str:
    """What the sim engine answers ``prompt`` (no seed, its first weights)."""
    h = zlib.crc32(f"0\x00{prompt}".encode())
    return "".join(VOCAB[token_id(h, i)] + " " for i in range(tokens))


async def nats_one(client: Client, tokens: int, timeout: float) -> Outcome:
    rid = uuid.uuid4().hex
    sent = time.monotonic()
    gap, last = 0.0, 0.0
    prompt = f"fault load {rid}"
    stream = client.stream(MODEL, prompt, max_tokens=tokens, request_id=rid, timeout=timeout)
    rid = stream.request_id  # the platform's id for it (the tenant's name before ours)
    try:
        async for _ in stream:
            now = time.monotonic()
            gap, last = max(gap, now - last) if last else 0.0, now
        assert stream.outcome is not None
        if stream.outcome.usage.completion_tokens != tokens:
            return Outcome(rid, sent, time.monotonic(), "error", "short", gap)
        if stream.text != sim_text(prompt, tokens):
            return Outcome(rid, sent, time.monotonic(), "error", "text", gap)
        return Outcome(rid, sent, time.monotonic(), "ok", "", gap)
    except RequestError as exc:
        if exc.event is None and exc.code == "timeout":
            return Outcome(rid, sent, time.monotonic(), "hung", f"nats, {len(stream.text)} chars")
        kind = "retryable" if exc.retryable else "error"
        return Outcome(rid, sent, time.monotonic(), kind, exc.code or str(exc))
    except Exception as exc:  # the client's own connection to NATS failed: retry later
        return Outcome(rid, sent, time.monotonic(), "retryable", repr(exc))


async def http_one(http: aiohttp.ClientSession, tokens: int, timeout: float) -> Outcome:
    rid = uuid.uuid4().hex
    sent = time.monotonic()
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"fault load {rid}"}],
    }
    got = "no answer"
    try:
        async with asyncio.timeout(timeout):
            # the gateway's id for it is the platform's (an id the client chose would
            # be its tenant's: <tenant>~<id>)
            async with http.post("/v1/chat/completions", json=body) as r:
                rid = r.headers.get("x-request-id", rid)
                if r.status != 200:
                    kind = "retryable" if r.status in (429, 503) else "error"
                    return Outcome(rid, sent, time.monotonic(), kind, f"HTTP {r.status}")
                usage, error = None, None
                gap, last = 0.0, 0.0
                events = 0
                got = "headers"
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    events += 1
                    got = f"{events} events"
                    now = time.monotonic()
                    gap, last = max(gap, now - last) if last else 0.0, now
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        error = obj["error"]
                    elif obj.get("usage"):
                        usage = obj["usage"]
                if error is not None:
                    kind = "retryable" if error.get("code") in _RETRYABLE else "error"
                    return Outcome(rid, sent, time.monotonic(), kind, error.get("code", ""))
                ok = usage is not None and usage["completion_tokens"] == tokens
                kind = "ok" if ok else "error"
                return Outcome(rid, sent, time.monotonic(), kind, "" if ok else "short", gap)
    except TimeoutError:
        return Outcome(rid, sent, time.monotonic(), "hung", f"http, {got}")
    except (aiohttp.ClientError, ConnectionError) as exc:  # the gateway went away: seen at once
        return Outcome(rid, sent, time.monotonic(), "retryable", type(exc).__name__)


_RETRYABLE = {
    "bus_unavailable",
    "stream_interrupted",
    "worker_lost",
    "worker_shutdown",
    "no_worker",
    "queue_timeout",
    "queue_full",
}


async def _whole(p: Platform, fault: str, running: dict[str, int], result: FaultResult) -> None:
    if fault == "up":
        p.proc.kill()  # its children get SIGTERM as it dies (PR_SET_PDEATHSIG)
        await asyncio.to_thread(p.proc.wait)
        while any(alive(pid) for pid in running.values()):
            await asyncio.sleep(0.05)
        await asyncio.to_thread(p.start)
        result.killed_at = time.monotonic()
        return
    filler = p.state.parent / "filler"
    await asyncio.to_thread(
        subprocess.run, ["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True
    )
    await asyncio.sleep(FULL_S)
    filler.unlink()
    result.killed_at = time.monotonic()


async def run_fault(
    p: Platform,
    fault: str,
    *,
    nats_clients: int = 6,
    http_clients: int = 2,
    tokens: int = 20,
    kill_after_s: float = 1.5,
    load_s: float = 8.0,
    timeout_s: float = 20.0,
) -> FaultResult:
    """Load, kill ``fault`` (a process name under ``inferbus up``), load on; counted.
    The load goes on past ``load_s`` until a request sent after the kill was served
    (``timeout_s`` more at most): a restart slower than the window (a loaded machine,
    a submit's redelivery after the dead one's ack wait) is then measured, not taken
    for "nothing served after the kill"."""
    result = FaultResult(fault)
    watch = Watch()
    await watch.open(p)
    client = await Client.connect(p.nats_url, "faults-load", creds=p.tenant)
    http = aiohttp.ClientSession(p.http, connector=aiohttp.TCPConnector(limit=0))
    stop_at = time.monotonic() + load_s

    def recovered() -> bool:
        killed_at = result.killed_at
        return killed_at > 0 and any(
            o.kind == "ok" and o.sent_at > killed_at for o in result.outcomes
        )

    restarting = False

    def loading() -> bool:
        # the wait for a recovery counts from the end of the window or from the
        # restart, whichever is later: a whole platform's restart waits for the old
        # processes to end (a scheduler's drain with its bus gone, up to its 30 s
        # timeout), which once used up the whole wait (CI: "nothing was served")
        if restarting:
            return True
        now = time.monotonic()
        waited_from = max(stop_at, result.killed_at)
        return now < stop_at or (not recovered() and now < waited_from + timeout_s)

    async def loop(one) -> None:
        while loading():
            out = await one()
            result.outcomes.append(out)
            if out.kind != "ok":
                await asyncio.sleep(0.2)  # as a client backs off

    loops = [
        asyncio.create_task(loop(lambda: nats_one(client, tokens, timeout_s)))
        for _ in range(nats_clients)
    ]
    loops += [
        asyncio.create_task(loop(lambda: http_one(http, tokens, timeout_s)))
        for _ in range(http_clients)
    ]
    await asyncio.sleep(kill_after_s)
    running = await p.pids()
    hang = fault.endswith(HANG)
    pid = 0
    if fault in WHOLE:
        restarting = True
        try:
            await _whole(p, fault, running, result)
        finally:
            restarting = False
    else:
        pid = running[fault.removesuffix(HANG)]
        if fault.startswith("worker"):
            await watch.serving(fault.removesuffix(HANG))
        result.killed_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP if hang else signal.SIGKILL)
    killed_at = result.killed_at
    takeover = (
        asyncio.create_task(_takeover(p, fault, killed_at))
        if fault.startswith("scheduler-")
        else None
    )
    try:
        await asyncio.gather(*loops)
    finally:
        if hang:
            os.kill(pid, signal.SIGCONT)
    # the last terminal events on their way to the watch; a stopped worker let go on
    # has streams to end (or, rightly, not to)
    await asyncio.sleep(3.0 if hang else 1.0)
    result.duplicate_detail = watch.duplicates([o.request_id for o in result.outcomes])
    result.duplicates = len(result.duplicate_detail)
    result.moved = set(watch.moved)
    if takeover is not None:
        result.takeover_s = await takeover
    after = [o.ended_at for o in result.outcomes if o.kind == "ok" and o.sent_at > killed_at]
    result.recover_s = min(after) - killed_at if after else None
    await http.close()
    try:
        await asyncio.wait_for(client.nc.close(), 5)
    except Exception:
        pass
    await watch.close()
    await p.wait_running(tuple(running))  # whole again before the next fault
    return result


async def statuses(p: Platform, service: str) -> dict[str, dict]:
    """Each running instance's status (its ``$SRV`` stats' data), by instance id."""
    from inferbus.top.collect import discover

    nc = await connect(p.nats_url, "faults-stats", load_credentials(p.operator))
    try:
        replies = await discover(nc, 1.0)
    finally:
        await nc.close()
    out: dict[str, dict] = {}
    for reply in replies:
        if reply.get("name") != f"inferbus-{service}":
            continue
        for endpoint in reply.get("endpoints") or []:
            data = endpoint.get("data")
            if isinstance(data, dict) and "instance" in data:
                out[data["instance"]] = data
    return out


async def _takeover(p: Platform, instance: str, killed_at: float) -> float | None:
    """How long until every partition the killed scheduler instance held is held
    again: its lease written since (by another instance, or by the instance restarted
    under the same name, which takes its own back)."""
    nc = await connect(p.nats_url, "faults-leases", load_credentials(p.operator))
    try:
        kv = await nc.jetstream().key_value(SCHEDULER_LEASES)

        async def leases() -> dict[str, tuple[bytes, int]]:
            out = {}
            for key in await kv.keys():
                if key.startswith("part."):
                    entry = await kv.get(key)
                    out[key] = (entry.value or b"", entry.revision or 0)
            return out

        held = {k: rev for k, (v, rev) in (await leases()).items() if v == instance.encode()}
        while time.monotonic() - killed_at < 30:
            try:
                now_held = await leases()
            except Exception:  # a key deleted as it was read: look again
                await asyncio.sleep(0.05)
                continue
            if all(now_held.get(k, (b"", rev))[1] > rev for k, rev in held.items()):
                return time.monotonic() - killed_at
            await asyncio.sleep(0.05)
        return None
    finally:
        await nc.close()


def table(results: list[FaultResult]) -> str:
    cols = [
        "fault",
        "sent",
        "ok",
        "retryable",
        "errors",
        "hung",
        "duplicates",
        "moved",
        "gap_p50",
        "gap_p99",
        "recover_s",
        "takeover_s",
    ]
    lines = ["  ".join(f"{c:>10}" for c in cols)]
    for r in results:
        row = r.row()
        lines.append("  ".join(f"{'-' if row[c] is None else row[c]!s:>10}" for c in cols))
    return "\n".join(lines)
