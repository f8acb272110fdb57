"""Reading a service's dead letters from their stream (IB_DLQ), not from a live
subscription: a letter sent before the reader's subscription reached the server, or
after a fixed wait on a loaded machine, is still found."""

from __future__ import annotations

import time

from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from inferbus.contracts import DeadLetter, dead_letter_subject
from inferbus.shared.codec import decode_or_none


async def letter_about(nc: Client, service: str, needle: str, timeout: float = 60.0) -> DeadLetter:
    """The first of ``service``'s dead letters whose payload holds ``needle`` (a request
    or worker id); waits for it as long as ``timeout``."""
    sub = await nc.jetstream().subscribe(
        dead_letter_subject(service), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=min(left, 1.0))
            except TimeoutError:
                continue
            letter = decode_or_none(msg.data, DeadLetter)
            if letter is not None and needle.encode() in letter.payload:
                return letter
        raise TimeoutError(f"no dead letter from {service} about {needle!r} in {timeout:g}s")
    finally:
        await sub.unsubscribe()
