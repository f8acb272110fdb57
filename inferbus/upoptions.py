"""``inferbus up``'s options, declared once: each field is its default, its flag and
its help, and the ``up`` command's click options are made from these fields. Light
(dataclasses and click only), so the CLI starts without importing the platform."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from inferbus.contracts.control import DEFAULT_SUPERVISOR
from inferbus.supervisor.core import RestartPolicy

F = TypeVar("F", bound=Callable[..., Any])


def flag(default: Any, *decls: str, help: str = "", **click_kw: Any) -> Any:
    """A field that is also an option of ``inferbus up`` (``decls`` as click takes
    them; a list field is a repeatable option)."""
    meta = {"decls": decls, "help": help, "click": click_kw}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Options:
    engine: str = flag(
        "vllm",
        "--engine",
        type=click.Choice(["vllm", "sim"]),
        help="vllm: the real engine. sim: a timing model, for scale tests.",
    )
    model: str | None = flag(
        None,
        "--model",
        help="vllm: a model folder (default: a tiny "
        "local Llama, built on first use). sim: any name.",
    )
    port: int = flag(8000, "--port", help="Gateway HTTP port (0: any free one).")
    host: str = flag("127.0.0.1", "--host", help="The address the gateway binds.")
    nats_url: str | None = flag(
        None, "--nats-url", envvar="NATS_URL", help="Use this NATS server instead of starting one."
    )
    nats_port: int = flag(4222, "--nats-port", help="Embedded NATS port (0: any free one).")
    state_dir: Path = flag(
        Path(".inferbus"),
        "--state-dir",
        type=click.Path(path_type=Path),
        help="NATS store and logs.",
    )
    workers: int = flag(1, "--workers", help="Worker processes.")
    gateways: int = flag(1, "--gateways", help="Gateway processes (they share --port).")
    sanitizers: int = flag(1, "--sanitizers", help="Sanitizer processes.")
    schedulers: int = flag(
        1,
        "--schedulers",
        help="Scheduler processes: more than one share the fleet in partitions "
        "(--scheduler-partitions).",
    )
    scheduler_partitions: int = flag(
        0,
        "--scheduler-partitions",
        help="Partitions of the fleet the schedulers share (0: one with one "
        "scheduler, four per scheduler with more). More than 1 lets "
        "`inferbus scale scheduler` add instances.",
    )

    @property
    def partitions(self) -> int:
        """The schedulers' partitions this platform runs with."""
        if self.scheduler_partitions > 0:
            return self.scheduler_partitions
        return 1 if self.schedulers <= 1 else 4 * self.schedulers

    metrics_port_base: int = flag(
        9100, "--metrics-port-base", help="The services' /metrics ports start here."
    )
    selftest: bool = flag(
        True, "--selftest/--no-selftest", help="Serve one request at start-up, as a check."
    )
    check: bool = flag(
        False, "--check", is_flag=True, help="Start, serve the self-test request, stop, exit."
    )
    worker_args: list[str] = flag(
        [], "--worker-arg", help="Extra flag for each worker, e.g. --worker-arg=--max-num-seqs=64"
    )
    api_keys_file: Path | None = flag(
        None,
        "--api-keys-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Require API keys (TOML from 'inferbus keys new'); without it the gateway is open.",
    )
    probe_key: str = ""
    """With API keys on, up's own key for its readiness probe and self-test."""
    trace_slow_s: float = flag(
        1.0,
        "--trace-slow-s",
        type=click.FloatRange(min=0),
        help="Tail sampling: keep the trace of every request slower "
        "than this (and of every failed one). Tracing is on when "
        "OTEL_EXPORTER_OTLP_ENDPOINT is set.",
    )
    trace_keep_ratio: float = flag(
        0.001,
        "--trace-keep-ratio",
        type=click.FloatRange(0, 1),
        help="Tail sampling: the share of other requests' traces kept.",
    )
    supervisor: str = flag(
        DEFAULT_SUPERVISOR,
        "--supervisor",
        help="Its name on the control subject ib.sup.<name>.control (inferbus ps / scale).",
    )
    open_bus: bool = flag(
        False,
        "--open-bus",
        is_flag=True,
        help="Run the embedded NATS without users and permissions (anyone "
        "who reaches it may do anything). By default the bus is closed: "
        "every service, the operator and each tenant connect with their "
        "own credentials.",
    )
    nats_tls_dir: Path | None = flag(
        None,
        "--nats-tls-dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Serve the embedded NATS over TLS with this folder's server-cert.pem and "
        "server-key.pem; every client verifies it against its ca.pem (inferbus certs make).",
    )
    nats_cluster: int = flag(
        1,
        "--nats-cluster",
        type=click.IntRange(min=1),
        help="Embedded nats-servers: 3 runs a cluster (loopback routes) "
        "whose streams keep 3 copies, so the platform serves on when one "
        "node is lost.",
    )
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    log_max_mb: int = flag(
        64,
        "--log-max-mb",
        type=click.IntRange(min=1),
        help="A process log past this many MiB is moved to <log>.1 (the one before it "
        "dropped) and started again.",
    )
    autoscale: bool = flag(
        False,
        "--autoscale",
        is_flag=True,
        help="Run the autoscaler: it starts and drains workers as the load "
        "asks (from --workers, between its --min-replicas and "
        "--max-replicas).",
    )
    autoscaler_args: list[str] = flag(
        [],
        "--autoscaler-arg",
        help="Extra flag for the autoscaler, e.g. --autoscaler-arg=--max-replicas=4",
    )
    sanitizer_args: list[str] = flag(
        [],
        "--sanitizer-arg",
        help="Extra flag for the sanitizer, e.g. "
        "--sanitizer-arg=--input-policy=flag "
        "(--sanitizer-arg=--tokenizers= turns exact prefix "
        "routing off)",
    )
    cpu_placement: str = flag(
        "auto",
        "--cpu-placement",
        type=click.Choice(["auto", "on", "off"]),
        help="With the vllm engine on a CPU: the engine on its own "
        "cores, the services on the others (a quarter, at least one), "
        "so the request path's hops do not wait for cores the engine's "
        "threads hold. auto: with four cores or more; on: with two.",
    )

    @classmethod
    def from_flags(cls, given: dict[str, Any]) -> Options:
        """The options from what click parsed (repeatable options as lists)."""
        values: dict[str, Any] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in given.items()
        }
        return cls(**values)


def click_options(f: F) -> F:
    """``f`` with one click option for each flag field of ``Options``, in their order."""
    for fld in reversed(dataclasses.fields(Options)):
        if "decls" not in fld.metadata:
            continue
        kw = dict(fld.metadata["click"])
        default = fld.default if fld.default is not dataclasses.MISSING else None
        if fld.default_factory is not dataclasses.MISSING:
            kw["multiple"] = True
        else:
            kw.setdefault("default", default)
            kw.setdefault("show_default", default is not None and not kw.get("is_flag"))
        f = click.option(*fld.metadata["decls"], fld.name, help=fld.metadata["help"], **kw)(f)
    return f
