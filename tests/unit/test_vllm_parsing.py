"""The worker's chat-answer parsing on vLLM's real parsers (hermes tool calls) and the
tiny model's tokenizer, fed model output as the engine would stream it: tool calls come
out as pieces whose arguments join into the call, text around them stays text, and
the finish reason follows OpenAI's rule. A model that writes a tool call cannot be
had from random weights, so these texts stand in for it (the engine tests run the
constrained choices, required and named, on the real engine)."""

from __future__ import annotations

import json

import pytest

from inferbus.contracts import (
    ChatMessage,
    FunctionTool,
    SamplingParams,
    ToolCallDelta,
    ToolUse,
)
from inferbus.services.worker.engine import EngineError, EngineOptions, EngineRequest
from inferbus.shared.prompttokens import load_tokenizer, prompt_token_ids
from inferbus.tinymodel import build_tokenizer

pytest.importorskip("vllm")

from inferbus.services.worker.vllm_parsing import (
    ChatParsing,
    parser_class,
    refuse_tools,
)

WEATHER = FunctionTool(
    name="get_weather",
    description="The weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
TIME = FunctionTool(name="get_time", parameters={"type": "object", "properties": {}})
HERMES = EngineOptions(model="tiny", tool_call_parser="hermes", enable_auto_tool_choice=True)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out, 2048, 2048)
    return load_tokenizer(str(out))


def _parsing(tokenizer, tools: ToolUse, options: EngineOptions = HERMES) -> ChatParsing:
    messages = [ChatMessage(role="user", content="What is the weather in Paris?")]
    request = EngineRequest(
        request_id="r1", model="tiny", messages=messages, tools=tools, sampling=SamplingParams()
    )
    ids = prompt_token_ids(tokenizer, None, messages, None, tools)
    return ChatParsing(parser_class(options, tokenizer), tokenizer, request, ids)


def _stream(parsing: ChatParsing, tokenizer, text: str, index: int = 0, piece: int = 3):
    """Feed ``text`` a few tokens at a time, as the engine's outputs come."""
    ids = tokenizer.encode(text)
    texts, reasoning, calls = [], [], []
    for at in range(0, len(ids), piece):
        part = ids[at : at + piece]
        text_of = tokenizer.decode(part, skip_special_tokens=True)  # as the engine shows it
        out = parsing.feed(index, text_of, part, at + piece >= len(ids))
        texts.append(out.text)
        reasoning.append(out.reasoning)
        calls += out.tool_calls
    return "".join(texts), "".join(reasoning), calls


def _joined(calls: list[ToolCallDelta]) -> list[dict]:
    """The calls the deltas spell, as a client's accumulator joins them."""
    out: dict[int, dict] = {}
    for c in calls:
        call = out.setdefault(c.index, {"id": None, "name": None, "arguments": ""})
        call["id"] = call["id"] or c.id
        call["name"] = call["name"] or c.name
        call["arguments"] += c.arguments
    return [out[i] for i in sorted(out)]


def test_auto_takes_calls_out_of_the_text_and_ends_tool_calls(tokenizer):
    parsing = _parsing(tokenizer, ToolUse(tools=[WEATHER, TIME]))
    text, _, calls = _stream(
        parsing,
        tokenizer,
        'Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 2}}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    )
    assert text.strip() == "Let me look."
    joined = _joined(calls)
    assert [c["name"] for c in joined] == ["get_weather", "get_time"]
    assert json.loads(joined[0]["arguments"]) == {"city": "Paris", "days": 2}
    assert json.loads(joined[1]["arguments"]) == {}
    assert all(c["id"] for c in joined) and joined[0]["id"] != joined[1]["id"]
    assert parsing.finish_reason(0, "stop") == "tool_calls"
    assert parsing.finish_reason(0, "length") == "length"


def test_auto_without_a_call_is_plain_text_ending_stop(tokenizer):
    parsing = _parsing(tokenizer, ToolUse(tools=[WEATHER]))
    text, _, calls = _stream(parsing, tokenizer, "It is sunny in Paris today, I think.")
    assert text == "It is sunny in Paris today, I think." and calls == []
    assert parsing.finish_reason(0, "stop") == "stop"


def test_each_choice_is_parsed_on_its_own(tokenizer):
    parsing = _parsing(tokenizer, ToolUse(tools=[WEATHER]))
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    _, _, first = _stream(parsing, tokenizer, call, index=0)
    text, _, second = _stream(parsing, tokenizer, "No call here.", index=1)
    assert _joined(first)[0]["name"] == "get_weather" and second == []
    assert text == "No call here."
    assert parsing.finish_reason(0, "stop") == "tool_calls"
    assert parsing.finish_reason(1, "stop") == "stop"


def test_required_constrains_to_the_tools_schemas_and_reads_the_json(tokenizer):
    parsing = _parsing(tokenizer, ToolUse(tools=[WEATHER, TIME], choice="required"))
    constraint = parsing.constraint
    assert constraint is not None
    # hermes asks for its structural tag (calls in its own <tool_call> format) where
    # strict tool calling is on, else the JSON array of {name, parameters}
    assert constraint.structural_tag is not None or constraint.json is not None
    shown = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
        if constraint.structural_tag is not None
        else '[{"name": "get_weather", "parameters": {"city": "Rome"}}]'
    )
    text, _, calls = _stream(parsing, tokenizer, shown)
    joined = _joined(calls)
    assert [c["name"] for c in joined] == ["get_weather"]
    assert json.loads(joined[0]["arguments"]) == {"city": "Rome"}
    assert not text.strip()
    assert parsing.finish_reason(0, "stop") == "tool_calls"


def test_a_named_function_ends_stop(tokenizer):
    parsing = _parsing(
        tokenizer, ToolUse(tools=[WEATHER, TIME], choice="function", function="get_weather")
    )
    assert parsing.constraint is not None
    shown = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>'
        if parsing.constraint.structural_tag is not None
        else '{"city": "Lima"}'
    )
    _, _, calls = _stream(parsing, tokenizer, shown)
    joined = _joined(calls)
    assert joined[0]["name"] == "get_weather"
    assert json.loads(joined[0]["arguments"]) == {"city": "Lima"}
    assert parsing.finish_reason(0, "stop") == "stop"


def test_tools_need_a_parser_as_on_vllms_server():
    none = ToolUse(tools=[WEATHER], choice="none")
    refuse_tools(none, EngineOptions())  # offered, not callable: any worker
    for choice, options, needs in [
        ("required", EngineOptions(), "--tool-call-parser"),
        ("auto", EngineOptions(), "--tool-call-parser"),
        ("auto", EngineOptions(tool_call_parser="hermes"), "--enable-auto-tool-choice"),
    ]:
        with pytest.raises(EngineError, match=needs) as err:
            refuse_tools(ToolUse(tools=[WEATHER], choice=choice), options)
        assert err.value.code == "unsupported_by_engine"
    refuse_tools(
        ToolUse(tools=[WEATHER], choice="required"), EngineOptions(tool_call_parser="hermes")
    )


def test_an_unknown_parser_is_refused_at_start(tokenizer):
    with pytest.raises(Exception, match="nope"):
        parser_class(EngineOptions(tool_call_parser="nope"), tokenizer)
    with pytest.raises(ValueError, match="--tool-call-parser"):
        parser_class(EngineOptions(enable_auto_tool_choice=True), tokenizer)
    assert parser_class(EngineOptions(), tokenizer) is None


def test_reasoning_streams_apart_from_the_answer(tokenizer):
    options = EngineOptions(model="tiny", reasoning_parser="deepseek_r1")
    messages = [ChatMessage(role="user", content="2+2?")]
    request = EngineRequest(request_id="r", model="tiny", messages=messages)
    ids = prompt_token_ids(tokenizer, None, messages)
    parsing = ChatParsing(parser_class(options, tokenizer), tokenizer, request, ids)
    text, reasoning, calls = _stream(
        parsing, tokenizer, "<think>Two and two make four.</think>It is 4.", piece=1
    )
    assert reasoning == "Two and two make four."
    assert text == "It is 4." and calls == []
    assert parsing.finish_reason(0, "stop") == "stop"


def test_reasoning_and_tool_calls_from_one_answer(tokenizer):
    options = EngineOptions(
        model="tiny",
        reasoning_parser="deepseek_r1",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
    )
    parsing = _parsing(tokenizer, ToolUse(tools=[WEATHER]), options)
    _, reasoning, calls = _stream(
        parsing,
        tokenizer,
        '<think>Need the weather.</think><tool_call>{"name": "get_weather", '
        '"arguments": {"city": "Oslo"}}</tool_call>',
        piece=1,  # a token a step, as the engine streams (vLLM's parsers expect it)
    )
    assert reasoning == "Need the weather."
    assert json.loads(_joined(calls)[0]["arguments"]) == {"city": "Oslo"}
