"""A worker that dies never leaves a client hanging (its streams move to another); a
graceful stop finishes its work or hands its long streams over."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest
from testkit.faults import sim_text
from testkit.procs import ServiceProcess, start_all
from testkit.simplatform import ready_workers, wait_for_status

from inferbus.client import RequestError
from inferbus.contracts import (
    STARTED,
    ReplyEvent,
    RequestFinished,
    RequestStarted,
    RequestSubmitted,
    SamplingParams,
    TokenChunk,
    WorkAssigned,
    work_subject,
)
from inferbus.shared.codec import decode, encode

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]


def _workers(nats_url, log_dir, model, *args):
    return start_all(
        [
            ServiceProcess(
                "worker",
                nats_url,
                log_dir,
                "--model",
                model,
                "--heartbeat-interval-s",
                "0.3",
                *args,
                name=f"{model}-{i}",
            )
            for i in range(2)
        ]
    )


def _owner(workers, worker_id: str) -> ServiceProcess:
    return next(w for w in workers if worker_id.startswith(w.name + "."))


async def _streaming(client, workers, model: str, prompt: str, chunks: int = 1, **sampling):
    """A stream of ``prompt`` with ``chunks`` chunks read, its start event and the
    worker process serving it."""
    started = await client.nc.subscribe(STARTED)
    stream = client.stream(model, prompt, **sampling)
    for _ in range(chunks):
        await stream.__anext__()
    ev = decode((await started.next_msg(timeout=5)).data, RequestStarted)
    await started.unsubscribe()
    assert ev.request_id == stream.request_id
    return stream, ev, _owner(workers, ev.worker_id)


async def test_killed_mid_stream_continues_on_the_other_worker(nats_url, log_dir, client):
    # issue 38: the stream moves to the other worker as a continuation; the client
    # reads the text an uninterrupted run gives, with no error and no gap
    workers = _workers(nats_url, log_dir, "fragile", "--sim-decode-s-per-step", "0.02")
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "fragile") == 2)
        reference = client.stream("fragile", "a long answer", max_tokens=150, seed=7)
        await client_collect(reference)
        stream, ev, owner = await _streaming(
            client, workers, "fragile", "a long answer", chunks=10, max_tokens=150, seed=7
        )
        assert ev.migratable
        owner.kill()
        killed_at = time.monotonic()
        gap = None
        async for _ in stream:
            gap = gap if gap is not None else time.monotonic() - killed_at
        outcome = stream.outcome
        assert outcome is not None and outcome.attempt == 2 and outcome.resumed
        assert outcome.worker_id != ev.worker_id
        assert stream.text == reference.text
        assert outcome.usage.completion_tokens == 150
        assert [c.seq for c in stream.chunks] == list(range(len(stream.chunks)))
        assert gap is not None and gap < 5.0  # worker timeout 1.5 s here, plus a tick
    finally:
        for w in workers:
            w.stop()


async def test_killed_mid_stream_that_cannot_move_ends_with_a_clear_error(
    nats_url, log_dir, client
):
    # stop strings are checked on text the new worker would not hold: it fails as before
    workers = _workers(nats_url, log_dir, "fragile3", "--sim-decode-s-per-step", "0.05")
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "fragile3") == 2)
        stream, ev, owner = await _streaming(
            client, workers, "fragile3", "a long answer", max_tokens=1000, stop=["@@"]
        )
        assert stream.chunks[0].seq == 0 and not ev.migratable
        owner.kill()
        killed_at = time.monotonic()
        with pytest.raises(RequestError) as exc:
            async for _ in stream:
                pass
        waited = time.monotonic() - killed_at
        assert exc.value.code == "worker_lost" and exc.value.event.retryable
        assert "stop strings" in exc.value.event.reason
        assert waited < 5.0  # worker timeout 1.5 s in this platform, plus a tick
    finally:
        for w in workers:
            w.stop()


async def test_a_worker_stopped_past_the_timeout_and_let_go_on_ends_nothing_twice(
    nats_url, log_dir, client
):
    """SIGSTOP past the heartbeat timeout: the scheduler ends the stream it cannot move
    ``worker_lost``; let go on (SIGCONT), the worker checks for the stop before it
    streams on or ends it, so its client hears one end (issue 42 item 7: it had heard
    ``worker_lost`` and then ``request.finished``)."""
    workers = _workers(nats_url, log_dir, "stalled", "--sim-decode-s-per-step", "0.05")
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "stalled") == 2)
        stream, ev, owner = await _streaming(
            client, workers, "stalled", "a long answer", max_tokens=60, stop=["@@"]
        )
        raw = await client.nc.subscribe(stream.request.reply_to)  # what reaches the client
        assert not ev.migratable
        assert owner.proc is not None
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(RequestError) as exc:
                async for _ in stream:
                    pass
            assert exc.value.code == "worker_lost"
        finally:
            owner.proc.send_signal(signal.SIGCONT)
        # 57 tokens were left at 0.05 s: long enough to have ended them, were it to
        await asyncio.sleep(4.0)
        ends = []
        while True:
            try:
                msg = await raw.next_msg(timeout=0.1)
            except Exception:
                break
            event = decode(msg.data, ReplyEvent)
            if not isinstance(event, TokenChunk):
                ends.append(type(event).__name__)
        assert ends == ["RequestFailed"], ends
        await wait_for_status(client.nc, lambda st: ready_workers(st, "stalled") == 2)
    finally:
        for w in workers:
            w.stop()


async def test_killed_before_streaming_is_reassigned(nats_url, log_dir, client):
    # prefill of 0.4 s per prompt token: the request sits in prefill long enough to kill
    workers = _workers(nats_url, log_dir, "fragile2", "--sim-prefill-s-per-token", "0.4")
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "fragile2") == 2)
        assigned = await client.nc.subscribe("ib.work.>")
        stream = client.stream("fragile2", "four token prompt", max_tokens=5)
        task = asyncio.create_task(client_collect(stream))
        work = decode((await assigned.next_msg(timeout=5)).data, WorkAssigned)
        assert work.attempt == 1
        _owner(workers, work.worker_id).kill()
        retry = decode((await assigned.next_msg(timeout=10)).data, WorkAssigned)
        assert retry.attempt == 2 and retry.worker_id != work.worker_id
        outcome = await asyncio.wait_for(task, 20)
        assert outcome.attempt == 2 and outcome.usage.completion_tokens == 5
    finally:
        for w in workers:
            w.stop()


async def client_collect(stream):
    async for _ in stream:
        pass
    return stream.outcome


async def test_sigterm_drains_in_flight_requests(nats_url, log_dir, client):
    workers = _workers(nats_url, log_dir, "drainable", "--sim-decode-s-per-step", "0.02")
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "drainable") == 2)
        streams = [client.stream("drainable", f"drain {i}", max_tokens=60) for i in range(4)]
        for s in streams:  # all four are streaming (60 tokens take ~1.2 s)
            await s.__anext__()
        tasks = [asyncio.create_task(client_collect(s)) for s in streams]
        for w in workers:
            w.proc.terminate()
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert all(o.usage.completion_tokens == 60 for o in outcomes)
        codes = [await asyncio.to_thread(w.proc.wait, 10) for w in workers]
        assert codes == [0, 0]
    finally:
        for w in workers:
            w.stop()


async def test_a_draining_worker_hands_its_long_streams_to_the_other(nats_url, log_dir, client):
    # issue 38: drain by migration. SIGTERM mid-stream: after --drain-handover-s the
    # stream goes on on the other worker, and the draining one exits at once instead
    # of holding the stream to its end (400 tokens at 20 ms: 8 s)
    workers = _workers(
        nats_url,
        log_dir,
        "handover",
        "--sim-decode-s-per-step",
        "0.02",
        "--drain-handover-s",
        "1",
    )
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "handover") == 2)
        prompt = "a long answer to hand over"
        stream, _, draining = await _streaming(
            client, workers, "handover", prompt, chunks=5, max_tokens=400
        )
        draining.proc.terminate()
        termed = time.monotonic()
        rest = asyncio.create_task(client_collect(stream))
        code = await asyncio.to_thread(draining.proc.wait, 10)
        assert code == 0 and time.monotonic() - termed < 5.0  # 1 s grace, a round trip
        await asyncio.wait_for(rest, 20)
        outcome = stream.outcome
        assert outcome is not None and outcome.resumed and outcome.attempt == 2
        assert stream.text == sim_text(prompt, 400) and outcome.usage.completion_tokens == 400
    finally:
        for w in workers:
            w.stop()


async def test_a_newer_attempt_given_back_to_the_same_worker_replaces_the_older(
    nats_url, log_dir, client
):
    # found by the fault suite under load: a worker taken for lost (silent 1.5 s) came
    # back, the scheduler gave it the request again as attempt 2 while attempt 1 still
    # ran there, and the worker dropped attempt 2 as a redelivery: the request hung
    (worker,) = start_all(
        [
            ServiceProcess(
                "worker",
                nats_url,
                log_dir,
                "--model",
                "comeback",
                "--sim-decode-s-per-step",
                "0.02",
                name="comeback-0",
            )
        ]
    )
    try:
        status = await wait_for_status(client.nc, lambda st: ready_workers(st, "comeback") == 1)
        (wid,) = [w for w, v in status["workers"].items() if "comeback" in v["models"]]
        rid = uuid.uuid4().hex
        reply = client.reply_subject(rid)
        replies = await client.nc.subscribe(reply)
        request = RequestSubmitted(
            request_id=rid,
            model="comeback",
            reply_to=reply,
            prompt="first run",
            sampling=SamplingParams(max_tokens=300),
        )
        for attempt in (1, 2):
            work = WorkAssigned(request=request, worker_id=wid, attempt=attempt)
            await client.js.publish(work_subject(wid), encode(work))
            if attempt == 1:  # streaming when attempt 2 comes
                first = decode((await replies.next_msg(timeout=10)).data, ReplyEvent)
                assert isinstance(first, TokenChunk) and first.attempt == 1
        ends = []
        while not ends:
            ev = decode((await replies.next_msg(timeout=20)).data, ReplyEvent)
            if not isinstance(ev, TokenChunk):
                ends.append(ev)
        (end,) = ends
        assert isinstance(end, RequestFinished) and end.attempt == 2, end
        assert end.usage.completion_tokens == 300
    finally:
        worker.stop()


async def test_a_stream_left_at_the_end_of_a_drain_moves_instead_of_failing(
    nats_url, log_dir, client
):
    # no handover (--drain-handover-s 0) and a 3 s drain: the stream still running at
    # its end stops without a word, and the "stopped" heartbeat moves it (it ended
    # worker_shutdown before, and its reader with it)
    workers = _workers(
        nats_url,
        log_dir,
        "drainend",
        "--sim-decode-s-per-step",
        "0.02",
        "--drain-handover-s",
        "0",
        "--drain-timeout-s",
        "3",
    )
    try:
        await wait_for_status(client.nc, lambda st: ready_workers(st, "drainend") == 2)
        prompt = "a long answer left at the end of a drain"
        stream, _, owner = await _streaming(client, workers, "drainend", prompt, max_tokens=400)
        owner.proc.terminate()
        await asyncio.wait_for(client_collect(stream), 30)
        outcome = stream.outcome
        assert outcome is not None and outcome.resumed and outcome.attempt == 2
        assert stream.text == sim_text(prompt, 400)
    finally:
        for w in workers:
            w.stop()
