"""A service told to stop while the bus is down (NATS lost, then SIGTERM: a node
drained during a NATS outage) exits at once and cleanly. Every service exited 1 with a
traceback (nats-py's close wrote to the dead socket), so a supervisor or Kubernetes
took an orderly stop for a crash; a partitioned scheduler also waited out each
lease's release and the KV index's write (15 s at four partitions)."""

from __future__ import annotations

import time

import pytest
from testkit.procs import ServiceProcess, start_all

from inferbus.shared.natsserver import NatsServer

pytestmark = [pytest.mark.integration]

SERVICES = {
    "gateway": (),
    "sanitizer": (),
    "scheduler": ("--scheduler-partitions", "4"),
    "worker": ("--model", "m", "--sim-decode-s-per-step", "0.01"),
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_stopped_with_the_bus_down_exits_at_once_and_cleanly(tmp_path, service):
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    proc = ServiceProcess(service, server.url, tmp_path, *SERVICES[service], name=f"nb-{service}")
    try:
        start_all([proc])
        server.stop()
        time.sleep(1.0)  # it knows: reconnecting
        began = time.monotonic()
        rc = proc.stop(timeout=30)
        took = time.monotonic() - began
    finally:
        proc.kill()
        server.stop()
    assert rc == 0, proc.logs()
    assert "Traceback" not in proc.logs()
    assert took < 5, took
