"""``inferbus apply``, ``inferbus llmservice crd`` and ``inferbus operator``: the
LLMService against ``inferbus up`` (or any platform's bus), its CRD, its operator."""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from pathlib import Path
from typing import Any

import click
import msgspec

from inferbus.cli.modelversions import nats_option

HEARTBEAT_WAIT_S = 2.5
"""``apply`` listens this long for the workers serving the model (they beat each 1 s)."""


@click.command()
@click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML (or JSON) with one or more LLMService documents.",
)
@click.option(
    "--scale-target",
    default="worker",
    show_default=True,
    help="What runs the model's workers for the autoscaler: inferbus up's "
    "scalable service; empty: leave the model's size alone.",
)
@click.option(
    "--rules-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".inferbus") / "rules",
    show_default=True,
    help="Where the Prometheus rule files of the services' stages and custom metrics go.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the settings record and the rules; send nothing.",
)
@nats_option
def apply(path: Path, scale_target: str, rules_dir: Path, dry_run: bool, nats_url: str) -> None:
    """Serve each LLMService in FILE on a running platform (`inferbus up`): the
    autoscaler and the sanitizer follow its scaling and checks for its model at once,
    the delivery service rolls its model version out when another is served, and its
    rule file is written. Prints each service's phase, as the operator would set it."""
    from inferbus.llmservice import render

    services = _load(path)
    by = f"inferbus apply ({getpass.getuser()})"
    now = time.time()
    if dry_run:
        for svc in services:
            s = render.service_settings(svc, scale_target=scale_target, set_by=by, now=now)
            click.echo(
                json.dumps(
                    {"settings": msgspec.to_builtins(s), "rules": render.prometheus_rules(svc)},
                    indent=2,
                )
            )
        return
    code = asyncio.run(_apply(services, scale_target, rules_dir, by, nats_url))
    raise SystemExit(code)


async def _apply(
    services: list[Any], scale_target: str, rules_dir: Path, by: str, nats_url: str
) -> int:
    from inferbus.contracts import HEARTBEATS, WorkerHeartbeat
    from inferbus.llmservice import bus, render
    from inferbus.llmservice.render import DeploymentView
    from inferbus.shared.bus import CLI_PATIENCE_S, connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.codec import decode_or_none
    from inferbus.shared.streams import ensure_streams

    nc = await connect(nats_url, "inferbus-apply", credentials_from_env(), give_up_s=CLI_PATIENCE_S)
    beats: dict[str, WorkerHeartbeat] = {}

    async def on_beat(msg: Any) -> None:
        hb = decode_or_none(msg.data, WorkerHeartbeat)
        if hb is not None:
            beats[hb.worker_id] = hb

    failed = 0
    try:
        js = nc.jetstream()
        await ensure_streams(js, update=False)
        sub = await nc.subscribe(HEARTBEATS, cb=on_beat)
        started = time.monotonic()
        for svc in services:
            model = svc.spec.model.name
            existing = await bus.current_settings(js, model)
            taken = render.conflict(svc, existing)
            if taken:
                click.echo(f"llmservice {svc.key}: refused: {taken}", err=True)
                failed += 1
                continue
            synced = await bus.sync(
                js, svc, existing, scale_target=scale_target, asked=None, set_by=by, now=time.time()
            )
            rules = render.rules_text(svc)
            rules_path = rules_dir / f"{svc.metadata.name}.rules.yml"
            await asyncio.to_thread(write_rules, rules_path, rules)
            await asyncio.sleep(max(0.0, HEARTBEAT_WAIT_S - (time.monotonic() - started)))
            req = synced.request
            delivery = await bus.delivery_view(js, model) if req else synced.delivery
            workers = DeploymentView.from_heartbeats(beats.values(), model)
            st = render.status(svc, workers, delivery, "", time.time())
            click.echo(
                f"llmservice {svc.key}: {'configured' if synced.changed else 'unchanged'}; "
                f"model {model}"
                + (f"; rollout of {req.version} asked" if req else "")
                + (f"; rules {rules_path}" if rules is not None else "")
                + f"\n  phase {st.phase}: {st.reason}: {st.message}"
            )
        await sub.unsubscribe()
    finally:
        await nc.close()
    return 1 if failed else 0


@click.command()
@click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option(
    "--rules-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".inferbus") / "rules",
    show_default=True,
)
@nats_option
def delete(path: Path, rules_dir: Path, nats_url: str) -> None:
    """Stop serving FILE's LLMServices as declared: the autoscaler and the sanitizer go
    back to their flags for each model, and its rule file is removed. The served
    version and the workers stay as they are."""
    from inferbus.llmservice import bus
    from inferbus.shared.bus import CLI_PATIENCE_S, connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    services = _load(path)
    by = f"inferbus delete ({getpass.getuser()})"

    async def run() -> None:
        nc = await connect(
            nats_url, "inferbus-delete", credentials_from_env(), give_up_s=CLI_PATIENCE_S
        )
        try:
            js = nc.jetstream()
            await ensure_streams(js, update=False)
            for svc in services:
                if not await bus.withdraw(js, svc, set_by=by, now=time.time()):
                    click.echo(f"llmservice {svc.key}: not applied")
                    continue
                (rules_dir / f"{svc.metadata.name}.rules.yml").unlink(missing_ok=True)
                click.echo(f"llmservice {svc.key}: deleted")
        finally:
            await nc.close()

    asyncio.run(run())


def _load(path: Path) -> list[Any]:
    """FILE's LLMServices, or a click error naming the bad field."""
    from inferbus.llmservice.spec import SpecError, load_file

    try:
        return load_file(path)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def llmservice() -> None:
    """The LLMService resource: its CRD and its operator."""


@llmservice.command("crd")
def crd_cmd() -> None:
    """Print the LLMService CustomResourceDefinition (YAML)."""
    import yaml

    from inferbus.llmservice.crd import crd

    click.echo(yaml.safe_dump(crd(), sort_keys=False), nl=False)


@llmservice.command("render")
@click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option("--image", default="inferbus", show_default=True)
def render_cmd(path: Path, image: str) -> None:
    """Print the Kubernetes objects the operator makes of FILE's LLMServices (YAML), for
    review or GitOps; the operator also sends their settings on the bus."""
    import yaml

    from inferbus.llmservice import render

    objects: list[Any] = []
    for svc in _load(path):
        cluster = render.Cluster(image=image)
        objects.append(render.worker_deployment(svc, cluster, None))
        objects.extend(render.scale_access(svc, cluster.autoscaler_account))
        rules = render.rules_text(svc)
        if rules is not None:
            objects.append(render.rules_configmap(svc, rules))
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@llmservice.command("operator")
@nats_option
@click.option(
    "--kubeconfig", envvar="KUBECONFIG", default="", help="Empty: the pod's service account."
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar="INFERBUS_OPERATOR_NAMESPACES",
    help="Watch these namespaces only (default: the whole cluster).",
)
@click.option(
    "--image",
    envvar="INFERBUS_IMAGE",
    default="inferbus",
    show_default=True,
    help="The image the workers run.",
)
@click.option(
    "--models-claim",
    default="models",
    show_default=True,
    help="The ReadOnlyMany claim with the models' folders (mounted at /models).",
)
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True)
def operator_cmd(
    nats_url: str,
    kubeconfig: str,
    namespaces: tuple[str, ...],
    image: str,
    models_claim: str,
    liveness: str,
) -> None:
    """Run the LLMService operator (kopf) against the cluster."""
    from inferbus.llmservice.render import Cluster
    from inferbus.operator.main import main as run_operator

    run_operator(
        nats_url=nats_url,
        kubeconfig=kubeconfig,
        namespaces=list(namespaces),
        cluster=Cluster(image=image, models_claim=models_claim),
        liveness=liveness,
    )


def register(main: click.Group) -> None:
    main.add_command(apply)
    main.add_command(delete)
    main.add_command(llmservice)


def write_rules(path: Path, rules: str | None) -> None:
    """An LLMService's alert rules beside the others (None: it has none: removed)."""
    if rules is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rules)
