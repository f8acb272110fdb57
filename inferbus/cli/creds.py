"""``inferbus creds``: the closed bus's users: tenants, stacks, Kubernetes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from inferbus import servicetable
from inferbus.shared.config import DEFAULT_NATS_URL


@click.group()
def creds() -> None:
    """Credentials on the closed bus of `inferbus up` (its state folder's registry)."""


_state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), default=Path(".inferbus"), show_default=True
)


def _reload_bus(state_dir: Path, nats_url: str = "", new_creds: Path | None = None) -> None:
    """Tell the embedded nats-server to reread its users (SIGHUP), when it runs."""
    import os
    import signal

    from inferbus.busauth import Registry

    Registry.open(state_dir / "auth").write_server_config(servicetable.permissions())

    def reload() -> int:
        reloaded = 0
        for pid_file in sorted(state_dir.glob("nats*.pid")):  # one, or each node of a cluster
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)
                reloaded += 1
            except (OSError, ValueError):
                pass
        return reloaded

    if not reload():
        click.echo(
            "the embedded nats-server is not running: it reads them when it starts", err=True
        )
    elif new_creds is not None:
        _wait_accepted(nats_url, new_creds, reload)


def _wait_accepted(nats_url: str, creds_path: Path, reload: Callable[[], object]) -> None:
    """Until every node takes the new credentials (a reload is quick, not instant) and
    routes a new tenant's submits (its account's imports take a second reload)."""
    from inferbus.shared.bus import BusAuthError, BusUnreachableError, wait_accepted
    from inferbus.shared.buscreds import load_credentials

    try:
        asyncio.run(wait_accepted(nats_url, load_credentials(creds_path), nudge=reload))
    except (BusAuthError, BusUnreachableError) as exc:
        raise click.ClickException(f"the bus did not take the new credentials: {exc}") from None


def _operator_of(state_dir: Path) -> Any:
    """The operator's credentials of the registry being changed: ``inferbus up`` wrote
    them in its state folder (``--state-dir`` names which; the global default is only
    the current folder's), else INFERBUS_NATS_CREDS / ``--creds``."""
    from inferbus.busauth import OPERATOR, Registry
    from inferbus.shared.buscreds import credentials_from_env, load_credentials

    path = Registry(state_dir / "auth").creds_path(OPERATOR)
    return load_credentials(path) if path.exists() else credentials_from_env()


def _publish_tenant(nats_url: str, policy: Any, operator: Any) -> None:
    from inferbus.contracts import tenant_policy_subject
    from inferbus.shared.bus import CLI_PATIENCE_S, connect, publish_durable
    from inferbus.shared.streams import ensure_streams

    async def publish() -> None:
        nc = await connect(nats_url, "inferbus-creds", operator, give_up_s=CLI_PATIENCE_S)
        try:
            js = nc.jetstream()
            await ensure_streams(js, update=False)
            await publish_durable(
                js,
                tenant_policy_subject(policy.tenant),
                policy,
                request_id=f"tenant-{policy.tenant}",
            )
        finally:
            await nc.close()

    asyncio.run(publish())


@creds.command("new")
@click.option("--tenant", required=True, help="Letters, digits, '-' and '_'.")
@click.option(
    "--priority",
    type=click.Choice(["interactive", "standard", "batch"]),
    default="standard",
    show_default=True,
)
@click.option("--model", "models", multiple=True, help="A model it may use (default: all).")
@click.option("--max-tokens", default=0, show_default=True, help="Per request; 0: no cap.")
@click.option(
    "--max-bytes-per-minute",
    default=0,
    show_default=True,
    help="What its submits may weigh in a minute; 0: the deployment's (the sanitizer's "
    "--tenant-bytes-per-minute).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=0),
    default=None,
    help="Its NATS connections at once; 0: the default (256). Unset: what it had.",
)
@click.option(
    "--input-policy",
    type=click.Choice(["", "block", "flag", "off"]),
    default="",
    help="Input checks for its requests (default: the deployment's).",
)
@click.option(
    "--data-policy",
    type=click.Choice(["", "block", "flag", "spotlight", "off"]),
    default="",
    help="Instructions found in the tool results its agents send (default: the deployment's).",
)
@click.option(
    "--tool-call-policy",
    type=click.Choice(["", "mask", "refuse"]),
    default="",
    help="PII its messages never gave, in its tool calls' arguments (default: the "
    "deployment's, mask).",
)
@click.option(
    "--mask-pii/--no-mask-pii",
    default=None,
    help="Mask PII in its output (default: the deployment's, on).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also copy the credentials file here.",
)
@_state_dir_option
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
def creds_new(
    tenant: str,
    priority: str,
    models: tuple[str, ...],
    max_tokens: int,
    max_bytes_per_minute: int,
    max_connections: int | None,
    input_policy: str,
    data_policy: str,
    tool_call_policy: str,
    mask_pii: bool | None,
    out: Path | None,
    state_dir: Path,
    nats_url: str,
) -> None:
    """Issue a tenant's NATS credentials: it may submit on its own subject and read its
    own replies, and its requests run with this record's priority and policies, whatever
    they say. Prints the credentials file's path (mode 0600); pass it to a client as
    `Client.connect(creds=PATH)` or INFERBUS_NATS_CREDS."""
    import shutil
    import time

    from inferbus.busauth import Registry
    from inferbus.contracts import TenantPolicy

    policy = TenantPolicy(
        tenant=tenant,
        priority=priority,
        models=list(models) or ["*"],
        max_tokens=max_tokens,
        max_bytes_per_minute=max_bytes_per_minute,
        input_policy=input_policy,
        data_policy=data_policy,
        tool_call_policy=tool_call_policy,
        mask_pii=mask_pii,
        set_at=time.time(),
    )
    registry = Registry.open(state_dir / "auth")
    existed = f"tenant-{tenant}" in registry.users
    try:
        path = registry.tenant(tenant, max_connections)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None
    try:
        _reload_bus(state_dir, nats_url, path)
        _publish_tenant(nats_url, policy, _operator_of(state_dir))
    except Exception as exc:
        if not existed:  # a user with no record is refused every request: none instead
            registry.remove(f"tenant-{tenant}")
            _reload_bus(state_dir)
        why = exc.message if isinstance(exc, click.ClickException) else repr(exc)
        raise click.ClickException(f"tenant {tenant!r} not made: {why}") from None
    if out is not None:
        shutil.copyfile(path, out)
        out.chmod(0o600)
        path = out
    click.echo(str(path))


@creds.command("revoke")
@click.option("--tenant", required=True)
@_state_dir_option
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
def creds_revoke(tenant: str, state_dir: Path, nats_url: str) -> None:
    """Remove a tenant's credentials (new connections are refused, and the server drops
    its current ones on reload) and refuse its requests still in flight to the sanitizer."""
    import time

    from inferbus.busauth import Registry
    from inferbus.contracts import TenantPolicy

    if not Registry.open(state_dir / "auth").remove(f"tenant-{tenant}"):
        raise click.ClickException(f"no tenant {tenant!r} in {state_dir / 'auth'}")
    _reload_bus(state_dir)
    revoked = TenantPolicy(tenant=tenant, revoked=True, set_at=time.time())
    _publish_tenant(nats_url, revoked, _operator_of(state_dir))
    click.echo(f"revoked {tenant}")


@creds.command("stack")
@click.argument("auth_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--replicas",
    multiple=True,
    metavar="SERVICE=N",
    help="Instances of a scalable service (default: the service table's).",
)
def creds_stack(auth_dir: Path, replicas: tuple[str, ...]) -> None:
    """The closed bus of a stack whose processes are fixed (compose): the operator and
    one user per service instance, named as `inferbus up` names them (gateway,
    worker-0, ...), their credentials in AUTH_DIR/creds/ and the server's users in
    AUTH_DIR/nats.conf (give it to nats-server with -c). Users already there keep
    their passwords; run it again after an upgrade to refresh the permissions."""
    from inferbus.busauth import Registry

    counts = {e.name: e.instances for e in servicetable.SERVICES}
    for item in replicas:
        name, _, n = item.partition("=")
        if name not in counts or not n.isdigit() or int(n) < 1:
            raise click.BadParameter(
                f"{item!r}: SERVICE=N with a service of the table and N >= 1",
                param_hint="--replicas",
            )
        if int(n) > 1 and not servicetable.get(name).scalable:
            raise click.BadParameter(f"{name} runs once", param_hint="--replicas")
        counts[name] = int(n)
    reg = Registry.open(auth_dir)
    reg.operator()
    for entry in servicetable.SERVICES:
        for i in range(counts[entry.name]):
            reg.service(entry.name, entry.instance_name(i))
    click.echo(str(reg.write_server_config(servicetable.permissions())))


@creds.command("k8s")
@click.argument("auth_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--nats-replicas",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="The NATS StatefulSet's replicas (deploy/k8s/base/nats.yaml).",
)
def creds_k8s(auth_dir: Path, nats_replicas: int) -> None:
    """The closed bus of a Kubernetes deployment, as Secrets on standard output:
    `inferbus creds k8s DIR | kubectl -n inferbus apply -f -`. One NATS user per service
    (its pods share it), the operator, the server's users and its routes' password.
    Keep AUTH_DIR: run again, it gives the same passwords (after an upgrade, the new
    permissions)."""
    from inferbus.k8sbus import bus_secrets

    click.echo(json.dumps(bus_secrets(auth_dir, nats_replicas), indent=2))


@creds.command("list")
@_state_dir_option
def creds_list(state_dir: Path) -> None:
    """The users of the closed bus: who, which role, for what."""
    from inferbus.busauth import Registry

    for u in Registry.open(state_dir / "auth").users.values():
        click.echo(f"{u.user:<28} {u.role:<10} {u.name}")
