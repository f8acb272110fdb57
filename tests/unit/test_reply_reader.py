"""The one rule for reading a reply stream (contracts/replies.py): the newest attempt
wins, its chunks merged and counted; the docs example's port agrees with it."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import msgspec
import pytest

from inferbus.contracts import (
    FailureCode,
    ReplyEvent,
    ReplyReader,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    TokenChunk,
    TokenLogprob,
    Usage,
)

RID = "r1"


def chunk(
    attempt: int,
    seq: int,
    text: str = "",
    ids: list[int] | None = None,
    resumed: bool = False,
    resumed_from: int | None = None,
) -> TokenChunk:
    return TokenChunk(
        request_id=RID,
        seq=seq,
        text=text or f"a{attempt}s{seq} ",
        attempt=attempt,
        token_ids=ids if ids is not None else [seq],
        resumed=resumed,
        resumed_from=resumed_from,
    )


def finished(attempt: int, chunks: int, resumed: bool = False) -> RequestFinished:
    return RequestFinished(
        request_id=RID,
        finish_reason="stop",
        chunks=chunks,
        attempt=attempt,
        usage=Usage(prompt_tokens=3, completion_tokens=chunks),
        resumed=resumed,
    )


def read(events: list[ReplyEvent], whole: bool = True) -> tuple[str, object, bool]:
    """What a buffering client ends with: (text, end, whether it restarted)."""
    reader = ReplyReader(RID, whole=whole)
    text, restarted = "", False
    for ev in events:
        r = reader.read(ev)
        if r.restarted:
            text, restarted = "", True
        text += "".join(c.text for c in r.chunks)
        if r.end is not None:
            return text, r.end, restarted
    return text, None, restarted


def test_a_newer_attempt_replaces_the_older_ones_text_and_ends_on_its_own_finish():
    # the defect: the gateway and the client returned attempt 1's text ended by
    # attempt 2's finish
    text, end, restarted = read([chunk(1, 0), chunk(2, 0), chunk(2, 1), finished(2, 2)])
    assert text == "a2s0 a2s1 "
    assert end == finished(2, 2)
    assert restarted


def test_an_older_attempts_finish_does_not_end_the_newer_one():
    # the defect: both readers ended on attempt 1's finish
    events = [chunk(2, 0), finished(1, 5), chunk(2, 1), finished(2, 2)]
    text, end, restarted = read(events)
    assert (text, end, restarted) == ("a2s0 a2s1 ", finished(2, 2), False)


def test_an_older_attempts_chunks_after_the_newer_began_are_dropped():
    events = [chunk(2, 0), chunk(1, 0), chunk(1, 1), chunk(2, 1), finished(2, 2)]
    assert read(events) == ("a2s0 a2s1 ", finished(2, 2), False)


def test_an_older_attempts_worker_failure_is_ignored_but_one_of_no_attempt_ends_it():
    worker_failed = RequestFailed(
        request_id=RID, code=FailureCode.WORKER_SHUTDOWN, reason="x", attempt=1
    )
    scheduler_failed = RequestFailed(request_id=RID, code=FailureCode.WORKER_LOST, reason="y")
    text, end, _ = read([chunk(2, 0), worker_failed, chunk(2, 1), scheduler_failed])
    assert text == "a2s0 a2s1 " and end == scheduler_failed
    cancelled = RequestCancelled(request_id=RID, attempt=1)
    assert read([chunk(2, 0), cancelled, finished(2, 1)])[1] == finished(2, 1)


def test_a_newer_attempts_finish_with_no_chunk_still_restarts_the_text():
    text, end, restarted = read([chunk(1, 0), finished(2, 0)])
    assert (text, end, restarted) == ("", finished(2, 0), True)


def test_chunks_lost_on_the_way_end_a_whole_reading_as_stream_interrupted():
    events = [chunk(1, 0), chunk(1, 2), finished(1, 4)]
    _, end, _ = read(events)
    assert isinstance(end, RequestFailed) and end.code == FailureCode.STREAM_INTERRUPTED
    assert "2 of the stream's 4 chunks" in end.reason and end.retryable
    reader = ReplyReader(RID, whole=False)  # a relay passes the finish on and counts
    assert [reader.read(e).end for e in events][-1] == finished(1, 4)
    assert reader.lost == 2 and reader.received == 2


def test_a_gap_in_an_older_attempt_is_forgotten_when_a_newer_one_starts():
    events = [chunk(1, 0), chunk(1, 3), chunk(2, 0), finished(2, 1)]
    assert read(events)[1] == finished(2, 1)


def test_chunks_read_together_are_merged_and_an_unsent_older_attempt_is_no_restart():
    reader = ReplyReader(RID)
    r = reader.read_all([chunk(1, 0, "a", [1]), chunk(2, 0, "b", [2]), chunk(2, 1, "c", [3])])
    assert not r.restarted  # attempt 1's text never went out
    [c] = r.chunks
    assert c.text == "bc" and c.token_ids == [2, 3]
    r = reader.read_all([chunk(2, 2, "d"), finished(2, 3), chunk(2, 3, "late")])
    assert [c.text for c in r.chunks] == ["d"] and r.end == finished(2, 3)
    assert reader.ended and reader.read(chunk(2, 4)) == reader.read(finished(2, 5))


def test_merged_chunks_count_filtered_tokens():
    a = TokenChunk(request_id=RID, seq=0, text="x", n_tokens=2)
    b = TokenChunk(request_id=RID, seq=1, text="y", n_tokens=3)
    [c] = ReplyReader(RID).read_all([a, b]).chunks
    assert c.tokens == 5 and c.text == "xy"


def test_chunks_of_each_choice_merge_apart_with_their_logprobs():
    def lp(t: str) -> TokenLogprob:
        return TokenLogprob(token=t, logprob=-1.0)

    events = [
        TokenChunk(request_id=RID, seq=0, text="a", index=0, logprobs=[lp("a")]),
        TokenChunk(request_id=RID, seq=1, text="x", index=1, logprobs=[lp("x")]),
        TokenChunk(request_id=RID, seq=2, text="b", index=0, logprobs=[lp("b")]),
    ]
    r = ReplyReader(RID).read_all(events)
    assert [(c.index, c.text, [x.token for x in c.logprobs]) for c in r.chunks] == [
        (0, "ab", ["a", "b"]),
        (1, "x", ["x"]),
    ]


def test_a_reader_that_cannot_take_text_back_gets_a_retryable_interruption():
    reader = ReplyReader(RID)
    reader.read(chunk(1, 0))
    assert reader.read(chunk(2, 0)).restarted
    failed = reader.interrupted()
    assert failed.code == FailureCode.STREAM_INTERRUPTED and failed.retryable
    assert reader.ended


# -- a stream moved to another worker (a continuation) ------------------------------------


def test_a_continuation_goes_on_with_the_text_and_drops_the_replayed_chunk():
    # attempt 2 continues from seq 2, first sending attempt 1's last chunk again
    events = [
        chunk(1, 0),
        chunk(1, 1),
        chunk(2, 1, "a1s1 ", resumed=True),
        chunk(2, 2, resumed=True),
        finished(2, 3, resumed=True),
    ]
    text, end, restarted = read(events)
    assert (text, end, restarted) == ("a1s0 a1s1 a2s2 ", finished(2, 3, resumed=True), False)


def test_a_continuation_replays_the_chunk_the_reader_lost_with_the_worker():
    # the worker died between the scheduler's copy of seq 1 and the reader's
    events = [chunk(1, 0), chunk(2, 1, "a1s1 ", resumed=True), finished(2, 2, resumed=True)]
    reader = ReplyReader(RID)
    texts = [c.text for e in events for c in reader.read(e).chunks]
    assert texts == ["a1s0 ", "a1s1 "] and reader.lost == 0 and reader.resumed


def test_a_continuations_end_alone_ends_the_stream_whole():
    text, end, restarted = read([chunk(1, 0), chunk(1, 1), finished(2, 2, resumed=True)])
    assert (text, end, restarted) == ("a1s0 a1s1 ", finished(2, 2, resumed=True), False)


def test_a_continuation_from_where_the_reader_is_joins_and_from_behind_it_restarts():
    at = ReplyReader(RID)
    at.read(chunk(1, 0))
    assert not at.read(chunk(2, 0, resumed=True, resumed_from=1)).restarted and at.resumed
    ahead = ReplyReader(RID)
    ahead.read(chunk(1, 0))
    ahead.read(chunk(1, 1))  # the scheduler never had a copy of this one
    r = ahead.read(chunk(2, 0, resumed=True, resumed_from=1))
    assert r.restarted and r.interrupts and not ahead.resumed


def test_a_continuation_from_nothing_copied_restarts_a_reader_with_any_chunk():
    # the scheduler had no copy at all: no replay, the continuation's first chunk is seq 0
    empty = ReplyReader(RID)
    assert not empty.read(chunk(2, 0, resumed=True, resumed_from=0)).restarted
    assert empty.resumed
    holding = ReplyReader(RID)
    holding.read(chunk(1, 0))
    assert holding.read(chunk(2, 0, resumed=True, resumed_from=0)).restarted


def test_a_continuations_end_seen_first_is_checked_as_its_chunks_are():
    ahead = ReplyReader(RID)
    ahead.read(chunk(1, 0))
    ahead.read(chunk(1, 1))
    end = msgspec.structs.replace(finished(2, 3, resumed=True), resumed_from=1)
    r = ahead.read(end)
    assert r.restarted and isinstance(r.end, RequestFailed)
    assert r.end.code == FailureCode.STREAM_INTERRUPTED  # a restart that lacks the start


def test_a_restart_missing_the_start_of_the_text_ends_a_buffering_reader_interrupted():
    # a continuation from seq 2 (its replay is seq 1's copy), the reader holding seq 2
    # already: behind it, a restart, whose text lacks seq 0
    events = [chunk(1, 0), chunk(1, 1), chunk(1, 2), chunk(2, 1, resumed=True, resumed_from=2)]
    _, end, restarted = read([*events, finished(2, 3, resumed=True)])
    assert restarted
    assert isinstance(end, RequestFailed) and end.code == FailureCode.STREAM_INTERRUPTED


def test_a_restart_after_a_continuation_starts_over():
    reader = ReplyReader(RID)
    reader.read(chunk(1, 0))
    reader.read(chunk(2, 1, resumed=True))
    r = reader.read(chunk(3, 0))
    assert r.restarted and not reader.resumed and reader.next_seq == 1


# -- the docs example's port ------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "nats_client.py"


@pytest.fixture(scope="module")
def example_replies() -> type:
    spec = importlib.util.spec_from_file_location("nats_client_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Replies


EVENTS: list[ReplyEvent] = [
    chunk(1, 0),
    chunk(1, 1),
    chunk(2, 0),
    chunk(2, 2),
    finished(1, 2),
    finished(2, 3),
    RequestFailed(request_id=RID, code=FailureCode.WORKER_SHUTDOWN, reason="x", attempt=1),
    chunk(3, 2, resumed=True, resumed_from=3),
    chunk(3, 3, resumed=True, resumed_from=3),
    finished(3, 4, resumed=True),
    chunk(2, 3),  # past where attempt 3 goes on from: read first, attempt 3 restarts
]


def test_the_docs_example_reads_every_ordering_as_the_reader_does(example_replies):
    as_json = [msgspec.json.decode(msgspec.json.encode(ev)) for ev in EVENTS]
    for order in itertools.permutations(range(len(EVENTS)), 5):
        reader, port = ReplyReader(RID, whole=False), example_replies()
        for i in order:
            r = reader.read(EVENTS[i])
            action, restarted = port.read(as_json[i])
            expected = "end" if r.end else ("text" if r.chunks else "skip")
            assert (action, restarted) == (expected, r.restarted), (order, i)
            assert (port.attempt, port.lost) == (reader.attempt, reader.lost), (order, i)
            if r.end is not None:
                break


def test_a_merge_keeps_every_field_a_chunk_carries():
    """Replies that piled up are read as one chunk: the merge once kept text, ids and
    logprobs only, and a tool call streamed under load came out cut (found by the sim
    engine's tool calls through the gateway)."""
    from inferbus.contracts import TokenChunk, TokenLogprob, ToolCallDelta
    from inferbus.contracts.replies import merge_chunks

    a = TokenChunk(
        request_id="r",
        seq=0,
        text="x",
        token_ids=[1],
        logprobs=[TokenLogprob(token="x", logprob=-1.0)],
        tool_calls=[ToolCallDelta(index=0, id="c", name="f", arguments='{"a')],
        reasoning="think ",
        resumed=True,
        resumed_from=0,
    )
    b = TokenChunk(
        request_id="r",
        seq=1,
        text="y",
        token_ids=[2],
        logprobs=[TokenLogprob(token="y", logprob=-2.0)],
        tool_calls=[ToolCallDelta(index=0, arguments='": 1}')],
        reasoning="more",
    )
    merged = merge_chunks(a, b)
    for field in TokenChunk.__struct_fields__:
        if field in ("seq", "request_id", "attempt", "index", "resumed", "resumed_from"):
            assert getattr(merged, field) == getattr(a, field), field  # the first's
            continue
        assert getattr(merged, field) == getattr(a, field) + getattr(b, field), field
