"""Service configuration in one place: a msgspec Struct per service, read from flags and env.

Every setting ``foo_bar`` of a settings Struct is set by ``--foo-bar`` or by the
environment variable ``INFERBUS_FOO_BAR`` (flags win). ``nats_url`` also honours the
conventional ``NATS_URL``.

A field whose type is itself a Struct is a *group*: the core's own policy or an
engine's options, written once where they are used and nested in the settings. Its
fields are settings of the service like any other (flattened, so the scheduler's
``--routing`` sets ``policy.routing``), optionally under a prefix declared with
``Annotated[Options, group("sim_")]``. A flag that two groups would both claim is an
error at start-up, not a silent copy.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import itertools
import os
import socket
import textwrap
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from inferbus.shared.errors import ConfigError

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
"""Where ``inferbus up`` puts its embedded server."""

ENV_PREFIX = "INFERBUS_"


class ServiceSettings(msgspec.Struct, kw_only=True):
    nats_url: str = DEFAULT_NATS_URL
    """The NATS server (``NATS_URL`` is read too); a cluster: comma-separated URLs."""
    nats_creds: str = ""
    """Its credentials file on a closed bus (``inferbus creds``); empty: none."""
    nats_tls_ca: str = ""
    """A CA file to verify the NATS server's TLS certificate (with a tls:// URL)."""
    http_host: str = "127.0.0.1"
    """The address its HTTP port binds (``0.0.0.0`` in a container)."""
    http_port: int = 0
    """Port of /healthz, /readyz and /metrics; 0 picks a free one."""
    instance_id: str = ""
    """Unique per process; defaults to <hostname>-<pid>."""
    log_level: str = "info"
    """debug, info, warning or error (JSON lines on stderr)."""
    http_idle_timeout_s: float = 30.0
    """An HTTP connection that sends no request (or only part of its headers) for this
    long is closed, from its first byte on: idle and slow-header connections go."""
    http_reuse_port: bool = False
    """Share the HTTP port with other processes that set it too (SO_REUSEPORT: the
    kernel spreads connections over them): several gateways on one port."""
    http_max_connections: int = 4096
    """Open HTTP connections past this are closed as they arrive."""
    chunk_batching: bool = True
    """Token chunks of streams stepping together go to a sanitizer or a gateway in one
    message (``ChunkBatch``); off while one of them runs a version from before it."""
    drain_timeout_s: float = 30.0
    """On SIGTERM, how long it may take to finish its work in flight before it exits."""
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

_GROUP_PREFIX = "inferbus_flag_prefix"


def group(prefix: str = "") -> msgspec.Meta:
    """Mark a nested Struct field's settings as flags under ``prefix`` (``"sim_"`` makes
    ``decode_s_per_step`` the flag ``--sim-decode-s-per-step``)."""
    return msgspec.Meta(extra={_GROUP_PREFIX: prefix})


@dataclass(frozen=True)
class Setting:
    """One flag: its flat name (``sim_decode_s_per_step``), where it lives in the nested
    settings (``("sim", "decode_s_per_step")``), its type and default."""

    name: str
    path: tuple[str, ...]
    type: Any
    default: Any
    owner: type[msgspec.Struct] | None = None
    """The Struct that declares it (its docstring is there)."""

    @property
    def doc(self) -> str:
        """The field's docstring (``--help`` shows it), read from the source on demand:
        a service starting does not parse its settings' source."""
        return field_docs(self.owner).get(self.path[-1], "") if self.owner else ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _group_of(hint: Any) -> tuple[type[msgspec.Struct], str] | None:
    """(Struct, prefix) when ``hint`` is a nested group, else None."""
    prefix = ""
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        for m in meta:
            if isinstance(m, msgspec.Meta) and m.extra and _GROUP_PREFIX in m.extra:
                prefix = m.extra[_GROUP_PREFIX]
        hint = base
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return hint, prefix
    return None


def settings_of(cls: type[msgspec.Struct]) -> list[Setting]:
    """Every setting of ``cls``, groups flattened; two settings with one flag are refused."""
    out: list[Setting] = []

    def walk(struct: type[msgspec.Struct], prefix: str, path: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(struct, include_extras=True)
        for f in msgspec.structs.fields(struct):
            nested = _group_of(hints[f.name])
            if nested is not None:
                walk(nested[0], prefix + nested[1], (*path, f.name))
                continue
            default = f.default
            if default is msgspec.NODEFAULT and f.default_factory is not msgspec.NODEFAULT:
                default = f.default_factory()
            out.append(Setting(prefix + f.name, (*path, f.name), hints[f.name], default, struct))

    walk(cls, "", ())
    seen: dict[str, Setting] = {}
    for s in out:
        if s.name in seen:
            raise TypeError(
                f"{cls.__name__}: the setting {s.name!r} is declared twice "
                f"({'.'.join(seen[s.name].path)} and {'.'.join(s.path)}); rename one"
            )
        seen[s.name] = s
    return out


@functools.cache
def field_docs(cls: type[msgspec.Struct]) -> dict[str, str]:
    """The docstrings under a Struct's fields (its bases' too), read from its source:
    Python keeps no attribute docstrings, and they are where settings are explained."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, msgspec.Struct) or klass is msgspec.Struct:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue  # no source (a frozen build): the help says less
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for field, after in itertools.pairwise(body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[field.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _parse_pairs(name: str, text: str) -> dict[str, str]:
    """``a=/x,b=/y`` (or a JSON object) for a ``dict[str, str]`` setting."""
    if text.lstrip().startswith("{"):
        return msgspec.json.decode(text, type=dict[str, str])
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--{name.replace('_', '-')} wants name=value pairs, got {item!r}")
        out[key] = value
    return out


def _place(raw: dict[str, Any], setting: Setting, value: Any) -> None:
    if isinstance(value, str) and typing.get_origin(setting.type) is dict:
        value = _parse_pairs(setting.name, value)
    node = raw
    for key in setting.path[:-1]:
        node = node.setdefault(key, {})
    node[setting.path[-1]] = value


class _SettingsHelp(argparse.HelpFormatter):
    """Puts each setting's docstring before its help, when help is asked for."""

    def __init__(self, prog: str, settings: dict[str, Setting]) -> None:
        super().__init__(prog)
        self.settings = settings

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        s = self.settings.get(action.dest)
        if s is None or not s.doc:
            return text
        return f"{s.doc} ".replace("%", "%%") + (text or "")


def parser_for(cls: type[ServiceSettings], prog: str | None = None) -> argparse.ArgumentParser:
    settings = settings_of(cls)
    by_name = {s.name: s for s in settings}

    def formatter(prog: str) -> argparse.HelpFormatter:
        return _SettingsHelp(prog, by_name)

    parser = argparse.ArgumentParser(
        prog=prog, description=(cls.__doc__ or "").strip(), formatter_class=formatter
    )
    for s in settings:
        default = s.default if s.default is not msgspec.NODEFAULT else None
        help = f"(env {s.env}; default: {default!r})".replace("%", "%%")
        parser.add_argument(s.flag, dest=s.name, default=argparse.SUPPRESS, help=help)
    return parser


def load_settings(
    cls: type[S],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> S:
    """Build ``cls`` from env, then flags, then keyword overrides (by flat setting name);
    a clear error on bad values."""
    environ = os.environ if environ is None else environ
    settings = {s.name: s for s in settings_of(cls)}
    flat: dict[str, Any] = {}
    for s in settings.values():
        if s.name == "nats_url" and "NATS_URL" in environ:
            flat[s.name] = environ["NATS_URL"]
        if s.env in environ:
            flat[s.name] = environ[s.env]
    if argv is not None:
        flat.update(vars(parser_for(cls).parse_args(list(argv))))
    for name in overrides:
        if name not in settings:
            raise TypeError(f"{cls.__name__} has no setting {name!r}")
    flat.update(overrides)
    raw: dict[str, Any] = {}
    for name, value in flat.items():
        _place(raw, settings[name], value)
    try:
        # strict=False lets "0.5" from env or flags become a float, "true" a bool, and so on.
        return msgspec.convert(raw, cls, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"invalid {cls.__name__}: {exc}") from None
