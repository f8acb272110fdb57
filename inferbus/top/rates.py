"""How much counters and histograms grew between two snapshots. Pure.

Only instances read in both snapshots count: a process seen for the first time has
no baseline, and its lifetime totals are not a rate. A counter that went down was
restarted (a process with the same instance id), so all of its value is new, as in
Prometheus's ``increase``; a series that appeared between the two started from 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .snapshot import Instance, Labels, Snapshot


def increase(before: float | None, now: float) -> float:
    if before is None or now < before:
        return now
    return now - before


@dataclass(frozen=True)
class Interval:
    before: Snapshot
    now: Snapshot

    @property
    def seconds(self) -> float:
        return self.now.at - self.before.at

    def paired(self, service: str | None = None) -> Iterator[tuple[Instance, Instance]]:
        """(then, now) of each instance whose metrics were read both times."""
        then = {i.key: i for i in self.before.instances if i.metrics is not None}
        for inst in self.now.instances:
            old = then.get(inst.key)
            if old is not None and inst.metrics is not None and service in (None, inst.service):
                yield old, inst


def counter_increases(
    interval: Interval,
    name: str,
    service: str | None = None,
) -> Iterator[tuple[Instance, dict[str, str], float]]:
    """(instance, labels, increase) of every series named ``name``."""
    for old, new in interval.paired(service):
        assert old.metrics is not None and new.metrics is not None
        before = old.metrics.get(name, {})
        for labels, value in new.metrics.get(name, {}).items():
            yield new, dict(labels), increase(before.get(labels, 0.0), value)


def _buckets_by_series(samples: Mapping[Labels, float]) -> dict[Labels, dict[float, float]]:
    """``<name>_bucket`` samples grouped by their labels other than ``le``."""
    out: dict[Labels, dict[float, float]] = {}
    for labels, value in samples.items():
        rest = tuple((k, v) for k, v in labels if k != "le")
        le = dict(labels).get("le")
        if le is None:
            continue
        try:
            out.setdefault(rest, {})[float(le)] = value
        except ValueError:
            continue
    return out


def histogram_increases(
    interval: Interval,
    name: str,
    service: str | None = None,
) -> Iterator[tuple[Instance, dict[str, str], dict[float, float]]]:
    """(instance, labels without ``le``, {upper bound: cumulative increase}) of every
    series of the histogram ``name``; a histogram any of whose buckets went down was
    restarted, and counts whole."""
    for old, new in interval.paired(service):
        assert old.metrics is not None and new.metrics is not None
        then = _buckets_by_series(old.metrics.get(f"{name}_bucket", {}))
        for labels, buckets in _buckets_by_series(new.metrics.get(f"{name}_bucket", {})).items():
            prev = then.get(labels, {})
            restarted = any(count < prev.get(le, 0.0) for le, count in buckets.items())
            yield (
                new,
                dict(labels),
                {
                    le: count if restarted else count - prev.get(le, 0.0)
                    for le, count in buckets.items()
                },
            )
