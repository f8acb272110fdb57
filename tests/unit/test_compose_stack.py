"""compose.yaml against the code it runs: every service of the table, each as its own
NATS user whose credentials `inferbus creds stack` makes, and the worker given what the
engine needs. `docker compose config` checks the file where Compose v2 is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from testkit.compose import default

from inferbus import servicetable
from inferbus.busauth import Registry
from inferbus.cli import main

ROOT = Path(__file__).resolve().parents[2]
CREDS = "/var/lib/inferbus/auth/creds/"


def _services() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]


def _served() -> dict[str, dict]:
    return {n: s for n, s in _services().items() if s.get("command", [""])[0] == "serve"}


def test_every_service_runs_as_its_own_user_made_by_creds_stack(tmp_path):
    result = CliRunner().invoke(main, ["creds", "stack", str(tmp_path / "auth")])
    assert result.exit_code == 0, result.output
    made = {p.name for p in (tmp_path / "auth" / "creds").iterdir()}
    served = _served()
    assert set(served) == set(servicetable.names())
    instances = set()
    for name, s in served.items():
        env = s["environment"]
        instance = env["INFERBUS_INSTANCE_ID"]
        assert instance == servicetable.get(name).instance_name(0), name
        assert env["INFERBUS_NATS_CREDS"] == f"{CREDS}svc-{instance}.json", name
        assert f"svc-{instance}.json" in made, name
        assert any(v.startswith("auth:/var/lib/inferbus/auth") for v in s["volumes"]), name
        instances.add(instance)
    assert len(instances) == len(served)
    assert "operator.json" in made
    # the server's users: nats mounts the file creds stack wrote
    assert "-c" in _services()["nats"]["command"]
    # under the store watch (issue 42 item 2), watching the store it names
    nats = _services()["nats"]
    assert nats["entrypoint"][:3] == ["inferbus", "nats", "run"]
    assert nats["command"][0] == "nats-server"
    store = nats["entrypoint"][nats["entrypoint"].index("--store-dir") + 1]
    assert nats["command"][nats["command"].index("-sd") + 1] == store
    assert (tmp_path / "auth" / "nats.conf").read_text().startswith("accounts")


def test_creds_stack_keeps_passwords_and_adds_replicas(tmp_path):
    auth = tmp_path / "auth"
    runner = CliRunner()
    assert runner.invoke(main, ["creds", "stack", str(auth)]).exit_code == 0
    before = (auth / "creds" / "svc-gateway.json").read_bytes()
    result = runner.invoke(main, ["creds", "stack", str(auth), "--replicas", "worker=3"])
    assert result.exit_code == 0, result.output
    assert (auth / "creds" / "svc-gateway.json").read_bytes() == before
    users = Registry.open(auth).users
    assert {"svc-worker-0", "svc-worker-1", "svc-worker-2"} <= set(users)


@pytest.mark.parametrize("bad", ["worker=0", "nosuch=2", "autoscaler=2", "worker"])
def test_creds_stack_refuses_bad_replicas(tmp_path, bad):
    result = CliRunner().invoke(main, ["creds", "stack", str(tmp_path), "--replicas", bad])
    assert result.exit_code == 2
    assert "--replicas" in result.output
    assert not (tmp_path / "users.json").exists()


def _bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)([kmg]?)b?", size.lower())
    assert m, size
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]


def test_the_worker_gets_the_shared_memory_its_engine_needs():
    # measured: vLLM's engine asks 160 MiB of /dev/shm for the tiny model and refused
    # to start on Docker's default 64 MiB ("Insufficient space in /dev/shm")
    worker = _services()["worker"]
    assert _bytes(worker["shm_size"]) >= 1 << 30
    assert worker["command"][worker["command"].index("--engine") + 1] == "vllm"
    assert default(worker["environment"]["VLLM_CPU_KVCACHE_SPACE"]) == "1"


def test_the_stack_needs_no_image_but_its_own():
    services = _services()
    image = default(services["init"]["image"])
    assert "build" in services["init"]
    for name in ["nats", *_served()]:
        assert default(services[name]["image"]) == image, name
        assert services[name]["pull_policy"] == "never", name
    for name in _served():
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy"
    assert services["nats"]["depends_on"]["init"]["condition"] == "service_completed_successfully"


@pytest.mark.skipif(
    not shutil.which("docker")
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="no Compose v2 here (scripts/docker-setup.sh installs it)",
)
def test_compose_config_accepts_the_file():
    done = subprocess.run(
        ["docker", "compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
