"""``inferbus model ...``: the registry (push, list, status), signing keys, rollouts
(deploy, rollback) and residency. Every command talks to the bus as the operator."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click

from inferbus.shared.config import DEFAULT_NATS_URL

DEFAULT_SIGNING_KEY = Path(".inferbus") / "signing" / "release.key"
"""Where `inferbus up` (default state folder) keeps its signing key."""

nats_option = click.option(
    "--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True
)


@contextlib.asynccontextmanager
async def _bus(nats_url: str, name: str) -> AsyncIterator[Any]:
    from inferbus.shared.bus import CLI_PATIENCE_S, connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    nc = await connect(nats_url, name, credentials_from_env(), give_up_s=CLI_PATIENCE_S)
    try:
        js = nc.jetstream()
        await ensure_streams(js, update=False)
        yield js
    finally:
        await nc.close()


def _ref(text: str) -> tuple[str, str]:
    name, sep, version = text.partition("@")
    if not sep or not name or not version:
        raise click.BadParameter(f"want NAME@VERSION, got {text!r}")
    return name, version


def register(model: click.Group) -> None:
    for command in (keygen, push, list_cmd, status, deploy, rollback, residency, quantize):
        model.add_command(command)


@click.command()
@click.argument("private_key", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--curve", type=click.Choice(["P-256", "P-384", "P-521"]), default="P-256", show_default=True
)
def keygen(private_key: Path, curve: str) -> None:
    """Make a signing key pair: PRIVATE_KEY (keep it secret) and PRIVATE_KEY.pub (give it
    to workers: --trusted-keys)."""
    from inferbus.shared.signing import generate_key

    if private_key.exists():
        raise click.ClickException(f"{private_key} exists: not overwriting a key")
    public = generate_key(private_key, curve)
    click.echo(f"private  {private_key}\npublic   {public}")


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", required=True, help="The model's served name (an adapter's own name).")
@click.option("--version", "version", required=True)
@click.option(
    "--key",
    "key",
    type=click.Path(exists=True, dir_okay=False),
    default=lambda: str(DEFAULT_SIGNING_KEY) if DEFAULT_SIGNING_KEY.exists() else None,
    help="The private key that signs it (inferbus model keygen); default: "
    f"{DEFAULT_SIGNING_KEY}, which `inferbus up` makes.",
)
@click.option("--base", default="", help="An adapter: the model name it applies to.")
@click.option(
    "--store",
    type=click.Choice(["object", "path"]),
    default="object",
    show_default=True,
    help="object: the files go into the JetStream Object Store. "
    "path: they stay in --location, a volume every worker mounts.",
)
@click.option("--location", default="", help="--store path: the folder workers read.")
@nats_option
def push(
    folder: Path,
    name: str,
    version: str,
    key: str | None,
    base: str,
    store: str,
    location: str,
    nats_url: str,
) -> None:
    """Sign FOLDER (OpenSSF model-signing, ECDSA key) and push it as NAME@VERSION."""
    from inferbus.shared import modelstore

    if key is None:
        raise click.UsageError("no signing key: pass --key (inferbus model keygen makes one)")
    from inferbus.shared.signing import sign_folder

    try:
        manifest = modelstore.manifest_of(
            folder, name, version, base_model=base, pushed_by=getpass.getuser()
        )
    except modelstore.RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    with tempfile.TemporaryDirectory() as tmp:
        sig = Path(tmp) / manifest.signature
        sign_folder(folder, sig, key)
        signature = sig.read_bytes()

    location = location or str(folder.resolve())

    async def run() -> Any:
        async with _bus(nats_url, "inferbus-model-push") as js:
            return await modelstore.push(
                js, folder, manifest, signature, store=store, location=location
            )

    try:
        pushed = asyncio.run(run())
    except modelstore.RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    mb = pushed.size_bytes / 1e6
    click.echo(
        f"{pushed.ref}  {pushed.kind}  {len(pushed.files)} files  {mb:.1f} MB  "
        f"shape {pushed.shape}  signed  ({pushed.store})"
    )


@click.command("list")
@click.argument("name", default="")
@nats_option
def list_cmd(name: str, nats_url: str) -> None:
    """The registry's versions (of NAME), the current ones marked *."""
    from inferbus.shared import modelstore

    async def run() -> tuple[list[Any], dict[str, str]]:
        async with _bus(nats_url, "inferbus-model-list") as js:
            try:
                versions = await modelstore.list_versions(js, name)
            except modelstore.RegistryError:
                return [], {}
            currents = {}
            for n in {v.name for v in versions}:
                c = await modelstore.get_current(js, n)
                if c is not None:
                    currents[n] = c.version
            return versions, currents

    versions, currents = asyncio.run(run())
    if not versions:
        click.echo("no versions pushed")
    for v in versions:
        mark = "*" if currents.get(v.name) == v.version else " "
        extra = f" on {v.base_model}" if v.base_model else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.pushed_at))
        click.echo(
            f"{mark} {v.ref:<32} {v.kind}{extra:<16} {v.size_bytes / 1e6:8.1f} MB  "
            f"{v.quantization or '-':<16} {when}"
        )


async def read_decisions(js: Any, name: str, last: int = 0) -> list[Any]:
    """The rollout decisions recorded for ``name`` (its audit trail), oldest first."""
    from nats.js.api import DeliverPolicy
    from nats.js.errors import NotFoundError

    from inferbus.contracts import RolloutDecision, rollout_subject
    from inferbus.shared.codec import decode

    subject = rollout_subject(name)
    try:
        info = await js.stream_info("IB_DELIVERY", subjects_filter=subject)
    except NotFoundError:
        return []
    total = (info.state.subjects or {}).get(subject, 0)
    if not total:
        return []
    out: list[Any] = []
    done = asyncio.Event()

    async def on(msg: Any) -> None:
        out.append(decode(msg.data, RolloutDecision))
        if len(out) >= total or msg.metadata.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        subject,
        stream="IB_DELIVERY",
        cb=on,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    try:
        await asyncio.wait_for(done.wait(), timeout=10.0)
    finally:
        await sub.unsubscribe()
    return out[-last:] if last else out


def _show(d: Any) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(d.decided_at))
    figures = ""
    if d.candidate.samples:
        c, b = d.candidate, d.baseline
        figures = (
            f"  [new: {c.samples} req, ttft p95 {c.ttft_p95 * 1000:.0f} ms, "
            f"itl p95 {c.itl_p95 * 1000:.1f} ms, errors {c.error_rate:.1%}; current: "
            f"{b.samples} req, ttft p95 {b.ttft_p95 * 1000:.0f} ms]"
        )
    ref = f"{d.model}@{d.version}" if d.version else f"{d.model} (--model)"
    return f"{when}  {ref}  {d.action:<8} {d.weight:>4.0%}  {d.reason}{figures}"


@click.command()
@click.argument("name")
@click.option("--last", default=20, show_default=True, help="Decisions shown (0: all).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: current, versions, decisions (the audit trail, oldest first).",
)
@nats_option
def status(name: str, last: int, as_json: bool, nats_url: str) -> None:
    """NAME's current version, its versions, its rollout and the latest decisions."""
    from inferbus.shared import modelstore

    async def run() -> tuple[Any, list[Any], list[Any]]:
        async with _bus(nats_url, "inferbus-model-status") as js:
            try:
                current = await modelstore.get_current(js, name)
                versions = await modelstore.list_versions(js, name)
            except modelstore.RegistryError:
                current, versions = None, []
            return current, versions, await read_decisions(js, name, last)

    current, versions, decisions = asyncio.run(run())
    if as_json:
        import json

        from inferbus.shared.codec import to_builtins

        click.echo(
            json.dumps(
                {
                    "current": to_builtins(current) if current else None,
                    "versions": [to_builtins(v) for v in versions],
                    "decisions": [to_builtins(d) for d in decisions],
                }
            )
        )
        return
    own = "(each worker's own --model)"
    now = (current.version or own) if current else own
    before = f" (before: {current.previous or own})" if current else ""
    click.echo(f"{name}: current {now}{before}")
    click.echo("versions: " + (", ".join(v.version for v in versions) or "none"))
    for d in decisions:
        click.echo(_show(d))


def _slo(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise click.BadParameter(f"want KEY=VALUE pairs, got {item!r}")
    return out


def _duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


@click.command()
@click.argument("ref")
@click.option(
    "--steps",
    default="1,5,25,50,100",
    show_default=True,
    help="Percent of the model's requests on the new version, step by step.",
)
@click.option("--interval", default="5m", show_default=True, help="Time at each step (5m, 30s).")
@click.option(
    "--slo",
    default="",
    help="Gates: ttft_p95=0.5,itl_p95=0.05,error_rate=0.001 "
    "(seconds, a share); *_ratio=1.5 bounds the new version against the current.",
)
@click.option(
    "--min-samples",
    default=20,
    show_default=True,
    help="Requests on the new version a step needs before it is judged.",
)
@click.option(
    "--canary-workers",
    default=1,
    show_default=True,
    help="Workers that load a full model's new version first.",
)
@click.option(
    "--canary/--no-canary",
    default=True,
    show_default=True,
    help="--no-canary: every worker loads it at once (one worker, or an urgent fix); "
    "refused swaps still roll it back.",
)
@click.option(
    "--wait/--no-wait", default=False, help="Follow the rollout's decisions until it ends."
)
@click.option("--timeout", default="1h", show_default=True, help="With --wait: give up after.")
@nats_option
def deploy(
    ref: str,
    steps: str,
    interval: str,
    slo: str,
    min_samples: int,
    canary_workers: int,
    canary: bool,
    wait: bool,
    timeout: str,
    nats_url: str,
) -> None:
    """Roll NAME@VERSION out: canary workers load it, its share of traffic rises step by
    step while it meets the SLO, and it is promoted, or rolled back the moment it does
    not (by the delivery service; every decision is recorded)."""
    from inferbus.contracts import DeployRequest, delivery_command_subject
    from inferbus.shared.bus import publish_durable

    name, version = _ref(ref)
    try:
        pcts = [float(s) for s in steps.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"steps {steps!r}: percentages, comma-separated") from None
    req = DeployRequest(
        model=name,
        version=version,
        steps=pcts,
        interval_s=_duration(interval),
        slo=_slo(slo),
        min_samples=min_samples,
        canary_workers=canary_workers,
        canary=canary,
        requested_by=getpass.getuser(),
        requested_at=time.time(),
    )

    async def run() -> int:
        async with _bus(nats_url, "inferbus-model-deploy") as js:
            seen = len(await read_decisions(js, name))
            await publish_durable(
                js, delivery_command_subject(name), req, request_id=f"deploy-{name}"
            )
            click.echo(f"deploy {ref}: asked")
            if not wait:
                return 0
            return await _follow(js, name, seen, _duration(timeout))

    raise SystemExit(asyncio.run(run()))


async def _follow(js: Any, name: str, seen: int, timeout_s: float) -> int:
    """Print the rollout's new decisions until it ends: 0 promoted and done, 1 rolled
    back or failed, 2 timed out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        decisions = await read_decisions(js, name)
        for d in decisions[seen:]:
            click.echo(_show(d))
            if d.action in ("done",):
                return 0
            if d.action in ("rollback", "failed"):
                return 1
        seen = max(seen, len(decisions))
        await asyncio.sleep(1.0)
    click.echo("still rolling out (see `inferbus model status`)")
    return 2


@click.command()
@click.argument("name")
@click.option("--reason", default="by hand", show_default=True)
@nats_option
def rollback(name: str, reason: str, nats_url: str) -> None:
    """End NAME's rollout on the old version, or go back to the version before the
    current one."""
    from inferbus.contracts import RollbackRequest, delivery_command_subject
    from inferbus.shared.bus import publish_durable

    async def run() -> None:
        async with _bus(nats_url, "inferbus-model-rollback") as js:
            await publish_durable(
                js,
                delivery_command_subject(name),
                RollbackRequest(
                    model=name,
                    reason=reason,
                    requested_by=getpass.getuser(),
                    requested_at=time.time(),
                ),
                request_id=f"rollback-{name}",
            )

    asyncio.run(run())
    click.echo(f"rollback {name}: asked (`inferbus model status {name}` shows the decision)")


@click.command()
@click.argument("name")
@click.argument("level", type=click.Choice(["hot", "warm", "cold"]))
@click.option(
    "--window",
    "windows",
    multiple=True,
    help="HH:MM-HH:MM=LEVEL (UTC): another level inside the window, e.g. "
    "--window 22:00-06:00=warm (hot by day, warm by night).",
)
@nats_option
def residency(name: str, level: str, windows: tuple[str, ...], nats_url: str) -> None:
    """How workers keep NAME's versions: hot (loaded in the engine), warm (verified on
    their disk), cold (in the registry only)."""
    from inferbus.contracts import ModelResidency, ResidencyWindow, residency_subject
    from inferbus.services.worker.swap import check_residency
    from inferbus.shared.bus import publish_durable

    schedule = []
    for w in windows:
        span, sep, lvl = w.partition("=")
        start, dash, end = span.partition("-")
        if not (sep and dash):
            raise click.BadParameter(f"window {w!r}: want HH:MM-HH:MM=LEVEL")
        schedule.append(ResidencyWindow(start=start, end=end, residency=lvl))
    policy = ModelResidency(name=name, residency=level, schedule=schedule, set_at=time.time())
    try:
        check_residency(policy)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

    async def run() -> None:
        async with _bus(nats_url, "inferbus-model-residency") as js:
            await publish_durable(
                js, residency_subject(name), policy, request_id=f"residency-{name}"
            )

    asyncio.run(run())
    click.echo(f"{name}: {level}" + "".join(f", {w}" for w in windows))


@click.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--group-size",
    default=128,
    show_default=True,
    help="Input channels sharing a scale and zero point.",
)
@click.option("--samples", default=32, show_default=True, help="Calibration texts.")
@click.option("--rtn", is_flag=True, help="Round to nearest only: no activation-aware scales.")
def quantize(src: Path, dst: Path, group_size: int, samples: int, rtn: bool) -> None:
    """Quantize the model at SRC to 4-bit AWQ (AutoAWQ gemm format, zero point) in DST,
    for vLLM (needs the engine's extra: torch and transformers). vLLM serves it on GPUs
    and on CPUs with AVX-512; workers elsewhere refuse it with the reason."""
    from inferbus.quantize import awq_quantize

    if dst.exists() and any(dst.iterdir()):
        raise click.ClickException(f"{dst} is not empty")
    report = awq_quantize(
        src, dst, group_size=group_size, samples=samples, activation_aware=not rtn
    )
    for layer, rel in report.items():
        click.echo(f"  {layer:<40} output error {rel:.3f}x round-to-nearest's")
    click.echo(f"awq 4-bit g{group_size}  {dst}")
    try:
        from inferbus.services.worker.capability import quantization_refusal

        why = quantization_refusal("vllm", "awq")
    except ImportError:  # no vLLM here: whether it serves this is the workers' to say
        why = ""
    if why:
        click.echo(f"note: vLLM on this machine cannot serve it: {why}", err=True)
