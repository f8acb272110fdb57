"""The platform itself: ``up``, ``serve``, ``generate``, and the supervisor's ``ps``,
``scale`` and ``top``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from inferbus import servicetable
from inferbus.contracts.control import DEFAULT_SUPERVISOR
from inferbus.shared.config import DEFAULT_NATS_URL
from inferbus.upoptions import Options, click_options


@click.command()
@click_options
def up(**given: Any) -> None:
    """Start the whole platform on this machine."""
    from inferbus.up import run

    sys.exit(run(Options.from_flags(given)))


@click.command()
@click.argument("prompt")
@click.option("--model", "-m", required=True)
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--stop", multiple=True)
@click.option("--seed", type=int, default=None)
@click.option(
    "--chat/--completion",
    default=True,
    show_default=True,
    help="Send the prompt as a user message, or as raw text.",
)
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
@click.option("--timeout", default=600.0, show_default=True)
def generate(
    prompt: str,
    model: str,
    max_tokens: int,
    temperature: float,
    stop: tuple[str, ...],
    seed: int | None,
    chat: bool,
    nats_url: str,
    timeout: float,
) -> None:
    """Stream a completion to the terminal over NATS."""
    from inferbus.client import Client, RequestError

    async def go() -> int:
        client = await Client.connect(nats_url, name="inferbus-generate")
        try:
            stream = client.stream(
                model,
                None if chat else prompt,
                messages=[{"role": "user", "content": prompt}] if chat else None,
                max_tokens=max_tokens,
                temperature=temperature,
                stop=list(stop),
                seed=seed,
                timeout=timeout,
            )
            try:
                async for chunk in stream:
                    click.echo(chunk.text, nl=False)
            except RequestError as exc:
                click.echo(f"\nerror ({exc.code}): {exc}", err=True)
                return 1
            click.echo()
            out = stream.outcome
            assert out is not None
            ttft = (stream.first_token_at or stream.submitted_at) - stream.submitted_at
            click.echo(
                f"[{out.finish_reason}; {out.usage.prompt_tokens} prompt + "
                f"{out.usage.completion_tokens} completion tokens; "
                f"ttft {ttft * 1000:.1f} ms]",
                err=True,
            )
            return 0
        finally:
            await client.close()

    sys.exit(asyncio.run(go()))


@click.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("service", type=click.Choice(servicetable.names()))
@click.pass_context
def serve(ctx: click.Context, service: str) -> None:
    """Run one service in the foreground (flags as for python -m inferbus.services.NAME)."""
    from inferbus.shared import runtime

    entry = servicetable.get(service)
    runtime.main(entry.service_class(), entry.settings_class(), ctx.args)


SUPERVISOR_PATIENCE_S = 30.0
"""How long ``ps`` and ``scale`` ask a supervisor that does not answer in time."""


def _supervisor_call(nats_url: str, supervisor: str, command: Any) -> Any:
    """Send a command to ``inferbus up``'s supervisor; its state back."""
    from inferbus.contracts.control import SupervisorState, supervisor_subject
    from inferbus.shared.bus import CLI_PATIENCE_S, connect, request_patiently
    from inferbus.shared.buscreds import credentials_from_env
    from inferbus.shared.codec import decode, encode

    async def call() -> SupervisorState:
        nc = await connect(
            nats_url, "inferbus-ctl", credentials_from_env(), give_up_s=CLI_PATIENCE_S
        )
        try:  # both commands may be repeated: a query and an absolute count
            reply = await request_patiently(
                nc,
                supervisor_subject(supervisor),
                encode(command),
                patience_s=SUPERVISOR_PATIENCE_S,
            )
        finally:
            await nc.close()
        return decode(reply.data, SupervisorState)

    try:
        state = asyncio.run(call())
    except Exception as exc:
        raise click.ClickException(
            f"no answer from supervisor {supervisor!r} at {nats_url} "
            f"({exc or type(exc).__name__}); is `inferbus up` running?"
        ) from None
    for p in state.processes:
        http = f" http :{p.http_port}" if p.http_port else ""  # nats serves no /metrics
        click.echo(f"{p.name:<14} {p.state:<9} pid {p.pid:<8} restarts {p.restarts:<3}{http}")
    if state.error:
        raise click.ClickException(state.error)
    return state


_supervisor_options = [
    click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True),
    click.option("--supervisor", default=DEFAULT_SUPERVISOR, show_default=True),
]


def _with_supervisor_options(f: Any) -> Any:
    for option in reversed(_supervisor_options):
        f = option(f)
    return f


@click.command()
@_with_supervisor_options
def ps(nats_url: str, supervisor: str) -> None:
    """The processes `inferbus up` supervises, with their state and restarts."""
    from inferbus.contracts.control import SupervisorQuery

    _supervisor_call(nats_url, supervisor, SupervisorQuery())


@click.command()
@click.argument("service")
@click.argument("instances", type=click.IntRange(min=0))
@click.option("--stop-first", multiple=True, help="Instance to stop first when scaling down.")
@_with_supervisor_options
def scale(
    service: str, instances: int, stop_first: tuple[str, ...], nats_url: str, supervisor: str
) -> None:
    """Run INSTANCES processes of SERVICE (workers) under `inferbus up`; stopped ones drain
    their in-flight requests first."""
    from inferbus.contracts.control import ScaleService

    _supervisor_call(
        nats_url,
        supervisor,
        ScaleService(service=service, instances=instances, stop_first=list(stop_first)),
    )


@click.command()
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between snapshots; rates are over this interval.",
)
@click.option(
    "--once", is_flag=True, help="Take two snapshots --interval apart, print one view and exit."
)
@click.option("--json", "as_json", is_flag=True, help="With --once: the view as JSON.")
@click.option("--nats-url", envvar="NATS_URL", default=DEFAULT_NATS_URL, show_default=True)
def top(interval: float, once: bool, as_json: bool, nats_url: str) -> None:
    """A live view of the running platform: workers and their models, queue depth per
    lane, tokens/s, TTFT p50/p95 and error rate, from $SRV stats and each service's
    /metrics."""
    if as_json and not once:
        raise click.UsageError("--json needs --once")
    from inferbus.top.command import run

    sys.exit(run(nats_url, interval, once, as_json))
