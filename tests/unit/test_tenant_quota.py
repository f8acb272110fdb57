"""A tenant's bytes per minute (services/sanitizer/quota.py, issue 42 item 3)."""

from __future__ import annotations

from inferbus.services.sanitizer.quota import ByteQuota

MB = 1 << 20


def test_a_tenant_past_its_bytes_per_minute_waits_and_others_do_not():
    q = ByteQuota()
    for _ in range(10):  # a minute's worth at once: a burst is taken
        assert q.take("flood", MB, 10 * MB, 0.0) == 0.0
    wait = q.take("flood", MB, 10 * MB, 0.1)
    assert 5.0 < wait < 6.1  # 1 MB at 10 MB a minute, less what 0.1 s refilled
    assert q.take("calm", MB, 10 * MB, 0.1) == 0.0  # buckets are per tenant
    assert q.take("flood", MB, 10 * MB, 6.5) == 0.0  # refilled
    assert q.take("flood", 20 * MB, 10 * MB, 500.0) == 60.0  # never fits
    assert q.take("anyone", 100 * MB, 0, 0.0) == 0.0  # no quota
