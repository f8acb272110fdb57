"""Start ``inferbus up`` on free ports for a benchmark; shared by the bench scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nats

from inferbus.shared.buscreds import CREDS_ENV, credentials_from_env
from inferbus.shared.natsserver import free_port, free_ports
from inferbus.top.collect import discover


def nats_auth(creds_file: str = "") -> dict[str, str]:
    """nats.connect's keywords for the credentials in ``creds_file`` (default: those of
    INFERBUS_NATS_CREDS); none on an open bus."""
    creds = credentials_from_env(creds_file)
    if creds is None:
        return {}
    return creds.connect_options()


def new_tenant(state: Path, nats_url: str, tenant: str = "bench") -> str:
    """A tenant's credentials on a closed bus (``inferbus creds new``); its path."""
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferbus.cli",
            "creds",
            "new",
            "--tenant",
            tenant,
            "--state-dir",
            str(state),
            "--nats-url",
            nats_url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.strip()


def start_up(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    """``inferbus up --no-selftest ARGS`` on free ports (``env`` added to this process's);
    returns (process, NATS URL, HTTP base)."""
    port, nats_port = free_ports(2)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferbus.cli",
            "up",
            "--no-selftest",
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
            "--state-dir",
            str(state),
            "--metrics-port-base",
            str(free_port() // 100 * 100 % 30000 + 20000),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NATS_URL": "", **(env or {})},
    )
    assert proc.stdout
    said: list[str] = []
    for line in proc.stdout:
        said.append(line)
        if line.startswith("try:"):
            operator = state / "auth" / "creds" / "operator.json"
            if operator.exists():  # a closed bus: this process and its children are the operator
                os.environ[CREDS_ENV] = str(operator)
            return proc, f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{port}"
        if line.startswith("inferbus up failed"):
            break
    proc.terminate()
    proc.wait(60)
    # the caller's temporary state folder goes with its logs: say what they said
    for log in sorted((state / "logs").glob("*.log")):
        said.append(
            f"--- {log.name}\n" + "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        )
    raise RuntimeError("inferbus up failed:\n" + "".join(said[-60:]))


async def chunk_messages(nats_url: str) -> dict[str, dict[str, int]]:
    """Chunks the workers and sanitizers sent and the messages they took, summed by
    service (their ``$SRV`` stats): what gathering chunks a reader saved."""
    nc = await nats.connect(nats_url, **nats_auth())
    try:
        replies = await discover(nc, 1.0)
    finally:
        await nc.close()
    out: dict[str, dict[str, int]] = {}
    for reply in replies:
        service = str(reply.get("name", "")).removeprefix("inferbus-")
        for endpoint in reply.get("endpoints") or []:
            data = endpoint.get("data")
            if isinstance(data, dict) and "chunks_sent" in data:
                sums = out.setdefault(service, {"chunks": 0, "messages": 0})
                sums["chunks"] += data["chunks_sent"]
                sums["messages"] += data["chunk_messages"]
    return out
