"""Undecodable events go to a dead-letter subject with the reason; services keep running."""

from __future__ import annotations

import pytest
from testkit.simplatform import MODEL

from inferbus.client import RequestError
from inferbus.contracts import (
    ACCEPTED,
    SUBMIT,
    DeadLetter,
    RequestFailed,
    dead_letter_subject,
)
from inferbus.shared.codec import decode

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]


async def _dead_letter(sub, subject: str) -> DeadLetter:
    while True:
        letter = decode((await sub.next_msg(timeout=10)).data, DeadLetter)
        if letter.subject == subject:
            return letter


async def test_undecodable_request_is_dead_lettered_and_the_sanitizer_goes_on(client):
    dlq = await client.nc.subscribe(dead_letter_subject("sanitizer"))
    await client.js.publish(SUBMIT, b"\x00 this is not json")
    letter = await _dead_letter(dlq, SUBMIT)
    assert "undecodable RequestSubmitted" in letter.reason
    assert letter.payload == b"\x00 this is not json"
    assert (await client.generate(MODEL, "still alive?", max_tokens=3)).outcome is not None


async def test_request_missing_fields_gets_a_clear_error(client):
    inbox = client.nc.new_inbox()
    sub = await client.nc.subscribe(inbox)
    await client.js.publish(
        SUBMIT,
        b'{"type": "request.submitted", "request_id": "r-bad",'
        b' "reply_to": "' + inbox.encode() + b'"}',
    )
    failed = decode((await sub.next_msg(timeout=10)).data, RequestFailed)
    assert failed.code == "invalid_request" and "model" in failed.reason


async def test_json_nested_too_deeply_gets_an_answer_and_a_dead_letter(client):
    """Issue 42: 100,000 nested arrays in a template variable raised RecursionError in
    the sanitizer on each of five deliveries, then the request was dropped: no answer,
    no dead letter."""
    inbox = client.nc.new_inbox()
    sub = await client.nc.subscribe(inbox)
    dlq = await client.nc.subscribe(dead_letter_subject("sanitizer"))
    depth = 100_000
    body = (
        b'{"type": "request.submitted", "request_id": "r-deep", "model": "m", '
        b'"reply_to": "' + inbox.encode() + b'", "prompt": "hi", '
        b'"chat_template": {"kwargs": {"x": ' + b"[" * depth + b"]" * depth + b"}}}"
    )
    await client.js.publish(SUBMIT, body)
    failed = decode((await sub.next_msg(timeout=10)).data, RequestFailed)
    assert failed.code == "invalid_request" and "nested too deeply" in failed.reason
    letter = await _dead_letter(dlq, SUBMIT)
    assert "nested too deeply" in letter.reason
    assert (await client.generate(MODEL, "still alive?", max_tokens=3)).outcome is not None


async def test_bad_sampling_is_rejected_by_the_sanitizer(client):
    with pytest.raises(RequestError) as exc:
        await client.generate(MODEL, "hi", max_tokens=0)
    assert exc.value.code == "invalid_request" and "max_tokens" in str(exc.value)


async def test_undecodable_accepted_event_reaches_the_scheduler_dead_letters(client):
    dlq = await client.nc.subscribe(dead_letter_subject("scheduler"))
    await client.js.publish(ACCEPTED, b'{"type": "request.accepted", "request": 42}')
    letter = await _dead_letter(dlq, ACCEPTED)
    assert "RequestAccepted" in letter.reason
    assert (await client.generate(MODEL, "scheduler alive?", max_tokens=3)).outcome is not None


async def test_undecodable_assignment_reaches_the_worker_dead_letters(client, platform):
    import json
    import urllib.request

    with urllib.request.urlopen(f"{platform['worker'].base}/readyz") as r:
        assert json.loads(r.read())["ready"]
    status = json.loads((await client.nc.request("ib.svc.worker.status", b"", timeout=5)).data)
    worker_id = status["worker_id"]
    dlq = await client.nc.subscribe(dead_letter_subject("worker"))
    subject = f"ib.work.{worker_id}"
    await client.js.publish(subject, b"garbage")
    letter = await _dead_letter(dlq, subject)
    assert "WorkAssigned" in letter.reason
    model = status["models"][0]  # whichever worker answered must still serve
    assert (await client.generate(model, "worker alive?", max_tokens=3)).outcome is not None


async def test_request_with_an_unusable_reply_subject_is_dead_lettered(client):
    from inferbus.contracts import RequestSubmitted
    from inferbus.shared.codec import encode

    dlq = await client.nc.subscribe(dead_letter_subject("sanitizer"))
    bad = RequestSubmitted(
        request_id="r-no-reply", model=MODEL, reply_to="has spaces in it", prompt="hi"
    )
    await client.js.publish(SUBMIT, encode(bad))
    letter = await _dead_letter(dlq, SUBMIT)
    assert "reply_to" in letter.reason
    assert (await client.generate(MODEL, "sanitizer alive?", max_tokens=3)).outcome is not None
