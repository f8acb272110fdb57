"""What ``inferbus top`` reads from the platform at one moment: every instance that
answered ``$SRV.STATS`` and its parsed /metrics. Plain data and pure parsing, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SERVICE_PREFIX = "inferbus-"
"""Every service registers its nats.micro service as ``inferbus-<service>``."""

Labels = tuple[tuple[str, str], ...]
"""A series' labels, sorted by name, so that equal label sets are equal keys."""

Metrics = Mapping[str, Mapping[Labels, float]]
"""Sample name (``inferbus_tokens_total``, ``..._bucket``) → labels → value."""


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


def parse_metrics(text: str) -> dict[str, dict[Labels, float]]:
    """Prometheus exposition text → samples by name; raises ValueError on bad text."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[labels_of(sample.labels)] = float(sample.value)
    return out


@dataclass(frozen=True)
class Instance:
    """One running process of one service."""

    service: str
    """gateway, sanitizer, scheduler or worker (``inferbus-`` taken off the micro name)."""
    instance: str
    status: Mapping[str, Any] = field(default_factory=dict)
    """Its stats handler's answer: service, instance, http_port, ready and its ``status()``."""
    metrics_url: str = ""
    metrics: Metrics | None = None
    """None: /metrics was not read (see ``metrics_error``)."""
    metrics_error: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.service, self.instance


@dataclass(frozen=True)
class Snapshot:
    at: float
    """Monotonic seconds when the metrics were read."""
    instances: tuple[Instance, ...] = ()
    problem: str = ""
    """Why nothing could be read at all (NATS unreachable); empty when all went well."""


def instance_from_stats(reply: Mapping[str, Any]) -> Instance | None:
    """An inferbus instance from one ``$SRV.STATS`` reply; None for anything else.

    The reply is nats.micro's stats response: ``name``, ``id``, ``metadata`` (our
    ``instance``, ``http_host``, ``http_port``) and ``endpoints``, each carrying the
    stats handler's output as ``data``.
    """
    name = reply.get("name")
    if not isinstance(name, str) or not name.startswith(SERVICE_PREFIX):
        return None
    raw_metadata = reply.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, Mapping) else {}
    status: Mapping[str, Any] = {}
    for endpoint in reply.get("endpoints") or ():
        if isinstance(endpoint, Mapping) and isinstance(endpoint.get("data"), Mapping):
            status = endpoint["data"]
            break
    instance = metadata.get("instance") or status.get("instance") or reply.get("id") or "?"
    port = metadata.get("http_port") or status.get("http_port")
    host = metadata.get("http_host") or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    url = f"http://{host}:{port}/metrics" if port else ""
    return Instance(
        service=name[len(SERVICE_PREFIX) :], instance=str(instance), status=status, metrics_url=url
    )
