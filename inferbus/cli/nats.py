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
