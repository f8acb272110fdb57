"""The supervisor's process adapter with real processes: what a dead service leaves
behind goes with it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from inferbus.supervisor.core import ProcessSpec, SupervisorCore
from inferbus.supervisor.processes import Command, Processes

# a service that starts a helper of its own (as a vLLM worker starts its engine core)
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper counts as gone
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


async def test_a_killed_service_takes_its_children_with_it(tmp_path):
    log = tmp_path / "svc.log"
    core = SupervisorCore()
    procs = Processes(
        core,
        lambda spec: Command([sys.executable, "-c", PARENT], dict(os.environ), log),
        lambda text: None,
    )
    await procs.apply(
        core.add(ProcessSpec(name="svc", service="svc", index=0, stop_order=1), time.monotonic())
    )
    deadline = time.monotonic() + 20
    while not log.read_text().strip() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    child = int(log.read_text().split()[0])
    parent = next(s.pid for s in procs.states() if s.name == "svc")
    assert alive(child)
    os.kill(parent, signal.SIGKILL)  # a crash: no chance to stop its child itself
    while alive(child) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(child), "the dead service's child is still running"
    core.processes.clear()  # no restart: the test is over
    for name in list(procs._procs):
        procs.send_signal(name, signal.SIGKILL)
    await procs.wait_all()
