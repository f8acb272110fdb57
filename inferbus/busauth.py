"""A closed bus: NATS users, what each may publish and subscribe, the server's config.

Every service process, every tenant's client and the operator connect as their own
NATS user (a password checked against its bcrypt hash). Permissions name subjects:
a service may publish and read only what its part of the request path needs (derived
from what it declares it reads and writes, ``services/<name>/wiring.py``); a tenant
only its own submit and cancel subjects and its own replies; JetStream's API only as
far as each needs (no one but the operator deletes or purges). The registry of users
lives in a folder (``<state>/auth`` under ``inferbus up``): ``users.json`` (hashes,
never passwords), ``creds/<user>.json`` (each user's credentials, mode 0600) and
``nats.conf``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec

from inferbus.contracts import (
    GATEWAY_REPLY_OWNER,
    KV_INDEX,
    KV_SPILL_INDEX,
    MODEL_ARTIFACTS,
    MODEL_REGISTRY,
    REPLY_PREFIX,
    RESPONSES,
    SCHEDULER_LEASES,
    STARTED_PARTITIONS,
    STREAMS,
    TENANT_CANCELS,
    TENANT_SUBMITS,
    TRACE_DECIDED,
    dead_letter_subject,
    status_subject,
    tenant_cancel_subject,
    tenant_reply_prefix,
    tenant_submit_subject,
)
from inferbus.contracts.control import supervisor_subject
from inferbus.shared.buscreds import (
    BusCredentials,
    inbox_prefix,
    load_credentials,
    write_credentials,
)
from inferbus.shared.subscriptions import Consume, Follow, Listen, Own, Wiring, as_permission

OPERATOR = "operator"
"""The administrator's user: everything (the CLI's top, canary, scale, creds)."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY = "*"
"""The instance of a service user that stands for all its instances (one token of a
subject: instance ids are letters, digits, '-' and '_')."""
RESERVED_TENANTS = {GATEWAY_REPLY_OWNER}


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to; ``{instance}``, ``{service}``
    and ``{user}`` are filled in per user."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    responses: bool = False
    """It answers requests it receives ($SRV discovery, control subjects)."""

    def __add__(self, other: Permissions) -> Permissions:
        return Permissions(
            publish=self.publish + other.publish,
            subscribe=self.subscribe + other.subscribe,
            responses=self.responses or other.responses,
        )

    def filled(self, **values: str) -> Permissions:
        def fill(subjects: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(s.format(**values) for s in subjects))

        return replace(self, publish=fill(self.publish), subscribe=fill(self.subscribe))


# JetStream's API, as far as each needs it (deleting and purging is the operator's)
JS_PROVISION = Permissions(
    publish=(
        "$JS.API.INFO",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.INFO.*",
        "$JS.API.STREAM.CREATE.*",
        "$JS.API.STREAM.UPDATE.*",
    ),
)
JS_CONSUME = Permissions(
    publish=(
        "$JS.API.CONSUMER.CREATE.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.>",
        "$JS.API.CONSUMER.INFO.>",
        "$JS.API.CONSUMER.DELETE.>",
        "$JS.ACK.>",
        "$JS.FC.>",
    ),
)


def stream_read(*streams: str) -> tuple[str, ...]:
    """Reading these streams' messages: get, and the ordered consumers that the Object
    Store streams chunks through."""
    return (
        *(
            f"$JS.API.{api}.{stream}{tail}"
            for stream in streams
            for api, tail in (
                ("STREAM.MSG.GET", ""),
                ("DIRECT.GET", ".>"),
                ("CONSUMER.CREATE", ""),
                ("CONSUMER.CREATE", ".>"),
                ("CONSUMER.INFO", ".>"),
                ("CONSUMER.DELETE", ".>"),
            )
        ),
        "$JS.FC.>",
    )


REGISTRY_READ = stream_read(f"KV_{MODEL_REGISTRY}", f"OBJ_{MODEL_ARTIFACTS}")
"""Reading the model registry and artifacts (the KV bucket and Object Store behind them)."""

RESPONSES_READ = stream_read(f"KV_{RESPONSES}")
"""Reading the gateway's stored responses (it writes them through its wiring)."""

KV_INDEX_READ = stream_read(f"KV_{KV_INDEX}")
"""Reading the scheduler's stored KV index (it writes it through its wiring)."""
SCHEDULER_PARTITIONS = Permissions(
    publish=stream_read(f"KV_{SCHEDULER_LEASES}"),
    subscribe=(
        "ib.deliver.scheduler-accepted.*",
        "ib.deliver.scheduler-ended.*",
        STARTED_PARTITIONS,
    ),
)
"""A partitioned scheduler: its leases (written through its wiring), and the accepted
requests, starts and ends of the partitions it holds, subscribed as it takes them
(services/scheduler/wiring.py, ``partition_subscriptions``)."""

PLATFORM_STREAMS = (
    *(spec.name for spec in STREAMS),
    *(
        f"KV_{bucket}"
        for bucket in (RESPONSES, KV_SPILL_INDEX, MODEL_REGISTRY, KV_INDEX, SCHEDULER_LEASES)
    ),
    f"OBJ_{MODEL_ARTIFACTS}",
)
"""Every stream the platform declares, the KV buckets and Object Store included."""

JS_BOOTSTRAP = Permissions(
    publish=(
        "$JS.API.INFO",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.INFO.*",
        *(f"$JS.API.STREAM.CREATE.{name}" for name in PLATFORM_STREAMS),
    ),
)
"""A service's part in provisioning: creating a platform stream that is missing (its
first start, before any provisioner), never another stream, never changing one (a
service's credentials set IB_DLQ's ``max_msgs`` to 1 and created a stream on
``ib.reply.>``; issue 42 item 13). Limits are the provisioner's: JS_PROVISION."""

SERVICE_BASE = JS_BOOTSTRAP + Permissions(
    publish=("{dead_letters}", TRACE_DECIDED),
    subscribe=("_INBOX.{user}.>", "$SRV.>", TRACE_DECIDED, "{status}"),
    responses=True,
)
"""What the runtime does for every service: bootstrapping streams, dead letters, trace
decisions, $SRV discovery and its status endpoint. Acks are granted with the
consumers a service reads (a worker acks its own work only)."""

REPLIES = Permissions(publish=(f"{REPLY_PREFIX}.>", "ib.filter.>", "_INBOX.>"))
"""Answering requesters, wherever their reply subject (gateway, tenant, inbox)."""


def wiring_permissions(wiring: Wiring) -> Permissions:
    """What a service's declared subscriptions and publications need of the bus: the
    subjects it listens on, its durable consumers' delivery subjects, JetStream's
    consumer API (for a consumer of its own, on its own subject only)."""
    publish = [as_permission(s) for s in wiring.publishes]
    subscribe: list[str] = []
    consumes = False
    for sub in wiring.subscriptions:
        source = sub.source
        if isinstance(source, Listen):
            subscribe.append(as_permission(sub.subject))
        elif isinstance(source, Consume):
            subscribe.append(source.consumer.deliver_subject)
            consumes = True
        elif isinstance(source, Follow):
            consumes = True  # an ordered consumer, delivered to its inbox
        elif isinstance(source, Own):
            stream = source.stream
            publish += [
                f"$JS.API.CONSUMER.CREATE.{stream}.*.{as_permission(sub.subject)}",
                f"$JS.API.CONSUMER.INFO.{stream}.*",
                f"$JS.API.CONSUMER.DELETE.{stream}.*",
                f"$JS.ACK.{stream}.>",
            ]
    own = Permissions(
        publish=tuple(dict.fromkeys(publish)), subscribe=tuple(dict.fromkeys(subscribe))
    )
    return JS_CONSUME + own if consumes else own


def service_permissions(own: Permissions, service: str, instance: str, user: str) -> Permissions:
    return (SERVICE_BASE + own).filled(
        service=service,
        instance=instance,
        user=user,
        dead_letters=dead_letter_subject(service),
        status=status_subject(service),
    )


def supervisor_permissions(supervisor: str, user: str) -> Permissions:
    # answers by explicit grant: a scale command adds users, and the reload it triggers
    # forgets the pending responses allow_responses would have let through
    return (
        JS_PROVISION
        + Permissions(
            publish=("_INBOX.>",),
            subscribe=("_INBOX.{user}.>", supervisor_subject(supervisor)),
            responses=True,
        )
    ).filled(user=user)


def tenant_permissions(tenant: str, user: str) -> Permissions:
    return Permissions(
        publish=(tenant_submit_subject(tenant), tenant_cancel_subject(tenant)),
        subscribe=(tenant_reply_prefix(tenant) + ">", f"{inbox_prefix(user)}.>"),
    )


OPERATOR_PERMISSIONS = Permissions(publish=(">",), subscribe=(">",))

PLATFORM_ACCOUNT = "PLATFORM"
"""The services', supervisors' and operator's NATS account: every stream is in it."""
TENANT_CONNECTIONS = 256
"""A tenant's connections at once unless its user says otherwise: one tenant opening
thousands would use up the server's (64K) and lock every other client out."""
TENANT_GATES = (
    ("service", TENANT_SUBMITS),
    ("service", TENANT_CANCELS),
    ("stream", tenant_reply_prefix("*") + ">"),
)
"""What the platform account exports to tenants: submits and cancels as services (the
server answers them on a reply subject of its own, mapped back to the tenant's), their
replies as a stream. Each tenant's account imports only its own."""


def tenant_account(tenant: str) -> str:
    """A tenant's own NATS account: no streams, only its gates into the platform, and
    its own connection limit. A reload that adds an account does not wire its imports
    (nats-server 2.15.1: its publishes find no responders until the next reload), so
    ``inferbus creds new`` reloads until the tenant's submit reaches the platform."""
    return f"TENANT_{tenant}"


def tenant_imports(tenant: str) -> list[dict[str, object]]:
    own = (
        ("service", tenant_submit_subject(tenant)),
        ("service", tenant_cancel_subject(tenant)),
        ("stream", tenant_reply_prefix(tenant) + ">"),
    )
    return [{kind: {"account": PLATFORM_ACCOUNT, "subject": subject}} for kind, subject in own]


def check_name(kind: str, name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{kind} name {name!r}: letters, digits, '-' and '_' only (1..64)")
    return name


def route_password(folder: Path) -> str:
    """The password a NATS cluster's nodes route with, kept in ``folder``."""
    path = folder / "route-secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    return path.read_text().strip()


# -- the registry ----------------------------------------------------------------------


class User(msgspec.Struct, kw_only=True):
    user: str
    role: str
    """``service``, ``supervisor``, ``tenant`` or ``operator``."""
    name: str = ""
    """The service instance, supervisor or tenant it stands for."""
    service: str = ""
    password_hash: str
    max_connections: int = 0
    """A tenant's connections at once (its NATS account's limit); 0: TENANT_CONNECTIONS."""


HASH_ROUNDS = 4
"""bcrypt's cost for the server's password hashes: the least it takes. Every password
is 24 random bytes (192 bits): a slow hash protects guessable passwords, not these,
while the server pays it on every CONNECT, a wrong one included: at cost 10 (50 ms),
13 wrong-password CONNECTs a second pinned nats-server's CPU and a tenant's p50 went
from 121 ms to 1,141 ms (issue 42 item 4); at 4 a check costs under 1 ms."""


def _hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=HASH_ROUNDS)).decode()


def _costly(password_hash: str) -> bool:
    """A hash made at a higher cost than HASH_ROUNDS (``$2b$10$...``)."""
    parts = password_hash.split("$")
    return len(parts) > 2 and parts[2].isdigit() and int(parts[2]) > HASH_ROUNDS


@dataclass
class Registry:
    """The users of one closed bus, kept in ``folder``."""

    folder: Path
    users: dict[str, User] = field(default_factory=dict)

    @classmethod
    def open(cls, folder: Path) -> Registry:
        reg = cls(folder)
        reg.reload()
        return reg

    def reload(self) -> None:
        """Read the users again: other processes (``inferbus creds``, ``inferbus up``)
        change them too."""
        path = self.folder / "users.json"
        self.users = {}
        if path.exists():
            for u in msgspec.json.decode(path.read_bytes(), type=list[User]):
                self.users[u.user] = u

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """One writer at a time across processes, each starting from what is on disk:
        a change made from a stale copy would drop another process's users (a tenant
        made by ``inferbus creds new`` lost when ``inferbus up`` adds a worker)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "users.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self.reload()
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def rehash(self) -> None:
        """Hashes an older version made at a higher cost, made again at HASH_ROUNDS from
        the users' credentials files (the same passwords)."""
        with self._changing():
            self._rehash()

    def _rehash(self) -> None:
        changed = False
        for u in self.users.values():
            path = self.creds_path(u.user)
            if _costly(u.password_hash) and path.exists():
                u.password_hash = _hash(load_credentials(path).password)
                changed = True
        if changed:
            self.save()

    def creds_path(self, user: str) -> Path:
        return self.folder / "creds" / f"{user}.json"

    def ensure(
        self, user: str, role: str, name: str = "", service: str = "", tenant: str = ""
    ) -> Path:
        """The user's credentials file, made (with a new password) when missing."""
        path = self.creds_path(user)
        with self._changing():
            if user in self.users and path.exists():
                return path
            password = secrets.token_urlsafe(24)
            self.users[user] = User(
                user=user, role=role, name=name, service=service, password_hash=_hash(password)
            )
            write_credentials(path, BusCredentials(user=user, password=password, tenant=tenant))
            self.save()
        return path

    def remove(self, user: str) -> bool:
        with self._changing():
            found = self.users.pop(user, None) is not None
            self.creds_path(user).unlink(missing_ok=True)
            self.save()
        return found

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "users.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(list(self.users.values()))))
        tmp.chmod(0o600)
        tmp.replace(path)

    # -- roles -------------------------------------------------------------------------

    def service(self, service: str, instance: str) -> Path:
        return self.ensure(f"svc-{check_name('instance', instance)}", "service", instance, service)

    def service_role(self, service: str) -> Path:
        """One user for every instance of ``service`` (a Kubernetes Deployment's pods,
        named at run time, share it): its permissions name any instance's subjects.
        Not ``svc-``: that is an instance's user, and a service that runs once has an
        instance named as the service."""
        return self.ensure(f"pods-{check_name('service', service)}", "service", ANY, service)

    def supervisor(self, name: str) -> Path:
        return self.ensure(f"supervisor-{check_name('supervisor', name)}", "supervisor", name)

    def operator(self) -> Path:
        return self.ensure(OPERATOR, "operator")

    def tenant(self, tenant: str, max_connections: int | None = None) -> Path:
        """``max_connections``: set (0: TENANT_CONNECTIONS); None keeps what it was."""
        check_name("tenant", tenant)
        if tenant in RESERVED_TENANTS:
            raise ValueError(f"tenant name {tenant!r} is reserved")
        user = f"tenant-{tenant}"
        path = self.ensure(user, "tenant", tenant, tenant=tenant)
        if max_connections is not None and max_connections < 0:
            raise ValueError("max_connections: 0 (the default) or more")
        if max_connections is not None:
            with self._changing():
                if self.users[user].max_connections != max_connections:
                    self.users[user].max_connections = max_connections
                    self.save()
        return path

    # -- the server's view -------------------------------------------------------------

    def permissions(self, u: User, service_perms: dict[str, Permissions]) -> Permissions:
        if u.role == "service":
            return service_permissions(service_perms[u.service], u.service, u.name, u.user)
        if u.role == "supervisor":
            return supervisor_permissions(u.name, u.user)
        if u.role == "tenant":
            return tenant_permissions(u.name, u.user)
        return OPERATOR_PERMISSIONS

    def server_config(self, service_perms: dict[str, Permissions]) -> str:
        """The ``accounts`` block of nats-server's config (JSON is valid in its config
        syntax): the platform's users in one account, tenants in another.

        Tenants reach the platform only through its exports, and a service import maps
        the reply subject of what they publish to one of the server's own: JetStream's
        PubAck, or any answer, goes back to the tenant's account. In one account a
        tenant could name a platform subject as its reply, and the server would publish
        the PubAck there, into whatever stream captures it. Each tenant has an account
        of its own, so its connections are bounded apart from every other's."""
        accounts: dict[str, dict[str, object]] = {
            PLATFORM_ACCOUNT: {
                "jetstream": "enabled",
                "users": [],
                "exports": [{kind: subject} for kind, subject in TENANT_GATES],
            },
        }
        for u in self.users.values():
            p = self.permissions(u, service_perms)
            entry: dict[str, object] = {
                "user": u.user,
                "password": u.password_hash,
                "permissions": {
                    "publish": {"allow": list(p.publish)},
                    "subscribe": {"allow": list(p.subscribe)},
                },
            }
            if p.responses:
                entry["permissions"]["allow_responses"] = True  # type: ignore[index]
            if u.role == "tenant":
                accounts[tenant_account(u.name)] = {
                    "users": [entry],
                    "imports": tenant_imports(u.name),
                    "limits": {"max_connections": u.max_connections or TENANT_CONNECTIONS},
                }
            else:
                accounts[PLATFORM_ACCOUNT]["users"].append(entry)  # type: ignore[attr-defined]
        return "accounts " + json.dumps(accounts, indent=2) + "\n"

    @property
    def config_path(self) -> Path:
        """The server's users and permissions (included by its configuration)."""
        return self.folder / "nats.conf"

    def write_server_config(self, service_perms: dict[str, Permissions]) -> Path:
        """The server's users as they are on disk now (not as this copy last saw them)."""
        with self._changing():
            return self._write_server_config(service_perms)

    def _write_server_config(self, service_perms: dict[str, Permissions]) -> Path:
        self._rehash()
        path = self.config_path
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.server_config(service_perms))
        tmp.chmod(0o600)
        tmp.replace(path)
        return path
