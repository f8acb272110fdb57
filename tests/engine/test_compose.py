"""The compose stack on a real Docker engine: scripts/compose_check.py brings it up
(the image's vLLM engine and tiny model in the worker, NATS closed), serves a request
through the gateway container, checks its trace and the services' metrics arrive and
that the bus refuses a client without credentials, and tears it down.

Needs a Docker engine with Compose v2 and the image (CI: scripts/docker-setup.sh and
scripts/docker-build.sh); skipped, saying which is missing, elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit.containers import docker_missing

pytestmark = [
    pytest.mark.engine(seconds=120),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(900),
]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("INFERBUS_IMAGE", "inferbus:cpu")


def test_the_compose_stack_serves_traces_and_meters_a_real_engine_request():
    missing = docker_missing(IMAGE, compose=True)
    if missing:
        pytest.skip(missing)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose_check.py"), "--image", IMAGE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=850,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    assert "compose check passed" in out
    assert "Prometheus scraped 7 services" in out or "read from each /metrics" in out
    assert "the bus refuses a connection without credentials" in out
