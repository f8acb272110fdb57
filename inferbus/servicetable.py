"""The platform's services, declared once.

``inferbus up``, ``inferbus serve``, ``inferbus top`` and the tests read this table;
a test checks that every ``services/*/`` package is in it, in the built wheel, in
compose.yaml, in deploy/k8s and in the Prometheus scrape jobs. Adding a service is
its folder plus one entry here (docs/architecture.md lists what else it writes).

Classes are named as ``module:Class`` strings and imported only when asked for, so
the CLI starts without importing every service.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferbus.busauth import (
    KV_INDEX_READ,
    REGISTRY_READ,
    REPLIES,
    RESPONSES_READ,
    SCHEDULER_PARTITIONS,
    Permissions,
    wiring_permissions,
)

if TYPE_CHECKING:
    from inferbus.shared.config import ServiceSettings
    from inferbus.shared.runtime import Service
    from inferbus.shared.subscriptions import Wiring


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    """Its folder under services/, ``inferbus serve NAME``, and its processes' names."""
    service: str
    """``module:Class`` of its runtime Service."""
    settings: str
    """``module:Class`` of its settings Struct (flags and INFERBUS_* variables)."""
    wiring: str
    """``module:WIRING``: what it reads and writes on the bus (its NATS permissions)."""
    start_order: int
    """``inferbus up`` starts lower first (the gateway last: it is the readiness probe)."""
    stop_order: int
    """``inferbus up`` stops lower first: the gateway takes no new work, then what
    feeds workers stops before the workers drain; the scheduler sees them end."""
    port_offset: int | None
    """``inferbus up``: its /metrics port is ``--metrics-port-base`` plus this (plus
    the instance's index); None for a service that serves on up's ``--port``."""
    container_port: int = 9100
    """Its HTTP port in a container (compose, k8s): /healthz, /readyz, /metrics."""
    in_up: bool = True
    """Started by ``inferbus up`` by default."""
    up_option: str = ""
    """The ``inferbus up`` option (an ``Options`` field) that starts it when it is not
    started by default."""
    instances: int = 1
    """Processes ``inferbus up`` starts by default."""
    scalable: bool = False
    """``inferbus scale`` (up's control subject) may change how many run."""
    count_option: str = ""
    """The ``inferbus up`` option that says how many start (else ``instances``)."""
    numbered: bool = False
    """Every instance's name has its index (``worker-0``); else the first is the bare
    name (``gateway``, as with one) and the others ``gateway-1``, ``gateway-2``..."""
    launch: str = ""
    """``module:function`` that completes the command ``inferbus up`` starts it with,
    beyond the port and instance id every service gets (the worker's engine and
    cores, the gateway's key): ``function(platform, launch)``."""
    grants: Permissions = field(default_factory=Permissions)
    """What its NATS user may do on a closed bus beyond its wiring and what every
    service does (busauth.SERVICE_BASE): answering requesters, reading the registry."""

    def service_class(self) -> type[Service[Any]]:
        cls: type[Service[Any]] = load(self.service)
        return cls

    def settings_class(self) -> type[ServiceSettings]:
        cls: type[ServiceSettings] = load(self.settings)
        return cls

    def wiring_of(self) -> Wiring:
        wiring: Wiring = load(self.wiring)
        return wiring

    def permissions(self) -> Permissions:
        """What its NATS user may publish and subscribe on a closed bus, beyond what
        every service does; ``{instance}`` is its instance id."""
        return wiring_permissions(self.wiring_of()) + self.grants

    def instance_name(self, index: int) -> str:
        return f"{self.name}-{index}" if self.numbered or index else self.name

    def metrics_port(self, base: int, index: int = 0) -> int | None:
        return None if self.port_offset is None else base + self.port_offset + index


def load(ref: str) -> Any:
    """What a ``module:name`` string of the table names, imported now."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(name: str, cls: str, **kw: Any) -> ServiceEntry:
    base = f"inferbus.services.{name}"
    return ServiceEntry(
        name=name,
        service=f"{base}.service:{cls}Service",
        settings=f"{base}.service:{cls}Settings",
        wiring=f"{base}.wiring:WIRING",
        **kw,
    )


SERVICES: tuple[ServiceEntry, ...] = (
    # in the order a request meets them
    # several gateways share up's --port (SO_REUSEPORT); sanitizers and schedulers
    # count from their own bases
    _entry("gateway", "Gateway", start_order=9, stop_order=1, port_offset=None,
           container_port=8000, launch="inferbus.up:launch_gateway", scalable=True,
           count_option="gateways",
           grants=Permissions(publish=RESPONSES_READ)),
    _entry("sanitizer", "Sanitizer", start_order=1, stop_order=2, port_offset=100,
           scalable=True, count_option="sanitizers",
           launch="inferbus.up:launch_sanitizer", grants=REPLIES),
    _entry("scheduler", "Scheduler", start_order=2, stop_order=4, port_offset=200,
           scalable=True, count_option="schedulers",
           grants=REPLIES + Permissions(publish=KV_INDEX_READ) + SCHEDULER_PARTITIONS),
    # workers at base+10, base+11, ... (one port each); a worker's user may publish its
    # own instance's heartbeats and KV events, and read its own work only
    _entry("worker", "Worker", start_order=3, stop_order=3, port_offset=10, scalable=True,
           count_option="workers", launch="inferbus.up:launch_worker", numbered=True,
           grants=REPLIES + Permissions(publish=REGISTRY_READ)),
    # off by default (`inferbus up --autoscale`); stops with the gateway, so the others'
    # shutdown is not load it reacts to
    _entry("autoscaler", "Autoscaler", start_order=4, stop_order=1, port_offset=3,
           in_up=False, up_option="autoscale", launch="inferbus.up:launch_autoscaler"),
    # bounds the shared KV spill tier (a folder the workers read and write)
    _entry("kvspill", "KvSpill", start_order=6, stop_order=1, port_offset=5,
           launch="inferbus.up:launch_kvspill"),
    # model versions to workers, canary weights to the scheduler; judges each version
    # on the requests' ends
    _entry("delivery", "Delivery", start_order=5, stop_order=1, port_offset=4,
           grants=Permissions(publish=REGISTRY_READ)),
)  # fmt: skip

MAX_INSTANCES = 90
"""Instances of one scalable service under ``inferbus up`` (their ports must not meet
the next service's)."""


def names() -> tuple[str, ...]:
    return tuple(e.name for e in SERVICES)


def default_names() -> tuple[str, ...]:
    """The services ``inferbus up`` runs unless told otherwise."""
    return tuple(e.name for e in SERVICES if e.in_up)


def get(name: str) -> ServiceEntry:
    for e in SERVICES:
        if e.name == name:
            return e
    raise KeyError(f"no service {name!r}; the services are {', '.join(names())}")


def permissions() -> dict[str, Permissions]:
    """Each service's own permissions, for the bus's server config."""
    return {e.name: e.permissions() for e in SERVICES}


def by_start_order() -> list[ServiceEntry]:
    return sorted(SERVICES, key=lambda e: e.start_order)
