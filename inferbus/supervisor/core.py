"""The supervisor's decisions as a state machine with no I/O.

``inferbus up`` feeds it what happened (a process exited, a scale command, a tick) with
the time as a parameter, and carries out the effects it returns: start a process, send
it SIGTERM, kill it. It restarts what dies with a backoff that resets once a process
has run healthily for a while, starts and stops instances of scalable services, and
stops everything group by group in stop order, each group given a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

State = Literal["starting", "running", "backoff", "stopping"]


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    healthy_after_s: float = 30.0
    """A process that ran this long before it died is restarted at once-ish again
    (the first delay): its earlier crashes are forgiven."""
    stop_grace_s: float = 35.0
    """How long a group has to exit after SIGTERM before it is killed (a worker drains
    for up to 30 s)."""


@dataclass(frozen=True)
class ProcessSpec:
    """What the core knows of a process; how to run it is the adapter's business."""

    name: str
    service: str
    index: int
    stop_order: int


# -- effects ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    spec: ProcessSpec


@dataclass(frozen=True)
class Terminate:
    name: str


@dataclass(frozen=True)
class Kill:
    name: str


@dataclass(frozen=True)
class Note:
    """A line for the operator."""

    text: str


Effect = Start | Terminate | Kill | Note


@dataclass
class Process:
    spec: ProcessSpec
    state: State = "starting"
    started_at: float = 0.0
    restarts: int = 0
    """Crashes in a row without a healthy run between them."""
    next_start: float = 0.0
    wanted: bool = True
    """False once it is being scaled away or shut down: its exit is final."""
    kill_at: float = float("inf")
    """When a process told to stop is killed if it has not exited."""
    killed: bool = False


@dataclass
class Shutdown:
    groups: list[int]
    """Stop orders still to stop, lowest first."""


@dataclass
class SupervisorCore:
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    processes: dict[str, Process] = field(default_factory=dict)
    shutdown: Shutdown | None = None

    # -- inputs ----------------------------------------------------------------------

    def add(self, spec: ProcessSpec, now: float) -> list[Effect]:
        """Run a new process (at start-up, or to scale up)."""
        if self.shutdown is not None:
            return []
        self.processes[spec.name] = Process(spec=spec, started_at=now)
        return [Start(spec)]

    def on_started(self, name: str, now: float) -> None:
        p = self.processes.get(name)
        if p is not None and p.state == "starting":
            p.state, p.started_at = "running", now

    def on_exit(self, name: str, code: int | None, now: float) -> list[Effect]:
        p = self.processes.get(name)
        if p is None:
            return []
        if not p.wanted:
            del self.processes[name]
            return self._next_group(now) if self.shutdown is not None else []
        if now - p.started_at >= self.policy.healthy_after_s:
            p.restarts = 0  # it ran well: this crash starts a new count
        p.restarts += 1
        delay = min(self.policy.max_delay_s, self.policy.first_delay_s * 2 ** (p.restarts - 1))
        p.state, p.next_start = "backoff", now + delay
        return [Note(f"{name} exited with {code}; restarting in {delay:g}s")]

    def tick(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for p in self.processes.values():
            if p.state == "stopping" and not p.killed and now >= p.kill_at:
                p.killed = True
                effects += [
                    Note(f"{p.spec.name} did not stop in time; killing it"),
                    Kill(p.spec.name),
                ]
            elif p.state == "backoff" and now >= p.next_start and self.shutdown is None:
                p.state, p.started_at = "starting", now
                effects.append(Start(p.spec))
        return effects

    def scale(
        self, service: str, make: list[ProcessSpec], keep: int, stop_first: list[str], now: float
    ) -> list[Effect]:
        """Run ``keep`` processes of ``service``: start the specs in ``make`` (the adapter
        names them), or stop the surplus, those in ``stop_first`` before the newest."""
        effects: list[Effect] = []
        for spec in make:
            effects += self.add(spec, now)
        alive = self.of(service)
        surplus = len(alive) - keep
        if surplus > 0:
            first = [p for p in alive if p.spec.name in stop_first]
            rest = sorted(
                (p for p in alive if p.spec.name not in stop_first),
                key=lambda p: p.spec.index,
                reverse=True,
            )
            for p in (first + rest)[:surplus]:
                effects += self._stop(p, now)
        return effects

    def begin_shutdown(self, now: float) -> list[Effect]:
        if self.shutdown is not None:
            return []
        orders = sorted({p.spec.stop_order for p in self.processes.values()})
        self.shutdown = Shutdown(groups=orders)
        for p in self.processes.values():
            p.wanted = False
        # processes waiting out a backoff are not running: nothing to stop
        for name in [n for n, p in self.processes.items() if p.state == "backoff"]:
            del self.processes[name]
        return self._next_group(now, first=True)

    # -- views -----------------------------------------------------------------------

    def of(self, service: str) -> list[Process]:
        """The wanted processes of a service (starting, running or restarting)."""
        return [p for p in self.processes.values() if p.spec.service == service and p.wanted]

    @property
    def done(self) -> bool:
        return self.shutdown is not None and not self.processes

    # -- internals -------------------------------------------------------------------

    def _stop(self, p: Process, now: float) -> list[Effect]:
        p.wanted = False
        if p.state == "backoff":  # not running: nothing to wait for
            del self.processes[p.spec.name]
            return []
        p.state, p.kill_at = "stopping", now + self.policy.stop_grace_s
        return [Terminate(p.spec.name)]

    def _group(self, order: int) -> list[Process]:
        return [p for p in self.processes.values() if p.spec.stop_order == order]

    def _next_group(self, now: float, first: bool = False) -> list[Effect]:
        """Move on once the group being stopped has exited."""
        s = self.shutdown
        assert s is not None
        if not first and s.groups and self._group(s.groups[0]):
            return []  # still waiting for some of it
        if not first and s.groups:
            s.groups.pop(0)
        while s.groups and not self._group(s.groups[0]):
            s.groups.pop(0)
        if not s.groups:
            return []
        effects: list[Effect] = []
        for p in self._group(s.groups[0]):
            if p.state != "stopping":  # one being scaled away already was told
                effects += self._stop(p, now)
        return effects
