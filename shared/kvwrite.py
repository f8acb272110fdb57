"""A JetStream KV write that outlasts a slow or restarting server."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import nats.js.errors
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from inferbus.shared import logs

log = logs.get("inferbus.kv")

KV_PATIENCE_S = 30.0
"""How long a control-plane write is asked again before its error is raised."""

_UNANSWERED = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


async def put_until_stored(
    kv: KeyValue,
    key: str,
    value: bytes,
    *,
    patience_s: float = KV_PATIENCE_S,
    retry_s: float = 0.2,
) -> None:
    """Put ``value`` at ``key``, asked again while JetStream does not answer, up to
    ``patience_s`` (then the last error is raised). A put whose answer was lost may
    have been stored, so the key is read back first: one that landed is not written
    twice, for a watcher would see the change twice. A service whose core already
    counts the write as done (the delivery service's current version) must not lose
    it to one slow answer: CI's loaded runner once took over 5 s to answer a put."""
    deadline = time.monotonic() + patience_s
    asked = 0
    while True:
        try:
            await kv.put(key, value)
            return
        except _UNANSWERED as exc:
            if isinstance(exc, nats.errors.TimeoutError | TimeoutError) and await _holds(
                kv, key, value
            ):
                return
            if time.monotonic() >= deadline:
                raise
            asked += 1
            if asked == 1:  # once: a server away for a while would fill the log
                log.warning("a KV write went unanswered; asking again", key=key, error=repr(exc))
            await asyncio.sleep(retry_s)


async def _holds(kv: KeyValue, key: str, value: bytes) -> bool:
    try:
        return (await kv.get(key)).value == value
    except (KeyNotFoundError, *_UNANSWERED):
        return False
