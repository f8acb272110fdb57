"""OpenAI's Responses API through the bus, as the official SDK calls it: created whole
and streamed, stored in JetStream KV and continued by ``previous_response_id`` from
any gateway, read back and deleted; what it cannot honour refused by name."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI
from testkit.simplatform import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]


@pytest.fixture
def sdk(platform) -> OpenAI:
    with OpenAI(base_url=platform["gateway"].base + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_create_gives_a_response_with_its_text_and_usage(sdk: OpenAI):
    r = sdk.responses.create(
        model=MODEL, input="Say something about queues.", max_output_tokens=12, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text and r.output[0].type == "message"
    assert r.output[0].content[0].type == "output_text"
    # max_output_tokens reached: incomplete, and says why
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 12
    assert r.usage.total_tokens == r.usage.input_tokens + 12


def test_the_stream_spells_the_same_response(sdk: OpenAI):
    asked = dict(model=MODEL, input="Tell a story.", max_output_tokens=16, temperature=0)
    whole = sdk.responses.create(**asked, store=False)
    events = list(sdk.responses.create(**asked, store=False, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete"
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == whole.output_text


def test_a_stored_response_is_continued_read_back_and_deleted(sdk: OpenAI):
    first = sdk.responses.create(
        model=MODEL, input="My name is Ada.", instructions="Be brief.", max_output_tokens=5
    )
    again = sdk.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    # the next turn runs after the stored conversation: its prompt holds the first turn
    second = sdk.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=5
    )
    alone = sdk.responses.create(
        model=MODEL, input="What is my name?", max_output_tokens=5, store=False
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > alone.usage.input_tokens
    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        sdk.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"
    # store=False: nothing to read back
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(alone.id)


def test_function_call_items_go_back_as_the_agent_s_history(sdk: OpenAI):
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    r = sdk.responses.create(model=MODEL, input=history, max_output_tokens=4, store=False)
    assert r.status in ("completed", "incomplete")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content[0].type"),
        ({"temperature": 5}, "temperature"),  # the chat path's ranges hold
        ({"max_output_tokens": 0}, None),
    ],
)  # fmt: skip
def test_what_it_cannot_honour_is_refused_by_name(sdk: OpenAI, fields, param):
    body = {"model": MODEL, "input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as e:
        sdk.post("/responses", body=body, cast_to=object)
    if param is not None:
        assert e.value.body["param"] == param
