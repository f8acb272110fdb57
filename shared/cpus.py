"""Where the engine and the services run on a CPU machine.

On a CPU the engine's OpenMP threads take every core they are given, and then every
hop of the request path (NATS, gateway, sanitizer, scheduler, the worker's own event
loop) waits for one: measured here, tens to hundreds of milliseconds a hop
(bench/jetstream_latency.py). ``inferbus up`` therefore gives the engine its own cores
and the rest of the platform the others, unless that does not apply: a GPU engine
(the cores are the services'), fewer than two cores, or a container whose CPU time
the cgroup limits (its cores are shared in time, so pinning would only halve them).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path


def parse_cpus(text: str) -> set[int]:
    """``"0-2,5"`` → {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpus(cpus: set[int]) -> str:
    """{0, 1, 2, 5} → ``"0-2,5"`` (the form VLLM_CPU_OMP_THREADS_BIND takes)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def split(available: set[int]) -> tuple[set[int], set[int]] | None:
    """(engine cores, service cores): a quarter of the cores (at least one) for the
    services, the rest for the engine; None with fewer than two."""
    if len(available) < 2:
        return None
    cores = sorted(available)
    services = max(1, math.ceil(len(cores) / 4))
    return set(cores[:-services]), set(cores[-services:])


def why_not(engine: str, mode: str = "auto") -> str:
    """Why placement does not apply on this machine for ``engine`` (empty: it does).
    ``mode``: ``auto`` places with four cores or more; ``on`` with two or more; ``off``
    never. Below four, the services' share is half the machine: on the 2-core machine
    this was built on, placing the tiny model's engine on one core gave 0.69x vLLM's
    server throughput (vLLM's engine on both), as sharing did (bench/README.md)."""
    if mode == "off":
        return "--cpu-placement off"
    if engine != "vllm":
        return f"the {engine} engine does no heavy work on the CPU"
    if _gpu_present():
        return "a GPU runs the engine"
    cores, least = len(os.sched_getaffinity(0)), 4 if mode == "auto" else 2
    if cores < least:
        return f"{cores} cores, under the {least} --cpu-placement {mode} needs"
    if _cgroup_quota():
        return "the cgroup limits CPU time (cores are shared in time)"
    return ""


def _gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _cgroup_quota() -> bool:
    try:
        quota = Path("/sys/fs/cgroup/cpu.max").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return quota != "max"


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process onto ``cpus`` (its children keep their own)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass
