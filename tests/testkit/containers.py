"""testcontainers where a Docker engine can run them, and nothing where it cannot."""

from __future__ import annotations

import shutil
import subprocess
import warnings


def docker_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def docker_missing(image: str, compose: bool = False) -> str:
    """Why a test on ``image`` (and Compose v2) cannot run here; empty when it can."""
    if not docker_available():
        return "no Docker engine runs here (scripts/docker-setup.sh starts one)"
    if compose and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        return "no Compose v2 (scripts/docker-setup.sh installs it)"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
        return f"no {image} image (scripts/docker-build.sh builds it)"
    return ""


def nats_container(available=docker_available):
    """testcontainers' NATS, started, where a Docker engine runs and can provide its
    images; None otherwise (no engine, no testcontainers, or an engine that cannot pull
    `nats` or testcontainers' `ryuk` image: an offline machine's), said once."""
    if not available():
        return None
    try:
        from testcontainers.community.nats import NatsContainer
    except ImportError:
        try:  # testcontainers before 4.14
            from testcontainers.nats import NatsContainer
        except ImportError:
            return None
    container = NatsContainer("nats:2.10", jetstream=True)
    try:
        container.start()
    except Exception as exc:  # the engine's answer, e.g. "404 ... ryuk:0.8.1/json"
        warnings.warn(
            f"testcontainers' NATS did not start ({str(exc)[:200]}); "
            "using the nats-server binary instead",
            stacklevel=2,
        )
        try:
            container.stop()
        except Exception:
            pass
        return None
    return container
