"""Quantiles from cumulative histogram buckets, the way Prometheus's histogram_quantile
computes them: find the bucket holding the rank, interpolate linearly inside it."""

from __future__ import annotations

import math
from collections.abc import Iterable


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The q-quantile of ``(upper bound, cumulative count)`` buckets; None without data.

    As Prometheus: buckets must end at +Inf; counts are forced non-decreasing; a rank
    in the +Inf bucket gives the highest finite bound; the first bucket starts at 0
    (or is its own bound when that is not positive).
    """
    if math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:
        merged[bound] = merged.get(bound, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    bounds = [b for b, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next((i for i, c in enumerate(counts[:-1]) if c >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count <= 0:
        return None
    return start + (end - start) * (rank / count)
