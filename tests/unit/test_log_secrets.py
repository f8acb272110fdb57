"""Logs say no secret (issue 42, item 12): a malformed HTTP request with bare-LF line
endings was logged raw by aiohttp, its `Authorization: Bearer` key and body included,
into a 0644 log."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import stat

import pytest
import structlog
from aiohttp import web

from inferbus.shared import logs
from inferbus.shared.logs import redact
from inferbus.supervisor.processes import open_log

KEY = "sk-SECRET-KEY-123"
BODY = b'{"messages":[{"role":"user","content":"my SSN is 123-45-6789"}]}'


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """logs.configure changes the process's logging: put it back for the tests after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    server = logging.getLogger("aiohttp.server")
    filters = server.filters[:]
    yield
    root.handlers[:], server.filters[:] = handlers, filters
    root.setLevel(level)
    structlog.configure(**config)
    structlog.contextvars.clear_contextvars()


def test_bearer_tokens_and_api_key_values_are_redacted():
    assert redact(f"Authorization: Bearer {KEY}") == "Authorization: Bearer [redacted]"
    assert redact('{"api_key": "abcdefgh123"}') == '{"api_key": "[redacted]"}'
    assert redact("x-api-key=ib-agent-block") == "x-api-key=[redacted]"
    assert redact("the keys file lists 3 keys") == "the keys file lists 3 keys"


async def test_a_request_aiohttp_cannot_parse_is_logged_without_its_bytes(capfd):
    logs.configure("gateway")
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            head = f"POST /v1/chat/completions HTTP/1.1\nHost: x\nAuthorization: Bearer {KEY}\n"
            s.sendall(head.encode() + b"Content-Length: %d\n\n" % len(BODY) + BODY)
            s.recv(300)

    try:
        await asyncio.to_thread(send)
        await asyncio.sleep(0.2)
    finally:
        await runner.cleanup()
    lines = [json.loads(x) for x in capfd.readouterr().err.splitlines() if x.startswith("{")]
    bad = [x for x in lines if x.get("logger") == "aiohttp.server"]
    assert bad and "BadStatusLine (400)" in bad[0]["event"]
    text = json.dumps(lines)
    assert KEY not in text and "123-45-6789" not in text


def test_a_structlog_line_with_a_key_in_it_is_redacted(capfd):
    logs.configure("gateway")
    logs.get("t").warning("refused", header=f"Bearer {KEY}")
    logging.getLogger("other").warning("saw Authorization: Bearer %s", KEY)
    err = capfd.readouterr().err
    assert KEY not in err and err.count("[redacted]") == 2


def test_process_logs_are_their_owners_only(tmp_path):
    old = tmp_path / "old.log"
    old.write_text("from before\n")
    old.chmod(0o644)
    for path in (tmp_path / "logs" / "gateway.log", old):
        with open_log(path) as f:
            f.write(b"x\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert old.read_text() == "from before\nx\n"  # appended, not truncated


def test_a_process_log_past_its_bound_moves_aside_and_starts_again(tmp_path):
    """Issue 42 item 12: process logs were never rotated."""
    import stat

    from inferbus.supervisor.processes import open_log, rotate_log

    path = tmp_path / "worker-0.log"
    log = open_log(path)  # as the supervisor hands it to its process
    log.write(b"x" * 3000)
    log.flush()
    assert not rotate_log(path, 4096)
    log.write(b"y" * 2000)
    log.flush()
    assert rotate_log(path, 4096)
    kept = tmp_path / "worker-0.log.1"
    assert kept.read_bytes() == b"x" * 3000 + b"y" * 2000
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    log.write(b"after")  # the process writes on, from the start of the emptied file
    log.flush()
    assert path.read_bytes() == b"after"
    log.close()
