"""Reading a snapshot of the running platform: who answers ``$SRV.STATS`` on NATS, then
each one's /metrics over HTTP. An instance whose /metrics cannot be read is kept,
marked unreachable; a lost NATS connection gives an empty snapshot saying so."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace
from typing import Any

import aiohttp
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from inferbus.shared.buscreds import credentials_from_env

from .snapshot import Instance, Snapshot, instance_from_stats, parse_metrics

STATS_SUBJECT = "$SRV.STATS"
"""nats.micro's stats request to every service; each instance answers once."""


class NatsUnreachable(Exception):
    pass


async def connect(url: str, **auth: Any) -> NatsClient:
    """Connect, failing in about a second rather than retrying for minutes."""

    async def quiet(_: Exception) -> None:  # reported by the caller, not as tracebacks
        pass

    try:
        return await nats.connect(
            url.split(","),
            name="inferbus-top",
            connect_timeout=2,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
            **auth,
        )
    except Exception as exc:
        raise NatsUnreachable(f"cannot reach NATS at {url}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def discover(nc: NatsClient, window_s: float) -> list[dict[str, Any]]:
    """Every ``$SRV.STATS`` reply that arrives within ``window_s``."""
    replies: list[dict[str, Any]] = []

    async def on_reply(msg: Msg) -> None:
        try:
            reply = json.loads(msg.data)
        except ValueError:
            return  # e.g. the server's "no responders" status, with no body
        if isinstance(reply, dict):
            replies.append(reply)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(STATS_SUBJECT, b"", reply=inbox)
        await asyncio.sleep(window_s)
    finally:
        await sub.unsubscribe()
    return replies


async def read_metrics(http: aiohttp.ClientSession, inst: Instance, timeout_s: float) -> Instance:
    if not inst.metrics_url:
        return replace(inst, metrics_error="no HTTP address in its $SRV metadata")
    try:
        async with http.get(
            inst.metrics_url, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return replace(inst, metrics_error=f"HTTP {resp.status}")
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return replace(inst, metrics_error=_describe(exc))
    try:
        return replace(inst, metrics=parse_metrics(text))
    except Exception as exc:  # the parser raises ValueError and others on bad text
        return replace(inst, metrics_error=f"unreadable metrics: {_describe(exc)}")


async def _connect(url: str) -> NatsClient:
    """As the credentials INFERBUS_NATS_CREDS names (the operator's, on a closed bus)."""
    creds = credentials_from_env()
    if creds is None:
        return await connect(url)
    return await connect(url, **creds.connect_options())


class Collector:
    """Takes snapshots; keeps one NATS connection and one HTTP session, and reconnects
    to NATS when the connection was lost."""

    def __init__(self, nats_url: str, window_s: float = 0.4, http_timeout_s: float = 1.0) -> None:
        self.nats_url = nats_url
        self.window_s = window_s
        self.http_timeout_s = http_timeout_s
        self._nc: NatsClient | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Collector:
        self._nc = await _connect(self.nats_url)  # a wrong URL fails here, clearly
        # with API keys on, the gateway's /metrics takes a key marked metrics
        key = os.environ.get("INFERBUS_METRICS_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else None
        self._http = aiohttp.ClientSession(headers=headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    async def _connection(self) -> NatsClient:
        if self._nc is None or self._nc.is_closed:
            self._nc = await _connect(self.nats_url)
        return self._nc

    async def snapshot(self) -> Snapshot:
        assert self._http is not None, "use Collector as an async context manager"
        try:
            nc = await self._connection()
            if not nc.is_connected:
                return Snapshot(
                    at=time.monotonic(), problem=f"lost NATS at {self.nats_url}, reconnecting"
                )
            replies = await discover(nc, self.window_s)
        except NatsUnreachable as exc:
            return Snapshot(at=time.monotonic(), problem=str(exc))
        except Exception as exc:
            return Snapshot(at=time.monotonic(), problem=f"NATS: {_describe(exc)}")
        found = [i for i in map(instance_from_stats, replies) if i is not None]
        at = time.monotonic()
        instances = await asyncio.gather(
            *(read_metrics(self._http, i, self.http_timeout_s) for i in found)
        )
        return Snapshot(at=at, instances=tuple(instances))
