"""Ports for ``inferbus up``'s services in tests that run side by side (pytest-xdist)."""

from __future__ import annotations

import os
import random
import socket

from inferbus import servicetable

LOW, HIGH = 20000, 32000
"""Below the kernel's ephemeral range (32768 and up), where free_port's ports come from."""
OFFSETS = sorted({e.port_offset for e in servicetable.SERVICES if e.port_offset is not None})
SPAN = max(OFFSETS) + servicetable.MAX_INSTANCES
"""What one platform takes from its base: every service's offset (sanitizers from
+100, schedulers from +200) and its instances."""
BANDS = 4
"""One band per test process (tests/conftest.py starts at most four)."""


def metrics_port_base() -> int:
    """A ``--metrics-port-base`` no other test process picks (each draws from its own
    band of the range) whose first ports are free now."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    band = (int(worker) if worker.isdigit() else 0) % BANDS
    width = (HIGH - LOW) // BANDS
    bases = list(range(LOW + band * width, LOW + (band + 1) * width - SPAN + 1, SPAN))
    random.shuffle(bases)
    for base in bases:
        if all(_free(base + offset + i) for offset in OFFSETS for i in range(4)):
            return base
    raise RuntimeError(f"no free ports in {LOW + band * width}..{LOW + (band + 1) * width}")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
