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

from inferbus.modelcli import nats_option

HEARTBEAT_WAIT_S = 2.5
"""``apply`` listens this long for the workers serving the model (they beat each 1 s)."""


@click.command()
@click.option("-f", "--filename", "path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML (or JSON) with one or more LLMService documents.")  # fmt: skip
@click.option("--scale-target", default="worker", show_default=True,
              help="What runs the model's workers for the autoscaler: inferbus up's "
              "scalable service; empty: leave the model's size alone.")  # fmt: skip
@click.option("--rules-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".inferbus") / "rules", show_default=True,
              help="Where the Prometheus rule files of the services' stages and custom "
              "metrics go.")  # fmt: skip
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the settings record, rollout and rule files; send nothing.",
)
@nats_option
def apply(path: Path, scale_target: str, rules_dir: Path, dry_run: bool, nats_url: str) -> None:
    """Serve each LLMService in FILE on a running platform (`inferbus up`): the
    autoscaler and the sanitizer follow its scaling and checks for its model at once,
    the delivery service rolls its model version out when another is served, and its
    rule file is written. Prints each service's phase, as the operator would set it."""
    from inferbus.llmservice import render
    from inferbus.llmservice.spec import SpecError, load_file

    try:
        services = load_file(path)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    by = f"inferbus apply ({getpass.getuser()})"
    now = time.time()
    if dry_run:
        for svc in services:
            s = render.service_settings(svc, scale_target=scale_target, set_by=by, now=now)
            click.echo(json.dumps({"settings": msgspec.to_builtins(s),
                                   "rules": render.prometheus_rules(svc)}, indent=2))  # fmt: skip
        return
    code = asyncio.run(_apply(services, scale_target, rules_dir, by, nats_url))
    raise SystemExit(code)


async def _apply(services: list[Any], scale_target: str, rules_dir: Path, by: str,
                 nats_url: str) -> int:  # fmt: skip
    import yaml

    from inferbus.contracts import HEARTBEATS, WorkerHeartbeat
    from inferbus.llmservice import bus, render
    from inferbus.shared.bus import connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.codec import decode_or_none
    from inferbus.shared.streams import ensure_streams

    nc = await connect(nats_url, "inferbus-apply", credentials_from_env())
    beats: dict[str, WorkerHeartbeat] = {}

    async def on_beat(msg: Any) -> None:
        hb = decode_or_none(msg.data, WorkerHeartbeat)
        if hb is not None:
            beats[hb.worker_id] = hb

    failed = 0
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        sub = await nc.subscribe(HEARTBEATS, cb=on_beat)
        started = time.monotonic()
        for svc in services:
            now = time.time()
            model = svc.spec.model.name
            existing = await bus.current_settings(js, model)
            taken = render.conflict(svc, existing)
            if taken:
                click.echo(f"llmservice {svc.key}: refused: {taken}", err=True)
                failed += 1
                continue
            settings = render.service_settings(svc, scale_target=scale_target, set_by=by, now=now)
            changed = not bus.same(existing, settings)
            if changed:
                await bus.publish_settings(js, settings)
            delivery = await bus.delivery_view(js, model)
            # asked already when the record with this version went out (as the operator
            # asks once per generation): a rolled-back version is asked again by
            # `inferbus model deploy`, not by applying the same file
            asked = (render.ask_key(svc) if existing is not None and not existing.removed
                     and existing.version == svc.spec.model.version else "")  # fmt: skip
            req = render.deploy_request(svc, delivery, asked, set_by=by, now=now)
            if req is not None:
                await bus.ask_deploy(js, req)
            rules = render.prometheus_rules(svc)
            rules_path = rules_dir / f"{svc.metadata.name}.rules.yml"
            if rules is not None:
                rules_dir.mkdir(parents=True, exist_ok=True)
                rules_path.write_text(yaml.safe_dump(rules, sort_keys=False))
            elif rules_path.exists():
                rules_path.unlink()
            await asyncio.sleep(max(0.0, HEARTBEAT_WAIT_S - (time.monotonic() - started)))
            if req is not None:
                delivery = await bus.delivery_view(js, model)
            st = render.status(svc, _workers(beats, model), delivery,
                               "", time.time())  # fmt: skip
            click.echo(f"llmservice {svc.key}: {'configured' if changed else 'unchanged'}; "
                       f"model {model}"
                       + (f"; rollout of {req.version} asked" if req else "")
                       + (f"; rules {rules_path}" if rules is not None else "")
                       + f"\n  phase {st.phase}: {st.reason}: {st.message}")  # fmt: skip
        await sub.unsubscribe()
    finally:
        await nc.close()
    return 1 if failed else 0


@click.command()
@click.option("-f", "--filename", "path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))  # fmt: skip
@click.option("--rules-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".inferbus") / "rules", show_default=True)  # fmt: skip
@nats_option
def delete(path: Path, rules_dir: Path, nats_url: str) -> None:
    """Stop serving FILE's LLMServices as declared: the autoscaler and the sanitizer go
    back to their flags for each model, and its rule file is removed. The served
    version and the workers stay as they are."""
    from inferbus.llmservice import bus, render
    from inferbus.llmservice.spec import SpecError, load_file
    from inferbus.shared.bus import connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    try:
        services = load_file(path)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    by = f"inferbus delete ({getpass.getuser()})"

    async def run() -> None:
        nc = await connect(nats_url, "inferbus-delete", credentials_from_env())
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            for svc in services:
                model = svc.spec.model.name
                existing = await bus.current_settings(js, model)
                if existing is None or existing.removed or existing.service != svc.key:
                    click.echo(f"llmservice {svc.key}: not applied")
                    continue
                record = render.removed_settings(model, svc.key, set_by=by, now=time.time())
                await bus.publish_settings(js, record)
                (rules_dir / f"{svc.metadata.name}.rules.yml").unlink(missing_ok=True)
                click.echo(f"llmservice {svc.key}: deleted")
        finally:
            await nc.close()

    asyncio.run(run())


def _workers(beats: dict[str, Any], model: str) -> Any:
    """The workers serving ``model`` as a Deployment's view (ready ones count)."""
    from inferbus.llmservice.render import DeploymentView

    serving = [hb for hb in beats.values() if model in hb.models]
    ready = [hb for hb in serving if hb.state == "ready"]
    return DeploymentView(exists=bool(beats), replicas=len(serving), ready=len(ready))


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
@click.option("-f", "--filename", "path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))  # fmt: skip
@click.option("--image", default="inferbus", show_default=True)
def render_cmd(path: Path, image: str) -> None:
    """Print the Kubernetes objects the operator makes of FILE's LLMServices (YAML), for
    review or GitOps; the operator also sends their settings on the bus."""
    import yaml

    from inferbus.llmservice import render
    from inferbus.llmservice.spec import SpecError, load_file

    try:
        services = load_file(path)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    objects: list[Any] = []
    for svc in services:
        cluster = render.Cluster(image=image)
        objects.append(render.worker_deployment(svc, cluster, None))
        objects.extend(render.scale_access(svc, cluster.autoscaler_account))
        rules = render.prometheus_rules(svc)
        if rules is not None:
            objects.append(render.rules_configmap(svc, yaml.safe_dump(rules, sort_keys=False)))
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@llmservice.command("operator")
@nats_option
@click.option("--kubeconfig", envvar="KUBECONFIG", default="",
              help="Empty: the pod's service account.")  # fmt: skip
@click.option("--namespace", "namespaces", multiple=True, envvar="INFERBUS_OPERATOR_NAMESPACES",
              help="Watch these namespaces only (default: the whole cluster).")  # fmt: skip
@click.option("--image", envvar="INFERBUS_IMAGE", default="inferbus", show_default=True,
              help="The image the workers run.")  # fmt: skip
@click.option(
    "--models-claim",
    default="models",
    show_default=True,
    help="The ReadOnlyMany claim with the models' folders (mounted at /models).",
)
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True)
def operator_cmd(nats_url: str, kubeconfig: str, namespaces: tuple[str, ...], image: str,
                 models_claim: str, liveness: str) -> None:  # fmt: skip
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
