"""Control of ``inferbus up``'s supervisor over core NATS (request/reply).

``inferbus scale`` and the autoscaler's local actuator send a ``supervisor.scale`` to
``ib.sup.<supervisor>.control`` and get the supervisor's state back; ``supervisor.query``
asks for the state alone. The answer to anything it cannot do is a state with ``error``
set, never silence.
"""

from __future__ import annotations

import msgspec

from .events import Event

__all__ = [
    "DEFAULT_SUPERVISOR",
    "SUPERVISORS",
    "ProcessState",
    "ScaleService",
    "SupervisorCommand",
    "SupervisorQuery",
    "SupervisorState",
    "supervisor_subject",
]

DEFAULT_SUPERVISOR = "local"
SUPERVISORS = "ib.sup.*.control"


def supervisor_subject(supervisor: str = DEFAULT_SUPERVISOR) -> str:
    return f"ib.sup.{supervisor}.control"


class ScaleService(Event, tag="supervisor.scale"):
    """Run ``instances`` processes of ``service`` (a scalable one: workers). Going down,
    the instances named in ``stop_first`` are stopped before the newest others; a
    stopped instance drains (its in-flight requests finish) before it exits."""

    service: str
    instances: int
    stop_first: list[str] = []


class SupervisorQuery(Event, tag="supervisor.query"):
    """Ask for the supervisor's state."""


SupervisorCommand = ScaleService | SupervisorQuery


class ProcessState(msgspec.Struct, kw_only=True):
    name: str
    """``worker-2``; a worker's id on the bus starts with it."""
    service: str
    state: str
    """starting, running, backoff (restarting after a crash), stopping."""
    pid: int = 0
    restarts: int = 0
    """Restarts since it last ran healthily."""
    started_at: float = 0.0
    """Unix time of its current start."""
    http_port: int = 0


class SupervisorState(Event, tag="supervisor.state"):
    supervisor: str
    processes: list[ProcessState]
    error: str = ""
    """Why the command was refused (unknown service, not scalable, out of bounds)."""
