"""``NatsServer.start`` on a port another server holds: tests run many servers at once
and a port chosen free may be taken before the server starts. A test once paused
"its" server and talked on to another test's (``test_kv_write`` in CI): the server on
the port is known by its name now."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferbus.shared.natsserver import NatsServer, server_name_at

pytestmark = pytest.mark.integration


def test_a_chosen_port_found_taken_is_given_up_for_another(tmp_path: Path) -> None:
    first = NatsServer(tmp_path / "first").start()
    second = NatsServer(tmp_path / "second")
    second.port = first.port  # chosen free, taken by the time it starts
    try:
        second.start()
        assert second.port != first.port
        assert server_name_at(second.host, second.port) == second.name
        assert server_name_at(first.host, first.port) == first.name
    finally:
        second.stop()
        first.stop()


def test_a_port_the_caller_gave_that_is_taken_is_a_clear_error(tmp_path: Path) -> None:
    first = NatsServer(tmp_path / "first").start()
    try:
        with pytest.raises(RuntimeError, match="nats-server exited"):
            NatsServer(tmp_path / "second", port=first.port).start()
    finally:
        first.stop()
