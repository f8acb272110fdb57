"""``inferbus canary``: a model's traffic split between its versions, by hand."""

from __future__ import annotations

import asyncio

import click

from inferbus.shared.config import DEFAULT_NATS_URL


@click.group()
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
    from inferbus.shared.bus import CLI_PATIENCE_S, connect, publish_durable
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
        nc = await connect(
            nats_url, "inferbus-canary", credentials_from_env(), give_up_s=CLI_PATIENCE_S
        )
        try:
            js = nc.jetstream()
            await ensure_streams(js, update=False)
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
