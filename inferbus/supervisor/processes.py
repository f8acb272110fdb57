"""The supervisor's adapter: real processes under the pure core's decisions.

Each process runs in its own session (so a Ctrl-C in the terminal reaches only
``inferbus up``, which stops them in order) with its output appended to its log file,
and, on Linux, is sent SIGTERM when ``inferbus up`` dies however it dies (kill -9 had
left every service and nats-server running unsupervised, holding the ports a second
``up`` needs).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from inferbus.contracts.control import ProcessState

from .core import Effect, Kill, Note, ProcessSpec, Start, SupervisorCore, Terminate


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    http_port: int = 0
    cpus: set[int] | None = None
    """The cores it runs on (None: any); threads it starts inherit them."""


class Processes:
    """Starts, signals and reaps the processes the core asks for."""

    def __init__(
        self,
        core: SupervisorCore,
        command_for: Callable[[ProcessSpec], Command],
        say: Callable[[str], None],
    ) -> None:
        self.core = core
        self._command_for = command_for
        self._say = say
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._commands: dict[str, Command] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._waiters: set[asyncio.Task[None]] = set()
        self.exits: list[tuple[str, int | None]] = []
        """Every exit seen (name, code), for the start-up check."""

    async def apply(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Start):
                await self._start(e.spec)
            elif isinstance(e, Terminate):
                self._signal(e.name, signal.SIGTERM)
            elif isinstance(e, Kill):
                self._signal(e.name, signal.SIGKILL)
            elif isinstance(e, Note):
                self._say(e.text)

    async def tick(self) -> None:
        await self.apply(self.core.tick(time.monotonic()))

    def log_paths(self) -> list[Path]:
        return [cmd.log_path for cmd in self._commands.values()]

    def log_path(self, name: str) -> Path | None:
        cmd = self._commands.get(name)
        return cmd.log_path if cmd is not None else None

    def log_tail(self, name: str, chars: int = 2000) -> str:
        cmd = self._commands.get(name)
        if cmd is None or not cmd.log_path.exists():
            return ""
        return cmd.log_path.read_text(errors="replace")[-chars:]

    def states(self) -> list[ProcessState]:
        out = []
        wall = time.time() - time.monotonic()
        for name, p in sorted(self.core.processes.items()):
            proc = self._procs.get(name)
            out.append(
                ProcessState(
                    name=name,
                    service=p.spec.service,
                    state=p.state,
                    pid=proc.pid if proc is not None and proc.returncode is None else 0,
                    restarts=p.restarts,
                    started_at=round(wall + p.started_at, 3),
                    http_port=self._commands[name].http_port if name in self._commands else 0,
                )
            )
        return out

    async def _start(self, spec: ProcessSpec) -> None:
        cmd = self._commands.get(spec.name) or self._command_for(spec)
        self._commands[spec.name] = cmd
        log = self._logs.get(spec.name)
        if log is None:
            log = self._logs[spec.name] = await asyncio.to_thread(open_log, cmd.log_path)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd.argv,
                env=cmd.env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_parent(),
            )
        except OSError as exc:  # the binary is gone: treated as a crash, retried with backoff
            self._say(f"{spec.name} could not start: {exc}")
            await self.apply(self.core.on_exit(spec.name, None, time.monotonic()))
            return
        if cmd.cpus:
            try:  # at once, before it starts threads: they inherit the main thread's
                os.sched_setaffinity(proc.pid, cmd.cpus)
            except OSError as exc:
                self._say(f"{spec.name}: could not place it on cores {sorted(cmd.cpus)}: {exc}")
        self._procs[spec.name] = proc
        self.core.on_started(spec.name, time.monotonic())
        task = asyncio.create_task(self._reap(spec.name, proc), name=f"reap-{spec.name}")
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    async def _reap(self, name: str, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        # what it started and left behind goes with it: a worker killed -9 would leave its
        # vLLM engine core running, holding its memory (GPU memory on a GPU), forever
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is its pid
        except (ProcessLookupError, PermissionError):
            pass
        if self._procs.get(name) is proc:
            del self._procs[name]
        self.exits.append((name, code))
        effects = self.core.on_exit(name, code, time.monotonic())
        if name not in self.core.processes:  # gone for good: its log is closed
            log = self._logs.pop(name, None)
            if log is not None:
                log.close()
            self._commands.pop(name, None)
        await self.apply(effects)

    def send_signal(self, name: str, sig: signal.Signals) -> None:
        self._signal(name, sig)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        proc = self._procs.get(name)
        if proc is None or proc.returncode is not None:
            return
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass

    async def wait_all(self) -> None:
        if self._waiters:
            await asyncio.wait(list(self._waiters), timeout=5)
        for log in self._logs.values():
            log.close()
        self._logs.clear()


def dies_with_parent() -> Callable[[], None] | None:
    """Linux: what a child runs before it execs to be sent SIGTERM when this process
    dies (PR_SET_PDEATHSIG), so its services drain and exit with it. The death watched
    is that of the thread that forks: processes start on the event loop's thread, which
    lives as long as ``inferbus up``. None elsewhere."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    parent = os.getpid()

    def in_child() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the line above: go now
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def rotate_log(path: Path, max_bytes: int) -> bool:
    """Past ``max_bytes``, ``path`` is copied to ``<path>.1`` (replacing it) and cut to
    nothing: its process keeps writing to the same file (opened to append), so nothing
    needs reopening; only what it writes between the copy and the cut is lost."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    kept = path.with_name(path.name + ".1")
    fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out, open(path, "rb") as log:
        shutil.copyfileobj(log, out, 1 << 20)
    os.truncate(path, 0)
    return True


def open_log(path: Path) -> IO[bytes]:
    """A process's log, appended to across its restarts; its owner's only (0600): a
    log may hold what a request carried."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # one an older version made 0644
    return os.fdopen(fd, "ab")
