"""A stream moved off a lost worker mid-stream (issue 38), core by core: the
scheduler keeps what each migratable request streamed and re-queues it as a
continuation; the worker numbers, replays and counts a continuation; the sim engine
generates on from the ids carried; the sanitizer's filter keeps masking across the
join."""

from __future__ import annotations

import msgspec
import pytest

from inferbus.contracts import (
    ReplyReader,
    RequestFinished,
    RequestSubmitted,
    Resume,
    SamplingParams,
    StructuredOutput,
    TokenChunk,
    WorkAssigned,
    WorkerHeartbeat,
)
from inferbus.services.sanitizer.core import FilteredStream
from inferbus.services.scheduler.core import (
    Assign,
    Fail,
    SchedulerCore,
    SchedulerPolicy,
    Supersede,
)
from inferbus.services.scheduler.migration import Progress, unmovable
from inferbus.services.worker.core import (
    RequestStream,
    ServedAssignments,
    StallWatch,
    Voice,
    engine_request,
    nothing_left,
)
from inferbus.services.worker.engine import EngineOutput, EngineRequest
from inferbus.services.worker.sim import SimEngine, SimTiming

POLICY = SchedulerPolicy(worker_timeout_s=3.0, queue_timeout_s=30.0, max_attempts=3)


def req(rid: str = "r", **sampling) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=rid,
        model="m",
        reply_to=f"ib.reply.t.{rid}",
        prompt="hello",
        sampling=SamplingParams(**sampling),
    )


def ends(effects) -> list:
    """What becomes of requests, without the stops sent to presumed-lost workers."""
    return [e for e in effects if not isinstance(e, Supersede)]


def hb(wid: str, state: str = "ready") -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=wid, models=["m"], engine="sim", state=state, max_num_seqs=8)


def chunk(seq: int, ids: list[int], attempt: int = 1, rid: str = "r") -> TokenChunk:
    return TokenChunk(request_id=rid, seq=seq, text=f"t{seq} ", token_ids=ids, attempt=attempt)


def streaming(core: SchedulerCore, request: RequestSubmitted, chunks: int = 3) -> Assign:
    """``request`` placed on w1, started (migratable as its assignment says) and
    ``chunks`` chunks of two tokens each streamed."""
    core.on_heartbeat(hb("w1"), 0.0)
    (placed,) = core.on_accepted(request, 0.0)
    assert isinstance(placed, Assign) and placed.worker_id == "w1"
    rid = request.request_id
    core.on_started(rid, 1, "w1", migratable=placed.migratable)
    for seq in range(chunks):
        core.on_progress("w1", chunk(seq, [10 * seq, 10 * seq + 1], rid=rid))
    return placed


# -- the scheduler --------------------------------------------------------------------------


def test_a_lost_workers_stream_moves_on_as_a_continuation():
    core = SchedulerCore(POLICY)
    placed = streaming(core, req())
    assert placed.migratable and placed.resume is None
    core.on_heartbeat(hb("w2"), 3.0)
    effects = core.tick(3.5)  # w1 silent past 3 s
    (stop,) = [e for e in effects if isinstance(e, Supersede)]
    assert (stop.worker_id, stop.attempt) == ("w1", 1)  # should it only have stalled
    (moved,) = ends(effects)
    assert isinstance(moved, Assign) and (moved.worker_id, moved.attempt) == ("w2", 2)
    resume = moved.resume
    assert resume is not None and moved.cause == "lost"
    assert resume.output_ids == [0, 1, 10, 11, 20, 21] and resume.next_seq == 3
    assert resume.last_chunk == chunk(2, [20, 21]) and resume.from_attempt == 1
    assert resume.migrations == 1 and moved.migratable


def test_a_worker_that_says_it_stopped_hands_its_streams_on_at_once():
    core = SchedulerCore(POLICY)
    streaming(core, req())
    core.on_heartbeat(hb("w2"), 0.5)
    (moved,) = ends(core.on_heartbeat(hb("w1", state="stopped"), 0.6))
    assert isinstance(moved, Assign) and moved.cause == "stopped" and moved.worker_id == "w2"


def test_a_continuation_goes_on_counting_from_where_it_picked_up():
    core = SchedulerCore(POLICY)
    streaming(core, req(), chunks=2)
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign) and moved.resume is not None
    core.on_started("r", 2, "w2", migratable=True)
    core.on_progress("w2", chunk(1, [10, 11], attempt=2))  # the replay: known already
    core.on_progress("w2", chunk(2, [7], attempt=2))
    core.on_progress("w1", chunk(2, [99], attempt=1))  # the lost worker's late word
    core.on_heartbeat(hb("w3"), 6.0)
    (again,) = [e for e in ends(core.tick(6.6)) if isinstance(e, Assign)]
    assert again.worker_id == "w3" and again.attempt == 3
    assert again.resume is not None and again.resume.output_ids == [0, 1, 10, 11, 7]
    assert again.resume.next_seq == 3 and again.resume.migrations == 2


def test_a_continuation_lost_before_it_started_stays_a_continuation():
    core = SchedulerCore(POLICY)
    streaming(core, req())
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    core.on_heartbeat(hb("w3"), 6.0)
    (again,) = [e for e in ends(core.tick(6.6)) if isinstance(e, Assign)]  # w2 lost, not started
    assert again.worker_id == "w3" and again.resume == moved.resume


@pytest.mark.parametrize(
    ("sampling", "why"),
    [
        ({"stop": ["\n"]}, "stop strings"),
        ({"n": 2}, "2 choices"),
        ({"presence_penalty": 0.5}, "penalties"),
        ({"structured": StructuredOutput(json_object=True)}, "constraint"),
        ({"prompt_logprobs": 1}, "prompt logprobs"),
    ],
)
def test_what_cannot_move_fails_worker_lost_saying_why(sampling, why):
    core = SchedulerCore(POLICY)
    placed = streaming(core, req(**sampling))
    assert not placed.migratable
    core.on_heartbeat(hb("w2"), 3.0)
    (fail,) = ends(core.tick(3.5))
    assert isinstance(fail, Fail) and fail.code == "worker_lost" and fail.retryable
    assert why in fail.reason and why in unmovable(req(**sampling))


def test_a_worker_that_sends_no_progress_or_loses_some_fails_it_as_before():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req("quiet"), 0.0)
    core.on_started("quiet", 1, "w1", migratable=False)  # e.g. a reasoning parser
    core.on_accepted(req("gap"), 0.0)
    core.on_started("gap", 1, "w1", migratable=True)
    core.on_progress("w1", chunk(0, [1], rid="gap"))
    core.on_progress("w1", chunk(2, [3], rid="gap"))  # seq 1's copy never came
    core.on_heartbeat(hb("w2"), 3.0)
    fails = {e.request.request_id: e.reason for e in ends(core.tick(3.5)) if isinstance(e, Fail)}
    assert "sent no progress" in fails["quiet"] and "was lost on the way" in fails["gap"]


def test_migration_off_and_attempts_used_up_fail_worker_lost():
    core = SchedulerCore(msgspec.structs.replace(POLICY, migrate=False))
    assert not streaming(core, req()).migratable
    core.on_heartbeat(hb("w2"), 3.0)
    (fail,) = ends(core.tick(3.5))
    assert isinstance(fail, Fail) and "migration is off" in fail.reason
    core = SchedulerCore(msgspec.structs.replace(POLICY, max_attempts=1))
    streaming(core, req())
    core.on_heartbeat(hb("w2"), 3.0)
    (fail,) = ends(core.tick(3.5))
    assert isinstance(fail, Fail) and "assigned 1 times" in fail.reason


def test_a_continuation_no_worker_takes_soon_ends_worker_lost():
    core = SchedulerCore(msgspec.structs.replace(POLICY, migration_wait_s=5.0))
    streaming(core, req())
    assert ends(core.tick(3.5)) == []  # moved, but no other worker: it waits
    assert core.is_queued("r")
    (fail,) = ends(core.tick(8.6))  # 5 s later, long before the 30 s queue timeout
    assert isinstance(fail, Fail) and fail.code == "worker_lost"
    assert "no worker could take the stream over within 5s" in fail.reason


def test_a_restored_assignment_moves_only_with_all_its_progress():
    # after a scheduler restart the chunks sent before it are unknown: it fails as before
    core = SchedulerCore(POLICY)
    core.restore([(req(), "w1", 1)], {}, 0.0)
    core.on_progress("w1", chunk(4, [1]))
    core.on_heartbeat(hb("w2"), 3.0)
    (fail,) = [e for e in ends(core.tick(3.5)) if isinstance(e, Fail)]
    assert fail.code == "worker_lost"


def test_progress_ignores_repeats_and_records_gaps():
    p = Progress()
    p.add(chunk(0, [1]))
    p.add(chunk(0, [1]))
    p.add(chunk(1, [2, 3]))
    assert (p.output_ids, p.next_seq, p.gap) == ([1, 2, 3], 2, False)
    p.add(chunk(3, [5]))
    assert p.gap


# -- the worker -----------------------------------------------------------------------------


def continuation(max_tokens: int = 8, carried: int = 3) -> WorkAssigned:
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req(max_tokens=max_tokens, min_tokens=4), 0.0)
    core.on_started("r", 1, "w1", migratable=True)
    for seq in range(carried):
        core.on_progress("w1", chunk(seq, [seq]))
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign)
    return WorkAssigned(
        request=moved.request,
        worker_id=moved.worker_id,
        attempt=moved.attempt,
        migratable=moved.migratable,
        resume=moved.resume,
    )


def test_a_continuation_runs_the_ids_carried_with_their_tokens_counted_off():
    work = continuation()
    er = engine_request(work)
    assert er.resume_ids == [0, 1, 2]
    assert (er.sampling.max_tokens, er.sampling.min_tokens) == (5, 1)
    assert work.request.sampling.max_tokens == 8  # the request itself is untouched
    assert not nothing_left(work) and nothing_left(continuation(max_tokens=3))


def test_a_continuation_replays_its_last_chunk_then_numbers_on_and_counts_it_all():
    work = continuation()
    stream = RequestStream(work, "w2", 0.0)
    stream.migratable = True
    started = stream.started(0.1)
    assert started is not None and started.resumed and started.migratable
    replay = stream.replay()
    assert replay is not None and (replay.seq, replay.attempt, replay.resumed) == (2, 2, True)
    assert replay.token_ids == [2] and replay.resumed_from == 3
    out = EngineOutput(
        text="x ", token_ids=[9, 9], prompt_tokens=4, completion_tokens=2, cached_tokens=4
    )
    c = stream.chunk(out)
    assert c is not None and (c.seq, c.resumed, c.attempt, c.resumed_from) == (3, True, 2, 3)
    out.finish_reason = out.choice_finish_reason = "length"
    end = stream.finished(out, 0.2)
    assert end.resumed and end.chunks == 4 and end.attempt == 2 and end.resumed_from == 3
    # the engine saw 1 prompt token + 3 carried: the client's usage counts them as output
    assert (end.usage.prompt_tokens, end.usage.completion_tokens) == (1, 5)
    assert end.usage.cached_prompt_tokens == 1 and end.choices[0].completion_tokens == 5


def test_a_continuation_of_a_continuation_says_where_it_goes_on_from_itself():
    last = TokenChunk(
        request_id="r", seq=3, text="t3 ", token_ids=[3], attempt=2, resumed=True, resumed_from=1
    )
    resume = Resume(from_attempt=2, output_ids=[0, 1, 2, 3], next_seq=4, last_chunk=last)
    stream = RequestStream(
        WorkAssigned(request=req(max_tokens=8), worker_id="w3", attempt=3, resume=resume),
        "w3",
        0.0,
    )
    replay = stream.replay()
    assert replay is not None and (replay.seq, replay.attempt, replay.resumed_from) == (3, 3, 4)


def test_a_first_attempt_neither_replays_nor_says_resumed():
    stream = RequestStream(WorkAssigned(request=req(), worker_id="w1"), "w1", 0.0)
    started = stream.started(0.0)
    assert started is not None and not started.resumed and not started.migratable
    assert stream.replay() is None


# -- the sim engine -------------------------------------------------------------------------


async def run(engine: SimEngine, r: EngineRequest) -> tuple[list[int], str]:
    ids, text = [], ""
    async for out in engine.generate(r):
        ids += out.token_ids
        text += out.text
    return ids, text


@pytest.mark.parametrize("prompt", ["Tell me about queues.", "/echo a known answer, 3 a token"])
async def test_the_sim_generates_on_from_the_ids_carried_as_it_would_have(prompt):
    engine = SimEngine("m", SimTiming())
    await engine.start()
    try:
        whole = EngineRequest(
            request_id="a", prompt=prompt, sampling=SamplingParams(max_tokens=9, seed=4)
        )
        ids, text = await run(engine, whole)
        head_ids, head_text = await run(
            engine, msgspec.structs.replace(whole, sampling=SamplingParams(max_tokens=4, seed=4))
        )
        tail = msgspec.structs.replace(
            whole, sampling=SamplingParams(max_tokens=5, seed=4), resume_ids=head_ids
        )
        tail_ids, tail_text = await run(engine, tail)
        assert head_ids + tail_ids == ids and head_text + tail_text == text
    finally:
        await engine.stop()


# -- the sanitizer's output filter -----------------------------------------------------------


def test_the_output_filter_masks_across_the_join_and_numbers_on():
    stream = FilteredStream("r", "client", 0.0)
    sent: list = []
    events = [
        TokenChunk(request_id="r", seq=0, text="card 4111 1111 ", token_ids=[1], attempt=1),
        # the continuation's replay of seq 0, then what it generates
        TokenChunk(
            request_id="r", seq=0, text="card 4111 1111 ", token_ids=[1], attempt=2, resumed=True
        ),
        TokenChunk(
            request_id="r", seq=1, text="1111 1111 ok", token_ids=[2], attempt=2, resumed=True
        ),
        RequestFinished(
            request_id="r",
            finish_reason="stop",
            usage={"prompt_tokens": 1, "completion_tokens": 2},
            chunks=2,
            attempt=2,
            resumed=True,
        ),
    ]
    for ev in events:
        out, _ = stream.on_event(ev, 0.0)
        sent += out
    text = "".join(e.text for e in sent if isinstance(e, TokenChunk))
    assert "4111" not in text and "ok" in text
    assert [e.seq for e in sent if isinstance(e, TokenChunk)] == list(range(len(sent) - 1))
    attempts = [(e.attempt, e.resumed) for e in sent if isinstance(e, TokenChunk)]
    assert attempts[-1] == (2, True)
    end = sent[-1]
    assert isinstance(end, RequestFinished) and end.chunks == len(sent) - 1


def cut_off_and_moved(copied: int) -> list:
    """A worker streams tokens 0-3 in two chunks of two; the scheduler has copies of the
    first ``copied`` chunks when the worker falls silent (cut off from the bus, its
    publishes buffered) and moves the stream. The continuation, on a worker that
    sends a chunk a token, reaches the output filter after both of the first worker's
    chunks (sent when its connection came back). Returns what the filter passes on."""
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req(max_tokens=5), 0.0)
    core.on_started("r", 1, "w1", migratable=True)
    first = RequestStream(WorkAssigned(request=req(max_tokens=5), worker_id="w1"), "w1", 0.0)
    sent = [
        first.chunk(
            EngineOutput(
                text=f"t{i} t{i + 1} ", token_ids=[i, i + 1], prompt_tokens=1, completion_tokens=2
            )
        )
        for i in (0, 2)
    ]
    for c in sent[:copied]:
        core.on_progress("w1", c)
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign) and moved.resume is not None
    work = WorkAssigned(
        request=moved.request, worker_id="w2", attempt=moved.attempt, resume=moved.resume
    )
    second = RequestStream(work, "w2", 0.0)
    replay = second.replay()
    carried = len(moved.resume.output_ids)
    events = [*sent, *([replay] if replay is not None else [])]
    for i in range(carried, 5):
        step = EngineOutput(text=f"t{i} ", token_ids=[i], prompt_tokens=1, completion_tokens=1)
        events.append(second.chunk(step))
    last = EngineOutput(
        text="", token_ids=[], prompt_tokens=1 + carried, completion_tokens=5 - carried
    )
    last.finish_reason = last.choice_finish_reason = "length"
    events.append(second.finished(last, 1.0))
    relay = FilteredStream("r", "client", 0.0)
    out: list = []
    for ev in events:
        out += relay.on_event(ev, 0.0)[0]
    return out


def test_a_continuation_joins_a_reader_that_holds_what_the_scheduler_held():
    client = ReplyReader("r")
    readings = [client.read(ev) for ev in cut_off_and_moved(copied=2)]
    text = "".join(c.text for r in readings for c in r.chunks)
    assert text == "t0 t1 t2 t3 t4 "
    assert isinstance(readings[-1].end, RequestFinished) and not any(r.restarted for r in readings)


def test_a_continuation_behind_what_a_reader_holds_interrupts_it_rather_than_mix_text():
    # the scheduler had a copy of the first chunk only: joined by seq, the reader would
    # end "t0 t1 t2 t3 t3 t4 ", a token twice and no gap to see (a NATS node killed
    # under load, test_faults' nats-0 case, once)
    events = cut_off_and_moved(copied=1)
    chunks = [e for e in events if isinstance(e, TokenChunk)]
    assert (chunks[-1].attempt, chunks[-1].resumed) == (2, False)  # the filter restarted it
    client = ReplyReader("r")
    readings = [client.read(ev) for ev in events]
    assert any(r.interrupts for r in readings)  # a streaming client: stream_interrupted
    # a client that buffers drops the void text and keeps the restart's, which here
    # begins with the replayed first chunk: whole, or else counted as lost
    buffered, text = ReplyReader("r"), ""
    for ev in events:
        r = buffered.read(ev)
        text = ("" if r.restarted else text) + "".join(c.text for c in r.chunks)
    assert text == "t0 t1 t2 t3 t4 " and isinstance(r.end, RequestFinished)


def test_a_streaming_worker_gone_silent_is_lost_before_the_heartbeat_timeout():
    # a dead worker's streams stop at once: its clients wait 1.5 s, not 3
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(hb("w2"), 0.0)
    core.on_heartbeat(hb("idle"), 0.0)
    core.on_accepted(req(), 0.0)
    wid = core.inflight["r"].worker_id
    core.on_started("r", 1, wid, migratable=True)
    core.on_progress(wid, chunk(0, [1]), 0.2)
    for other in {"w1", "w2", "idle"} - {wid}:
        core.on_heartbeat(hb(other), 1.0)
    assert ends(core.tick(1.6)) == []
    (moved,) = ends(core.tick(1.8))  # 1.6 s without a copy or a heartbeat
    assert isinstance(moved, Assign) and moved.resume is not None and moved.worker_id != wid
    # only its streams move: it gets no new work until it is heard from, and is lost
    # as a whole at the heartbeat timeout (what else it held waits for that)
    assert core.workers[wid].state == "silent" and core.workers[wid].assigned == set()
    assert wid not in [a.worker_id for a in ends(core.on_accepted(req("next"), 1.9))]
    core.tick(3.1)
    assert wid not in core.workers


def test_a_worker_told_an_attempt_was_given_up_never_serves_it():
    # the stop can reach a stalled worker before the assignment it stops
    served = ServedAssignments()
    served.refuse("r", 1)
    assert not served.take(WorkAssigned(request=req(), worker_id="w1", attempt=1), False)
    assert served.take(WorkAssigned(request=req(), worker_id="w1", attempt=2), False)


def test_a_worker_silent_past_its_lease_syncs_before_streaming_on():
    voice = Voice(0.0)
    voice.spoke(1.0, 1.5)
    assert not voice.must_sync(2.0, 1.5, seen=0)
    assert voice.must_sync(2.6, 1.5, seen=0)  # stopped 1.6 s: it may have been moved
    voice.spoke(2.7, 1.5)  # a heartbeat got out first: the silence is still counted
    assert voice.silences == 1 and voice.must_sync(2.8, 1.5, seen=0)
    assert not voice.must_sync(2.8, 1.5, seen=1) and not voice.must_sync(9.0, 0.0, seen=0)
    # once synced, it streams on until it is silent past the lease again
    assert not voice.must_sync(3.0, 1.5, seen=1, synced_at=2.8)
    assert voice.must_sync(4.5, 1.5, seen=1, synced_at=2.8)


def test_a_stream_that_cannot_move_still_has_a_lease_short_of_the_timeout():
    """A stopped worker's unmovable stream ends ``worker_lost`` at the timeout; the
    worker, let go on, must check for the stop before it ends the request a second
    time (issue 42 item 7: ``worker_lost`` then ``request.finished``)."""
    core = SchedulerCore(POLICY)
    still = streaming(core, req("still", presence_penalty=0.5))
    assert not still.migratable and 0 < still.lease_s < POLICY.worker_timeout_s
    moves = streaming(core, req("moves"))
    assert moves.migratable and moves.lease_s == POLICY.stream_silence_s
    off = SchedulerCore(msgspec.structs.replace(POLICY, migrate=False))
    assert 0 < streaming(off, req()).lease_s < POLICY.worker_timeout_s


def test_the_end_of_an_attempt_given_up_on_leaves_its_queued_successor():
    core = SchedulerCore(POLICY)
    streaming(core, req())
    core.tick(3.5)  # moved, no other worker: attempt 2 waits
    assert core.on_ended("r", 3.6, attempt=1) == [] and core.is_queued("r")
    core.on_heartbeat(hb("w2"), 3.7)
    assert "r" in core.inflight and core.inflight["r"].attempt == 2


# -- a hung engine, a drain ---------------------------------------------------------------


def test_the_stall_watch_counts_only_while_something_streams():
    watch = StallWatch(0.0)
    assert watch.stalled_s(50.0, streaming=0) == 0.0  # idle: nothing is owed
    watch.progressed(51.0)
    assert watch.stalled_s(52.5, streaming=2) == 1.5
    assert watch.stalled_s(90.0, streaming=2) == 39.0


def test_a_worker_whose_engine_stalls_has_its_streams_moved():
    core = SchedulerCore(POLICY)
    streaming(core, req())
    core.on_heartbeat(hb("w2"), 0.5)
    assert ends(core.on_heartbeat(msgspec.structs.replace(hb("w1"), stalled_s=12.0), 1.0)) == []
    stalled = msgspec.structs.replace(hb("w1"), stalled_s=31.0)
    (moved,) = ends(core.on_heartbeat(stalled, 2.0))
    assert isinstance(moved, Assign) and moved.cause == "stalled" and moved.worker_id == "w2"
    assert "w1" not in core.workers  # and it is not taken back while it says so
    assert ends(core.on_heartbeat(stalled, 3.0)) == [] and "w1" not in core.workers


def test_a_draining_worker_hands_over_what_can_move_where_there_is_room():
    core = SchedulerCore(POLICY)
    streaming(core, req("long"))
    core.on_accepted(req("stops", stop=["\n"]), 0.0)
    core.on_started("stops", 1, "w1", migratable=False)
    draining = msgspec.structs.replace(hb("w1", state="draining"), handover=["long", "stops"])
    assert ends(core.on_heartbeat(draining, 1.0)) == []  # no other worker: both stay
    assert core.inflight["long"].worker_id == "w1"
    core.on_heartbeat(hb("w2"), 1.5)
    effects = core.on_heartbeat(draining, 2.0)
    (moved,) = ends(effects)
    assert isinstance(moved, Assign) and moved.request.request_id == "long"
    assert moved.cause == "drain" and moved.worker_id == "w2" and moved.resume is not None
    (stop,) = [e for e in effects if isinstance(e, Supersede)]
    assert (stop.request.request_id, stop.worker_id, stop.attempt) == ("long", "w1", 1)
    assert core.inflight["stops"].worker_id == "w1"  # runs to its end there
    assert core.workers["w1"].assigned == {"stops"}


def test_a_continuations_start_says_how_long_its_stream_stood_still():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req(), 0.0)
    core.on_started("r", 1, "w1", migratable=True, now=0.1)
    core.on_progress("w1", chunk(0, [1]), 0.4)
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign) and moved.worker_id == "w2"
    assert core.on_started("r", 1, "w1", now=3.6) is None  # the lost attempt's late word
    assert core.on_started("r", 2, "w2", migratable=True, now=3.9) == pytest.approx(3.5)
    assert core.on_started("r", 2, "w2", migratable=True, now=4.0) is None  # once


def test_a_handover_moves_no_more_than_the_other_workers_have_seats_for():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    for i in range(3):
        core.on_accepted(req(f"r{i}"), 0.0)
        core.on_started(f"r{i}", 1, "w1", migratable=True)
        core.on_progress("w1", chunk(0, [1], rid=f"r{i}"), 0.1)
    small = msgspec.structs.replace(hb("w2"), max_num_seqs=2)
    core.on_heartbeat(small, 0.2)
    ask = msgspec.structs.replace(
        hb("w1", state="draining"), handover=["r0", "r1", "r2"], sent_at=100.0
    )
    assert ends(core.on_heartbeat(ask, 0.3, wall=101.5)) == []  # asked too long ago
    moved = [e for e in ends(core.on_heartbeat(ask, 0.4, wall=100.2)) if isinstance(e, Assign)]
    assert len(moved) == 2 and all(m.worker_id == "w2" for m in moved)
    assert len(core.workers["w1"].assigned) == 1  # the third runs to its end on w1
    assert not [q for q in core.queues["m"]]  # none left waiting for a seat


def test_a_worker_whose_engine_hung_gets_nothing_until_it_restarts():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_heartbeat(msgspec.structs.replace(hb("w1"), stalled_s=31.0), 1.0)
    assert ends(core.on_heartbeat(hb("w1"), 2.0)) == []  # its count went back to 0
    assert "w1" not in core.workers and core.on_accepted(req(), 2.1) == []
    (placed,) = core.on_heartbeat(hb("w1-restarted"), 3.0)
    assert isinstance(placed, Assign) and placed.worker_id == "w1-restarted"


def test_a_stream_lost_after_its_last_chunk_only_ends_on_the_next_worker():
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req(max_tokens=50), 0.0)
    core.on_started("r", 1, "w1", migratable=True)
    core.on_progress("w1", chunk(0, [5, 2]), 0.1, finish_reason="stop")  # 2: end of text
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign) and moved.resume is not None
    assert moved.resume.finish_reason == "stop"
    work = WorkAssigned(request=moved.request, worker_id="w2", attempt=2, resume=moved.resume)
    assert nothing_left(work) == "stop"


def test_a_chunk_copy_before_its_start_counts_as_started():
    # found in CI under load: the scheduler read the worker's copies but not yet its
    # start when it lost the worker, and ran the request afresh: the client had text
    # of attempt 1 and ended stream_interrupted
    core = SchedulerCore(POLICY)
    core.on_heartbeat(hb("w1"), 0.0)
    core.on_accepted(req(), 0.0)
    core.on_progress("w1", chunk(0, [4]), 0.2)
    core.on_heartbeat(hb("w2"), 3.0)
    (moved,) = ends(core.tick(3.5))
    assert isinstance(moved, Assign) and moved.resume is not None
    assert moved.resume.output_ids == [4]


def test_a_scheduler_that_could_not_hear_judges_no_silence():
    """A NATS restart cut the scheduler off with everyone else: judged by the clock, it
    moved every stream, and the workers, which had heard no stop, ended theirs too (two
    request.finished on a client's reply subject; CI, the nats fault)."""
    core = SchedulerCore(POLICY)
    streaming(core, req())
    core.heard_nothing(2.5)  # its connection came back at 2.5 s
    core.tick(2.6)
    assert "r" in core.inflight and not core.is_queued("r")
    core.tick(4.5)  # silent since it could hear: moved (no other worker: it waits)
    assert core.is_queued("r")


def test_a_worker_that_was_cut_off_is_told_its_stop_again():
    """A stop goes out on core NATS: a worker partitioned from a scheduler that stayed
    connected never got it, and would end, when back, a stream already moved. While its
    heartbeats say it still runs the attempt, each brings the stop again."""
    core = SchedulerCore(POLICY)
    streaming(core, req())
    stops = [e for e in core.tick(1.7) if isinstance(e, Supersede)]  # silent: moved
    assert [(s.worker_id, s.attempt) for s in stops] == [("w1", 1)]
    back = msgspec.structs.replace(hb("w1"), inflight=["r"])
    again = [e for e in core.on_heartbeat(back, 2.0) if isinstance(e, Supersede)]
    assert [(s.worker_id, s.attempt) for s in again] == [("w1", 1)]
    done = msgspec.structs.replace(hb("w1"), inflight=[])
    assert not [e for e in core.on_heartbeat(done, 3.0) if isinstance(e, Supersede)]
    assert not [e for e in core.on_heartbeat(back, 4.0) if isinstance(e, Supersede)]
