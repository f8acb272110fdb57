"""A replicated stream on a cluster that has just formed: JetStream refuses its placement
("no suitable peers for placement, peer offline", err 10005) until its new leader has
heard from every node. The provisioner asks again instead of failing the start (CI's
k8s NATS cluster test once failed on the first refusal), and says plainly when the
nodes never come.

JetStream's answers are played by a fake here, since a real cluster gives that refusal
only by a race; the cluster itself is tested in test_k8s_nats_cluster."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NotFoundError

from inferbus.contracts import STREAMS
from inferbus.shared.streams import NoPeersError, ensure_streams

NO_PEERS = APIError(
    code=400, err_code=10005, description="no suitable peers for placement, peer offline"
)


class Forming:
    """A JetStream that has no stream yet and refuses the first ``refusals`` placements."""

    def __init__(self, refusals: int, error: APIError = NO_PEERS) -> None:
        self.refusals = refusals
        self.error = error
        self.made: dict[str, StreamConfig] = {}
        self.asked = 0

    async def stream_info(self, name: str) -> object:
        if name not in self.made:
            raise NotFoundError(code=404, err_code=10059, description="stream not found")
        return _Info(self.made[name])

    async def add_stream(self, config: StreamConfig) -> object:
        return await self._place(config)

    async def update_stream(self, config: StreamConfig) -> object:
        return await self._place(config)

    async def _place(self, config: StreamConfig) -> object:
        self.asked += 1
        if self.refusals:
            self.refusals -= 1
            raise self.error
        assert config.name is not None
        self.made[config.name] = config
        return _Info(config)


class _Info:
    def __init__(self, config: StreamConfig) -> None:
        self.config = config


@pytest.mark.parametrize(
    "refusal",
    [
        NO_PEERS,
        APIError(code=503, err_code=10008, description="JetStream system temporarily unavailable"),
    ],
    ids=["no-peers", "unavailable"],
)
def test_streams_are_made_once_the_cluster_places_them(refusal):
    js = Forming(refusals=3, error=refusal)
    asyncio.run(ensure_streams(js, 3, placement_patience_s=30))  # type: ignore[arg-type]
    assert set(js.made) == {spec.name for spec in STREAMS}
    assert {c.num_replicas for c in js.made.values()} == {3}
    assert js.asked == 3 + len(STREAMS)  # the refusals, then each made once


def test_nodes_that_never_come_are_named_in_the_error():
    js = Forming(refusals=10_000)
    with pytest.raises(NoPeersError, match=r"no suitable peers.*node for each replica\?"):
        asyncio.run(ensure_streams(js, 3, placement_patience_s=0.6))  # type: ignore[arg-type]
    assert js.made == {}


def test_other_refusals_are_not_waited_on():
    js = Forming(refusals=1, error=APIError(code=400, err_code=10074, description="replicas"))
    with pytest.raises(APIError, match="replicas") as refused:
        asyncio.run(ensure_streams(js, 3, placement_patience_s=30))  # type: ignore[arg-type]
    assert refused.value.err_code == 10074  # JetStream's own refusal, not a lookup's
    assert js.asked == 1


def test_a_stream_another_service_made_meanwhile_is_taken():
    js = Forming(refusals=1, error=APIError(code=400, err_code=10058, description="in use"))
    original = js._place

    async def made_by_another(config: StreamConfig) -> object:
        assert config.name is not None
        js.made.setdefault(config.name, config)  # the other service's, just now
        return await original(config)

    js.add_stream = made_by_another  # type: ignore[method-assign]
    asyncio.run(ensure_streams(js, update=False, placement_patience_s=30))  # type: ignore[arg-type]
    assert set(js.made) == {spec.name for spec in STREAMS}
