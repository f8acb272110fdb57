"""Every service is declared once (inferbus/servicetable.py), and everything that runs
services agrees with that table: the built wheel, the CLI, compose.yaml, deploy/k8s and
the Prometheus scrape jobs. A new service folder missing from any of them fails here,
with what to add."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferbus import servicetable
from inferbus.shared.config import ServiceSettings, settings_of
from inferbus.shared.runtime import Service

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {e.name: e for e in servicetable.SERVICES}


def service_folders() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "services").glob("*/__init__.py"))


def test_every_service_folder_is_in_the_table_and_every_entry_has_a_folder():
    assert service_folders() == sorted(ENTRIES), (
        "a services/<name>/ package needs an entry in inferbus/servicetable.py "
        "(see docs/architecture.md, 'Adding a service')"
    )


def test_a_folder_without_a_package_holds_only_its_plan():
    """services/<name>/ with code but no __init__.py would silently be left out."""
    for folder in sorted(p for p in (ROOT / "services").iterdir() if p.is_dir()):
        if folder.name == "__pycache__" or (folder / "__init__.py").exists():
            continue
        assert [p.name for p in folder.iterdir()] == ["README.md"], folder


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_entry_names_a_service_and_its_settings(name: str):
    entry = ENTRIES[name]
    cls = entry.service_class()
    settings = entry.settings_class()
    assert issubclass(cls, Service) and cls.name == name
    assert issubclass(settings, ServiceSettings)
    settings_of(settings)  # every flag is declared once


def test_up_ports_never_meet():
    """Each instance's /metrics port under ``inferbus up`` is its own."""
    used: dict[int, str] = {}
    for e in servicetable.SERVICES:
        if e.port_offset is None:
            continue
        count = servicetable.MAX_INSTANCES if e.scalable else e.instances
        for i in range(count):
            port = e.metrics_port(0, i)
            assert port not in used, (e.name, i, used.get(port))
            used[port] = e.instance_name(i)


def test_start_and_stop_orders_are_total():
    assert len({e.start_order for e in servicetable.SERVICES}) == len(servicetable.SERVICES)
    gateway = ENTRIES["gateway"]
    assert gateway.stop_order == min(e.stop_order for e in servicetable.SERVICES)
    assert gateway.start_order == max(e.start_order for e in servicetable.SERVICES)


def test_the_cli_serves_exactly_the_table():
    from inferbus.cli.platform import serve

    assert tuple(serve.params[0].type.choices) == servicetable.names()  # type: ignore[attr-defined]


def test_the_built_wheel_carries_every_module(tmp_path: Path):
    """The editable install sees every folder; a wheel (the image's ``pip install .``)
    carries only what packaging finds."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("inferbus-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    roots = {
        "inferbus": "inferbus",
        "contracts": "inferbus/contracts",
        "shared": "inferbus/shared",
        "services": "inferbus/services",
    }
    missing = []
    for folder, installed in roots.items():
        for source in (ROOT / folder).rglob("*.py"):
            rel = source.relative_to(ROOT / folder).as_posix()
            if f"{installed}/{rel}" not in names:
                missing.append(f"{folder}/{rel}")
    assert not missing, f"not in the wheel: {missing}"
    for name in ENTRIES:
        assert f"inferbus/services/{name}/service.py" in names


# -- deployments -------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_compose_runs_each_service_on_its_port(name: str):
    services = compose()
    assert name in services, f"compose.yaml has no service {name!r}"
    svc = services[name]
    assert svc["command"][:2] == ["serve", name]
    assert str(svc["environment"]["INFERBUS_HTTP_PORT"]) == str(ENTRIES[name].container_port)
    assert "healthcheck" in svc and svc["depends_on"]["nats"]["condition"] == "service_healthy"


def k8s_objects(name: str) -> list[dict[str, Any]]:
    path = ROOT / "deploy" / "k8s" / "base" / f"{name}.yaml"
    assert path.exists(), f"deploy/k8s/base/{name}.yaml is missing"
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_k8s_has_a_deployment_per_service_in_the_kustomization(name: str):
    base = ROOT / "deploy" / "k8s" / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert f"{name}.yaml" in kustomization["resources"]
    (deployment,) = [o for o in k8s_objects(name) if o["kind"] == "Deployment"]
    assert deployment["metadata"]["name"] == name
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"][:2] == ["serve", name]
    port = ENTRIES[name].container_port
    assert [p["containerPort"] for p in container["ports"]] == [port]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["INFERBUS_HTTP_PORT"] == str(port)
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_prometheus_scrapes_each_service(name: str):
    config = yaml.safe_load((ROOT / "deploy" / "observability" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    job = jobs.get(f"inferbus-{name}")
    assert job is not None, f"prometheus.yml has no job inferbus-{name}"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == [name] and sd["port"] == ENTRIES[name].container_port


def test_every_setting_of_every_service_is_explained_in_its_help():
    from inferbus.shared.config import parser_for, settings_of

    for entry in servicetable.SERVICES:
        cls = entry.settings_class()
        undocumented = [s.name for s in settings_of(cls) if not s.doc]
        assert undocumented == [], f"{entry.name}: give these a docstring: {undocumented}"
        # argparse wraps lines, at hyphens too: compare without whitespace
        text = "".join(parser_for(cls).format_help().split())
        for s in settings_of(cls):
            assert "".join(s.doc.split()) in text, (entry.name, s.name)


def test_a_wrong_setting_exits_with_the_reason_not_a_traceback():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "inferbus.services.kvspill", "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("inferbus kvspill: ")
    assert "kvspill needs --shared-dir" in out.stderr
    assert "Traceback" not in out.stderr


def test_no_testkit_module_shadows_the_standard_library():
    # testkit scripts run as `python tests/testkit/x.py`, which puts testkit/ first on
    # sys.path: a testkit/platform.py broke `import torch` there (platform.system)
    import sys

    testkit = Path(__file__).resolve().parents[1] / "testkit"
    names = {p.stem for p in testkit.glob("*.py")} | {
        p.name for p in testkit.iterdir() if p.is_dir()
    }
    assert not names & set(sys.stdlib_module_names)
