"""An API server that answers from a list of exchanges, in order, and keeps what it
was sent: the operator's calls checked against the responses a cluster gives, with no
cluster. A call out of order, or one the list does not hold, gets a 599 and is kept
as a mismatch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _same_param(got: str | None, want: str) -> bool:
    """As the API server reads a query parameter: booleans by Go's strconv.ParseBool
    (kubernetes_asyncio sends ``force=True``, which it takes)."""
    if want in ("true", "false") and got is not None:
        return got in (_GO_TRUE if want == "true" else _GO_FALSE)
    return got == want


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class ReplayApiServer:
    exchanges: list[dict[str, Any]]
    received: list[Received] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def __aenter__(self) -> ReplayApiServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def load(self, exchanges: list[dict[str, Any]]) -> None:
        self.exchanges = list(exchanges)

    @property
    def left(self) -> int:
        return len(self.exchanges)

    async def _answer(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        got = Received(
            request.method,
            request.path,
            dict(request.query),
            request.headers.get("Content-Type", ""),
            body,
        )
        self.received.append(got)
        if not self.exchanges:
            self.mismatches.append(f"unexpected {got.method} {got.path}")
            return web.json_response({"kind": "Status", "code": 599}, status=599)
        want = self.exchanges[0]["request"]
        problems = [
            f"{k}: {a!r} != {b!r}"
            for k, a, b in (
                ("method", got.method, want["method"]),
                ("path", got.path, want["path"]),
                (
                    "content type",
                    got.content_type.split(";")[0],
                    want.get("contentType", got.content_type.split(";")[0]),
                ),
            )
            if a != b
        ] + [
            f"query {k}: {got.query.get(k)!r} != {v!r}"
            for k, v in (want.get("query") or {}).items()
            if not _same_param(got.query.get(k), v)
        ]
        if problems:
            self.mismatches.append(f"{got.method} {got.path}: " + "; ".join(problems))
            return web.json_response({"kind": "Status", "code": 599}, status=599)
        response = self.exchanges.pop(0)["response"]
        return web.json_response(response["body"], status=response["status"])
