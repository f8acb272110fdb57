"""The Responses API's core, without a broker: a body read as the chat body it runs as
(input items as messages, tools and formats in their chat forms, the stored turn
before it), and the answer as a Response, its stream of events and its record."""

from __future__ import annotations

import json

import msgspec
import pytest

from inferbus.contracts import ChoiceEnd, RequestFinished, TokenChunk, ToolCallDelta, Usage
from inferbus.services.gateway.errors import ApiError
from inferbus.services.gateway.responses import ResponseShapes, StoredResponse, read_turn
from inferbus.services.gateway.shapes import Answer


def turn(earlier: StoredResponse | None = None, **fields):
    return read_turn(json.dumps({"model": "m", "input": "hi", **fields}).encode(), earlier)


def test_items_become_chat_messages_and_instructions_a_system_message():
    t = turn(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "w"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        max_output_tokens=9,
        reasoning={"effort": "low"},
    )
    chat = t.chat
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["messages"][1] == {"role": "user", "content": "Weather?"}
    calls = chat["messages"][2]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]  # one assistant turn, two calls
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert len(chat["messages"]) == 4
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert chat["max_completion_tokens"] == 9 and chat["reasoning_effort"] == "low"
    assert "input" not in chat and "instructions" not in chat
    assert t.messages == chat["messages"][1:]  # a record keeps no instructions


def test_a_stored_turn_goes_before_the_new_input():
    earlier = StoredResponse(
        response={},
        messages=[
            {"role": "user", "content": "I am Ada."},
            {"role": "assistant", "content": "Hi Ada."},
        ],
    )
    t = turn(earlier, input="Who am I?", previous_response_id="resp_1")
    assert [m["content"] for m in t.chat["messages"]] == ["I am Ada.", "Hi Ada.", "Who am I?"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"background": True}, "background"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_what_is_not_served_is_refused_by_name(fields, param):
    with pytest.raises(ApiError) as e:
        turn(**fields)
    assert (e.value.status, e.value.param) == (400, param)


FIN = RequestFinished(
    request_id="r",
    finish_reason="stop",
    usage=Usage(prompt_tokens=7, completion_tokens=5, cached_prompt_tokens=3),
    chunks=3,
    choices=[ChoiceEnd(index=0, finish_reason="tool_calls")],
)
CHUNKS = [
    TokenChunk(request_id="r", seq=0, text="", reasoning="Need it."),
    TokenChunk(request_id="r", seq=1, text="Checking."),
    TokenChunk(
        request_id="r",
        seq=2,
        text="",
        tool_calls=[ToolCallDelta(index=0, id="call_9", name="w", arguments='{"city":')],
    ),
    TokenChunk(
        request_id="r", seq=3, text="", tool_calls=[ToolCallDelta(index=0, arguments=' "Oslo"}')]
    ),
]


def events_of(stream: bytes) -> list[dict]:
    out = []
    for block in stream.decode().split("\n\n"):
        if block:
            kind, data = block.split("\n")
            body = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {body['type']}"
            out.append(body)
    return out


def test_the_stream_and_the_whole_answer_are_the_same_response():
    streamed = ResponseShapes(request_id="r", model="m", created=1, turn=turn())
    raw = streamed.opening() + b"".join(streamed.chunk_event(c) for c in CHUNKS)
    raw += streamed.end_events(FIN)
    events = events_of(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    args = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(args) == '{"city": "Oslo"}'
    assert any(e["type"] == "response.reasoning_text.delta" for e in events)

    whole = ResponseShapes(request_id="r", model="m", created=1, turn=turn())
    answer = Answer()
    for c in CHUNKS:
        answer.add(c)
    response = whole.complete(answer, FIN)
    assert events[-1]["response"] == response
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call"]
    call = response["output"][2]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_9", "w", '{"city": "Oslo"}')
    assert response["status"] == "completed"
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 3}


def test_the_record_holds_the_turn_and_its_answer_for_the_next():
    shapes = ResponseShapes(request_id="r", model="m", created=1, turn=turn(input="Weather?"))
    answer = Answer()
    for c in CHUNKS:
        answer.add(c)
    shapes.complete(answer, FIN)
    record = shapes.record()
    assert record is not None
    assert msgspec.json.decode(msgspec.json.encode(record), type=StoredResponse) == record
    assert record.messages[0] == {"role": "user", "content": "Weather?"}
    assert record.messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "w", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    unstored = ResponseShapes(request_id="r", model="m", created=1, turn=turn(store=False))
    unstored.complete(Answer(), FIN)
    assert unstored.record() is None
