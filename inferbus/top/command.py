"""``inferbus top``: a snapshot every ``interval`` seconds, each view's rates over the
time since the one before; shown live, or once as tables or JSON."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncGenerator

from rich.console import Console
from rich.live import Live

from .collect import Collector, NatsUnreachable
from .render import render
from .rows import View
from .view import build_view, view_json


async def views(collector: Collector, interval_s: float) -> AsyncGenerator[View, None]:
    """The first view has no rates; each next one has them over the last interval."""
    before = await collector.snapshot()
    yield build_view(None, before)
    while True:
        # the next metrics are read after the discovery window: start that much early
        elapsed = time.monotonic() - before.at
        await asyncio.sleep(max(0.0, interval_s - elapsed - collector.window_s))
        now = await collector.snapshot()
        yield build_view(before, now)
        before = now


def _heading(nats_url: str, interval_s: float | None) -> str:
    every = f"every {interval_s:g} s, Ctrl-C quits" if interval_s else "once"
    return f"inferbus top  {nats_url}  {time.strftime('%H:%M:%S')}  ({every})"


async def once(nats_url: str, interval_s: float) -> View:
    """Two snapshots ``interval_s`` apart, and the view of them."""
    async with Collector(nats_url) as collector:
        stream = views(collector, interval_s)
        await anext(stream)
        view = await anext(stream)
        await stream.aclose()
        return view


async def live(nats_url: str, interval_s: float, console: Console) -> None:
    async with Collector(nats_url) as collector:
        with Live(
            console=console, auto_refresh=False, screen=True, vertical_overflow="crop"
        ) as screen:
            async for view in views(collector, interval_s):
                screen.update(render(view, _heading(nats_url, interval_s)), refresh=True)


def run(nats_url: str, interval_s: float, run_once: bool, as_json: bool) -> int:
    """The command's exit status: 1 when NATS cannot be reached at start."""
    console = Console()
    try:
        if run_once:
            view = asyncio.run(once(nats_url, interval_s))
            if as_json:
                print(view_json(view))
            else:
                console.print(render(view, _heading(nats_url, None)))
            return 1 if view.problem else 0
        asyncio.run(live(nats_url, interval_s, console))
    except NatsUnreachable as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
