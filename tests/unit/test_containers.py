"""The suite's NATS where a Docker engine runs but cannot pull images (found when a
Docker engine was installed on this offline machine: testcontainers' ryuk image gave
``404 ... images/testcontainers/ryuk:0.8.1/json`` and the suite ended in 1 error
before any test ran): it falls back to the bundled nats-server binary."""

from __future__ import annotations

import pytest
from testkit import containers


class _Unpullable:
    stopped = False

    def __init__(self, image: str, jetstream: bool = False) -> None:
        self.image = image

    def start(self):
        raise RuntimeError(
            "404 Client Error for http+docker://localhost/v1.41/images/testcontainers/"
            "ryuk:0.8.1/json: Not Found"
        )

    def stop(self) -> None:
        _Unpullable.stopped = True


def test_an_engine_that_cannot_pull_the_images_falls_back_to_the_binary(monkeypatch):
    for module in ("testcontainers.community.nats", "testcontainers.nats"):
        nats = pytest.importorskip(module)
        monkeypatch.setattr(nats, "NatsContainer", _Unpullable)
    with pytest.warns(UserWarning, match="ryuk:0.8.1.*using the nats-server binary"):
        assert containers.nats_container(available=lambda: True) is None
    assert _Unpullable.stopped  # whatever it half-started is cleaned up


def test_no_engine_means_no_container():
    assert containers.nats_container(available=lambda: False) is None
