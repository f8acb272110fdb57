"""What a tenant's submits may weigh: bytes per minute, a token bucket per tenant.

One tenant's 50 rejected 1 MB prompts went into IB_REQUESTS in 2.1 s, and each of its
garbage submits became a dead letter (issue 42 item 3). Streams are bounded now (their
oldest go first), so a flood can no longer fill the disk, but it could still push the
other tenants' history out; past its quota a tenant's submits end ``rate_limited`` at
once, before any check, tokenizer or dead letter. Pure: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Bucket:
    level: float
    at: float


@dataclass
class ByteQuota:
    buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, tenant: str, size: int, per_minute: int, now: float) -> float:
        """0.0 when ``size`` bytes fit ``tenant``'s quota now (they are spent), else the
        seconds until they would. ``per_minute`` 0: no quota."""
        if per_minute <= 0:
            return 0.0
        rate = per_minute / 60.0
        b = self.buckets.get(tenant)
        if b is None:
            b = self.buckets[tenant] = _Bucket(level=float(per_minute), at=now)
        b.level = min(float(per_minute), b.level + (now - b.at) * rate)
        b.at = now
        if size <= b.level:
            b.level -= size
            return 0.0
        if size > per_minute:  # never fits: as long as a whole minute's room
            return 60.0
        return (size - b.level) / rate
