"""The per-request histogram: the same exposition as prometheus_client's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferbus.shared.metrics import BatchedHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def samples(text: bytes, name: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name == name:
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_batched_histogram_reads_exactly_like_a_histogram_fed_one_by_one():
    values = [0.0005, 0.001, 0.001, 0.0099, 0.01, 0.05, 0.1, 0.7, 1.0, 3.0]
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "ref_seconds", "d", ["model"], buckets=BUCKETS, registry=reference_registry
    )
    batched = BatchedHistogram("batched_seconds", "d", ["model"], BUCKETS)
    for model, part in (("a", values[:4]), ("b", values), ("a", values[4:])):
        tally = batched.tally()
        for v in part:
            tally.observe(v)
            reference.labels(model).observe(v)
        batched.add((model,), tally)
    registry = CollectorRegistry()
    registry.register(batched)
    got = {
        (n.replace("batched", "ref"), labels): v
        for (n, labels), v in samples(generate_latest(registry), "batched_seconds").items()
    }
    want = samples(generate_latest(reference_registry), "ref_seconds")
    assert got == want and len(want) == 2 * (len(BUCKETS) + 3)
