"""The one service runtime: config → logs → NATS → streams → HTTP → service → signals → drain.

Every service's ``main`` is ``runtime.main(MyService, MySettings)``. A service is a
small object built with its context, with ``start``/``drain``/``status``; the runtime
owns all the plumbing that must behave the same everywhere: reconnecting NATS
connection, idempotent stream provisioning, the subscriptions the service declares
(``Service.wiring``: subscribed, decoded or dead-lettered, counted), ``$SRV``
discovery and stats via nats.micro, /healthz, /readyz and /metrics, and
SIGTERM/SIGINT → drain → exit.
"""

from __future__ import annotations

import abc
import asyncio
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import msgspec
from aiohttp import web
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.micro import add_service
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import inferbus
from inferbus.contracts import status_subject, subject_token
from inferbus.shared import logs, metrics, tracing
from inferbus.shared.bus import ConnectionWatch, DeadLetterer, connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.config import ServiceSettings, load_settings
from inferbus.shared.errors import ConfigError
from inferbus.shared.httpconns import ConnectionLedger
from inferbus.shared.streams import ensure_consumers, ensure_streams
from inferbus.shared.subscriber import Subscriber
from inferbus.shared.subscriptions import ConsumerSpec, Wiring

S = TypeVar("S", bound=ServiceSettings)


@dataclass
class Context(Generic[S]):
    settings: S
    nc: Client
    js: JetStreamContext
    dead_letters: DeadLetterer
    tracing: tracing.Tracing
    connection: ConnectionWatch
    """Register here to hear of the connection's outages."""
    subscriptions: Subscriber
    """The declared subscriptions, open (``close`` them where a drain must stop reading)."""
    http_port: int = 0
    """The port its HTTP server took, known once ``start`` is called."""
    stop: asyncio.Event | None = None
    """Set it to end the process (drain, then exit): a service that found itself
    unfit (``alive`` false) exits 1 so its supervisor starts a new one."""


class Service(abc.ABC, Generic[S]):
    name: ClassVar[str]
    wiring: ClassVar[Wiring] = Wiring()
    """What it subscribes to and publishes (``services/<name>/wiring.py``): the runtime
    subscribes from it, and its NATS user's permissions are derived from it."""

    def __init__(self, settings: S, ctx: Context[S]) -> None:
        self.settings = settings
        self.ctx = ctx

    def routes(self) -> Sequence[web.RouteDef]:
        """Extra HTTP routes on the service's port (the gateway serves its API here)."""
        return ()

    @classmethod
    def consumers(cls) -> Sequence[ConsumerSpec]:
        """The durable JetStream consumers it reads through, provisioned before it is built."""
        return cls.wiring.consumers()

    def subject_fields(self) -> dict[str, str]:
        """What its subscriptions' subject templates name (``{instance}``...)."""
        return {"instance": subject_token(self.settings.instance_id)}

    @abc.abstractmethod
    async def start(self) -> None:
        """Start background tasks and load what serving needs; the declared
        subscriptions (but the ``early`` ones) open once this returns."""

    async def serving(self) -> None:
        """Called once every declared subscription is open."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Stop taking new work and finish or hand back what is in flight; the
        subscriptions still open afterwards are closed by the runtime."""

    def status(self) -> dict[str, Any]:
        """Live state for ``$SRV`` stats, the status endpoint and ``inferbus top``."""
        return {}

    def ready(self) -> tuple[bool, str]:
        return True, "ok"

    def alive(self) -> tuple[bool, str]:
        """False when only a restart helps (a hung engine): /healthz answers 503, and
        the process exits 1 once it has drained."""
        return True, "alive"

    def authorize_metrics(self, request: web.Request) -> web.Response | None:
        """None when ``request`` may read /metrics, else the refusal (the gateway, whose
        port is public, asks for a key)."""
        return None

    def render_metrics(self, body: bytes) -> bytes:
        """A hook on the /metrics text (the worker labels vLLM's metrics with its id)."""
        return body


class Runtime:
    """Builds one service and runs it until ``stop`` is set (by a signal, or by a test)."""

    def __init__(
        self, service_cls: type[Service[Any]], settings: Any, stop: asyncio.Event | None = None
    ) -> None:
        self.service_cls = service_cls
        self.settings = settings
        self.stop = stop or asyncio.Event()
        self.started = asyncio.Event()
        self.http_port = 0
        self.log = logs.get(f"inferbus.{service_cls.name}")
        self._nc: Client | None = None
        self._service: Service[Any] | None = None

    @property
    def service(self) -> Service[Any]:
        if self._service is None:
            raise RuntimeError(f"{self.service_cls.name} is not built yet")
        return self._service

    async def _healthz(self, _: web.Request) -> web.Response:
        ok, why = self.service.alive() if self._service else (True, "starting")
        if ok:
            return web.json_response({"status": "alive"})
        return web.json_response({"status": "dead", "reason": why}, status=503)

    async def _readyz(self, _: web.Request) -> web.Response:
        ok, why = self.service.ready() if self.started.is_set() else (False, "starting")
        if not (self._nc and self._nc.is_connected):
            ok, why = False, "not connected to NATS"
        if self.stop.is_set():
            ok, why = False, "draining"
        return web.json_response({"ready": ok, "reason": why}, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        refused = self.service.authorize_metrics(request)
        if refused is not None:
            return refused
        body = self.service.render_metrics(generate_latest())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _status_json(self) -> dict[str, Any]:
        return {
            "service": self.service_cls.name,
            "instance": self.settings.instance_id,
            "http_port": self.http_port,
            "ready": self.service.ready()[0],
            **self.service.status(),
        }

    @web.middleware
    async def _until_started(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The probes answer at once (a worker loads its model for minutes), but the
        service's own routes wait for its subscriptions: a gateway that took a request
        before its reply subscription was open lost the replies, and the request hung."""
        if self.started.is_set() or request.path in _PROBES:
            return cast(web.StreamResponse, await handler(request))
        error = {
            "message": f"the {self.service_cls.name} is starting; retry shortly",
            "type": "server_error",
            "code": "starting",
        }
        return web.json_response({"error": error}, status=503, headers={"Retry-After": "1"})

    async def _serve_http(self, service: Service[Any]) -> web.AppRunner:
        s = self.settings
        app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[self._until_started])
        ledger = app[CONNECTIONS] = ConnectionLedger(s.http_max_connections)
        app.add_routes(
            [
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/metrics", self._metrics),
                *service.routes(),
            ]
        )
        # handler_cancellation: a client that hangs up cancels its handler, and so its request
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            keepalive_timeout=s.http_idle_timeout_s,
        )
        await runner.setup()
        assert runner.server is not None
        cap_connections(runner.server, ledger, service.name)
        site = web.TCPSite(runner, s.http_host, s.http_port, reuse_port=s.http_reuse_port or None)
        await site.start()
        self.http_port = runner.addresses[0][1]
        return runner

    async def run(self) -> None:
        s = self.settings
        name = self.service_cls.name
        creds = load_credentials(s.nats_creds) if s.nats_creds else None
        watch = ConnectionWatch()
        nc = self._nc = await connect(
            s.nats_url, f"{name}:{s.instance_id}", creds, s.nats_tls_ca, watch
        )
        js = nc.jetstream()
        await ensure_streams(js, update=False)
        await ensure_consumers(js, self.service_cls.consumers())

        traces = tracing.setup(name, trace_policy(s), s.instance_id)
        await traces.listen(nc)
        dead_letters = DeadLetterer(js, name)
        ctx: Context[Any] = Context(
            settings=s,
            nc=nc,
            js=js,
            dead_letters=dead_letters,
            tracing=traces,
            connection=watch,
            subscriptions=Subscriber(name, nc, js, dead_letters),
            stop=self.stop,
        )
        runner: web.AppRunner | None = None
        try:
            service = self._service = self.service_cls(s, ctx)
            ctx.subscriptions.fields.update(service.subject_fields())
            runner = await self._serve_http(service)
            ctx.http_port = self.http_port
            declared = [x for x in service.wiring.subscriptions if not x.when or getattr(s, x.when)]
            await ctx.subscriptions.open(service, [x for x in declared if x.early])
            await service.start()
            await ctx.subscriptions.open(service, [x for x in declared if not x.early])
            await service.serving()
        except BaseException as exc:
            if runner is not None:
                await runner.cleanup()
            await traces.close()
            await nc.close()
            if isinstance(exc, ConfigError) or not isinstance(exc, Exception):
                raise  # a ConfigError is said once, by main
            # not ready, with the reason in the log (and, for workers, in a "failed" heartbeat)
            self.log.error("failed to start", error=f"{type(exc).__name__}: {exc}")
            raise SystemExit(1) from None

        micro = await add_service(
            nc,
            name=f"inferbus-{name}",
            version=inferbus.__version__,
            description=f"inferbus {name}",
            metadata={
                "instance": s.instance_id,
                "http_host": advertised_host(s.http_host),
                "http_port": str(self.http_port),
            },
            stats_handler=lambda _endpoint: self._status_json(),
        )

        async def status_endpoint(req: Any) -> None:
            await req.respond(msgspec.json.encode(self._status_json()))

        await micro.add_endpoint(
            name="status", subject=status_subject(name), handler=status_endpoint
        )
        self.log.info("started", http=f"http://{s.http_host}:{self.http_port}", nats=s.nats_url)
        self.started.set()

        await self.stop.wait()
        began = time.monotonic()
        self.log.info("draining", timeout_s=s.drain_timeout_s)
        try:
            await asyncio.wait_for(service.drain(), s.drain_timeout_s)
        except TimeoutError:
            self.log.warning("drain timed out")
        await ctx.subscriptions.close()
        await micro.stop()
        await runner.cleanup()
        await traces.close()  # exports what is still undecided, then flushes
        try:
            await asyncio.wait_for(nc.drain(), 5)
        except Exception:  # the bus is down: nothing left to hand over
            try:
                await nc.close()
            except Exception as exc:  # nats-py writes to the dead socket on its way out
                self.log.warning("bus connection closed with an error", error=repr(exc))
        self.log.info("stopped", drain_s=round(time.monotonic() - began, 3))
        alive, why = service.alive()
        if not alive:  # its supervisor (or Kubernetes) starts a fresh one
            self.log.error("exiting to be restarted", reason=why)
            raise SystemExit(1)


_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


CONNECTIONS = web.AppKey("inferbus.connections", ConnectionLedger)


def cap_connections(server: web.Server, ledger: ConnectionLedger, service: str) -> None:
    """Hold at most ``ledger.limit`` HTTP connections (each costs memory, and aiohttp has
    no cap of its own): past it, an idle one makes room for the arrival
    (shared/httpconns.py). aiohttp's handlers say whether a request is in progress
    and how many they served; without those (another version) every connection counts
    as busy and the arrival is closed, as before."""
    made, lost = server.connection_made, server.connection_lost

    def busy(handler: Any) -> bool:
        return bool(getattr(handler, "_request_in_progress", True))

    def served(handler: Any) -> int:
        return int(getattr(handler, "_request_count", 1))

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        made(handler, transport)
        ledger.made(handler, time.monotonic())
        victim = ledger.to_close(handler, busy, served)
        if victim is None:
            return
        metrics.HTTP_CONNECTIONS_REFUSED.labels(service).inc()
        if victim is handler:
            transport.close()
        else:
            victim.force_close()  # type: ignore[attr-defined]
            if victim.transport is not None:  # type: ignore[attr-defined]
                victim.transport.close()  # type: ignore[attr-defined]

    def connection_lost(handler: Any, exc: BaseException | None) -> None:
        ledger.lost(handler)
        lost(handler, exc)

    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign, assignment]


def trust_connection(request: web.Request) -> None:
    """The connection carrying ``request`` authenticated: shed after anonymous ones."""
    ledger = request.app.get(CONNECTIONS)
    if ledger is not None and request.protocol is not None:
        ledger.trusted(request.protocol)


def trace_policy(s: ServiceSettings) -> tracing.TracePolicy:
    return tracing.TracePolicy(
        slow_s=s.trace_slow_s,
        keep_ratio=s.trace_keep_ratio,
        slo_ttft_s=s.slo_ttft_s,
        decision_wait_s=s.trace_decision_wait_s,
    )


def advertised_host(bind_host: str) -> str:
    """Where others reach this process's HTTP port (for ``inferbus top``): the bind
    address, or this host's address when bound to every interface."""
    import socket

    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


async def serve(service_cls: type[Service[Any]], settings: Any) -> None:
    runtime = Runtime(service_cls, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.stop.set)
    await runtime.run()


def main(
    service_cls: type[Service[Any]], settings_cls: type[S], argv: Sequence[str] | None = None
) -> None:
    """The ``main`` of every service: settings from env and flags, then serve until signalled."""
    import sys

    try:
        settings = load_settings(settings_cls, sys.argv[1:] if argv is None else argv)
        logs.configure(service_cls.name, settings.log_level, settings.instance_id)
        run_loop(serve(service_cls, settings))
    except ConfigError as exc:  # the one place a wrong setting becomes an exit
        sys.exit(f"inferbus {service_cls.name}: {exc}")
    except KeyboardInterrupt:
        pass


def run_loop(main_coro: Any) -> Any:
    """asyncio.run on uvloop where it is installed (INFERBUS_EVENT_LOOP=asyncio opts out):
    every message and token crosses this loop."""
    import os

    if os.environ.get("INFERBUS_EVENT_LOOP") == "asyncio":
        return asyncio.run(main_coro)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main_coro)
    return uvloop.run(main_coro)
