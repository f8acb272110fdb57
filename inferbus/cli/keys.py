"""``inferbus keys``: the gateway's API keys."""

from __future__ import annotations

import json

import click


@click.group()
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
