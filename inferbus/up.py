"""``inferbus up``: the whole platform on one machine, each service its own process.

Starts an embedded nats-server with JetStream (or uses NATS_URL), provisions the
streams, supervises it and every service of the service table (a crashed one is
restarted with a backoff that resets once it has run healthily), serves one
self-test request through the HTTP gateway, answers ``inferbus scale`` / ``ps`` on
its control subject, and on Ctrl-C stops everything in the table's stop order:
gateway first (no new work), workers drain, then the rest and NATS.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from inferbus import servicetable
from inferbus.busauth import OPERATOR, Registry, route_password
from inferbus.contracts.control import (
    ScaleService,
    SupervisorCommand,
    SupervisorState,
    supervisor_subject,
)
from inferbus.services.gateway.auth import ApiKey, digest, new_key
from inferbus.shared.bus import BusAuthError, connect, wait_accepted
from inferbus.shared.buscreds import CREDS_ENV, TLS_CA_ENV, load_credentials
from inferbus.shared.codec import DecodeError, decode, encode
from inferbus.shared.cpus import format_cpus, split, why_not
from inferbus.shared.errors import ConfigError
from inferbus.shared.natsserver import (
    NatsServer,
    cluster_of,
    free_port,
    free_ports,
    port_open,
)
from inferbus.shared.streams import STORE_ENV, ensure_streams, stream_budget
from inferbus.supervisor.core import ProcessSpec, SupervisorCore
from inferbus.supervisor.processes import Command, Processes, rotate_log
from inferbus.supervisor.storewatch import StoreWatch
from inferbus.upoptions import Options

TINY_MODEL = "tiny-llama"
NATS = "nats"
"""The embedded server's process name; it stops last."""


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # its reader went away (`inferbus up | head`): measured, the error aborted the
        # stop that followed and left every service running; stopping must go on
        sys.stdout = open(os.devnull, "w")  # for the rest of the process


@dataclass
class Launch:
    """One service process's command line, environment and cores, as a service's
    launch function (``ServiceEntry.launch``) completes them."""

    argv: list[str]
    env: dict[str, str]
    cpus: set[int] | None


def launch_worker(p: Platform, launch: Launch) -> None:
    launch.argv += p._engine_args()
    if p.cpus is not None:  # it moves its own threads once its engine runs
        engine, services = p.cpus
        launch.argv += [
            "--engine-cpus",
            format_cpus(engine),
            "--service-cpus",
            format_cpus(services),
        ]
        launch.cpus = None


def launch_autoscaler(p: Platform, launch: Launch) -> None:
    o = p.o
    launch.argv += ["--models", f"{p.model}=worker", "--supervisor", o.supervisor]
    launch.argv += ["--max-replicas", str(max(4, o.workers)), *o.autoscaler_args]


def launch_kvspill(p: Platform, launch: Launch) -> None:
    launch.argv += ["--shared-dir", str(p.shared_kv_dir)]


def launch_sanitizer(p: Platform, launch: Launch) -> None:
    o = p.o
    if o.engine == "vllm" and not any(a.startswith("--tokenizers") for a in o.sanitizer_args):
        # prompts tokenized where first read: the scheduler routes on engine hashes
        launch.argv += ["--tokenizers", f"{p.model}={p.model_path}"]
    launch.argv += o.sanitizer_args


def launch_gateway(p: Platform, launch: Launch) -> None:
    o = p.o
    # every gateway on up's port, started now or scaled to later: the kernel spreads
    # the connections (up checks the port is free before it starts any)
    launch.argv += ["--http-host", o.host, "--http-reuse-port", "true"]
    if o.engine == "vllm":  # /tokenize and /detokenize with the model's tokenizer
        launch.argv += ["--tokenizers", f"{p.model}={p.model_path}"]
    if o.api_keys_file is None:
        return
    launch.argv += ["--api-keys-file", str(o.api_keys_file)]
    # up's own key: small and slow, only enough for its probe and self-test
    probe = ApiKey(name="inferbus-up", sha256=digest(o.probe_key), max_tokens=16, requests_per_s=5)
    launch.env = {**launch.env, "INFERBUS_API_KEYS": msgspec.json.encode([probe]).decode()}


class Platform:
    """How each process of the platform is run (the adapter's half of supervising)."""

    def __init__(
        self, o: Options, nats_url: str, model_path: str, served: str, nats: list[NatsServer]
    ) -> None:
        self.o = o
        self.nats_url = nats_url
        self.model_path = model_path
        """What the workers load."""
        self.model = served
        """The name clients ask for."""
        self.nats = nats
        """The embedded servers (none with an external NATS)."""
        self.logs = o.state_dir / "logs"
        self.placement_off = why_not(o.engine, o.cpu_placement)
        """Why the engine and the services share cores (empty: they do not)."""
        # why_not refuses fewer than two cores, so split has cores to split
        self.cpus = None if self.placement_off else split(os.sched_getaffinity(0))
        self.auth: Registry | None = None
        """The closed bus's users (the embedded NATS, unless --open-bus)."""
        # every service: the same tail-sampling settings (tracing itself is switched by
        # the standard OTEL_* variables, which pass through)
        self.env = {
            **os.environ,
            "NATS_URL": nats_url,
            "PYTHONUNBUFFERED": "1",
            "INFERBUS_TRACE_SLOW_S": str(o.trace_slow_s),
            "INFERBUS_TRACE_KEEP_RATIO": str(o.trace_keep_ratio),
            # the schedulers and the sanitizers must agree on it
            "INFERBUS_SCHEDULER_PARTITIONS": str(o.partitions),
        }

    def spec(self, entry: servicetable.ServiceEntry, index: int) -> ProcessSpec:
        return ProcessSpec(
            name=entry.instance_name(index),
            service=entry.name,
            index=index,
            stop_order=entry.stop_order,
        )

    def nats_specs(self) -> list[ProcessSpec]:
        last = max(e.stop_order for e in servicetable.SERVICES) + 1
        one = len(self.nats) == 1
        return [
            ProcessSpec(name=NATS if one else f"{NATS}-{i}", service=NATS, index=i, stop_order=last)
            for i in range(len(self.nats))
        ]

    def command(self, spec: ProcessSpec) -> Command:
        if spec.service == NATS:
            server = self.nats[spec.index]
            log = self.o.state_dir / f"{spec.name}.log"
            return Command(server.command(), dict(os.environ), log, cpus=self._service_cpus())
        entry = servicetable.get(spec.service)
        port = entry.metrics_port(self.o.metrics_port_base, spec.index) or self.o.port
        argv = [sys.executable, "-m", f"inferbus.services.{entry.name}", "--http-port", str(port)]
        # a stable identity: a restarted sanitizer keeps its filter subject, and a
        # process's NATS user is its instance's
        argv += ["--instance-id", spec.name]
        env = self.env
        if self.auth is not None:  # made beforehand (add_users): this only finds them
            env = {**env, CREDS_ENV: str(self.auth.service(entry.name, spec.name))}
        launch = Launch(argv=argv, env=env, cpus=self._service_cpus())
        if entry.launch:  # what this service is told beyond its port and identity
            servicetable.load(entry.launch)(self, launch)
        return Command(
            launch.argv,
            launch.env,
            self.logs / f"{spec.name}.log",
            http_port=port,
            cpus=launch.cpus,
        )

    @property
    def shared_kv_dir(self) -> Path:
        return self.o.state_dir / "kv-spill" / "shared"

    def _service_cpus(self) -> set[int] | None:
        return None if self.cpus is None else self.cpus[1]

    def add_users(self, specs: list[ProcessSpec]) -> bool:
        """Make the NATS users of these processes; whether any is new (then the server's
        config is rewritten, and a running server must reload it)."""
        if self.auth is None:
            return False
        before = len(self.auth.users)
        for spec in specs:
            self.auth.service(spec.service, spec.name)
        if len(self.auth.users) == before:
            return False
        self.auth.write_server_config(servicetable.permissions())
        return True

    def _engine_args(self) -> list[str]:
        o = self.o
        args = ["--engine", o.engine, "--model", self.model_path, "--state-dir", str(o.state_dir)]
        if o.engine == "vllm" and not any(a.startswith("--kv-spill") for a in o.worker_args):
            # every worker reads and writes the shared KV tier; kvspill bounds it
            args += ["--kv-spill-shared-dir", str(self.shared_kv_dir)]
        if not any(a.startswith("--trusted-keys") for a in o.worker_args):
            args += ["--trusted-keys", str(signing_key(o.state_dir)) + ".pub"]
        if o.engine == "vllm" and o.model is None:
            # the tiny model: eager mode starts in seconds on a CPU, and 2k tokens is its
            # context; its template shows tools and calls as Hermes models write them; and
            # random weights, which never learnt JSON, get no free whitespace in it
            args += ["--enforce-eager", "true", "--max-model-len", "2048"]
            args += ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "true"]
            args += ["--structured-outputs-backend", "xgrammar"]
            args += ["--structured-outputs-disable-any-whitespace", "true"]
        return args + o.worker_args


class Up:
    """The running platform: the core's decisions carried out, commands answered."""

    def __init__(self, o: Options, platform: Platform) -> None:
        self.o = o
        self.platform = platform
        self.core = SupervisorCore(o.restart)
        self.procs = Processes(self.core, platform.command, _say)
        self.stopping = asyncio.Event()
        self._control: Client | None = None
        self.stores = StoreWatch()
        self._log_read: dict[str, int] = {}

    async def start_nats(self) -> None:
        for spec in self.platform.nats_specs():
            await self.procs.apply(self.core.add(spec, time.monotonic()))
        deadline = time.monotonic() + 10
        for server in self.platform.nats:
            while not port_open(server.host, server.port):
                if self.procs.exits:
                    name, _ = self.procs.exits[0]
                    raise RuntimeError(f"nats-server exited:\n{self.procs.log_tail(name)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nats-server did not listen on {server.url}")
                await asyncio.sleep(0.05)

    def reload_nats(self) -> None:
        """Every embedded server rereads its users (SIGHUP)."""
        for spec in self.platform.nats_specs():
            self.procs.send_signal(spec.name, signal.SIGHUP)

    def initial_specs(self) -> list[ProcessSpec]:
        specs = []
        for entry in servicetable.by_start_order():
            if entry.in_up or (entry.up_option and getattr(self.o, entry.up_option)):
                count = (
                    getattr(self.o, entry.count_option) if entry.count_option else entry.instances
                )
                specs += [self.platform.spec(entry, i) for i in range(count)]
        return specs

    async def start_services(self) -> None:
        for spec in self.initial_specs():
            await self.procs.apply(self.core.add(spec, time.monotonic()))

    async def add_users(self, specs: list[ProcessSpec]) -> None:
        """New NATS users for new processes, known to the running server before they
        connect."""
        if not self.platform.add_users(specs):
            return
        self.reload_nats()
        auth = self.platform.auth
        assert auth is not None
        creds = load_credentials(auth.creds_path(f"svc-{specs[-1].name}"))
        await wait_accepted(self.platform.nats_url, creds, timeout=5)  # every node

    async def listen(self) -> None:
        """Provision the streams, then answer scale and status commands on the control
        subject."""
        auth = self.platform.auth
        creds = load_credentials(auth.supervisor(self.o.supervisor)) if auth else None
        nc = self._control = await connect(
            self.platform.nats_url, f"inferbus-up:{self.o.supervisor}", creds
        )
        replicas = min(3, len(self.platform.nats)) or None
        deadline = time.monotonic() + 60
        while True:  # a new cluster elects its JetStream leader first
            try:
                await ensure_streams(nc.jetstream(), replicas)
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream did not take the streams: {exc!r}") from None
                await asyncio.sleep(0.5)
        await nc.subscribe(supervisor_subject(self.o.supervisor), cb=self._on_command)

    async def _on_command(self, msg: Msg) -> None:
        error = ""
        cmd: SupervisorCommand | None = None
        try:
            cmd = decode(msg.data, SupervisorCommand)
        except DecodeError as exc:
            error = f"undecodable command: {exc}"
        if isinstance(cmd, ScaleService):
            error = await self.scale(cmd)
        state = SupervisorState(
            supervisor=self.o.supervisor, processes=self.procs.states(), error=error
        )
        if msg.reply:
            await msg.respond(encode(state))

    async def scale(self, cmd: ScaleService) -> str:
        """Start or stop instances of a scalable service; why not, when refused."""
        try:
            entry = servicetable.get(cmd.service)
        except KeyError as exc:
            return str(exc.args[0])
        if not entry.scalable:
            return f"{entry.name} is not scalable"
        if entry.name == "scheduler" and self.o.partitions == 1 and cmd.instances > 1:
            return (
                "one scheduler books every worker: start inferbus up with "
                "--scheduler-partitions above 1 to run several"
            )
        if not 0 <= cmd.instances <= servicetable.MAX_INSTANCES:
            return f"instances must be within 0..{servicetable.MAX_INSTANCES}"
        if self.stopping.is_set():
            return "shutting down"
        running = {p.spec.index for p in self.core.of(entry.name)}
        taken = {p.spec.index for p in self.core.processes.values() if p.spec.service == entry.name}
        make: list[ProcessSpec] = []
        free = (i for i in range(servicetable.MAX_INSTANCES) if i not in taken)
        for _ in range(cmd.instances - len(running)):
            make.append(self.platform.spec(entry, next(free)))
        try:
            await self.add_users(make)
        except BusAuthError as exc:
            return f"the bus did not take the new instances' users: {exc}"
        effects = self.core.scale(
            entry.name, make, cmd.instances, list(cmd.stop_first), time.monotonic()
        )
        if effects:
            _say(f"scaling {entry.name} from {len(running)} to {cmd.instances}")
        await self.procs.apply(effects)
        return ""

    async def wait_ready(self, base: str, timeout: float) -> None:
        start = time.monotonic()
        deadline, said = start + timeout, start
        _say(
            f"starting the services; the {self.o.engine} engine loads {self.platform.model!r}"
            + (" (about a minute for vLLM on a CPU)" if self.o.engine == "vllm" else "")
        )
        while time.monotonic() < deadline:
            if time.monotonic() - said >= 15:  # a long start is not a silent one
                said = time.monotonic()
                _say(f"  still starting ({said - start:.0f}s; logs in {self.platform.logs})")
            if self.procs.exits:  # while starting, a crash is a fault to show, not retry
                name, code = self.procs.exits[0]
                raise RuntimeError(f"{name} exited with {code}:\n{self.procs.log_tail(name)}")
            try:
                models = await asyncio.to_thread(
                    _http_json, f"{base}/v1/models", key=self.o.probe_key
                )
                if any(m["id"] == self.platform.model for m in models["data"]):
                    return
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the platform was not ready within {timeout:g}s; see the logs")

    async def supervise(self) -> None:
        checked = 0.0
        while not self.stopping.is_set():
            await self.procs.tick()
            if time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                await asyncio.to_thread(self.check_stores)
                await asyncio.to_thread(self.rotate_logs)
            try:
                await asyncio.wait_for(self.stopping.wait(), 0.2)
            except TimeoutError:
                pass

    def rotate_logs(self) -> None:
        """Process logs are bounded: one past --log-max-mb moves to ``<log>.1``."""
        for path in self.procs.log_paths():
            rotate_log(path, self.o.log_max_mb << 20)  # a store watch reads on from 0

    def check_stores(self) -> None:
        """An embedded server whose store could not write (its disk filled) is
        restarted once its disk has room again: its streams stay in error until then."""
        for spec, server in zip(self.platform.nats_specs(), self.platform.nats, strict=True):
            path = self.procs.log_path(spec.name)
            if path is None or not path.exists():
                continue
            size = path.stat().st_size
            start = self._log_read.setdefault(spec.name, size)  # what earlier runs wrote: not read
            if size < start:
                start = 0
            if size > start:
                with open(path, "rb") as log:
                    log.seek(start)
                    text = log.read(min(size - start, 1 << 20)).decode(errors="replace")
                self._log_read[spec.name] = size
                self.stores.read(spec.name, text, time.monotonic())
            free = shutil.disk_usage(server.store_dir).free
            if self.stores.to_restart(spec.name, free, time.monotonic()):
                _say(f"{spec.name}: its store could not write (a full disk?); restarting it")
                self.procs.send_signal(spec.name, signal.SIGTERM)

    async def stop(self) -> None:
        _say("stopping")
        if self._control is not None:
            try:
                await asyncio.wait_for(self._control.close(), 2)
            except Exception:  # NATS may be gone already
                pass
        await self.procs.apply(self.core.begin_shutdown(time.monotonic()))
        while not self.core.done:
            await self.procs.tick()
            await asyncio.sleep(0.1)
        await self.procs.wait_all()
        _say("stopped")


def _http_json(
    url: str, body: dict[str, Any] | None = None, timeout: float = 5.0, key: str = ""
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _selftest(base: str, model: str, key: str = "") -> str:
    reply = _http_json(
        f"{base}/v1/chat/completions",
        {
            "model": model,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Say hello to the operator."}],
        },
        timeout=120,
        key=key,
    )
    return str(reply["choices"][0]["message"]["content"])


def _model(o: Options) -> tuple[str, str]:
    """What the workers load, and the name clients ask for."""
    if o.engine == "sim":
        return o.model or "sim-model", o.model or "sim-model"
    if o.model:
        return o.model, Path(o.model.rstrip("/")).name
    path = o.state_dir / "models" / TINY_MODEL
    from inferbus.tinymodel import is_current, make_tiny

    if not is_current(path):  # absent, or built by an older release (another template)
        _say(f"building the tiny local model in {path}")
        make_tiny(path)
    return str(path), TINY_MODEL


def _banner(o: Options, base: str, up: Up) -> None:
    nats = up.platform.nats
    _say(f"inferbus is up ({o.engine} engine, model {up.platform.model!r})")
    _say(f"  gateway   {base}/v1   (OpenAI API; metrics at {base}/metrics)")
    _say(
        f"  nats      {up.platform.nats_url}   (JetStream; store {o.state_dir / 'nats'})"
        if nats
        else f"  nats      {up.platform.nats_url}"
    )
    ports = "  ".join(
        f"{s.name} :{s.http_port}" for s in up.procs.states() if s.service not in (NATS, "gateway")
    )
    _say(f"  metrics   {ports}")
    _say(f"  logs      {o.state_dir / 'logs'}")
    cpus = up.platform.cpus
    _say(
        f"  cpus      engine {format_cpus(cpus[0])}, services {format_cpus(cpus[1])}"
        if cpus
        else f"  cpus      shared by engine and services ({up.platform.placement_off})"
    )
    if o.engine == "vllm":  # on a CPU the worker runs its engine below the services
        _say(
            "  priority  on a CPU, the engine's processes at the worker's --cpu-nice "
            "(19 unless --worker-arg sets it)"
        )
    _say(f"  control   {supervisor_subject(o.supervisor)}   (inferbus ps, inferbus scale)")
    _say(
        f"  models    signed with {signing_key(o.state_dir)} (inferbus model push finds it); "
        "workers load only what verifies against its .pub"
    )
    auth = up.platform.auth
    _say(
        f"  bus       closed: each service its own NATS user; operator credentials in "
        f"{auth.creds_path(OPERATOR)} (the CLI finds them); tenants: inferbus creds new"
        if auth is not None
        else "  bus       open: no NATS credentials (anyone reaching it may do anything)"
    )
    _say(
        f"  auth      API keys from {o.api_keys_file}"
        if o.api_keys_file
        else "  auth      open: no API keys (pass --api-keys-file to require them)"
    )


def signing_key(state_dir: Path) -> Path:
    """The embedded default's model-signing key, made on first use (a real deployment
    signs with its release key and gives workers the public half)."""
    key = state_dir / "signing" / "release.key"
    if not key.exists():
        from inferbus.shared.signing import generate_key

        generate_key(key)
    return key


async def _run(o: Options) -> int:
    model, served = _model(o)
    signing_key(o.state_dir)
    if o.api_keys_file is not None:
        o.api_keys_file = o.api_keys_file.resolve()
        o.probe_key = new_key()
    nats: list[NatsServer] = []
    auth: Registry | None = None
    nats_url = o.nats_url or os.environ.get("NATS_URL")
    if not nats_url:
        if port_open("127.0.0.1", o.nats_port):
            raise ConfigError(
                f"port {o.nats_port} is in use: pass --nats-port, or --nats-url "
                "to use a running NATS server"
            )
        # JetStream reserves each stream's byte limit: size them to this disk (each node
        # of a local cluster holds a copy on it)
        budget = stream_budget(o.state_dir) // max(1, o.nats_cluster)
        os.environ.setdefault(STORE_ENV, f"{budget}b")
        config = None
        if not o.open_bus:
            auth = Registry.open(o.state_dir / "auth")
            auth.operator()
            auth.supervisor(o.supervisor)
            config = auth.config_path
        tls: tuple[Path, Path] | None = None
        if o.nats_tls_dir is not None:
            from inferbus import certs

            folder = o.nats_tls_dir.resolve()
            tls = (folder / certs.SERVER_CERT, folder / certs.SERVER_KEY)
            os.environ[TLS_CA_ENV] = str(folder / certs.CA)  # up, and all it starts
        if o.nats_cluster > 1:
            more = free_ports(2 * o.nats_cluster)  # the other nodes', and routes (+1 spare)
            more = [p for p in more if p != o.nats_port][: 2 * o.nats_cluster - 1]
            ports = [o.nats_port, *more[: o.nats_cluster - 1]]
            routes = route_password(o.state_dir / "auth")
            nats = cluster_of(
                o.state_dir / "nats",
                ports,
                more[o.nats_cluster - 1 :],
                routes,
                config_file=config,
                tls=tls,
            )
            for i, server in enumerate(nats):
                server.pid_file = o.state_dir / f"nats-{i}.pid"
        else:
            nats = [
                NatsServer(
                    o.state_dir / "nats",
                    port=o.nats_port,
                    config_file=config,
                    pid_file=o.state_dir / "nats.pid",
                    tls_cert=tls[0] if tls else None,
                    tls_key=tls[1] if tls else None,
                )
            ]
        nats_url = ",".join(server.url for server in nats)
    platform = Platform(o, nats_url, model, served, nats)
    platform.auth = auth
    up = Up(o, platform)
    # every user known to the server from its start (and the permissions of this code's
    # service table, even when no user is new)
    if not platform.add_users(up.initial_specs()) and auth is not None:
        auth.write_server_config(servicetable.permissions())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, up.stopping.set)
    base = f"http://{o.host}:{o.port}"
    code = 0
    try:
        if nats:
            await up.start_nats()
        await up.listen()
        await up.start_services()
        await up.wait_ready(base, timeout=600)
        _banner(o, base, up)
        if o.selftest or o.check:
            text = await asyncio.to_thread(_selftest, base, served, o.probe_key)
            _say(f"  self-test {text!r}")
        if o.check:
            return 0
        _say(f'try:  inferbus generate --model {served} "Hello"   (Ctrl-C stops everything)')
        await up.supervise()
    except (RuntimeError, TimeoutError, OSError, urllib.error.URLError) as exc:
        _say(f"inferbus up failed: {exc}")
        code = 1
    finally:
        await up.stop()
    return code


def keep_private(state_dir: Path) -> None:
    """The state folder holds the bus's credentials and the model-signing key: only its
    owner may enter it (the files in it are 0600 already)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)


def committable(state_dir: Path) -> bool:
    """Whether ``state_dir`` lies in a git work tree that does not ignore it, where a
    ``git add -A`` would commit its credentials."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(state_dir), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return False
        ignored = subprocess.run(
            ["git", "-C", str(state_dir), "check-ignore", "-q", "."],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):  # no git here: nothing to commit with
        return False
    return ignored.returncode == 1


def run(o: Options) -> int:
    keep_private(o.state_dir)
    if committable(o.state_dir):
        _say(
            f"warning: {o.state_dir} (credentials, the signing key) is inside a git work "
            "tree that does not ignore it: add it to .gitignore, or pass --state-dir"
        )
    o.port = o.port or free_port(o.host)
    if port_open("127.0.0.1" if o.host in ("0.0.0.0", "::") else o.host, o.port):
        # the gateways share their port with each other (SO_REUSEPORT): and would with
        # a stale one left from before, were it not checked here
        raise ConfigError(f"port {o.port} is in use: pass --port")
    o.nats_port = o.nats_port or free_port()
    return asyncio.run(_run(o))
