"""``inferbus nats``: the bus server where ``inferbus up`` does not run it."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def nats() -> None:
    """The NATS server of a compose stack or a Kubernetes StatefulSet."""


@nats.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--store-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The server's JetStream store (its store_dir): the disk watched for room.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def nats_run(store_dir: Path, command: tuple[str, ...]) -> None:
    """Run COMMAND (nats-server and its arguments, after `--`) and restart it once its
    store's disk has room again after a write failed for want of it: JetStream's
    streams stay in error until then, while its health endpoint says ok. Signals go to
    the server; this exits with its status."""
    from inferbus.supervisor.natsguard import run

    store_dir.mkdir(parents=True, exist_ok=True)
    raise SystemExit(run(list(command), store_dir))


@nats.command("provision")
@click.option("--nats-url", envvar="NATS_URL", default="nats://127.0.0.1:4222", show_default=True)
@click.option(
    "--replicas",
    type=int,
    default=None,
    help="Copies each stream keeps (a clustered NATS: 3); default: what each has.",
)
def nats_provision(nats_url: str, replicas: int | None) -> None:
    """Bring every platform stream to its spec, as the operator (INFERBUS_NATS_CREDS):
    its subjects, and its limits from INFERBUS_STREAM_STORE and INFERBUS_STREAM_LIMITS.
    What `inferbus up` and the Kubernetes operator do at start; compose runs it as its
    `provision` step. Services only create a stream that is missing, so a store made by
    an older inferbus (IB_REQUESTS once took every ib.req subject) needs this once."""
    import asyncio

    from inferbus.shared.bus import CLI_PATIENCE_S, connect
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.streams import ensure_streams

    async def provision() -> None:
        nc = await connect(
            nats_url, "inferbus-provision", credentials_from_env(), give_up_s=CLI_PATIENCE_S
        )
        try:
            await ensure_streams(nc.jetstream(), replicas)
        finally:
            await nc.close()

    asyncio.run(provision())
    click.echo("streams provisioned")
