"""The fault suite on the real platform under load (tests/testkit/faults.py): kill -9
each service in turn (and stop a worker with SIGSTOP), then the NATS server. Every
request sent ends once, served or with a retryable error; none hangs, none is served
twice, and the platform serves again after each kill; a lost worker's streams move
to the other one, so none of its requests fails. `python bench/faults.py` runs the
same with bigger counts."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from testkit.faults import (
    FAULTS,
    FaultResult,
    Platform,
    http_one,
    nats_one,
    run_fault,
    statuses,
    table,
)

from inferbus.client import Client

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def stranded_nothing(p: Platform, result: FaultResult) -> None:
    """Every request sent ended once, served or retryable; served again after the kill."""
    print("\n" + table([result]))
    result.check(p)
    assert result.count("ok") > len(result.outcomes) / 2


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):
    p = Platform(tmp_path_factory.mktemp("faults") / "state")
    yield p
    p.stop()


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_killed_process_strands_no_request(platform: Platform, fault: str):
    result = await run_fault(platform, fault, load_s=7.0)
    stranded_nothing(platform, result)
    if fault.startswith("worker"):
        # its streams moved to the other worker (issue 38): every request served in
        # full, each NATS one with the text of an uninterrupted run
        retried = [o for o in result.outcomes if o.kind == "retryable"]
        assert not retried, retried
        assert result.row()["moved"], "no stream was moved"


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory):
    """Two gateways on one port, two sanitizers, two scheduler instances sharing eight
    partitions of the fleet (issue 40)."""
    p = Platform(
        tmp_path_factory.mktemp("faults-scaled") / "state",
        extra=("--gateways", "2", "--sanitizers", "2", "--schedulers", "2"),
    )
    yield p
    p.stop()


async def test_several_gateways_sanitizers_and_schedulers_share_the_load(scaled: Platform):
    client = await Client.connect(scaled.nats_url, "scaled-load", creds=scaled.tenant)
    # a fresh connection a request: the kernel spreads connections over the gateways
    http = aiohttp.ClientSession(scaled.http, connector=aiohttp.TCPConnector(force_close=True))
    try:
        outcomes = await asyncio.gather(
            *(http_one(http, 8, 30.0) for _ in range(40)),
            *(nats_one(client, 8, 30.0) for _ in range(40)),
        )
    finally:
        await http.close()
        await client.close()
    assert [o.kind for o in outcomes] == ["ok"] * 80, [o for o in outcomes if o.kind != "ok"]
    gateways = await statuses(scaled, "gateway")
    sanitizers = await statuses(scaled, "sanitizer")
    schedulers = await statuses(scaled, "scheduler")
    assert sorted(gateways) == ["gateway", "gateway-1"]
    assert all(g["submitted"] > 0 for g in gateways.values()), gateways
    assert sum(g["submitted"] for g in gateways.values()) >= 40
    assert all(s["accepted"] > 0 for s in sanitizers.values()), sanitizers
    held = sorted(p for s in schedulers.values() for p in s["partitions"])
    assert held == list(range(8)) and all(s["partitions"] for s in schedulers.values())


@pytest.mark.parametrize("fault", ("scheduler-1", "gateway-1", "sanitizer-1"))
async def test_a_killed_instance_of_several_strands_no_request(scaled: Platform, fault: str):
    """kill -9 of one of two instances under load: the others serve on, nothing lost
    or served twice; a scheduler instance's partitions are taken within 5 s (the
    issue's bound)."""
    result = await run_fault(scaled, fault, load_s=7.0)
    stranded_nothing(scaled, result)
    if fault.startswith("scheduler"):
        assert result.takeover_s is not None and result.takeover_s < 5.0, result.row()


async def test_a_platform_killed_whole_and_started_again_ends_each_request_once(
    platform: Platform,
):
    """`inferbus up` killed with SIGKILL (its children with it) and started again on
    the same state: the in-flight requests' clients were told ``request.finished`` and
    then ``worker_lost`` (the workers' end went out before its record, which the
    restart lost, and the new scheduler decided it again): 16 of 704 in the bench.
    Now an end is recorded first and told only by whoever recorded it first."""
    result = await run_fault(platform, "up", load_s=7.0)
    print("\n" + table([result]))
    result.check(platform, "the restart")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    p = Platform(tmp_path_factory.mktemp("cluster") / "state", nats_cluster=3)
    yield p
    p.stop()


@pytest.mark.parametrize("node", ["nats-1", "nats-0"])
async def test_a_lost_node_of_a_three_node_nats_loses_nothing(cluster: Platform, node: str):
    """`inferbus up --nats-cluster 3`: streams keep three copies; a node killed under load
    strands nothing, runs nothing twice, and the platform serves again."""
    result = await run_fault(cluster, node, load_s=16.0)
    print("\n" + table([result]))
    result.check(cluster)
