"""A worker on its own: assignments published straight to it (no gateway, no scheduler
watching the clock) end at their deadline, and one delivered twice is served once."""

from __future__ import annotations

import asyncio
import time

import pytest
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.contracts import (
    HEARTBEATS,
    FailureCode,
    RequestFailed,
    RequestFinished,
    RequestSubmitted,
    Resume,
    SamplingParams,
    TokenChunk,
    WorkAssigned,
    WorkerHeartbeat,
    work_subject,
)
from inferbus.shared.codec import decode, encode

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]


async def worker_for(nc, model: str) -> str:
    found: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_beat(msg) -> None:
        hb = decode(msg.data, WorkerHeartbeat)
        if model in hb.models and hb.state == "ready" and not found.done():
            found.set_result(hb.worker_id)

    sub = await nc.subscribe(HEARTBEATS, cb=on_beat)
    try:
        return await asyncio.wait_for(found, 10)
    finally:
        await sub.unsubscribe()


class Replies:
    def __init__(self) -> None:
        self.events: list[object] = []
        self.ended = asyncio.Event()

    async def on_msg(self, msg) -> None:
        ev = decode(msg.data, TokenChunk | RequestFailed | RequestFinished)
        self.events.append(ev)
        if not isinstance(ev, TokenChunk):
            self.ended.set()

    @property
    def ends(self) -> list[object]:
        return [e for e in self.events if not isinstance(e, TokenChunk)]


def assigned(
    rid: str, model: str, worker_id: str, reply_to: str, *, max_tokens: int, deadline: float = 0.0
) -> WorkAssigned:
    request = RequestSubmitted(
        request_id=rid,
        model=model,
        reply_to=reply_to,
        prompt="count slowly",
        sampling=SamplingParams(max_tokens=max_tokens),
        deadline=deadline,
    )
    return WorkAssigned(request=request, worker_id=worker_id, attempt=1)


async def test_the_worker_ends_a_request_at_its_deadline_on_its_own(client):
    # the slow sim worker takes 0.02 s a token: 2000 tokens would run 40 s
    worker_id = await worker_for(client.nc, SLOW_MODEL)
    replies = Replies()
    reply_to = client.nc.new_inbox()
    sub = await client.nc.subscribe(reply_to, cb=replies.on_msg)
    began = time.time()
    work = assigned(
        "deadline-1", SLOW_MODEL, worker_id, reply_to, max_tokens=2000, deadline=began + 2.0
    )
    await client.js.publish(work_subject(worker_id), encode(work))
    await asyncio.wait_for(replies.ended.wait(), 10)
    ended = time.time()
    await asyncio.sleep(0.3)  # nothing follows the end
    await sub.unsubscribe()
    assert 1.9 < ended - began < 6.0  # bounds a loaded machine keeps: far under 40 s
    [end] = replies.ends
    assert isinstance(end, RequestFailed) and end.code == FailureCode.DEADLINE_EXCEEDED
    assert end.attempt == 1
    assert any(isinstance(e, TokenChunk) for e in replies.events)  # it had been streaming


@pytest.mark.parametrize(
    ("model", "max_tokens", "again"),
    [(SLOW_MODEL, 2000, "while it runs"), (MODEL, 4, "after it ended")],
)
async def test_an_assignment_delivered_twice_is_served_once(client, model, max_tokens, again):
    # delivered again: its ack was lost (a NATS node went away) or JetStream resent it
    worker_id = await worker_for(client.nc, model)
    replies = Replies()
    reply_to = client.nc.new_inbox()
    sub = await client.nc.subscribe(reply_to, cb=replies.on_msg)
    work = assigned(
        f"twice-{model}",
        model,
        worker_id,
        reply_to,
        max_tokens=max_tokens,
        deadline=time.time() + 1.0,
    )
    await client.js.publish(work_subject(worker_id), encode(work))
    if again == "after it ended":
        await asyncio.wait_for(replies.ended.wait(), 10)
    await client.js.publish(work_subject(worker_id), encode(work))
    await asyncio.wait_for(replies.ended.wait(), 10)
    await asyncio.sleep(1.5)  # a second run would have streamed and ended by now
    await sub.unsubscribe()
    assert len(replies.ends) == 1, replies.ends
    seqs = [e.seq for e in replies.events if isinstance(e, TokenChunk)]
    assert seqs and seqs == list(range(len(seqs)))  # one stream, not two interleaved


async def test_a_filtered_end_is_backed_up_only_when_the_filter_did_not_pass_it_on(client):
    """The end of a filtered stream goes to the sanitizer as a request (issue 42 item
    6): answered, the client hears nothing more (an answer lost on the way is asked
    for again); unanswered (a sanitizer that lost the stream) after
    ``filter_backup_s``, or with no sanitizer listening at once, the client hears
    ``stream_interrupted`` from the worker itself."""
    nc = client.nc
    worker_id = await worker_for(nc, MODEL)
    cases = {
        "answers": Replies(),
        "loses-an-answer": Replies(),
        "answers-slowly": Replies(),
        "swallows": Replies(),
        "absent": Replies(),
    }
    late: set[asyncio.Task] = set()
    asked: dict[str, int] = {}

    async def filter_answers(msg) -> None:
        client_subject = msg.subject.split(".", 3)[3]
        await nc.publish(client_subject, msg.data)  # passed on as a sanitizer does
        ev = decode(msg.data, TokenChunk | RequestFailed | RequestFinished)
        if not isinstance(ev, TokenChunk) and msg.reply:
            await nc.publish(msg.reply, b"")

    async def filter_loses_its_first_answer(msg) -> None:
        # a bus node killed between the sanitizer and the worker (CI, the fault suite):
        # the end went on, the answer never came back; asked again, the sanitizer
        # answers without passing it on twice
        ev = decode(msg.data, TokenChunk | RequestFailed | RequestFinished)
        if isinstance(ev, TokenChunk):
            await nc.publish(msg.subject.split(".", 3)[3], msg.data)
            return
        asked[ev.request_id] = asked.get(ev.request_id, 0) + 1
        if asked[ev.request_id] == 1:
            await nc.publish(msg.subject.split(".", 3)[3], msg.data)
        elif msg.reply:
            await nc.publish(msg.reply, b"")

    async def filter_answers_slowly(msg) -> None:
        # a busy sanitizer answers each asking 3.5 s late: past a third of
        # filter_backup_s (5 s), so a worker that gave up on its first asking would
        # have sent its backup after the real end
        ev = decode(msg.data, TokenChunk | RequestFailed | RequestFinished)
        if isinstance(ev, TokenChunk) or ev.request_id not in asked:
            await nc.publish(msg.subject.split(".", 3)[3], msg.data)  # the end once
        if not isinstance(ev, TokenChunk) and msg.reply:
            asked[ev.request_id] = asked.get(ev.request_id, 0) + 1

            async def answer(reply: str) -> None:
                await asyncio.sleep(3.5)
                await nc.publish(reply, b"")

            late.add(asyncio.ensure_future(answer(msg.reply)))

    async def filter_swallows_the_end(msg) -> None:
        ev = decode(msg.data, TokenChunk | RequestFailed | RequestFinished)
        if isinstance(ev, TokenChunk):
            await nc.publish(msg.subject.split(".", 3)[3], msg.data)

    subs = []
    began = time.monotonic()
    for case, replies in cases.items():
        inbox = nc.new_inbox()
        subs.append(await nc.subscribe(inbox, cb=replies.on_msg))
        via = f"ib.filter.test-{case}.{inbox}"
        if case != "absent":
            cb = {
                "answers": filter_answers,
                "loses-an-answer": filter_loses_its_first_answer,
                "answers-slowly": filter_answers_slowly,
                "swallows": filter_swallows_the_end,
            }[case]
            subs.append(await nc.subscribe(f"ib.filter.test-{case}.>", cb=cb))
        work = assigned(f"filtered-{case}-{began}", MODEL, worker_id, via, max_tokens=4)
        work.request.client_reply_to = inbox
        await client.js.publish(work_subject(worker_id), encode(work))
    await asyncio.wait_for(cases["absent"].ended.wait(), 10)
    # no one listens: told within about a second, well before the 5 s backup
    assert time.monotonic() - began < 4.5
    await asyncio.wait_for(cases["swallows"].ended.wait(), 10)
    await asyncio.sleep(1.0)
    for sub in subs:
        await sub.unsubscribe()
    await asyncio.gather(*late)
    for case in ("answers", "loses-an-answer", "answers-slowly"):
        [finished] = cases[case].ends
        assert isinstance(finished, RequestFinished), case
    # a lost answer asked for again; the slow one asked at 0, 1/3 and 2/3 of
    # filter_backup_s, its first answer taken at 3.5 s (a late wake asks once more,
    # and a loaded machine may ask the slow one twice before that answer)
    assert len(asked) == 2 and min(asked.values()) >= 2, asked
    for case in ("swallows", "absent"):
        [backup] = cases[case].ends
        assert isinstance(backup, RequestFailed) and backup.code == "stream_interrupted", case


async def test_a_continuation_with_only_its_end_left_names_the_model_that_served(client):
    # found in CI (a canary rolled back on the real engine): a stream lost after its
    # last chunk was ended by the next worker with an empty served_model, which a
    # rollout reads to tell versions apart
    worker_id = await worker_for(client.nc, MODEL)
    replies = Replies()
    reply_to = client.nc.new_inbox()
    sub = await client.nc.subscribe(reply_to, cb=replies.on_msg)
    work = assigned("only-end", MODEL, worker_id, reply_to, max_tokens=3)
    last = TokenChunk(request_id="only-end", seq=2, text="c", token_ids=[7])
    work.attempt = 2
    work.resume = Resume(
        from_attempt=1, output_ids=[5, 6, 7], next_seq=3, last_chunk=last, finish_reason="length"
    )
    await client.js.publish(work_subject(worker_id), encode(work))
    await asyncio.wait_for(replies.ended.wait(), 10)
    await sub.unsubscribe()
    (end,) = replies.ends
    assert isinstance(end, RequestFinished) and end.finish_reason == "length"
    assert end.served_model.startswith(MODEL), end


async def test_the_heartbeat_lists_an_end_recorded_until_it_is_sent(client):
    """From its assignment until its end is sent, a request is in every heartbeat of
    its worker, running (``inflight``) or recorded as ended and not yet sent
    (``telling``): a worker lost in between has the scheduler send the end for it.
    Here the filter never answers, so the end is being sent until the worker's
    backup, ``filter_backup_s`` (5 s) later."""
    nc = client.nc
    worker_id = await worker_for(nc, MODEL)
    rid = f"telling-{time.monotonic()}"
    beats: list[tuple[float, set[str], set[str]]] = []

    async def on_beat(msg) -> None:
        hb = decode(msg.data, WorkerHeartbeat)
        if hb.worker_id == worker_id:
            beats.append((time.monotonic(), set(hb.inflight), set(hb.telling)))

    async def filter_swallows_the_end(msg) -> None:
        if isinstance(decode(msg.data, TokenChunk | RequestFailed | RequestFinished), TokenChunk):
            await nc.publish(msg.subject.split(".", 3)[3], msg.data)

    replies = Replies()
    inbox = nc.new_inbox()
    subs = [
        await nc.subscribe(HEARTBEATS, cb=on_beat),
        await nc.subscribe(inbox, cb=replies.on_msg),
        await nc.subscribe("ib.filter.test-telling.>", cb=filter_swallows_the_end),
    ]
    work = assigned(rid, MODEL, worker_id, f"ib.filter.test-telling.{inbox}", max_tokens=4)
    work.request.client_reply_to = inbox
    await client.js.publish(work_subject(worker_id), encode(work))
    await asyncio.wait_for(replies.ended.wait(), 15)
    ended_at = time.monotonic()
    await asyncio.sleep(2.5)  # heartbeats sent after the end
    for sub in subs:
        await sub.unsubscribe()
    [backup] = replies.ends
    assert isinstance(backup, RequestFailed) and backup.code == "stream_interrupted"
    listed = [i for i, (_, running, telling) in enumerate(beats) if rid in running | telling]
    assert listed, beats
    during = beats[listed[0] : listed[-1] + 1]
    assert all(rid in running | telling for _, running, telling in during), during
    assert any(rid in telling for _, _, telling in during), during  # the 5 s wait
    assert listed[-1] < len(beats) - 1  # then dropped, once sent
    assert all(rid not in running | telling for t, running, telling in beats if t > ended_at + 1.5)
