"""Service configuration in one place: a msgspec Struct per service, read from flags and env.

Every field ``foo_bar`` of a settings Struct is set by ``--foo-bar`` or by the
environment variable ``INFERBUS_FOO_BAR`` (flags win). ``nats_url`` also honours the
conventional ``NATS_URL``.
"""

from __future__ import annotations

import argparse
import os
import socket
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
"""Where ``inferbus up`` puts its embedded server."""

ENV_PREFIX = "INFERBUS_"


class ServiceSettings(msgspec.Struct, kw_only=True):
    nats_url: str = DEFAULT_NATS_URL
    http_host: str = "127.0.0.1"
    http_port: int = 0
    """Port of /healthz, /readyz and /metrics; 0 picks a free one."""
    instance_id: str = ""
    """Unique per process; defaults to <hostname>-<pid>."""
    log_level: str = "info"
    drain_timeout_s: float = 30.0
    # tail sampling of traces (tracing is on when an OTLP endpoint is configured)
    trace_slow_s: float = 1.0
    """Keep every trace of a request slower than this end to end (and every failed one)."""
    trace_keep_ratio: float = 0.001
    """The share of the other requests' traces kept."""
    slo_ttft_s: float = 0.0
    """Time-to-first-token SLO: traces of requests over it are kept (0: none)."""
    trace_decision_wait_s: float = 300.0
    """Spans of a trace no decision reached in this long are exported anyway."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.trace_keep_ratio <= 1.0:
            raise ValueError(f"trace_keep_ratio must be in 0..1, got {self.trace_keep_ratio}")
        if not self.instance_id:
            self.instance_id = f"{socket.gethostname()}-{os.getpid()}"


S = TypeVar("S", bound=ServiceSettings)


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _raw_from_env(cls: type[ServiceSettings], environ: typing.Mapping[str, str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for field in msgspec.structs.fields(cls):
        if field.name == "nats_url" and "NATS_URL" in environ:
            raw[field.name] = environ["NATS_URL"]
        if _env_name(field.name) in environ:
            raw[field.name] = environ[_env_name(field.name)]
    return raw


def parser_for(cls: type[ServiceSettings], prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip())
    for field in msgspec.structs.fields(cls):
        default = field.default if field.default is not msgspec.NODEFAULT else None
        parser.add_argument(
            _flag_name(field.name),
            dest=field.name,
            default=argparse.SUPPRESS,
            help=f"env {_env_name(field.name)} (default: {default!r})",
        )
    return parser


def load_settings(
    cls: type[S],
    argv: Sequence[str] | None = None,
    environ: typing.Mapping[str, str] | None = None,
    **overrides: Any,
) -> S:
    """Build ``cls`` from env, then flags, then keyword overrides; clear error on bad values."""
    raw = _raw_from_env(cls, os.environ if environ is None else environ)
    if argv is not None:
        raw.update(vars(parser_for(cls).parse_args(list(argv))))
    raw.update(overrides)
    try:
        # strict=False lets "0.5" from env or flags become a float, "true" a bool, and so on.
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"invalid {cls.__name__}: {exc}") from None
