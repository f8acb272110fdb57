"""``inferbus up`` brings the whole platform up, serves, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from testkit.ports import metrics_port_base
from testkit.procs import alive
from testkit.tmpfs import tmpfs

from inferbus.shared.natsserver import free_ports

pytestmark = pytest.mark.integration

INFERBUS = [sys.executable, "-m", "inferbus.cli"]


def test_up_generate_and_stream_then_ctrl_c(tmp_path: Path):
    port, nats_port = free_ports(2)
    metrics_base = metrics_port_base()  # below the ephemeral port range
    up = subprocess.Popen(
        [
            *INFERBUS,
            "up",
            "--engine",
            "sim",
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
            "--metrics-port-base",
            str(metrics_base),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**__import__("os").environ, "NATS_URL": ""},
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, "inferbus up exited:\n" + "".join(lines)
            lines.append(line)
            if line.startswith("try:"):
                break
        out = "".join(lines)
        assert "inferbus is up" in out and "self-test" in out

        gen = subprocess.run(
            [
                *INFERBUS,
                "generate",
                "--model",
                "sim-model",
                "--max-tokens",
                "8",
                "--nats-url",
                f"nats://127.0.0.1:{nats_port}",
                "Hello",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=_operator_env(tmp_path / "state"),
        )
        assert gen.returncode == 0, gen.stderr
        assert len(gen.stdout.split()) == 8 and "8 completion tokens" in gen.stderr

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(
                {
                    "model": "sim-model",
                    "stream": True,
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}],
                }
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read().decode()
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        assert len(text.split()) == 5 and body.rstrip().endswith("data: [DONE]")
        assert events[-1]["choices"][0]["finish_reason"] == "length"

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_base + 10}/metrics") as r:
            assert b"inferbus_requests_total" in r.read()
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
    assert up.returncode == 0, rest
    assert rest.rstrip().endswith("stopped")


def test_keys_new_then_up_with_keys_serves_its_self_test(tmp_path: Path):
    made = subprocess.run(
        [*INFERBUS, "keys", "new", "--name", "ops", "--rps", "5"],
        capture_output=True,
        text=True,
        check=True,
    )
    secret = made.stderr.strip().rsplit(" ", 1)[-1]
    assert secret.startswith("ib-") and secret not in made.stdout  # only the hash is kept
    keys = tmp_path / "keys.toml"
    keys.write_text(made.stdout)
    run = subprocess.run(
        [
            *INFERBUS,
            "up",
            "--check",
            "--engine",
            "sim",
            "--port",
            "0",
            "--nats-port",
            "0",
            "--metrics-port-base",
            str(metrics_port_base()),
            "--state-dir",
            str(tmp_path / "state"),
            "--api-keys-file",
            str(keys),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "NATS_URL": ""},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"API keys from {keys}" in run.stdout and "self-test" in run.stdout


def _operator_env(state: Path) -> dict[str, str]:
    """The CLI as the operator of a closed bus (`inferbus up` wrote its credentials)."""
    import os

    return {**os.environ, "INFERBUS_NATS_CREDS": str(state / "auth" / "creds" / "operator.json")}


def _ps(nats_url: str, state: Path) -> dict[str, dict[str, str]]:
    out = subprocess.run(
        [*INFERBUS, "ps", "--nats-url", nats_url],
        capture_output=True,
        text=True,
        timeout=30,
        env=_operator_env(state),
    )
    assert out.returncode == 0, out.stderr
    assert "http :0" not in out.stdout  # issue 41: nats serves no HTTP of ours
    rows = {}
    for line in out.stdout.splitlines():
        name, state, _, pid, _, restarts, *_ = line.split()
        rows[name] = {"state": state, "pid": pid, "restarts": restarts}
    return rows


def _running(rows: dict[str, dict[str, str]], *names: str) -> dict[str, dict[str, str]] | None:
    """The rows, once every name runs with a pid."""
    ok = all(rows.get(n, {}).get("state") == "running" and rows[n]["pid"] != "0" for n in names)
    return rows if ok else None


def _wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def _chat(port: int) -> bool:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(
            {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["usage"]["completion_tokens"] == 4
    except OSError:
        return False


def test_up_scales_workers_and_restarts_what_dies_nats_included(tmp_path: Path):
    """The supervisor: `inferbus scale` starts and stops workers while running; a killed
    worker and a killed embedded nats-server come back, and requests are served again."""
    import os

    port, nats_port = free_ports(2)
    nats_url = f"nats://127.0.0.1:{nats_port}"
    state = tmp_path / "state"
    up = _up(port, nats_port, state, subprocess.PIPE)
    try:
        _wait_for(lambda: _chat(port), 60)
        scaled = subprocess.run(
            [*INFERBUS, "scale", "worker", "3", "--nats-url", nats_url],
            capture_output=True,
            text=True,
            timeout=30,
            env=_operator_env(state),
        )
        assert scaled.returncode == 0, scaled.stderr
        rows = _wait_for(
            lambda: _running(
                _ps(nats_url, state), "worker-0", "worker-1", "worker-2", "nats", "gateway"
            )
        )

        # a worker killed: restarted, its restart counted
        os.kill(int(rows["worker-1"]["pid"]), signal.SIGKILL)
        _wait_for(lambda: _ps(nats_url, state)["worker-1"]["restarts"] == "1")

        # the embedded NATS killed: restarted on its store, and the platform serves again
        os.kill(int(rows["nats"]["pid"]), signal.SIGKILL)
        began = time.monotonic()
        _wait_for(lambda: _chat(port), 30)
        print(f"served again {time.monotonic() - began:.1f}s after nats-server was killed")
        assert _ps(nats_url, state)["nats"]["restarts"] == "1"

        # down to one: the newest go, drained
        scaled = subprocess.run(
            [*INFERBUS, "scale", "worker", "1", "--nats-url", nats_url],
            capture_output=True,
            text=True,
            timeout=30,
            env=_operator_env(state),
        )
        assert scaled.returncode == 0, scaled.stderr
        _wait_for(lambda: not {"worker-1", "worker-2"} & _ps(nats_url, state).keys())
        assert _chat(port)

        refused = subprocess.run(
            [*INFERBUS, "scale", "delivery", "2", "--nats-url", nats_url],
            capture_output=True,
            text=True,
            timeout=30,
            env=_operator_env(state),
        )
        assert refused.returncode != 0 and "not scalable" in refused.stderr
        # one scheduler books every worker: a second needs partitions (issue 40)
        refused = subprocess.run(
            [*INFERBUS, "scale", "scheduler", "2", "--nats-url", nats_url],
            capture_output=True,
            text=True,
            timeout=30,
            env=_operator_env(state),
        )
        assert refused.returncode != 0 and "--scheduler-partitions" in refused.stderr
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=90)
    assert up.returncode == 0, rest
    assert "nats exited with -9; restarting" in rest and "worker-1 exited with -9" in rest
    assert rest.rstrip().endswith("stopped")


def _up(
    port: int, nats_port: int, state: Path, out: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """`inferbus up --engine sim` on these ports and state; its output to ``out``."""
    import os

    return subprocess.Popen(
        [
            *INFERBUS,
            "up",
            "--engine",
            "sim",
            "--no-selftest",
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
            "--metrics-port-base",
            str(metrics_port_base()),
            "--state-dir",
            str(state),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NATS_URL": ""},
    )


def test_up_killed_takes_its_processes_with_it_and_comes_up_again(tmp_path: Path):
    """kill -9 of `inferbus up` had left every service and nats-server running,
    unsupervised, and a second `up` refused (port in use) (issue 42 item 14). Its
    processes now go with it (and drain: SIGTERM), and `up` starts again on the same
    ports and state."""
    import os

    port, nats_port = free_ports(2)
    nats_url = f"nats://127.0.0.1:{nats_port}"
    state = tmp_path / "state"
    up = _up(port, nats_port, state)
    try:
        _wait_for(lambda: _chat(port), 60)
        rows = _wait_for(lambda: _running(_ps(nats_url, state), "nats", "gateway", "worker-0"))
        pids = [int(r["pid"]) for r in rows.values() if r["pid"] != "0"]
        os.kill(up.pid, signal.SIGKILL)
        up.wait(10)
        _wait_for(lambda: not any(alive(pid) for pid in pids), 40)
    finally:
        if up.poll() is None:
            up.kill()
    again = _up(port, nats_port, state)
    try:
        _wait_for(lambda: _chat(port), 60)
    finally:
        again.send_signal(signal.SIGINT)
        again.wait(90)
    assert again.returncode == 0


def test_ps_with_no_server_says_so_within_seconds():
    """It had hung for over 10 minutes (issue 42 item 14)."""
    (port,) = free_ports(1)
    began = time.monotonic()
    out = subprocess.run(
        [*INFERBUS, "ps", "--nats-url", f"nats://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "no NATS server answered" in out.stderr, out.stderr
    assert time.monotonic() - began < 30


def test_a_full_disk_heals_once_space_returns(tmp_path: Path):
    """Issue 42 item 2: with the state on a small tmpfs filled, JetStream's streams
    stayed in error after the space was freed (0 of 360 requests a minute later; only
    a nats-server restart cured it). `inferbus up` reads its server's log and restarts
    it once the disk has room: serving resumes within 10 s of space returning."""
    with tmpfs(tmp_path / "disk", "128m") as disk:
        _heals(disk)


def _heals(disk: Path) -> None:
    port, nats_port = free_ports(2)
    up = _up(port, nats_port, disk / "state", subprocess.PIPE)
    filler = disk / "filler"
    try:
        _wait_for(lambda: _chat(port), 60)
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
        assert not any(_chat(port) for _ in range(3))  # full: nothing is served
        filler.unlink()
        freed = time.monotonic()
        _wait_for(lambda: _chat(port), 30)
        healed = time.monotonic() - freed
        print(f"served again {healed:.1f}s after the space returned")
        assert healed < 10.0
    finally:
        filler.unlink(missing_ok=True)
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=90)
    assert "its store could not write" in rest, rest[-3000:]
