"""``inferbus certs``: a CA and server certificates for a TLS bus."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
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
