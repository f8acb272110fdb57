"""The failure-code table in the contracts: its documentation, its users, its wire form."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest

from inferbus.contracts import (
    FAILURES,
    FailureCode,
    ReplyEvent,
    RequestCancelled,
    RequestFailed,
    RequestRejected,
    RequestSubmitted,
    failure,
    http_status,
    is_retryable,
    request_failed,
)
from inferbus.services.gateway.errors import error_for
from inferbus.services.sanitizer.core import InputLimits, check
from inferbus.services.scheduler.core import Fail, SchedulerCore, SchedulerPolicy

ROOT = Path(__file__).resolve().parents[2]


def documented() -> dict[str, tuple[int, bool]]:
    """docs/nats-api.md's "Failure codes" table: code → (HTTP status, retryable)."""
    text = (ROOT / "docs" / "nats-api.md").read_text()
    section = text.split("\n## Failure codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert set(header) >= {"code", "HTTP", "retryable"}, header
    out: dict[str, tuple[int, bool]] = {}
    for line in rows[2:]:  # past the header and its |---| line
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        code = re.fullmatch(r"`([a-z_]+)`", cells["code"])
        assert code, f"a code in backticks: {line}"
        assert cells["retryable"] in ("yes", "no"), line
        assert code.group(1) not in out, f"documented twice: {code.group(1)}"
        out[code.group(1)] = (int(cells["HTTP"]), cells["retryable"] == "yes")
    return out


def test_the_docs_table_lists_every_code_with_the_contracts_status_and_retryable():
    docs = documented()
    table = {str(c): (f.http_status, f.retryable) for c, f in FAILURES.items()}
    assert docs == table


def test_every_code_has_a_row_and_a_meaning():
    assert set(FAILURES) == set(FailureCode)
    assert all(f.meaning and "\n" not in f.meaning for f in FAILURES.values())
    assert all(c.value == c.value.lower() and " " not in c.value for c in FailureCode)


def test_lookups_take_plain_strings_and_default_for_unknown_codes():
    assert failure("queue_full") is FAILURES[FailureCode.QUEUE_FULL]
    assert http_status("queue_full") == 429 and is_retryable("worker_lost")
    assert failure("from_a_later_version") is None
    assert http_status("from_a_later_version") == 500
    assert http_status("from_a_later_version", 400) == 400
    assert not is_retryable("from_a_later_version")


def test_the_wire_field_stays_a_plain_string():
    # a new code must not break an older reader: the field is str, not an enum
    assert msgspec.structs.fields(RequestFailed)[1].type is str
    ev = request_failed("r1", FailureCode.WORKER_SHUTDOWN, "stopping")
    assert ev.retryable  # from the table
    wire = msgspec.json.encode(ev)
    assert b'"code":"worker_shutdown"' in wire
    back = msgspec.json.decode(wire, type=ReplyEvent)
    assert back == ev and type(back.code) is str
    unknown = msgspec.json.decode(
        b'{"type":"request.failed","request_id":"r","code":"new_code","reason":"x"}',
        type=ReplyEvent,
    )
    assert isinstance(unknown, RequestFailed) and unknown.code == "new_code"


@pytest.mark.parametrize("code", list(FailureCode))
def test_retryable_on_request_failed_follows_the_table(code):
    assert request_failed("r", code, "x").retryable is FAILURES[code].retryable
    assert request_failed("r", str(code), "x").retryable is FAILURES[code].retryable


# -- the gateway's statuses are the table's ------------------------------------------------


@pytest.mark.parametrize("code", [c for c in FailureCode if c != FailureCode.CANCELLED])
def test_the_gateway_answers_a_failure_with_the_tables_status(code):
    err = error_for(RequestFailed(request_id="r", code=code, reason="x", retryable=False))
    assert err.status == FAILURES[code].http_status and err.code == code
    assert err.body()["error"]["code"] == code.value


def test_the_gateway_maps_unknown_codes_rejections_and_cancels():
    err = error_for(RequestFailed(request_id="r", code="new_code", reason="x", retryable=True))
    assert (err.status, err.type, err.retry_after) == (500, "server_error", 1.0)
    err = error_for(RequestFailed(request_id="r", code="queue_full", reason="x", retryable=True))
    assert (err.status, err.type) == (429, "rate_limit_error")
    err = error_for(RequestRejected(request_id="r", code="input_blocked", reason="x", param="p"))
    assert (err.status, err.param, err.type) == (400, "p", "invalid_request_error")
    err = error_for(RequestRejected(request_id="r", code="new_rule", reason="x"))
    assert err.status == 400  # a refusal is the request's own fault
    err = error_for(RequestCancelled(request_id="r"))
    assert (err.status, err.type, err.code) == (499, "cancelled", "cancelled")


# -- producers ---------------------------------------------------------------------------


def test_the_scheduler_sets_retryable_from_the_table():
    core = SchedulerCore(SchedulerPolicy(max_queue_per_model=0, queue_timeout_s=1.0))
    r = RequestSubmitted(request_id="r", model="m", reply_to="x", prompt="p")
    [fail] = core.on_accepted(r, 0.0)
    assert isinstance(fail, Fail) and (fail.code, fail.retryable) == ("queue_full", True)
    assert Fail.of(r, FailureCode.DEADLINE_EXCEEDED, "x").retryable is False


def test_the_sanitizer_rejects_with_contract_codes():
    limits = InputLimits(max_prompt_chars=3)
    r = RequestSubmitted(request_id="r", model="m", reply_to="ib.reply.x", prompt="long")
    assert check(r, limits).code == FailureCode.PROMPT_TOO_LONG
    r = RequestSubmitted(request_id="r", model="", reply_to="ib.reply.x", prompt="p")
    assert check(r, limits).code == FailureCode.INVALID_REQUEST


def test_services_write_failure_codes_through_the_enum():
    """No ``code="worker_lost"`` (nor ``EngineError("...")``, ``reject("...")``) where
    a ``FailureCode`` member belongs."""
    codes = {c.value for c in FailureCode}
    found = []
    for folder in ("services", "inferbus", "contracts", "shared"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if not isinstance(node, ast.Call):
                    continue
                args = [k.value for k in node.keywords if k.arg == "code"]
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("EngineError", "reject") and node.args:
                    args.append(node.args[0])
                found += [
                    f"{rel}:{node.lineno}: {a.value!r}"
                    for a in args
                    if isinstance(a, ast.Constant) and a.value in codes
                ]
    assert not found, found
