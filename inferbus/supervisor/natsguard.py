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


def _say(text: str) -> None:
    print(f"inferbus nats run: {text}", file=sys.stderr, flush=True)


class Guard:
    def __init__(self, command: list[str], store_dir: Path, watch: StoreWatch) -> None:
        self.command = command
        self.store_dir = store_dir
        self.watch = watch
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
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
            watching = asyncio.create_task(self._check_store())
            await self._read_log(self.proc)
            code = await self.proc.wait()
            watching.cancel()
            if not self.restarting or self.stopping:
                return code

    def _pass_on(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def _read_log(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            self.watch.read(SERVER, line.decode(errors="replace"), time.monotonic())

    async def _check_store(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            free = (await asyncio.to_thread(shutil.disk_usage, self.store_dir)).free
            if self.watch.to_restart(SERVER, free, time.monotonic()):
                _say("its store could not write (a full disk?); restarting it")
                self.restarting = True
                assert self.proc is not None
                self.proc.send_signal(signal.SIGTERM)
                return


def run(command: list[str], store_dir: Path) -> int:
    return asyncio.run(Guard(command, store_dir, StoreWatch()).run())
