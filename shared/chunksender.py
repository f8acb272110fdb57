"""Token chunks out to their readers, those of streams stepping together in one
message a reader.

A chunk costs its sender, the bus and its reader about a message's worth of work
whatever it holds, and an engine step makes one a stream: at 16 streams a step, 16
messages for what one could carry. Chunks for the platform's own readers (a
sanitizer's filter, a gateway: ``batch_subject``) are gathered until the event
loop's turn ends (every stream an engine step woke has run by then) and go as one
``ChunkBatch`` a reader; a lone chunk goes as itself, on its own subject. Any other
subject (a tenant's, a client's inbox) is sent at once. A stream's end must follow
its chunks: ``flush`` before sending one.

With a ``window_s``, chunks are gathered that long from the first one waiting, not
just a turn: when engine steps come faster than the window, the chunks of several
steps share a message, and every hop after this one (the bus, the sanitizer, the
gateway) handles fewer. Each chunk waits at most the window; a stream's first chunk
(``at_once``) goes at the end of its turn, so time to first token does not grow.

A migratable stream's chunk is copied to the scheduler before its readers get it (the
scheduler never knows less than a reader): those copies are gathered the same way, a
``ProgressBatch`` a worker, and go out ahead of every chunk sent after them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client

from inferbus.contracts import (
    ChunkBatch,
    ChunkTo,
    ProgressBatch,
    RequestProgress,
    TokenChunk,
    batch_subject,
)

from .codec import encode


class ChunkSender:
    def __init__(self, nc: Client, *, batching: bool = True, window_s: float = 0.0) -> None:
        self._nc = nc
        self.batching = batching
        self.window_s = window_s
        self._pending: dict[str, list[ChunkTo]] = {}
        self._copies: dict[str, list[RequestProgress]] = {}
        self._soon = False
        """A flush is asked for at the end of this turn."""
        self._timer: asyncio.TimerHandle | None = None
        """A flush is asked for at the end of the window."""
        self._lock = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()
        self.messages = 0
        """Messages sent (batches and lone chunks): with ``chunks``, what batching saved."""
        self.chunks = 0

    async def send(
        self,
        subject: str,
        chunk: TokenChunk,
        headers: dict[str, str] | None = None,
        *,
        at_once: bool = False,
    ) -> None:
        """``chunk`` to ``subject``'s reader: gathered when it takes batches, else now;
        ``at_once``: sent at the end of this turn whatever the window (what gathered
        before it goes with it)."""
        batch = batch_subject(subject) if self.batching else None
        self.chunks += 1
        if batch is None:
            if self._copies:  # the scheduler's copies of it go first
                await self.flush()
            self.messages += 1
            await self._nc.publish(subject, encode(chunk), headers=headers)
            return
        self._pending.setdefault(batch, []).append(ChunkTo(subject=subject, chunk=chunk))
        self._flush_due(at_once)

    def copy_ahead(self, subject: str, copy: RequestProgress, *, at_once: bool = False) -> None:
        """The scheduler's copy of a chunk (on the worker's ``ib.progress.<id>``), sent
        ahead of the chunk itself."""
        self._copies.setdefault(subject, []).append(copy)
        self._flush_due(at_once)

    def _flush_due(self, at_once: bool) -> None:
        if self._soon:
            return
        if at_once or self.window_s <= 0:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._flush_soon)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self._flush_soon)

    def _flush_soon(self) -> None:
        self._soon = False  # an armed window's timer is the flush's to cancel
        if not self._pending and not self._copies:  # flushed since it was asked for
            return
        task = asyncio.ensure_future(self.flush())
        self._flushes.add(task)  # held until done: the loop keeps weak references only
        task.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Send what is gathered (in order: a flush under way finishes first)."""
        async with self._lock:
            if self._timer is not None:  # what it waited for goes now
                self._timer.cancel()
                self._timer = None
            pending, self._pending = self._pending, {}
            copies, self._copies = self._copies, {}
            for subject, ahead in copies.items():
                if len(ahead) == 1:
                    await self._nc.publish(subject, encode(ahead[0]))
                else:
                    worker = ahead[0].worker_id
                    await self._nc.publish(
                        subject, encode(ProgressBatch(worker_id=worker, progress=ahead))
                    )
            for batch, chunks in pending.items():
                self.messages += 1
                if len(chunks) == 1:
                    await self._nc.publish(chunks[0].subject, encode(chunks[0].chunk))
                else:
                    await self._nc.publish(batch, encode(ChunkBatch(chunks=chunks)))

    def stats(self) -> dict[str, Any]:
        return {"chunks_sent": self.chunks, "chunk_messages": self.messages}
