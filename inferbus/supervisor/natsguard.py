"""One nats-server run under a store watch, where ``inferbus up`` does not run it
(compose, Kubernetes): ``inferbus nats run --store-dir DIR -- nats-server ARGS``.

After a write failed for want of space, JetStream's streams stay in error until the
server restarts, while its health endpoint still says ok (issue 42 item 2), so no
orchestrator probe sees it. This runs the server as its child, passes its log through
and reads it, and restarts the server once its store's disk has room again (the
decision is ``StoreWatch``'s, as under ``up``). The container's lifecycle stays the
server's: a signal is passed on, and when the server exits on its own this exits with
its status, for the orchestrator to act on.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import time
from pathlib import Path

from inferbus.supervisor.storewatch import StoreWatch

PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Stop, reload, reopen logs, lame duck: the server's own signals."""
SERVER = "nats"
CARRY = 200
"""Characters of a log block kept to read with the next (longer than any phrase
StoreWatch looks for)."""
STOP_S = 30.0
"""How long a server restarted after a full disk has to stop before it is killed."""


def _say(text: str) -> None:
    print(f"inferbus nats run: {text}", file=sys.stderr, flush=True)


class Guard:
    def __init__(self, command: list[str], store_dir: Path, watch: StoreWatch) -> None:
        self.command = command
        self.store_dir = store_dir
        self.watch = watch
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping: signal.Signals | None = None
        self.restarting = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in PASSED_ON:
            loop.add_signal_handler(sig, self._pass_on, sig)
        while True:
            self.restarting = False
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, stdout=None, stderr=asyncio.subprocess.PIPE
            )
            if self.stopping is not None:  # told to stop while it was (re)starting
                self.proc.send_signal(self.stopping)
            watching = asyncio.create_task(self._check_store())
            await self._read_log(self.proc)
            code = await self.proc.wait()
            watching.cancel()
            if not self.restarting or self.stopping is not None:
                return code if code >= 0 else 128 - code  # killed by a signal: as a shell says

    def _pass_on(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = sig
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def _read_log(self, proc: asyncio.subprocess.Process) -> None:
        """Passed through as it comes, in blocks (a line may be longer than a reader's
        buffer); a phrase split between two blocks is read with the end of the first."""
        assert proc.stderr is not None
        carry = ""
        while block := await proc.stderr.read(1 << 16):
            sys.stderr.buffer.write(block)
            sys.stderr.flush()
            text = block.decode(errors="replace")
            self.watch.read(SERVER, carry + text, time.monotonic())
            carry = text[-CARRY:]

    async def _check_store(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            free = (await asyncio.to_thread(shutil.disk_usage, self.store_dir)).free
            if self.watch.to_restart(SERVER, free, time.monotonic()):
                _say("its store could not write (a full disk?); restarting it")
                self.restarting = True
                assert self.proc is not None
                self.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(asyncio.shield(self.proc.wait()), STOP_S)
                except TimeoutError:
                    _say(f"it did not stop within {STOP_S:g}s; killing it")
                    self.proc.kill()
                return


def run(command: list[str], store_dir: Path) -> int:
    return asyncio.run(Guard(command, store_dir, StoreWatch()).run())
