"""Credentials for the bus: who a connection is, on a closed NATS server.

A credentials file (``inferbus creds new`` writes them; ``inferbus up`` writes its
services' into its state folder) is JSON: the NATS user and password, and for a
tenant's client the tenant it belongs to. The server knows only the password's
bcrypt hash and the user's permissions. Each user's request inboxes live under
``_INBOX.<user>.``, the only inboxes its permissions let it read.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import msgspec

from inferbus.shared.errors import ConfigError

CREDS_ENV = "INFERBUS_NATS_CREDS"
"""Where clients and the CLI look for a credentials file when none is named."""
TLS_CA_ENV = "INFERBUS_NATS_TLS_CA"
"""The CA that signed the NATS server's certificate, on a TLS bus."""


class BusCredentials(msgspec.Struct, kw_only=True, frozen=True):
    user: str
    password: str
    tenant: str = ""
    """Set for a tenant's client: it submits, cancels and reads replies on that
    tenant's subjects only."""

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.user)

    def connect_options(self) -> dict[str, str]:
        """nats-py ``connect`` keywords for this user."""
        return {"user": self.user, "password": self.password, "inbox_prefix": self.inbox_prefix}


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


def load_credentials(path: str | os.PathLike[str]) -> BusCredentials:
    """Read a credentials file; a clear error when it is missing or malformed."""
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=BusCredentials)
    except OSError as exc:
        raise ConfigError(f"cannot read NATS credentials {path}: {exc.strerror}") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"malformed NATS credentials {path}: {exc}") from None


def write_credentials(path: Path, creds: BusCredentials) -> Path:
    """Write a credentials file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(creds)) + b"\n")
    return path


def credentials_from_env(explicit: str = "") -> BusCredentials | None:
    """The credentials named by ``explicit`` or ``INFERBUS_NATS_CREDS``, else None (an
    open bus)."""
    path = explicit or os.environ.get(CREDS_ENV, "")
    return load_credentials(path) if path else None


def tls_context(ca_file: str = "") -> ssl.SSLContext | None:
    """A client TLS context verifying the server against ``ca_file``; None without."""
    if not ca_file:
        return None
    return ssl.create_default_context(cafile=ca_file)
