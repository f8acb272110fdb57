"""Conformance with the official OpenAI Python SDK, a client no one here wrote:
sync and async, streaming and not, errors raised as the SDK's own exception types."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from testkit.simplatform import MODEL, SLOW_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say something about queues."},
]


@pytest.fixture
def sdk(platform) -> OpenAI:
    with OpenAI(base_url=platform["gateway"].base + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
async def asdk(platform):
    async with AsyncOpenAI(
        base_url=platform["gateway"].base + "/v1", api_key="unused", max_retries=0
    ) as c:
        yield c


def test_chat_non_stream(sdk: OpenAI):
    r = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, temperature=0.0, user="alice"
    )
    assert r.object == "chat.completion" and r.model == MODEL
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_stream_with_usage_matches_non_stream(sdk: OpenAI):
    whole = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=20, seed=3
    )
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=20,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.id == chunks[0].id for c in chunks)


def test_completions_stream_and_non_stream(sdk: OpenAI):
    r = sdk.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, stop=["\n"])
    assert r.object == "text_completion" and r.choices[0].text
    pieces = [
        c.choices[0].text
        for c in sdk.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=8, stop=["\n"], stream=True
        )
    ]
    assert "".join(pieces) == r.choices[0].text


def test_models_list(sdk: OpenAI):
    ids = {m.id for m in sdk.models.list()}
    assert {MODEL, SLOW_MODEL} <= ids


def test_errors_are_the_sdks_own_exceptions(sdk: OpenAI):
    with pytest.raises(openai.NotFoundError) as e:
        sdk.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=3.5)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, n=200)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:  # a vLLM field not served: by name
        sdk.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"use_beam_search": True}
        )
    assert (e.value.code, e.value.param) == ("unsupported_parameter", "use_beam_search")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=tools, tool_choice={"type": "function"}
        )
    assert e.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:  # a function that is not offered
        sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
    assert e.value.param == "tool_choice"
    offered = sdk.chat.completions.create(  # offered, not to be called: served anywhere
        model=MODEL, messages=MESSAGES, tools=tools, tool_choice="none", max_tokens=3
    )
    assert offered.choices[0].message.tool_calls in (None, [])
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=MODEL, messages=[])
    assert e.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as e:  # the sim model's context is 8192
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)
    assert e.value.code == "context_length_exceeded"


def test_request_id_header_round_trips(sdk: OpenAI):
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": "sdk-rid-1"}
    )
    assert raw.headers["x-request-id"] == "sdk-rid-1"
    assert raw.parse().id == "chatcmpl-sdk-rid-1"


def test_a_timeout_ends_the_request_with_504(sdk: OpenAI):
    with pytest.raises(openai.InternalServerError) as e:  # the SDK's type for any 5xx
        sdk.chat.completions.create(
            model=SLOW_MODEL,
            messages=MESSAGES,
            max_tokens=2000,
            extra_headers={"X-Request-Timeout": "0.5"},
        )
    assert e.value.status_code == 504 and e.value.code == "deadline_exceeded"


def test_a_timeout_mid_stream_ends_with_an_error_event(sdk: OpenAI):
    stream = sdk.chat.completions.create(
        model=SLOW_MODEL,
        messages=MESSAGES,
        max_tokens=2000,
        stream=True,
        extra_headers={"X-Request-Timeout": "2"},  # 100 of 2000 tokens, on a loaded machine some
    )
    got = 0
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
    assert got > 3  # tokens flowed, then the deadline cut them off
    assert "deadline" in str(e.value)


async def test_async_client_stream_and_non_stream(asdk: AsyncOpenAI):
    r = await asdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, seed=1)
    stream = await asdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, seed=1, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == r.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        await asdk.completions.create(model="nope", prompt="x")


def test_models_carry_vllm_s_fields_and_one_can_be_retrieved(sdk: OpenAI, platform):
    listed = {m.id: m for m in sdk.models.list().data}
    card = sdk.models.retrieve(MODEL)
    assert card.id == MODEL and card.created > 0
    assert card.model_extra["root"] == MODEL and card.model_extra["parent"] is None
    assert listed[MODEL].model_extra["root"] == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        sdk.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found"


def test_health_ping_and_version_answer_as_vllm_s_do(platform):
    base = platform["gateway"].base
    for path in ("/health", "/ping"):
        with urllib.request.urlopen(base + path) as r:
            assert r.status == 200
    with urllib.request.urlopen(base + "/version") as r:
        assert json.loads(r.read())["version"]


def test_a_batch_of_prompts_answers_each_prompt_s_choices_in_order(sdk: OpenAI):
    """LangChain's OpenAI.batch and vLLM's clients send a list of prompts; the gateway
    refused any list but one (400). Each prompt runs as a request of its own."""
    prompts = ["/echo alpha", "/echo beta", "/echo gamma"]
    done = sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=20, n=2)
    assert [c.index for c in done.choices] == list(range(6))
    texts = [c.text for c in done.choices]
    assert texts == ["alpha", "alpha", "beta", "beta", "gamma", "gamma"]
    single = sdk.completions.create(model=MODEL, prompt="/echo alpha", max_tokens=20)
    assert done.usage.prompt_tokens == 3 * single.usage.prompt_tokens
    assert done.usage.completion_tokens == 6 * single.usage.completion_tokens
    stream = sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=20, stream=True)
    got: dict[int, str] = {}
    ends = {}
    for chunk in stream:
        for c in chunk.choices:
            got[c.index] = got.get(c.index, "") + c.text
            if c.finish_reason:
                ends[c.index] = c.finish_reason
    assert got == {0: "alpha", 1: "beta", 2: "gamma"} and set(ends) == {0, 1, 2}


def test_a_failed_prompt_fails_its_batch(sdk: OpenAI):
    with pytest.raises(openai.BadRequestError) as e:  # one prompt over the context
        sdk.completions.create(model=MODEL, prompt=["/echo ok", "x " * 9000], max_tokens=20)
    assert e.value.code in ("context_length_exceeded", "prompt_too_long")


def test_the_sim_engine_calls_tools_for_scale_tests(sdk: OpenAI):
    """Tool traffic at the sim engine's speed: a forced call's arguments are a value of
    the function's schema, streamed as the deltas a real engine's are."""
    weather = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Oslo", "Lima"]},
                    "days": {"type": "integer", "minimum": 2},
                },
                "required": ["city", "days"],
            },
        },
    }
    whole = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[weather], tool_choice="required", max_tokens=64
    )
    call = whole.choices[0].message.tool_calls[0]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}
    streamed = sdk.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[weather],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        max_tokens=64,
        stream=True,
    )
    pieces = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert len(pieces) > 1 and pieces[0].function.name == "weather"
    assert json.loads("".join(d.function.arguments or "" for d in pieces)) == {
        "city": "Oslo",
        "days": 2,
    }
    auto = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[weather], max_tokens=4
    )
    assert auto.choices[0].message.content  # auto: text, as random weights write
