"""inferbus top's pure core: quantiles, rates between snapshots, the view of odd fleets.

The fake services export their metrics through prometheus_client itself (a registry
each, the platform's metric names), so the text parsed here is the real format.
"""

from __future__ import annotations

import io
import json
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from rich.console import Console

from inferbus.top.quantile import histogram_quantile
from inferbus.top.rates import Interval, counter_increases, histogram_increases
from inferbus.top.render import render
from inferbus.top.snapshot import Instance, Snapshot, instance_from_stats, parse_metrics
from inferbus.top.view import build_view, view_json

INF = math.inf
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0)


class FakeProcess:
    """One service process: its status and a registry with the platform's metric names."""

    def __init__(self, service: str, instance: str, **status) -> None:
        self.service, self.instance = service, instance
        self.status = {"service": service, "instance": instance, "ready": True, **status}
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "inferbus_requests_total", "", ["service", "model", "outcome"], registry=r
        )
        self.tokens = Counter(
            "inferbus_tokens_total", "", ["service", "model", "phase"], registry=r
        )
        self.ttft = Histogram(
            "inferbus_time_to_first_token_seconds",
            "",
            ["service", "model"],
            buckets=BUCKETS,
            registry=r,
        )
        self.oldest = Gauge("inferbus_queue_oldest_wait_seconds", "", ["model", "lane"], registry=r)
        self.heartbeat = Gauge("inferbus_worker_heartbeat_age_seconds", "", ["worker"], registry=r)

    def read(self, reachable: bool = True) -> Instance:
        if not reachable:
            return Instance(
                self.service,
                self.instance,
                dict(self.status),
                "http://127.0.0.1:1/metrics",
                None,
                "ClientConnectorError: refused",
            )
        return Instance(
            self.service,
            self.instance,
            dict(self.status),
            "http://127.0.0.1:1/metrics",
            parse_metrics(generate_latest(self.registry).decode()),
        )


def snap(at: float, *procs: FakeProcess) -> Snapshot:
    return Snapshot(at=at, instances=tuple(p.read() for p in procs))


def platform():
    worker = FakeProcess(
        "worker",
        "w-proc",
        worker_id="w1",
        engine="sim",
        models=["m"],
        state="ready",
        running=2,
        waiting=0,
        kv_cache_usage=0.25,
        inflight=2,
    )
    scheduler = FakeProcess(
        "scheduler",
        "s1",
        inflight=2,
        queued={"m": 3},
        lanes={"m": {"short": 2, "long": 1}},
        workers={"w1": {"models": ["m"], "state": "ready", "assigned": 2, "max_num_seqs": 8}},
        routing={"policy": "kv_aware", "prefix_hit_rate": 0.5},
    )
    gateway = FakeProcess("gateway", "g1", inflight=1, auth="open", models={"m": 1})
    sanitizer = FakeProcess("sanitizer", "z1", accepted=4, rejected=1, blocked=0)
    return worker, scheduler, gateway, sanitizer


def rendered(view) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(render(view, "inferbus top (test)"))
    return out.getvalue()


# -- quantiles ----------------------------------------------------------------------

KNOWN = [(0.1, 10.0), (0.2, 20.0), (0.5, 30.0), (INF, 40.0)]


@pytest.mark.parametrize(
    "q, expected",
    [
        (0.25, 0.1),  # rank 10: the whole first bucket, from 0 to 0.1
        (0.125, 0.05),  # rank 5: half way through the first bucket
        (0.5, 0.2),  # rank 20: the end of the second
        (0.6, 0.32),  # rank 24: 4 of the third bucket's 10, 0.2 + 0.3 * 0.4
        (0.9, 0.5),  # rank 36 lies in +Inf: the highest finite bound, as Prometheus
        (1.0, 0.5),
    ],
)
def test_quantiles_interpolate_within_buckets_as_prometheus_does(q, expected):
    assert histogram_quantile(q, KNOWN) == pytest.approx(expected)


def test_quantiles_of_nothing_are_unknown_and_out_of_range_ones_infinite():
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.1, 3.0), (0.2, 5.0)]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, [(INF, 3.0)]) is None  # one bucket is not enough
    assert histogram_quantile(-0.1, KNOWN) == -INF
    assert histogram_quantile(1.1, KNOWN) == INF


def test_quantiles_take_unordered_and_non_monotonic_buckets():
    shuffled = [KNOWN[2], KNOWN[0], KNOWN[3], KNOWN[1]]
    assert histogram_quantile(0.6, shuffled) == pytest.approx(0.32)
    dented = [(0.1, 10.0), (0.2, 9.0), (0.5, 30.0), (INF, 40.0)]  # forced to 10, 10, 30, 40
    assert histogram_quantile(0.5, dented) == pytest.approx(0.2 + 0.3 * 10 / 20)


# -- rates between two snapshots ----------------------------------------------------


def test_rates_come_from_the_increase_between_two_snapshots():
    worker, scheduler, gateway, sanitizer = platform()
    worker.tokens.labels("worker", "m", "decode").inc(1000)  # before the interval
    before = snap(10.0, worker, scheduler, gateway, sanitizer)
    worker.tokens.labels("worker", "m", "decode").inc(400)
    worker.tokens.labels("worker", "m", "prefill").inc(100)
    for _ in range(3):
        worker.requests.labels("worker", "m", "request.finished").inc()
    worker.requests.labels("worker", "m", "request.failed").inc()
    gateway.requests.labels("gateway", "m", "request.finished").inc(3)  # the same requests
    now = snap(12.0, worker, scheduler, gateway, sanitizer)

    view = build_view(before, now)
    assert view.interval_s == 2.0
    (m,) = view.models
    assert m.model == "m"
    assert m.decode_tokens_per_s == pytest.approx(200.0)
    assert m.prefill_tokens_per_s == pytest.approx(50.0)
    assert m.requests_per_s == pytest.approx(2.0)  # counted where they end, once
    assert m.error_ratio == pytest.approx(0.25)
    assert m.outcomes_per_s == {"request.failed": 0.5, "request.finished": 1.5}
    assert view.totals is not None and view.totals.decode_tokens_per_s == pytest.approx(200.0)
    (w,) = view.workers
    assert w.decode_tokens_per_s == pytest.approx(200.0)


def test_a_counter_that_went_down_restarted_from_zero():
    worker, *_ = platform()
    worker.tokens.labels("worker", "m", "decode").inc(5000)
    before = snap(0.0, worker)
    restarted = FakeProcess("worker", "w-proc", worker_id="w1", models=["m"])
    restarted.tokens.labels("worker", "m", "decode").inc(30)
    now = snap(1.0, restarted)
    ((_, labels, grew),) = counter_increases(Interval(before, now), "inferbus_tokens_total")
    assert labels["phase"] == "decode" and grew == 30.0
    assert build_view(before, now).models[0].decode_tokens_per_s == pytest.approx(30.0)


def test_a_histogram_that_went_down_restarted_from_zero():
    gateway = FakeProcess("gateway", "g1")
    for _ in range(50):
        gateway.ttft.labels("gateway", "m").observe(0.7)
    before = snap(0.0, gateway)
    restarted = FakeProcess("gateway", "g1")
    restarted.ttft.labels("gateway", "m").observe(0.03)
    now = snap(1.0, restarted)
    ((_, _, buckets),) = histogram_increases(
        Interval(before, now), "inferbus_time_to_first_token_seconds"
    )
    assert buckets[INF] == 1.0 and buckets[0.01] == 0.0 and buckets[0.05] == 1.0


def test_a_process_seen_once_has_no_rate_and_a_new_series_starts_from_zero():
    worker, *_ = platform()
    worker.tokens.labels("worker", "m", "decode").inc(777)  # lifetime total, not a rate
    late = snap(1.0, worker)
    assert build_view(snap(0.0), late).models[0].decode_tokens_per_s == 0.0
    assert build_view(snap(0.0), late).workers[0].decode_tokens_per_s is None

    before = snap(0.0, worker)
    worker.tokens.labels("worker", "new-model", "decode").inc(10)  # appeared in between
    rows = {m.model: m for m in build_view(before, snap(1.0, worker)).models}
    assert rows["new-model"].decode_tokens_per_s == 10.0
    assert rows["m"].decode_tokens_per_s == 0.0


def test_ttft_prefers_what_the_gateway_saw_and_falls_back_to_the_workers():
    worker, _scheduler, gateway, _sanitizer = platform()
    before = snap(0.0, worker, gateway)
    for v in (0.02, 0.02, 0.02, 0.3):
        worker.ttft.labels("worker", "m").observe(v)
    only_workers = build_view(before, snap(1.0, worker, gateway)).models[0]
    assert only_workers.ttft_source == "worker" and only_workers.ttft_count == 4
    # ranks 2 and 3.8 of 4: in (0.01, 0.05], and in (0.1, 0.5]
    assert only_workers.ttft_p50_s == pytest.approx(0.01 + 0.04 * 2 / 3)
    assert only_workers.ttft_p95_s == pytest.approx(0.1 + 0.4 * 0.8)

    for v in (0.6, 0.6):
        gateway.ttft.labels("gateway", "m").observe(v)
    with_gateway = build_view(before, snap(1.0, worker, gateway)).models[0]
    assert with_gateway.ttft_source == "gateway" and with_gateway.ttft_count == 2
    assert with_gateway.ttft_p50_s == pytest.approx(0.5 + 0.5 * 0.5)


def test_no_time_passed_gives_no_rates_rather_than_a_division_by_zero():
    worker, *_ = platform()
    s = snap(5.0, worker)
    view = build_view(s, s)
    assert view.interval_s is None and view.totals is None
    assert view.models[0].requests_per_s is None


# -- the fleet, odd ones included ---------------------------------------------------


def test_the_fleet_merges_the_schedulers_view_with_the_workers_own():
    worker, scheduler, gateway, sanitizer = platform()
    scheduler.status["workers"]["w2"] = {
        "models": ["m"],
        "state": "draining",
        "assigned": 0,
        "max_num_seqs": 4,
    }
    scheduler.oldest.labels("m", "short").set(1.5)
    scheduler.heartbeat.labels("w1").set(0.2)
    view = build_view(None, snap(0.0, worker, scheduler, gateway, sanitizer))
    w1, w2 = view.workers
    assert (
        w1.worker_id,
        w1.models,
        w1.state,
        w1.running,
        w1.assigned,
        w1.max_num_seqs,
        w1.kv_cache_usage,
        w1.heartbeat_age_s,
    ) == ("w1", ["m"], "ready", 2, 2, 8, 0.25, 0.2)
    assert w2.state == "draining" and w2.running is None and "no $SRV answer" in w2.note
    assert [(q.model, q.lane, q.depth, q.oldest_wait_s) for q in view.queues] == [
        ("m", "long", 1, None),
        ("m", "short", 2, 1.5),
    ]
    assert view.queued == 3 and view.scheduler_inflight == 2
    assert view.missing_services == ["kvspill", "delivery"]  # default services not faked here
    assert [s.service for s in view.services] == ["gateway", "sanitizer", "scheduler", "worker"]
    assert view.services[0].detail == "auth open, 1 model"
    text = rendered(view)
    for word in (
        "Workers",
        "Queues",
        "Throughput & latency",
        "Services",
        "w1",
        "draining",
        "kv_aware",
        "auth open",
    ):
        assert word in text


def test_nothing_running_is_shown_as_such():
    view = build_view(None, Snapshot(at=0.0))
    assert view.missing_services == [
        "gateway",
        "sanitizer",
        "scheduler",
        "worker",
        "kvspill",
        "delivery",
    ]
    assert view.workers == [] and view.queues == [] and view.queued is None
    text = rendered(view)
    assert "no workers" in text and "no scheduler" in text and "none answered" in text
    assert json.loads(view_json(view))["missing_services"][0] == "gateway"


def test_nats_unreachable_is_shown_as_the_problem():
    view = build_view(None, Snapshot(at=0.0, problem="cannot reach NATS at nats://x:1"))
    assert "cannot reach NATS" in rendered(view)


def test_an_instance_whose_metrics_cannot_be_read_is_shown_unreachable():
    worker, scheduler, _gateway, _sanitizer = platform()
    before = snap(0.0, worker, scheduler)
    worker.tokens.labels("worker", "m", "decode").inc(10)
    now = Snapshot(at=1.0, instances=(worker.read(reachable=False), scheduler.read()))
    view = build_view(before, now)
    (row,) = [s for s in view.services if s.service == "worker"]
    assert row.metrics.startswith("unreachable") and row.ready is True
    assert view.workers[0].decode_tokens_per_s is None  # not read: not known, not zero
    assert view.missing_services == ["gateway", "sanitizer", "kvspill", "delivery"]
    assert "unreachable" in rendered(view)


def test_statuses_of_unexpected_shapes_do_not_crash_the_view():
    odd = FakeProcess(
        "scheduler",
        "s-odd",
        workers=["not", "a", "mapping"],
        lanes="none",
        queued=None,
        inflight="many",
        routing=7,
    )
    odd_worker = FakeProcess("worker", "w-odd", models="m", running="two", kv_cache_usage=None)
    view = build_view(None, snap(0.0, odd, odd_worker))
    assert view.queues == [] and view.queued == 0
    assert view.workers[0].worker_id == "w-odd" and view.workers[0].models == []
    rendered(view)
    json.loads(view_json(view))


def test_traces_kept_and_dropped_when_exported():
    registry = CollectorRegistry()
    traces = Counter("inferbus_traces_total", "", ["service", "decision"], registry=registry)
    proc = Instance("gateway", "g1", {}, "u", parse_metrics(generate_latest(registry).decode()))
    assert build_view(None, Snapshot(0.0, (proc,))).traces is None
    traces.labels("gateway", "kept").inc(1)
    before = Snapshot(
        0.0,
        (Instance("gateway", "g1", {}, "u", parse_metrics(generate_latest(registry).decode())),),
    )
    traces.labels("gateway", "kept").inc(2)
    traces.labels("gateway", "dropped").inc(8)
    now = Snapshot(
        2.0,
        (Instance("gateway", "g1", {}, "u", parse_metrics(generate_latest(registry).decode())),),
    )
    t = build_view(before, now).traces
    assert t is not None and (t.kept_per_s, t.dropped_per_s) == (1.0, 4.0)


# -- reading $SRV replies -----------------------------------------------------------


def test_srv_stats_replies_name_the_instance_and_where_its_metrics_are():
    reply = {
        "type": "io.nats.micro.v1.stats_response",
        "name": "inferbus-worker",
        "id": "NUID",
        "version": "0.1.0",
        "started": "2024-01-01T00:00:00.000000Z",
        "metadata": {"instance": "w-proc", "http_host": "10.0.0.5", "http_port": "9110"},
        "endpoints": [
            {
                "name": "status",
                "subject": "ib.svc.worker.status",
                "queue_group": "q",
                "num_requests": 0,
                "num_errors": 0,
                "last_error": "",
                "processing_time": 0,
                "average_processing_time": 0,
                "data": {"service": "worker", "worker_id": "w1", "ready": True},
            }
        ],
    }
    inst = instance_from_stats(reply)
    assert inst is not None
    assert (inst.service, inst.instance, inst.metrics_url, inst.status["worker_id"]) == (
        "worker",
        "w-proc",
        "http://10.0.0.5:9110/metrics",
        "w1",
    )
    assert instance_from_stats({**reply, "name": "someone-else"}) is None
    bare = instance_from_stats({"name": "inferbus-gateway", "id": "X", "endpoints": []})
    assert bare is not None and bare.instance == "X" and bare.metrics_url == ""
    v6 = instance_from_stats({**reply, "metadata": {"http_host": "::1", "http_port": "1"}})
    assert v6 is not None and v6.metrics_url == "http://[::1]:1/metrics"


def test_json_is_for_a_single_view():
    from click.testing import CliRunner

    from inferbus.cli import main

    result = CliRunner().invoke(main, ["top", "--json"])
    assert result.exit_code == 2 and "--json needs --once" in result.output


def test_rollouts_are_shown_in_flight_first_with_their_share():
    worker, scheduler, gateway, sanitizer = platform()
    delivery = FakeProcess(
        "delivery",
        "d1",
        rollouts={
            "old": {"version": "v1", "phase": "rolled_back", "weight": 0.0, "workers": ["w9"]},
            "m": {"version": "v2", "phase": "stepping", "weight": 0.25, "workers": ["w1"]},
            "odd": "not a mapping",
        },
    )
    view = build_view(None, snap(0.0, worker, scheduler, gateway, sanitizer, delivery))
    assert [(r.model, r.phase, r.weight) for r in view.rollouts][:2] == [
        ("m", "stepping", 0.25),
        ("odd", "?", None),
    ]
    assert view.rollouts[-1].model == "old"
    text = rendered(view)
    assert "Rollouts" in text and "stepping" in text and "25.0%" in text
    assert "Rollouts" not in rendered(build_view(None, snap(0.0, worker, scheduler)))


def test_the_shared_kv_tier_is_shown_with_its_use():
    worker, scheduler, gateway, sanitizer = platform()
    kvspill = FakeProcess("kvspill", "k1", used_bytes=2**30, capacity_bytes=4 * 2**30, blocks=256)
    view = build_view(None, snap(0.0, worker, scheduler, gateway, sanitizer, kvspill))
    (row,) = [s for s in view.services if s.service == "kvspill"]
    assert row.detail == "shared tier 25% of 4.0 GiB, 256 blocks"
    assert "kvspill" not in view.missing_services
