"""``inferbus contracts``: the event contract as JSON Schema."""

from __future__ import annotations

import json

import click


@click.group()
def contracts() -> None:
    """The event contracts."""


@contracts.command()
def schema() -> None:
    """Print the JSON Schema of every event, with the subjects they travel on."""
    from inferbus.contracts.schema import document

    click.echo(json.dumps(document(), indent=2))
