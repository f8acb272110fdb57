"""The ``inferbus`` command."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Literal

import click

from inferbus import modelcli, servicecli, servicetable
from inferbus.contracts.control import DEFAULT_SUPERVISOR
from inferbus.shared.buscreds import CREDS_ENV
from inferbus.shared.config import DEFAULT_NATS_URL
from inferbus.shared.errors import ConfigError
from inferbus.upoptions import Options, click_options

DEFAULT_OPERATOR_CREDS = Path(".inferbus") / "auth" / "creds" / "operator.json"
"""Where `inferbus up` (default state folder) leaves the operator's credentials."""


class _Commands(click.Group):
    """The one place a wrong setting (``ConfigError``) becomes a command's error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands)
@click.version_option(package_name="inferbus")
@click.option(
    "--creds",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=f"NATS credentials for the commands that use the bus (env {CREDS_ENV}; default: "
    f"{DEFAULT_OPERATOR_CREDS} when `inferbus up` left it here).",
)
def main(creds: str | None) -> None:
    """inferbus: LLM inference as event-driven services over NATS JetStream."""
    import os

    if creds:
        os.environ[CREDS_ENV] = creds
    elif not os.environ.get(CREDS_ENV) and DEFAULT_OPERATOR_CREDS.exists():
        os.environ[CREDS_ENV] = str(DEFAULT_OPERATOR_CREDS)


@main.command()
@click_options
def up(**given: Any) -> None:
    """Start the whole platform on this machine."""
    from inferbus.up import run

    sys.exit(run(Options.from_flags(given)))


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", required=True)
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--stop", multiple=True)
@click.option("--seed", type=int, default=None)
@click.option(
    "--chat/--completion",
    default=True,
    show_default=True,
    help="Send the prompt as a user message, or as raw text.",
)
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
@click.option("--timeout", default=600.0, show_default=True)
def generate(
    prompt: str,
    model: str,
    max_tokens: int,
    temperature: float,
    stop: tuple[str, ...],
    seed: int | None,
    chat: bool,
    nats_url: str,
    timeout: float,
) -> None:
    """Stream a completion to the terminal over NATS."""
    from inferbus.client import Client, RequestError

    async def go() -> int:
        client = await Client.connect(nats_url, name="inferbus-generate")
        try:
            stream = client.stream(
                model,
                None if chat else prompt,
                messages=[{"role": "user", "content": prompt}] if chat else None,
                max_tokens=max_tokens,
                temperature=temperature,
                stop=list(stop),
                seed=seed,
                timeout=timeout,
            )
            try:
                async for chunk in stream:
                    click.echo(chunk.text, nl=False)
            except RequestError as exc:
                click.echo(f"\nerror ({exc.code}): {exc}", err=True)
                return 1
            click.echo()
            out = stream.outcome
            assert out is not None
            ttft = (stream.first_token_at or stream.submitted_at) - stream.submitted_at
            click.echo(
                f"[{out.finish_reason}; {out.usage.prompt_tokens} prompt + "
                f"{out.usage.completion_tokens} completion tokens; "
                f"ttft {ttft * 1000:.1f} ms]",
                err=True,
            )
            return 0
        finally:
            await client.close()

    sys.exit(asyncio.run(go()))


@main.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("service", type=click.Choice(servicetable.names()))
@click.pass_context
def serve(ctx: click.Context, service: str) -> None:
    """Run one service in the foreground (flags as for python -m inferbus.services.NAME)."""
    from inferbus.shared import runtime

    entry = servicetable.get(service)
    runtime.main(entry.service_class(), entry.settings_class(), ctx.args)


def _supervisor_call(nats_url: str, supervisor: str, command: Any) -> Any:
    """Send a command to ``inferbus up``'s supervisor; its state back."""
    from inferbus.contracts.control import SupervisorState, supervisor_subject
    from inferbus.shared.bus import connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.codec import decode, encode

    async def call() -> SupervisorState:
        nc = await connect(nats_url, "inferbus-ctl", credentials_from_env())
        try:
            reply = await nc.request(supervisor_subject(supervisor), encode(command), timeout=5)
        finally:
            await nc.close()
        return decode(reply.data, SupervisorState)

    try:
        state = asyncio.run(call())
    except Exception as exc:
        raise click.ClickException(
            f"no answer from supervisor {supervisor!r} at {nats_url} ({type(exc).__name__}); "
            "is `inferbus up` running?"
        ) from None
    for p in state.processes:
        click.echo(
            f"{p.name:<14} {p.state:<9} pid {p.pid:<8} restarts {p.restarts:<3} http :{p.http_port}"
        )
    if state.error:
        raise click.ClickException(state.error)
    return state


_supervisor_options = [
    click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True),
    click.option("--supervisor", default=DEFAULT_SUPERVISOR, show_default=True),
]


def _with_supervisor_options(f: Any) -> Any:
    for option in reversed(_supervisor_options):
        f = option(f)
    return f


@main.command()
@_with_supervisor_options
def ps(nats_url: str, supervisor: str) -> None:
    """The processes `inferbus up` supervises, with their state and restarts."""
    from inferbus.contracts.control import SupervisorQuery

    _supervisor_call(nats_url, supervisor, SupervisorQuery())


@main.command()
@click.argument("service")
@click.argument("instances", type=click.IntRange(min=0))
@click.option("--stop-first", multiple=True, help="Instance to stop first when scaling down.")
@_with_supervisor_options
def scale(
    service: str, instances: int, stop_first: tuple[str, ...], nats_url: str, supervisor: str
) -> None:
    """Run INSTANCES processes of SERVICE (workers) under `inferbus up`; stopped ones drain
    their in-flight requests first."""
    from inferbus.contracts.control import ScaleService

    _supervisor_call(
        nats_url,
        supervisor,
        ScaleService(service=service, instances=instances, stop_first=list(stop_first)),
    )


@main.command()
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between snapshots; rates are over this interval.",
)
@click.option(
    "--once", is_flag=True, help="Take two snapshots --interval apart, print one view and exit."
)
@click.option("--json", "as_json", is_flag=True, help="With --once: the view as JSON.")
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
def top(interval: float, once: bool, as_json: bool, nats_url: str) -> None:
    """A live view of the running platform: workers and their models, queue depth per
    lane, tokens/s, TTFT p50/p95 and error rate, from $SRV stats and each service's
    /metrics."""
    if as_json and not once:
        raise click.UsageError("--json needs --once")
    from inferbus.top.command import run

    sys.exit(run(nats_url, interval, once, as_json))


@main.group()
def model() -> None:
    """Models: make a tiny one; push, sign, deploy and roll back versions."""


modelcli.register(model)
servicecli.register(main)


@model.command("make-tiny")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--lora",
    "lora_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a tiny LoRA adapter for it here.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--arch",
    type=click.Choice(["tiny", "tiny-deep", "1b"]),
    default="tiny",
    show_default=True,
    help="tiny: 2 layers, hidden 128. tiny-deep: 4 layers. 1b: a Llama-3.2-1B shape, "
    "for GPU benchmarks.",
)
def make_tiny_cmd(out_dir: Path, lora_dir: Path | None, seed: int, arch: str) -> None:
    """Build a tiny random-weight Llama with a locally trained tokenizer (seconds)."""
    from inferbus.tinymodel import make_tiny, make_tiny_lora

    click.echo(f"model  {make_tiny(out_dir, seed=seed, arch=arch)}")
    if lora_dir is not None:
        click.echo(f"lora   {make_tiny_lora(out_dir, lora_dir)}")


def _json_lines(stream: Any) -> Any:
    """``{"text": ...}`` objects, one a line, read as UTF-8 whatever the locale (so
    offsets count characters); a blank line is an empty text, so output line N always
    answers input line N; a bad line stops with its number."""
    for n, raw in enumerate(stream.buffer if hasattr(stream, "buffer") else stream, start=1):
        line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
        if not line.strip():
            yield ""
            continue
        try:
            obj = json.loads(line)
            text = obj["text"]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise click.ClickException(f'line {n}: want a JSON object {{"text": "..."}}') from None
        yield text


def _write_json(obj: Any) -> None:
    """One JSON line on stdout as UTF-8 (escaped where a lone surrogate cannot be)."""
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(obj).encode()
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    if out is None:
        sys.stdout.write(data.decode() + "\n")
    else:
        out.write(data + b"\n")
        out.flush()


@main.group()
def pii() -> None:
    """PII detection and masking."""


@pii.command("scan")
def pii_scan() -> None:
    """Read {"text": ...} JSON lines on stdin; write {"masked", "entities": [{"type",
    "start", "end"}]} for each (character offsets into the input text). Works on log
    files converted to JSON lines as well:

        jq -Rc '{text: .}' app.log | inferbus pii scan
    """
    from inferbus.services.sanitizer.pii import mask

    for text in _json_lines(sys.stdin):
        masked, entities = mask(text)
        _write_json(
            {
                "masked": masked,
                "entities": [{"type": e.type, "start": e.start, "end": e.end} for e in entities],
            }
        )


@main.group()
def sanitize() -> None:
    """Input checks: SQL injection, XSS and prompt injection."""


@sanitize.command("check")
@click.option(
    "--policy",
    type=click.Choice(["block", "flag"]),
    default="block",
    show_default=True,
    help="What a finding means (the platform's default: block).",
)
def sanitize_check(policy: Literal["block", "flag"]) -> None:  # click.Choice checked it
    """Read {"text": ...} JSON lines on stdin; write {"decision": block|flag|pass,
    "findings": [{"rule", "type", "start", "end"}]} for each."""
    from inferbus.services.sanitizer.injection import decide, findings

    for text in _json_lines(sys.stdin):
        found = findings(text)
        _write_json(
            {
                "decision": decide(found, policy),
                "findings": [
                    {"rule": f.rule, "type": f.type, "start": f.start, "end": f.end} for f in found
                ],
            }
        )


@main.group()
def canary() -> None:
    """Send a share of a model's requests to another model name (a new version)."""


@canary.command("set")
@click.argument("model")
@click.argument("weights", nargs=-1)
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
def canary_set(model: str, weights: tuple[str, ...], nats_url: str) -> None:
    """Set MODEL's canary: WEIGHTS are TARGET=SHARE pairs (shares 0..1, summing to at
    most 1), e.g. `inferbus canary set llama llama-v2=0.1`; none ends the canary. The
    schedulers follow it at once and read it again when they start."""
    import time as _time

    from inferbus.contracts import CanaryWeights, canary_subject
    from inferbus.shared.bus import connect, publish_durable
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    parsed: dict[str, float] = {}
    for item in weights:
        target, sep, share = item.partition("=")
        try:
            parsed[target] = float(share)
        except ValueError:
            sep = ""
        if not sep or not target or not 0 <= parsed[target] <= 1:
            raise click.BadParameter(f"want TARGET=SHARE with a share in 0..1, got {item!r}")
    if sum(parsed.values()) > 1:
        raise click.BadParameter("the shares sum to more than 1")

    async def publish() -> None:
        nc = await connect(nats_url, "inferbus-canary", credentials_from_env())
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            await publish_durable(
                js,
                canary_subject(model),
                CanaryWeights(model=model, weights=parsed, set_at=_time.time()),
                request_id=f"canary-{model}",
            )
        finally:
            await nc.close()

    asyncio.run(publish())
    click.echo(f"{model}: " + (", ".join(f"{t} {w:.0%}" for t, w in parsed.items()) or "no canary"))


@main.group()
def keys() -> None:
    """API keys for the gateway."""


@keys.command("new")
@click.option("--name", required=True, help="Who holds the key (shows in logs and metrics).")
@click.option("--tenant", default="", help="Tenant for fair sharing (default: the name).")
@click.option("--model", "models", multiple=True, help="A model it may use (default: all).")
@click.option("--max-tokens", default=0, show_default=True, help="Per request; 0: no cap.")
@click.option("--rps", default=0.0, show_default=True, help="Requests per second; 0: no limit.")
@click.option("--tpm", default=0, show_default=True, help="Tokens per minute; 0: no limit.")
@click.option(
    "--priority",
    type=click.Choice(["interactive", "standard", "batch"]),
    default="standard",
    show_default=True,
)
@click.option(
    "--metrics", is_flag=True, help="It may read the gateway's /metrics (a Prometheus scrape key)."
)
def keys_new(
    name: str,
    tenant: str,
    models: tuple[str, ...],
    max_tokens: int,
    rps: float,
    tpm: int,
    priority: str,
    metrics: bool,
) -> None:
    """Make a key: the secret goes to stderr (shown once), the TOML entry holding only its
    SHA-256 to stdout, ready to append to the keys file:

        inferbus keys new --name team-a --rps 5 >> keys.toml
    """
    from inferbus.services.gateway.auth import digest, new_key

    secret = new_key()
    click.echo(f"API key for {name} (store it now; only its hash is kept): {secret}", err=True)
    lines = ["[[keys]]", f"name = {json.dumps(name)}", f'sha256 = "{digest(secret)}"']
    if tenant:
        lines.append(f"tenant = {json.dumps(tenant)}")
    lines.append(f"models = {json.dumps(list(models) or ['*'])}")
    lines += [
        f"max_tokens = {max_tokens}",
        f"requests_per_s = {rps}",
        f"tokens_per_min = {tpm}",
        f'priority = "{priority}"',
        *(["metrics = true"] if metrics else []),
        "",
    ]
    click.echo("\n".join(lines))


@main.group()
def contracts() -> None:
    """The event contracts."""


@contracts.command()
def schema() -> None:
    """Print the JSON Schema of every event, with the subjects they travel on."""
    from inferbus.contracts.schema import document

    click.echo(json.dumps(document(), indent=2))


@main.group()
def certs() -> None:
    """Certificates for NATS over TLS."""


@certs.command("make")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A name or address clients reach the server by (default: localhost, 127.0.0.1).",
)
@click.option("--days", default=365, show_default=True)
def certs_make(folder: Path, hosts: tuple[str, ...], days: int) -> None:
    """Write a private CA (ca.pem, ca-key.pem) and a server certificate it signs
    (server-cert.pem, server-key.pem) into FOLDER, for `inferbus up --nats-tls-dir`.
    Clients verify the server with ca.pem (INFERBUS_NATS_TLS_CA)."""
    from inferbus.certs import make

    click.echo(str(make(folder, list(hosts) or ["localhost", "127.0.0.1"], days)))


@main.group()
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
    reloaded = 0
    for pid_file in sorted(state_dir.glob("nats*.pid")):  # one, or each node of a cluster
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)
            reloaded += 1
        except (OSError, ValueError):
            pass
    if not reloaded:
        click.echo(
            "the embedded nats-server is not running: it reads them when it starts", err=True
        )
    elif new_creds is not None:
        _wait_accepted(nats_url, new_creds)


def _wait_accepted(nats_url: str, creds_path: Path) -> None:
    """Until every node takes the new credentials (a reload is quick, not instant)."""
    from inferbus.shared.bus import BusAuthError, wait_accepted
    from inferbus.shared.buscreds import load_credentials

    try:
        asyncio.run(wait_accepted(nats_url, load_credentials(creds_path)))
    except BusAuthError as exc:
        raise click.ClickException(f"the bus did not take the new credentials: {exc}") from None


def _publish_tenant(nats_url: str, policy: Any) -> None:
    from inferbus.contracts import tenant_policy_subject
    from inferbus.shared.bus import connect, publish_durable
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    async def publish() -> None:
        nc = await connect(nats_url, "inferbus-creds", credentials_from_env())
        try:
            js = nc.jetstream()
            await ensure_streams(js)
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
    "--input-policy",
    type=click.Choice(["", "block", "flag", "off"]),
    default="",
    help="Input checks for its requests (default: the deployment's).",
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
    input_policy: str,
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

    try:
        path = Registry.open(state_dir / "auth").tenant(tenant)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None
    _reload_bus(state_dir, nats_url, path)
    _publish_tenant(
        nats_url,
        TenantPolicy(
            tenant=tenant,
            priority=priority,
            models=list(models) or ["*"],
            max_tokens=max_tokens,
            input_policy=input_policy,
            mask_pii=mask_pii,
            set_at=time.time(),
        ),
    )
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
    _publish_tenant(nats_url, TenantPolicy(tenant=tenant, revoked=True, set_at=time.time()))
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


if __name__ == "__main__":
    main()
