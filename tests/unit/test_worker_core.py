"""RequestStream: how engine outputs become numbered chunks and one terminal event."""

from __future__ import annotations

import pytest

from inferbus.contracts import (
    ChoiceEnd,
    FailureCode,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestStarted,
    RequestSubmitted,
    SamplingParams,
    StageTimings,
    TokenChunk,
    ToolCallDelta,
    Usage,
    WorkAssigned,
)
from inferbus.services.worker.core import (
    RequestStream,
    ServedAssignments,
    engine_request,
    expires_in,
    heartbeat,
)
from inferbus.services.worker.engine import EngineOutput, EngineStats


def assignment(attempt: int = 2) -> WorkAssigned:
    req = RequestSubmitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.g.r1",
        prompt="hi",
        sampling=SamplingParams(max_tokens=4, seed=1),
    )
    return WorkAssigned(request=req, worker_id="w1", attempt=attempt)


def out(
    text: str,
    n: int,
    finish: str | None = None,
    ids: list[int] | None = None,
    index: int = 0,
    choice_finish: str | None = None,
    stop_reason: str | None = None,
):
    return EngineOutput(
        text=text,
        token_ids=[n] if ids is None else ids,
        prompt_tokens=3,
        completion_tokens=n,
        finish_reason=finish,
        index=index,
        choice_finish_reason=choice_finish,
        stop_reason=stop_reason,
    )


def test_started_is_returned_once():
    s = RequestStream(assignment(), "w1", now=10.0)
    first = s.started(10.5)
    assert first == RequestStarted(request_id="r1", worker_id="w1", attempt=2)
    assert s.first_token_at == 10.5
    assert s.started(11.0) is None
    assert s.started(12.0) is None
    assert s.first_token_at == 10.5


def test_chunks_are_numbered_without_gaps():
    s = RequestStream(assignment(), "w1", now=0.0)
    chunks = [s.chunk(out("a ", 1)), s.chunk(out("b ", 2)), s.chunk(out("c ", 3))]
    assert [c.seq for c in chunks] == [0, 1, 2]
    assert all(isinstance(c, TokenChunk) for c in chunks)
    assert [c.text for c in chunks] == ["a ", "b ", "c "]
    assert all(c.request_id == "r1" and c.attempt == 2 for c in chunks)
    assert chunks[1].token_ids == [2]


def test_empty_output_yields_no_chunk_and_leaves_no_gap():
    s = RequestStream(assignment(), "w1", now=0.0)
    assert s.chunk(out("a", 1)).seq == 0
    assert s.chunk(out("", 2, ids=[])) is None
    assert s.chunk(out("b", 3)).seq == 1
    assert s.seq == 2


def test_token_ids_without_text_still_make_a_chunk():
    # e.g. held back for a possible stop string: the tokens are still reported
    s = RequestStream(assignment(), "w1", now=0.0)
    c = s.chunk(out("", 1, ids=[5]))
    assert c is not None and c.seq == 0 and c.text == "" and c.token_ids == [5]


def test_finished_carries_usage_chunk_count_and_attempt():
    s = RequestStream(assignment(attempt=3), "w1", now=0.0)
    s.chunk(out("a", 1))
    s.chunk(out("b", 2))
    fin = s.finished(out("", 4, finish="length", ids=[]), 2.0)
    assert fin == RequestFinished(
        request_id="r1",
        finish_reason="length",
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        chunks=2,
        worker_id="w1",
        attempt=3,
        timings=StageTimings(first_token_s=2.0),
        choices=[ChoiceEnd(index=0, finish_reason="length", completion_tokens=2)],
    )
    assert fin.usage.total_tokens == 7


def test_each_choice_ends_on_its_own_and_the_first_names_the_request_s_end():
    # n=2: the engine's outputs interleave the choices; each one's end and tokens are
    # its own, and chunks are numbered across both
    a = assignment()
    a.request.sampling.n = 2
    s = RequestStream(a, "w1", now=0.0)
    c0 = s.chunk(out("x", 1, index=0))
    c1 = s.chunk(out("y", 2, index=1, choice_finish="stop", stop_reason="\n"))
    c2 = s.chunk(out("z", 3, index=0, choice_finish="length"))
    assert [(c.seq, c.index) for c in (c0, c1, c2)] == [(0, 0), (1, 1), (2, 0)]
    fin = s.finished(out("", 3, finish="length", ids=[]), 1.0)
    assert fin.finish_reason == "length"
    assert fin.choices == [
        ChoiceEnd(index=0, finish_reason="length", completion_tokens=2),
        ChoiceEnd(index=1, finish_reason="stop", stop_reason="\n", completion_tokens=1),
    ]
    assert fin.choice_ends() == fin.choices


def test_a_choice_with_no_output_still_ends():
    a = assignment()
    a.request.sampling.n = 2
    s = RequestStream(a, "w1", now=0.0)
    s.chunk(out("x", 1, index=0, choice_finish="stop"))
    fin = s.finished(out("", 1, finish="stop", ids=[]), 1.0)
    assert [c.index for c in fin.choices] == [0, 1]
    assert fin.choices[1] == ChoiceEnd(index=1, finish_reason="stop")


def test_finished_stop_reason_and_no_chunks():
    s = RequestStream(assignment(), "w1", now=0.0)
    fin = s.finished(out("", 1, finish="stop", ids=[]), 2.0)
    assert fin.finish_reason == "stop"
    assert fin.chunks == 0


def test_engine_request_from_assignment():
    er = engine_request(assignment())
    assert er.request_id == "r1" and er.prompt == "hi" and er.messages is None
    assert er.sampling.max_tokens == 4 and er.sampling.seed == 1


def test_heartbeat_builder():
    hb = heartbeat(
        worker_id="w1",
        engine_name="sim",
        models=["m"],
        max_num_seqs=8,
        state="draining",
        stats=EngineStats(running=2, waiting=1),
        inflight=["r1"],
        interval_s=0.5,
        now=42.0,
        reason="bye",
    )
    assert (hb.worker_id, hb.engine, hb.models, hb.max_num_seqs, hb.state) == (
        "w1",
        "sim",
        ["m"],
        8,
        "draining",
    )
    assert (hb.running, hb.waiting, hb.inflight, hb.interval_s, hb.sent_at, hb.reason) == (
        2,
        1,
        ["r1"],
        0.5,
        42.0,
        "bye",
    )


def test_the_cost_meter_learns_prefill_and_restore_per_token():
    from inferbus.services.worker.core import CostMeter
    from inferbus.services.worker.engine import KvRestore

    m = CostMeter(alpha=0.5)
    m.observe(prefill_s=1.0, prompt_tokens=1000, cached_tokens=0, restored=None)
    assert m.prefill_s_per_token == pytest.approx(0.001) and m.restore_s_per_token == 0.0
    # 512 tokens restored in 0.05 s, 488 computed in the rest of the prefill
    restored = KvRestore(blocks=4, tokens=512, seconds=0.05)
    m.observe(prefill_s=0.538, prompt_tokens=1000, cached_tokens=512, restored=restored)
    assert m.restore_s_per_token == pytest.approx(0.05 / 512)
    assert m.prefill_s_per_token == pytest.approx(0.001)
    # too few computed tokens say nothing of prefill; an untimed restore nothing of restores
    m.observe(
        prefill_s=5.0,
        prompt_tokens=520,
        cached_tokens=512,
        restored=KvRestore(blocks=4, tokens=512, timed=False),
    )
    assert m.prefill_s_per_token == pytest.approx(0.001)
    assert m.restore_s_per_token == pytest.approx(0.05 / 512)
    hb = heartbeat(
        worker_id="w",
        engine_name="vllm",
        models=["m"],
        max_num_seqs=1,
        state="ready",
        stats=EngineStats(),
        inflight=[],
        interval_s=1.0,
        now=0.0,
        costs=m,
    )
    assert hb.prefill_s_per_token == pytest.approx(0.001)
    assert hb.kv_restore_s_per_token == pytest.approx(0.05 / 512)


def test_a_stopped_generation_ends_on_its_deadline_first_then_a_cancel_then_shutdown():
    s = RequestStream(assignment(attempt=3), "w1", now=0.0, served_model="m@v2")
    s.chunk(out("a ", 1))
    late = s.stopped(expired=True, cancel_reason="cancelled by client")
    assert isinstance(late, RequestFailed) and late.code == FailureCode.DEADLINE_EXCEEDED
    assert "after 1 chunks" in late.reason and not late.retryable
    assert (late.attempt, late.served_model) == (3, "m@v2")
    cancelled = s.stopped(expired=False, cancel_reason="client went away")
    assert cancelled == RequestCancelled(request_id="r1", reason="client went away", attempt=3)
    down = s.stopped(expired=False, cancel_reason=None)
    assert isinstance(down, RequestFailed) and down.code == FailureCode.WORKER_SHUTDOWN
    assert down.retryable and down.attempt == 3


def test_every_failure_names_its_attempt_so_a_newer_ones_reader_ignores_it():
    s = RequestStream(assignment(attempt=2), "w1", now=0.0)
    for failed in (s.failed(FailureCode.ENGINE_ERROR, "boom"), s.unfinished(), s.backup_end()):
        assert failed.request_id == "r1" and failed.attempt == 2
    assert s.backup_end().code == FailureCode.STREAM_INTERRUPTED and s.backup_end().retryable


def test_the_deadline_timer_is_set_from_the_request_and_never_negative():
    a = assignment()
    assert expires_in(a, wall=100.0) is None  # no deadline
    a.request.deadline = 130.0
    assert expires_in(a, wall=100.0) == 30.0
    assert expires_in(a, wall=200.0) == 0.0


def test_an_assignment_delivered_again_is_served_once():
    served = ServedAssignments(remember=2)
    first = assignment(attempt=1)
    assert served.take(first, running=False)
    assert not served.take(first, running=False)  # its ack was lost: redelivered
    assert served.take(assignment(attempt=2), running=False)  # a new attempt runs
    # one running under another attempt's key is not started twice either
    assert not served.take(assignment(attempt=4), running=True)
    assert served.take(assignment(attempt=3), running=False)
    assert served.take(first, running=False)  # forgotten past ``remember``


def test_tool_call_pieces_make_chunks_and_their_choice_ends_tool_calls():
    s = RequestStream(assignment(), "w1", now=0.0)
    o = out("", 1)
    o.tool_calls = [ToolCallDelta(index=0, id="c", name="f", arguments="{}")]
    o.choice_finish_reason = "tool_calls"
    c = s.chunk(o)
    assert c is not None and c.tool_calls == o.tool_calls and c.text == ""
    reasoning = out("", 2, ids=[])
    reasoning.reasoning = "thinking"
    assert s.chunk(reasoning).reasoning == "thinking"  # no token ids, still a chunk
    fin = s.finished(out("", 2, finish="stop", ids=[]), 1.0)
    assert fin.finish_reason == "stop"  # the request's end keeps its two values
    assert fin.choices[0].finish_reason == "tool_calls"
