"""The observability deployment (deploy/observability/, compose.yaml): rules, dashboard, wiring.

No network and no containers: promtool checks and unit-tests the rules (skipped where
it is not installed: `apt-get install prometheus` gives it), and every metric name the
rules and the dashboard use is checked against shared/metrics.py, so neither can
draw or alert on a series that no service exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from testkit.compose import default

from inferbus import servicetable
from inferbus.shared import metrics

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "deploy" / "observability"
RULES = OBS / "rules" / "inferbus.rules.yml"
RULES_TEST = OBS / "rules" / "inferbus.rules.test.yml"
PROMETHEUS = OBS / "prometheus.yml"
DASHBOARD = OBS / "grafana" / "dashboards" / "inferbus.json"
DATASOURCES = OBS / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
COLLECTOR = OBS / "otel-collector.yaml"
COMPOSE = ROOT / "compose.yaml"

# the series each metric type exposes (prometheus_client strips _total from counter names)
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
}


def _declared_series() -> set[str]:
    names = set()
    for collector in vars(metrics).values():
        if isinstance(collector, (MetricWrapperBase, metrics.BatchedHistogram)):
            for family in collector.describe():
                names.update(family.name + s for s in _SUFFIXES[family.type])
    return names


def _rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def _recorded() -> set[str]:
    return {r["record"] for g in _rules()["groups"] for r in g["rules"] if "record" in r}


def _rule_exprs() -> list[tuple[str, str]]:
    return [
        (r.get("record") or r["alert"], r["expr"]) for g in _rules()["groups"] for r in g["rules"]
    ]


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # panels inside collapsed rows


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = _dashboard()
    out = [(p["title"], t["expr"]) for p in _panels(dash) for t in p.get("targets", [])]
    out += [
        (f"annotation {a['name']}", a["expr"]) for a in dash["annotations"]["list"] if "expr" in a
    ]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out.append((f"variable {v['name']}", q["query"] if isinstance(q, dict) else q))
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_COMMENT = re.compile(r"#[^\n]*")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _inferbus_names(expr: str) -> set[str]:
    """Metric (or recorded) names in a PromQL expression that belong to inferbus."""
    bare = _COMMENT.sub("", _STRING.sub('""', expr))
    return {t for t in _IDENT.findall(bare) if "inferbus" in t}


def _grafana_to_promql(expr: str) -> str:
    """The dashboard's template variables replaced by what they stand for."""
    return (
        expr.replace("$__rate_interval", "5m")
        .replace("$model", ".*")
        .replace("$service", "gateway")
    )


# -- (a) promtool ----------------------------------------------------------------------

promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not on PATH (`apt-get install --no-install-recommends prometheus`)",
)


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=120
    )


@promtool
def test_promtool_checks_the_rules():
    r = _promtool("check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr


@promtool
def test_promtool_unit_tests_pass():
    r = _promtool("test", "rules", RULES_TEST)
    assert r.returncode == 0, r.stdout + r.stderr


@promtool
def test_promtool_checks_the_prometheus_config():
    r = _promtool("check", "config", PROMETHEUS)
    assert r.returncode == 0, r.stdout + r.stderr


@promtool
def test_dashboard_queries_are_valid_promql(tmp_path):
    """Each query, as a recording rule, through promtool's PromQL parser."""
    exprs = [e for title, e in _dashboard_exprs() if not title.startswith("variable ")]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard_query_{i}", "expr": _grafana_to_promql(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    r = _promtool("check", "rules", path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_unit_tested_firing_and_not_firing():
    alerts = {r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired, quiet = set(), set()
    for t in tests:
        for a in t.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested staying quiet"


def test_every_alert_says_how_bad_and_where_to_look():
    for g in _rules()["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
                assert r["annotations"]["summary"].strip(), r["alert"]
                assert len(r["annotations"]["description"]) > 80, r["alert"]


# -- (b) every name used is declared ---------------------------------------------------


def test_the_declared_names_are_read_from_shared_metrics():
    declared = _declared_series()
    # one of each kind, so a change in how prometheus_client names them shows here
    assert {
        "inferbus_requests_total",
        "inferbus_queue_depth",
        "inferbus_time_to_first_token_seconds_bucket",
    } <= declared
    assert "inferbus_requests" not in declared


def test_rules_use_only_declared_metrics_or_recorded_names():
    known = _declared_series() | _recorded()
    for name, expr in _rule_exprs():
        unknown = _inferbus_names(expr) - known
        assert not unknown, f"rule {name} uses {sorted(unknown)}: not in shared/metrics.py"


def test_dashboard_uses_only_declared_metrics_or_recorded_names():
    known = _declared_series() | _recorded()
    exprs = _dashboard_exprs()
    assert len(exprs) > 30
    for title, expr in exprs:
        unknown = _inferbus_names(expr) - known
        assert not unknown, f"panel {title!r} uses {sorted(unknown)}: no such series"


def test_the_name_check_catches_a_misspelling():
    known = _declared_series() | _recorded()
    expr = 'sum by (model) (rate(inferbus_request_total{outcome="inferbus_nope"}[5m]))'
    assert _inferbus_names(expr) - known == {"inferbus_request_total"}


def test_dashboard_reads_the_provisioned_prometheus():
    dash = _dashboard()
    uids = {ds["uid"] for ds in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    assert "prometheus" in uids
    assert dash["uid"] == "inferbus" and dash["schemaVersion"] >= 39
    for p in _panels(dash):
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "prometheus", p["title"]
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = {p["title"].split(":")[0] for p in _panels(dash) if p["type"] == "row"}
    assert {
        "SLO overview",
        "Stages",
        "Tokens",
        "Scheduler",
        "KV cache",
        "Sanitizer",
        "Tracing",
    } <= rows


# -- (c) compose, scrape config, collector ---------------------------------------------


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _inferbus_services(compose: dict) -> dict[str, dict]:
    """The services that run `inferbus serve NAME` (the x-service anchor)."""
    return {
        name: s for name, s in compose["services"].items() if s.get("command", [None])[0] == "serve"
    }


def test_compose_wires_every_inferbus_service_to_the_collector():
    compose = _compose()
    services = _inferbus_services(compose)
    assert set(services) == set(servicetable.names())
    for name, s in services.items():
        env = s["environment"]
        # the default: INFERBUS_OTLP_ENDPOINT may name another receiver, or be set empty
        # to turn tracing off (measured: ":-" put the collector back for an empty value)
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert endpoint == "${INFERBUS_OTLP_ENDPOINT-http://otel-collector:4318}", name
        assert env["OTEL_SERVICE_NAME"] == f"inferbus-{name}"
        assert float(default(env["INFERBUS_TRACE_SLOW_S"])) > 0
        assert 0 <= float(default(env["INFERBUS_TRACE_KEEP_RATIO"])) <= 1
        assert env["NATS_URL"] == "nats://nats:4222", name  # the anchor still merged
    assert {"prometheus", "grafana", "otel-collector", "jaeger", "nats"} <= set(compose["services"])
    assert compose["services"]["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_compose_mounts_files_that_exist():
    for name, s in _compose()["services"].items():
        for volume in s.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def _scrape_targets() -> dict[str, set[tuple[str, int]]]:
    out: dict[str, set[tuple[str, int]]] = {}
    for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]:
        targets = out.setdefault(job["job_name"], set())
        for sd in job.get("dns_sd_configs", []):
            targets.update((n, int(sd["port"])) for n in sd["names"])
        for sc in job.get("static_configs", []):
            for t in sc["targets"]:
                host, _, port = t.rpartition(":")
                targets.add((host, int(port)))
    return out


def test_prometheus_scrapes_every_inferbus_service_on_its_port():
    scraped = _scrape_targets()
    for name, s in _inferbus_services(_compose()).items():
        port = int(s["environment"]["INFERBUS_HTTP_PORT"])
        assert (name, port) in scraped.get(f"inferbus-{name}", set()), name


def test_prometheus_loads_the_rules():
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert [OBS / f for f in config["rule_files"]] == [RULES]
    # the alerts' absent(up{job=...}) name these jobs
    jobs = set(_scrape_targets())
    for _, expr in _rule_exprs():
        for job in re.findall(r'job="([^"]+)"', expr):
            assert job in jobs, job


def test_the_collector_sends_traces_to_jaeger_without_sampling():
    config = yaml.safe_load(COLLECTOR.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["otlp/jaeger"]
    assert "batch" in traces["processors"]
    # the services tail-sample themselves; a second sampler here would drop kept traces
    assert not [p for p in traces["processors"] if "sampl" in p]
    for p in traces["processors"]:
        assert p in config["processors"]
