"""vLLM's OpenAI request surface through the bus, on the real engine with the tiny model:
structured outputs, logprobs, n, vLLM's sampling extensions and chat-template options,
sent as a client of vLLM's own server sends them (the official ``openai`` SDK,
unchanged, and plain NATS events)."""

from __future__ import annotations

import json
import re
from typing import Literal

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

import openai
from pydantic import BaseModel, Field
from testkit.procs import ServiceProcess

from inferbus.contracts import (
    ChatTemplateOptions,
    FunctionTool,
    StructuredOutput,
    ToolUse,
)
from inferbus.tinymodel import make_tiny

pytestmark = [
    pytest.mark.engine(seconds=60),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.usefixtures("platform"),
]

MODEL = "tiny-surface"
CHAT = [{"role": "user", "content": "Describe a person."}]


@pytest.fixture(scope="module")
def vllm_worker(nats_url, log_dir, tmp_path_factory):
    model = make_tiny(tmp_path_factory.mktemp("models") / MODEL)
    worker = ServiceProcess(
        "worker",
        nats_url,
        log_dir,
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--enforce-eager",
        "true",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "8",
        # JSON without free whitespace: a model with random weights cannot spend its
        # tokens on blank space (vLLM's engine-wide --structured-outputs-config option)
        "--structured-outputs-backend",
        "xgrammar",
        "--structured-outputs-disable-any-whitespace",
        "true",
        # tool calls in the Hermes format the tiny model's template shows them in
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "true",
        "--heartbeat-interval-s",
        "0.3",
        "--state-dir",
        str(log_dir / "vllm-surface-state"),
        name="vllm-surface-worker",
    )
    worker.start().wait_ready(timeout=300)
    yield worker
    assert worker.stop(timeout=60) == 0, worker.logs()


@pytest.fixture
async def sdk(vllm_worker, platform):
    async with openai.AsyncOpenAI(
        base_url=platform["gateway"].base + "/v1", api_key="x", max_retries=0
    ) as client:
        yield client


class Person(BaseModel):
    # a pattern, not max_length: xgrammar's rule for a length-bounded string admits raw
    # control characters (invalid JSON, which the SDK's parse() refuses; its pattern
    # rule does not), and random weights find them (1 seed in 3 since the tiny
    # model's vocabulary grew)
    name: str = Field(pattern=r"^[A-Za-z ]{1,8}$")
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad"]


async def test_parse_gives_a_document_of_the_schema(sdk):
    # the SDK's own helper: response_format from a pydantic model (strict json_schema),
    # the answer parsed back into it; random weights, yet the grammar holds it
    for seed in range(3):
        done = await sdk.chat.completions.parse(
            model=MODEL,
            messages=CHAT,
            response_format=Person,
            max_tokens=200,
            seed=seed,
        )
        person = done.choices[0].message.parsed
        assert isinstance(person, Person), done.choices[0].message.content


async def test_json_object_regex_and_choice_constrain_the_text(sdk):
    whole = await sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=300,
        response_format={"type": "json_object"},
        seed=1,
    )
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(whole.choices[0].message.content), dict)
    regex = await sdk.completions.create(
        model=MODEL,
        prompt="Phone:",
        max_tokens=30,
        extra_body={"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", regex.choices[0].text)
    pick = await sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert pick.choices[0].message.content in ("yes", "no", "maybe")


async def test_two_constraints_are_refused_by_name(sdk):
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=3,
            extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}},
        )
    assert e.value.body["param"] == "structured_outputs"


async def test_chat_logprobs_with_alternatives_streamed_and_whole(sdk):
    args = dict(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        temperature=0.0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    whole = await sdk.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert len(content) == 8
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the token chosen is the most likely one (random weights tie often)
        assert t.logprob >= tops[0] - 1e-3
        assert bytes(t.bytes) == t.token.encode()
    streamed = [
        t
        async for chunk in await sdk.chat.completions.create(**args, stream=True)
        for choice in chunk.choices
        if choice.logprobs is not None
        for t in choice.logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


async def test_completion_logprobs_in_the_legacy_form(sdk):
    done = await sdk.completions.create(
        model=MODEL,
        prompt="def main():",
        max_tokens=6,
        temperature=0.0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == done.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    assert all(len(top) >= 2 for top in lp.top_logprobs)


async def test_n_choices_sampled_apart_in_one_request(sdk):
    done = await sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=12,
        n=3,
        seed=5,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in done.choices] == [0, 1, 2]
    texts = {c.message.content for c in done.choices}
    assert len(texts) == 3
    assert all(c.finish_reason == "length" for c in done.choices)
    assert done.usage.completion_tokens == 36
    chunks = await sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=12,
        n=2,
        seed=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    by_index: dict[int, str] = {}
    ends = {}
    async for chunk in chunks:
        for c in chunk.choices:
            by_index[c.index] = by_index.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                ends[c.index] = c.finish_reason
    assert set(by_index) == {0, 1} and ends == {0: "length", 1: "length"}


async def test_vllm_sampling_extensions_change_the_output(sdk):
    # min_tokens: no early end; allowed_token_ids and logit_bias: which tokens come
    base = dict(model=MODEL, prompt="Hello", max_tokens=8, temperature=0.0)
    pinned = await sdk.completions.create(
        **base, logprobs=0, extra_body={"allowed_token_ids": [42], "ignore_eos": True}
    )
    first = pinned.choices[0].logprobs.tokens
    assert len(set(first)) == 1
    biased = await sdk.completions.create(
        **base, logit_bias={"43": 100}, logprobs=0, extra_body={"ignore_eos": True}
    )
    assert len(set(biased.choices[0].logprobs.tokens)) == 1
    assert biased.choices[0].logprobs.tokens != first
    floor = await sdk.completions.create(**base, extra_body={"min_tokens": 8})
    assert floor.usage.completion_tokens == 8


async def test_chat_template_options_change_the_prompt(vllm_worker, client):
    history = [*CHAT, {"role": "assistant", "content": "A person"}]
    opened = await client.generate(MODEL, messages=history, max_tokens=2, ignore_eos=True)
    continued = await client.generate(
        MODEL,
        messages=history,
        max_tokens=2,
        ignore_eos=True,
        chat_template=ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True),
    )
    # continuing leaves the assistant's turn open: no end marker, no new turn opened
    assert continued.outcome.usage.prompt_tokens < opened.outcome.usage.prompt_tokens


async def test_an_agent_s_history_with_tool_calls_is_taken(sdk):
    # the second turn of an agent: the assistant's call and the tool's answer
    history = [
        *CHAT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "person"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Ada, 36"},
    ]
    done = await sdk.chat.completions.create(model=MODEL, messages=history, max_tokens=4)
    assert done.choices[0].finish_reason in ("stop", "length")
    # and with the tools offered, as an agent's loop sends it (the call rendered back
    # into the prompt: more prompt tokens than without the tools)
    offered = await sdk.chat.completions.create(
        model=MODEL, messages=history, max_tokens=4, tools=[openai.pydantic_function_tool(Lookup)]
    )
    assert offered.usage.prompt_tokens > done.usage.prompt_tokens


async def test_structured_outputs_over_nats(vllm_worker, client):
    done = await client.generate(
        MODEL,
        "Answer:",
        max_tokens=10,
        n=2,
        logprobs=1,
        structured=StructuredOutput(choice=["left", "right"]),
    )
    assert done.outcome.finish_reason == "stop"
    assert {done.choice_text(0), done.choice_text(1)} <= {"left", "right"}
    # the end-of-sequence token has a logprob too, though its text is not shown
    assert "".join(lp.token for lp in done.logprobs).startswith(done.text)


async def test_a_prompt_of_token_ids_runs_as_given(vllm_worker, client, sdk):
    ids = [5, 17, 42, 99, 7]
    done = await client.generate(
        MODEL, token_prompt=ids, max_tokens=4, ignore_eos=True, input_policy="off"
    )
    assert done.outcome.usage.prompt_tokens == len(ids)
    assert done.outcome.usage.completion_tokens == 4
    # over HTTP the fixture's sanitizer has no tokenizer to check them with (up gives it
    # one for its model): refused by name rather than passed unread
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.completions.create(model=MODEL, prompt=ids, max_tokens=2)
    assert e.value.body["param"] == "prompt" and "no tokenizer" in e.value.message


async def test_langchain_structured_output_runs_unchanged(vllm_worker, platform):
    """LangChain's ChatOpenAI, as an application writes it: with_structured_output by
    JSON Schema (response_format), by JSON mode and by function calling, and
    bind_tools."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=platform["gateway"].base + "/v1",
        api_key="x",
        max_retries=0,
        max_tokens=200,
        temperature=0.0,
    )
    person = await llm.with_structured_output(Person, method="json_schema").ainvoke(
        "Describe a person."
    )
    assert isinstance(person, Person)
    # by function calling: a forced call of the schema as a tool; strict, as on vLLM's
    # server, is what makes the engine hold the arguments to the schema (a tool that is
    # not strict has its call's format enforced, its arguments free)
    called = await llm.with_structured_output(
        Person, method="function_calling", strict=True
    ).ainvoke("Describe a person.")
    assert isinstance(called, Person)
    message = await llm.bind_tools(
        [Weather], tool_choice="required", strict=True, parallel_tool_calls=False
    ).ainvoke("Weather?")
    assert [c["name"] for c in message.tool_calls][:1] == ["Weather"]
    Weather.model_validate(message.tool_calls[0]["args"])
    # JSON mode bounds nothing: random weights write an object that does not end in
    # 200 tokens for most seeds (greedy too); this seed's ends
    sampled = ChatOpenAI(
        model=MODEL,
        base_url=platform["gateway"].base + "/v1",
        api_key="x",
        max_retries=0,
        max_tokens=200,
        temperature=1.0,
        seed=1,
    )
    raw = await sampled.with_structured_output(None, method="json_mode").ainvoke(
        "Describe a person as JSON."
    )
    assert isinstance(raw, dict)


class Weather(BaseModel):
    """The weather in a city."""

    city: Literal["Paris", "Oslo", "Lima"]
    days: int = Field(ge=1, le=7)


class Lookup(BaseModel):
    q: str = Field(pattern=r"^[a-z ]{1,12}$")  # a pattern: see Person


TOOLS = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Lookup)]


def _args_fit(call) -> None:
    """The arguments are a JSON object of the tool's schema. Read as Python's json reads
    by default (strict=False, as LangChain does): the structural tag that vLLM's hermes
    parser asks xgrammar for lets a raw control character into a string now and then
    (3 of 30 seeds with random weights), which strict JSON readers refuse."""
    model = {"Weather": Weather, "Lookup": Lookup}[call.function.name]
    model.model_validate(json.loads(call.function.arguments, strict=False))


async def test_required_and_named_tools_give_calls_of_the_schemas(sdk):
    """Decoded under the parser's constraint (the tools' schemas in Hermes' call
    format): random weights, yet every call names an offered tool with valid
    arguments, as on vLLM's server."""
    for seed in range(2):
        done = await sdk.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            tools=TOOLS,
            tool_choice="required",
            # one call: with parallel calls allowed, random weights call on and on
            parallel_tool_calls=False,
            max_tokens=300,
            seed=seed,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls and choice.message.content in (None, "")
        for call in choice.message.tool_calls:
            assert call.id and call.type == "function"
            _args_fit(call)
    named = await sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        parallel_tool_calls=False,
        max_tokens=300,
        seed=2,
    )
    choice = named.choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's rule for a named function
    assert [c.function.name for c in choice.message.tool_calls] == ["Weather"]
    _args_fit(choice.message.tool_calls[0])


async def test_streamed_tool_calls_join_into_the_same_calls(sdk):
    asked = dict(
        model=MODEL,
        messages=CHAT,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
        seed=3,
    )
    whole = await sdk.chat.completions.create(**asked)
    stream = await sdk.chat.completions.create(**asked, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or d.id
                if d.function is not None:
                    call["name"] = call["name"] or d.function.name
                    call["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    expected = [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls
    ]
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == expected
    assert all(c["id"] for c in calls.values())


async def test_the_sdk_parses_strict_tool_arguments(sdk):
    # no free string in Weather's schema: the arguments are strict JSON (see _args_fit)
    done = await sdk.chat.completions.parse(
        model=MODEL,
        messages=CHAT,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
    )
    call = done.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Weather)


async def test_auto_lets_the_model_answer_in_text(sdk):
    # random weights do not write <tool_call>: the answer is text, the request served
    done = await sdk.chat.completions.create(
        model=MODEL, messages=CHAT, tools=TOOLS, max_tokens=8, seed=0
    )
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls


async def test_an_agent_loop_over_the_responses_api(sdk):
    """The Responses API as an agent runs it: a forced call of a function tool, its
    output sent back by previous_response_id, then the answer."""
    weather = openai.pydantic_function_tool(Weather)["function"]
    tool = {"type": "function", **weather}
    first = await sdk.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["Weather"]
    Weather.model_validate_json(calls[0].arguments)
    second = await sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        tools=[tool],
        max_output_tokens=4,
    )
    assert second.status in ("completed", "incomplete")
    assert second.usage.input_tokens > first.usage.input_tokens


async def test_a_prompt_is_scored_as_lm_eval_scores_it(sdk):
    """Loglikelihood as lm-evaluation-harness asks for it: echo, logprobs, max_tokens 0
    (the prompt's own tokens and logprobs, nothing generated); and the logprobs a
    prompt's tokens get are those the same tokens got when the engine wrote them."""
    written = await sdk.completions.create(
        model=MODEL, prompt="def main():", max_tokens=6, temperature=0.0, logprobs=0
    )
    text = written.choices[0].text
    scored = await sdk.completions.create(
        model=MODEL, prompt="def main():" + text, max_tokens=0, echo=True, logprobs=1
    )
    choice = scored.choices[0]
    lp = choice.logprobs
    assert choice.text == "def main():" + text  # the prompt alone
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    gen = written.choices[0].logprobs
    if lp.tokens[-len(gen.tokens) :] == gen.tokens:  # the text tokenized back the same
        assert lp.token_logprobs[-len(gen.tokens) :] == pytest.approx(gen.token_logprobs, abs=1e-3)
    # vLLM's prompt_logprobs field: the same numbers, by token id
    raw = await sdk.completions.create(
        model=MODEL,
        prompt="def main():" + text,
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    prompt = raw.choices[0].model_extra["prompt_logprobs"]
    assert prompt[0] is None and len(prompt) == len(lp.tokens)
    # with 0 alternatives each entry holds the prompt's own token only
    chosen = [next(iter(entry.values()))["logprob"] for entry in prompt[1:]]
    assert chosen == pytest.approx(lp.token_logprobs[1:], abs=1e-4)


async def test_tools_over_nats_with_the_python_client(vllm_worker, client):
    weather = openai.pydantic_function_tool(Weather)["function"]
    tools = ToolUse(
        tools=[FunctionTool(**weather)], choice="function", function="Weather", parallel=False
    )
    done = await client.generate(
        MODEL, messages=CHAT, tools=tools, max_tokens=300, input_policy="off"
    )
    calls = done.tool_calls()
    assert [c.function.name for c in calls] == ["Weather"] and calls[0].id
    Weather.model_validate(json.loads(calls[0].function.arguments, strict=False))
    assert done.outcome.choice_ends()[0].finish_reason == "stop"  # a named call
