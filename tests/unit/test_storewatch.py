"""When the supervisor restarts an embedded nats-server whose disk filled
(inferbus/supervisor/storewatch.py)."""

from __future__ import annotations

from inferbus.supervisor.storewatch import StoreWatch

FULL = (
    "[ERR] JetStream failed to store a msg on stream '$G > IB_REQUESTS': write "
    "/state/nats/jetstream/$G/streams/IB_REQUESTS/msgs/1.blk: no space left on device\n"
)


def test_a_store_that_failed_is_restarted_once_its_disk_has_room():
    watch = StoreWatch(min_free_bytes=8 << 20, settle_s=30.0)
    watch.read("nats", "[INF] Server is ready\n", 0.0)
    assert not watch.to_restart("nats", 1 << 30, 1.0)  # nothing failed
    watch.read("nats", FULL, 2.0)
    assert not watch.to_restart("nats", 1 << 10, 3.0)  # still full: a restart cures nothing
    assert watch.to_restart("nats", 100 << 20, 9.0)  # room again: once
    assert not watch.to_restart("nats", 100 << 20, 10.0)


def test_errors_a_restart_does_not_cure_are_not_restarted_in_a_loop():
    watch = StoreWatch(min_free_bytes=8 << 20, settle_s=30.0)
    watch.read("nats", FULL, 0.0)
    assert watch.to_restart("nats", 1 << 30, 1.0)
    watch.read("nats", FULL, 2.0)  # back at once
    assert not watch.to_restart("nats", 1 << 30, 5.0)
    assert watch.to_restart("nats", 1 << 30, 31.5)
    watch.read("nats-1", FULL, 40.0)  # each server of a cluster on its own
    assert watch.to_restart("nats-1", 1 << 30, 40.5)
