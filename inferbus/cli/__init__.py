"""The ``inferbus`` command: the group, and one module per command group beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from inferbus.shared.buscreds import CREDS_ENV
from inferbus.shared.errors import ConfigError

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
    import sys

    import structlog

    # a command's output is its stdout (`creds new` prints a path): its logs go aside
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))

    if creds:
        os.environ[CREDS_ENV] = creds
    elif not os.environ.get(CREDS_ENV) and DEFAULT_OPERATOR_CREDS.exists():
        os.environ[CREDS_ENV] = str(DEFAULT_OPERATOR_CREDS)


def _register() -> None:
    from . import canary, certs, checks, contracts, creds, keys, llmservice, model, nats, platform

    for command in (
        platform.up,
        platform.generate,
        platform.serve,
        platform.ps,
        platform.scale,
        platform.top,
        model.model,
        checks.pii,
        checks.sanitize,
        canary.canary,
        keys.keys,
        contracts.contracts,
        certs.certs,
        creds.creds,
        nats.nats,
    ):
        main.add_command(command)
    llmservice.register(main)


_register()
