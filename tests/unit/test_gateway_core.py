"""Gateway decisions: OpenAI body parsing, error mapping, response shapes, model registry."""

from __future__ import annotations

import json

import msgspec
import pytest

from inferbus.contracts import (
    ChatMessage,
    ChoiceEnd,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestRejected,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    WorkerHeartbeat,
)
from inferbus.services.gateway.admission import ModelRegistry
from inferbus.services.gateway.errors import ApiError, error_for
from inferbus.services.gateway.shapes import Answer, Shapes
from inferbus.services.gateway.torequest import (
    echoed,
    parse_chat,
    parse_completion,
    submitted,
    tool_use,
)


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


USER = [{"role": "user", "content": "Hi"}]


def api_error(fn, raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(raw, 16)
    return info.value


# -- parse_chat -------------------------------------------------------------------------


def test_chat_with_string_content():
    req, sampling, messages = parse_chat(
        body(
            model="m",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi", "name": "bob"},
            ],
        ),
        16,
    )
    assert req.model == "m"
    assert req.stream is False
    assert messages == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi", name="bob"),
    ]
    assert sampling.max_tokens == 16  # the default given by the caller
    assert sampling.stop == []
    assert sampling.temperature == 1.0 and sampling.top_p == 1.0


def test_chat_with_list_of_text_parts():
    _, _, messages = parse_chat(
        body(
            model="m",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hello, "},
                        {"type": "text", "text": "world"},
                    ],
                }
            ],
        ),
        16,
    )
    assert messages == [ChatMessage(role="user", content="Hello, world")]


def test_chat_null_content_is_empty():
    _, _, messages = parse_chat(
        body(model="m", messages=[{"role": "assistant", "content": None}]), 16
    )
    assert messages[0].content == ""


def test_chat_max_tokens_is_used():
    _, sampling, _ = parse_chat(body(model="m", messages=USER, max_tokens=7), 16)
    assert sampling.max_tokens == 7


def test_chat_max_completion_tokens_wins_over_max_tokens():
    _, sampling, _ = parse_chat(
        body(model="m", messages=USER, max_tokens=7, max_completion_tokens=9), 16
    )
    assert sampling.max_tokens == 9
    _, sampling, _ = parse_chat(body(model="m", messages=USER, max_completion_tokens=3), 16)
    assert sampling.max_tokens == 3


def test_chat_sampling_fields_pass_through():
    req, sampling, _ = parse_chat(
        body(
            model="m",
            messages=USER,
            temperature=0.2,
            top_p=0.5,
            seed=42,
            stream=True,
            stream_options={"include_usage": True},
        ),
        16,
    )
    assert (sampling.temperature, sampling.top_p, sampling.seed) == (0.2, 0.5, 42)
    assert req.stream is True
    assert req.stream_options is not None and req.stream_options.include_usage is True


def test_stop_as_string_and_as_list():
    _, sampling, _ = parse_chat(body(model="m", messages=USER, stop="END"), 16)
    assert sampling.stop == ["END"]
    _, sampling, _ = parse_chat(body(model="m", messages=USER, stop=["a", "b"]), 16)
    assert sampling.stop == ["a", "b"]
    _, sampling, _ = parse_completion(body(model="m", prompt="p", stop="\n"), 16)
    assert sampling.stop == ["\n"]


def test_stop_sequences_are_bounded_past_openai_s_four():
    # vLLM takes more than OpenAI's 4; a bound stays (each one holds text back)
    _, sampling, _ = parse_chat(body(model="m", messages=USER, stop=list("abcde")), 16)
    assert sampling.stop == list("abcde")
    e = api_error(parse_chat, body(model="m", messages=USER, stop=["x"] * 65))
    assert (e.status, e.param) == (400, "stop")


def test_malformed_json():
    for raw in (b"{bad", b'{"model": "m",', b"nope"):
        e = api_error(parse_chat, raw)
        assert e.status == 400
        assert e.code == "invalid_json"
        assert e.body()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("raw", [b"", b"   \n"])
def test_empty_body(raw):
    e = api_error(parse_chat, raw)
    assert (e.status, e.code) == (400, "invalid_json")
    e = api_error(parse_completion, raw)
    assert (e.status, e.code) == (400, "invalid_json")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"model": 3, "messages": USER}, "model"),
        ({"model": "m", "messages": "Hi"}, "messages"),
        ({"model": "m", "messages": USER, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": USER, "max_tokens": "many"}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ],
)
def test_wrong_types_name_the_field(fields, param):
    e = api_error(parse_chat, json.dumps(fields).encode())
    assert e.status == 400
    assert e.param == param
    assert e.type == "invalid_request_error"
    assert e.body()["error"]["param"] == param


def test_wrong_type_in_completion_names_the_field():
    e = api_error(parse_completion, body(model="m", prompt=12))
    assert (e.status, e.param) == (400, "prompt")


def test_missing_required_field_names_the_field():
    e = api_error(parse_chat, body(model="m"))
    assert e.status == 400
    assert e.param == "messages"


def test_non_object_body_is_400():
    e = api_error(parse_chat, b"[]")
    assert e.status == 400


def test_empty_messages():
    e = api_error(parse_chat, body(model="m", messages=[]))
    assert (e.status, e.param) == (400, "messages")


@pytest.mark.parametrize(
    "fn, fields",
    [
        (parse_chat, {"model": "m", "messages": USER, "n": 2}),
        (parse_completion, {"model": "m", "prompt": "p", "n": 2}),
    ],
)
def test_n_choices_are_taken_within_openai_s_bound(fn, fields):
    _, sampling, _ = fn(json.dumps(fields).encode(), 16)
    assert sampling.n == 2 and sampling.output_tokens == 32
    for n in (0, 129):
        e = api_error(fn, json.dumps({**fields, "n": n}).encode())
        assert (e.status, e.param, e.code) == (400, "n", "invalid_value")


def test_unknown_content_part_type():
    e = api_error(
        parse_chat,
        body(
            model="m",
            messages=[
                {"role": "user", "content": "ok"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            ],
        ),
    )
    assert e.status == 400
    assert e.param.startswith("messages[1].content")
    assert "image_url" in e.message


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_values(fields, param):
    e = api_error(parse_chat, body(model="m", messages=USER, **fields))
    assert (e.status, e.param, e.code) == (400, param, "invalid_value")


# -- parse_completion -------------------------------------------------------------------


def test_completion_with_string_prompt():
    req, sampling, prompts = parse_completion(body(model="m", prompt="Once", max_tokens=5), 16)
    assert (req.model, prompts, sampling.max_tokens) == ("m", ["Once"], 5)


def test_completion_default_max_tokens():
    _, sampling, _ = parse_completion(body(model="m", prompt="Once"), 33)
    assert sampling.max_tokens == 33


def test_completion_with_a_batch_of_prompts():
    _, _, prompts = parse_completion(body(model="m", prompt=["Once"]), 16)
    assert prompts == ["Once"]
    _, _, prompts = parse_completion(body(model="m", prompt=["a", "b", "c"]), 16)
    assert prompts == ["a", "b", "c"]


def test_completion_prompts_as_token_ids_one_or_a_batch():
    _, _, prompts = parse_completion(body(model="m", prompt=[1, 2, 3]), 16)
    assert prompts == [[1, 2, 3]]
    _, _, prompts = parse_completion(body(model="m", prompt=[[1, 2], "text", [3]]), 16)
    assert prompts == [[1, 2], "text", [3]]
    ev = submitted(
        request_id="r", model="m", reply_to="x", sampling=SamplingParams(), now=0.0, prompt=[5]
    )
    assert ev.token_prompt == [5] and ev.prompt is None


@pytest.mark.parametrize("prompts", [[], ["a"] * 257, [1, "a"], [[]], [-1]])
def test_completion_with_no_prompt_too_many_or_mixed(prompts):
    e = api_error(parse_completion, body(model="m", prompt=prompts))
    assert (e.status, e.param[:6]) == (400, "prompt")


def test_submitted_builds_the_contract_event():
    _, sampling, messages = parse_chat(body(model="m", messages=USER, max_tokens=4), 16)
    ev = submitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.g.r1",
        sampling=sampling,
        now=12.5,
        messages=messages,
        tenant="t",
    )
    assert (ev.request_id, ev.model, ev.reply_to, ev.created_at, ev.tenant) == (
        "r1",
        "m",
        "ib.reply.g.r1",
        12.5,
        "t",
    )
    assert ev.prompt is None and ev.messages == messages
    assert ev.sampling.max_tokens == 4


# -- error_for ------------------------------------------------------------------------------


def test_rejected_maps_to_400_with_param():
    e = error_for(
        RequestRejected(request_id="r", code="prompt_too_long", reason="too long", param="messages")
    )
    assert (e.status, e.code, e.param, e.message) == (
        400,
        "prompt_too_long",
        "messages",
        "too long",
    )
    assert e.type == "invalid_request_error"


def test_failed_no_worker_maps_to_503_with_retry_after():
    e = error_for(RequestFailed(request_id="r", code="no_worker", reason="none", retryable=True))
    assert (e.status, e.code, e.type) == (503, "no_worker", "server_error")
    assert e.retry_after is not None and e.retry_after > 0


def test_failed_worker_lost_maps_to_503():
    e = error_for(RequestFailed(request_id="r", code="worker_lost", reason="gone", retryable=True))
    assert (e.status, e.code) == (503, "worker_lost")


def test_failed_not_retryable_has_no_retry_after():
    e = error_for(RequestFailed(request_id="r", code="queue_timeout", reason="x"))
    assert e.status == 503 and e.retry_after is None


def test_failed_unknown_code_maps_to_500():
    e = error_for(RequestFailed(request_id="r", code="engine_exploded", reason="boom"))
    assert (e.status, e.code, e.type) == (500, "engine_exploded", "server_error")


def test_cancelled_maps_to_499():
    e = error_for(RequestCancelled(request_id="r", reason="client left"))
    assert e.status == 499
    assert e.message == "client left"


def test_error_body_is_openai_shaped():
    e = ApiError(400, "bad", param="x", code="c")
    assert e.body() == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": "c"}
    }


# -- Shapes -------------------------------------------------------------------------------

FIN = RequestFinished(
    request_id="r1",
    finish_reason="length",
    usage=Usage(prompt_tokens=5, completion_tokens=3),
    chunks=3,
)
USAGE = {
    "prompt_tokens": 5,
    "completion_tokens": 3,
    "total_tokens": 8,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def tc(text: str, index: int = 0, logprobs: list[TokenLogprob] | None = None) -> TokenChunk:
    return TokenChunk(request_id="r1", seq=0, text=text, index=index, logprobs=logprobs or [])


def answer(*chunks: TokenChunk) -> Answer:
    a = Answer()
    for c in chunks:
        a.add(c)
    return a


def test_chat_stream_first_chunk_has_role_later_ones_do_not():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    first, second, third = s.chunk(tc("Hel")), s.chunk(tc("lo")), s.chunk(tc("!"))
    for c in (first, second, third):
        assert c["object"] == "chat.completion.chunk"
        assert c["id"] == "chatcmpl-r1"
        assert (c["model"], c["created"]) == ("m", 100)
        assert c["choices"][0]["finish_reason"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert second["choices"][0]["delta"] == {"content": "lo"}
    assert third["choices"][0]["delta"] == {"content": "!"}


def test_chat_final_chunk_carries_finish_reason_and_no_content():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    s.chunk(tc("x"))
    [final] = s.final_chunks(FIN)
    choice = final["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["delta"] == {}
    [stop] = s.final_chunks(
        RequestFinished(request_id="r1", finish_reason="stop", usage=Usage(), chunks=0)
    )
    assert stop["choices"][0]["finish_reason"] == "stop"


def test_chat_final_chunk_carries_role_when_nothing_came_before():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    assert s.final_chunks(FIN)[0]["choices"][0]["delta"] == {"role": "assistant"}


def test_usage_chunk_has_empty_choices_and_totals():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    fin = msgspec.structs.replace(FIN, usage=Usage(prompt_tokens=5, completion_tokens=3))
    fin.usage.cached_prompt_tokens = 4
    u = s.usage_chunk(fin)
    assert u["choices"] == []
    assert u["usage"] == {**USAGE, "prompt_tokens_details": {"cached_tokens": 4}}
    assert u["object"] == "chat.completion.chunk"


def test_chat_complete_has_message_and_usage():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    c = s.complete(answer(tc("Hel"), tc("lo!")), FIN)
    assert c["object"] == "chat.completion"
    assert c["id"] == "chatcmpl-r1"
    assert c["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ]
    assert c["usage"]["total_tokens"] == 8


def test_text_completion_shapes():
    s = Shapes(chat=False, request_id="r1", model="m", created=100)
    c = s.chunk(tc("Once"))
    assert c["object"] == "text_completion"
    assert c["id"] == "cmpl-r1"
    assert c["choices"] == [{"index": 0, "text": "Once", "logprobs": None, "finish_reason": None}]
    [f] = s.final_chunks(FIN)
    assert f["object"] == "text_completion"
    assert f["choices"][0]["text"] == "" and f["choices"][0]["finish_reason"] == "length"
    full = s.complete(answer(tc("Once"), tc(" upon")), FIN)
    assert full["object"] == "text_completion"
    assert full["choices"][0]["text"] == "Once upon"
    assert full["usage"] == USAGE
    assert s.usage_chunk(FIN)["choices"] == []


N2 = RequestFinished(
    request_id="r1",
    finish_reason="stop",
    usage=Usage(prompt_tokens=5, completion_tokens=3),
    chunks=3,
    choices=[
        ChoiceEnd(index=0, finish_reason="stop", stop_reason="."),
        ChoiceEnd(index=1, finish_reason="length"),
    ],
)


def test_each_choice_is_its_own_in_a_whole_answer_and_in_a_stream():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    c = s.complete(answer(tc("a"), tc("x", 1), tc("b"), tc("y", 1)), N2)
    assert [
        (ch["index"], ch["message"]["content"], ch["finish_reason"]) for ch in c["choices"]
    ] == [
        (0, "ab", "stop"),
        (1, "xy", "length"),
    ]
    assert c["choices"][0]["stop_reason"] == "."
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    events = [s.chunk(tc("a")), s.chunk(tc("x", 1)), s.chunk(tc("b"))]
    deltas = [(e["choices"][0]["index"], e["choices"][0]["delta"]) for e in events]
    assert deltas == [
        (0, {"role": "assistant", "content": "a"}),
        (1, {"role": "assistant", "content": "x"}),
        (0, {"content": "b"}),
    ]
    finals = s.final_chunks(N2)
    assert [(f["choices"][0]["index"], f["choices"][0]["finish_reason"]) for f in finals] == [
        (0, "stop"),
        (1, "length"),
    ]


LP = [
    TokenLogprob(token="Hi", logprob=-0.1, top=[TopLogprob(token="Hi", logprob=-0.1)]),
    TokenLogprob(token=" é", logprob=-2.0, top=[TopLogprob(token=" a", logprob=-1.0)]),
]


def test_chat_logprobs_carry_bytes_and_alternatives():
    s = Shapes(chat=True, request_id="r1", model="m", created=100, logprobs=True)
    streamed = s.chunk(tc("Hi é", logprobs=LP))["choices"][0]["logprobs"]
    whole = s.complete(answer(tc("Hi é", logprobs=LP)), FIN)["choices"][0]["logprobs"]
    assert streamed == whole
    assert whole["content"][1] == {
        "token": " é",
        "logprob": -2.0,
        "bytes": [32, 195, 169],
        "top_logprobs": [{"token": " a", "logprob": -1.0, "bytes": [32, 97]}],
    }


def test_completion_logprobs_are_the_legacy_form_with_offsets_across_chunks():
    s = Shapes(chat=False, request_id="r1", model="m", created=100, logprobs=True)
    first = s.chunk(tc("Hi", logprobs=LP[:1]))["choices"][0]["logprobs"]
    second = s.chunk(tc(" é", logprobs=LP[1:]))["choices"][0]["logprobs"]
    assert first["text_offset"] == [0] and second["text_offset"] == [2]
    whole = s.complete(answer(tc("Hi é", logprobs=LP)), FIN)["choices"][0]["logprobs"]
    assert whole == {
        "tokens": ["Hi", " é"],
        "token_logprobs": [-0.1, -2.0],
        "top_logprobs": [{"Hi": -0.1}, {" a": -1.0, " é": -2.0}],
        "text_offset": [0, 2],
    }


def test_shapes_are_json_serialisable():
    s = Shapes(chat=True, request_id="r1", model="m", created=1, logprobs=True)
    for obj in (
        s.chunk(tc("a", logprobs=LP)),
        *s.final_chunks(N2),
        s.usage_chunk(FIN),
        s.complete(answer(tc("a")), N2),
    ):
        json.dumps(obj)


# -- ModelRegistry --------------------------------------------------------------------------


def beat(wid: str, models: list[str], state: str = "ready") -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=wid, models=models, engine="sim", state=state)


def test_registry_counts_ready_workers_per_model():
    reg = ModelRegistry(stale_after_s=3.0)
    reg.on_heartbeat(beat("w1", ["a"]), 0.0)
    reg.on_heartbeat(beat("w2", ["a", "b"]), 0.0)
    reg.on_heartbeat(beat("w3", ["b"]), 0.0)
    assert reg.models(1.0) == {"a": 2, "b": 2}
    reg.on_heartbeat(beat("w1", ["a"]), 1.0)  # a repeat beat does not double count
    assert reg.models(1.5) == {"a": 2, "b": 2}


def test_registry_drops_stale_workers():
    reg = ModelRegistry(stale_after_s=3.0)
    reg.on_heartbeat(beat("w1", ["a"]), 0.0)
    reg.on_heartbeat(beat("w2", ["a"]), 2.0)
    assert reg.models(3.0) == {"a": 2}
    assert reg.models(3.5) == {"a": 1}
    assert reg.models(10.0) == {}
    # it comes back with a new beat
    reg.on_heartbeat(beat("w1", ["a"]), 10.0)
    assert reg.models(10.0) == {"a": 1}


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_registry_drops_stopped_workers(state):
    reg = ModelRegistry()
    reg.on_heartbeat(beat("w1", ["a"]), 0.0)
    reg.on_heartbeat(beat("w2", ["a"]), 0.0)
    reg.on_heartbeat(beat("w1", ["a"], state=state), 0.1)
    assert reg.models(0.2) == {"a": 1}


def test_registry_counts_draining_and_starting_workers_with_zero():
    reg = ModelRegistry()
    reg.on_heartbeat(beat("w1", ["a"], state="draining"), 0.0)
    reg.on_heartbeat(beat("w2", ["b"], state="starting"), 0.0)
    reg.on_heartbeat(beat("w3", ["b"]), 0.0)
    assert reg.models(0.5) == {"a": 0, "b": 1}


def test_registry_admit_maps_unknown_and_unready_models():
    reg = ModelRegistry(stale_after_s=3.0)
    reg.on_heartbeat(
        WorkerHeartbeat(worker_id="w1", models=["m"], engine="sim", state="draining"), now=0.0
    )
    with pytest.raises(ApiError) as unknown:
        reg.admit("other", now=3.5)  # past the start-up grace: it can be told
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
    reg.on_heartbeat(
        WorkerHeartbeat(worker_id="w1", models=["m"], engine="sim", state="draining"), now=3.5
    )
    with pytest.raises(ApiError) as unready:
        reg.admit("m", now=4.0)
    assert unready.value.status == 503 and unready.value.retry_after
    reg.on_heartbeat(WorkerHeartbeat(worker_id="w1", models=["m"], engine="sim"), now=4.5)
    reg.admit("m", now=5.0)


def test_a_model_whose_heartbeats_went_stale_is_unavailable_not_unknown():
    """A NATS outage holds every heartbeat up: its models got 404 model_not_found, a
    permanent error, for a transient fault (measured: ~3 s of 404s after a restart)."""
    reg = ModelRegistry(stale_after_s=3.0)
    reg.on_heartbeat(beat("w1", ["m"]), 10.0)
    with pytest.raises(ApiError) as err:
        reg.admit("m", now=20.0)  # every heartbeat stale
    assert (err.value.status, err.value.code) == (503, "no_worker") and err.value.retry_after
    reg.on_heartbeat(beat("w1", ["m"], state="stopped"), 21.0)  # its last worker stopped
    with pytest.raises(ApiError) as err:
        reg.admit("m", now=22.0)
    assert err.value.status == 503
    with pytest.raises(ApiError) as err:
        reg.admit("m", now=21.0 + reg.remember_s + 1)  # long gone: it does not exist
    assert err.value.status == 404


def test_a_fresh_gateway_does_not_call_a_model_unknown_before_the_heartbeats_come():
    reg = ModelRegistry(stale_after_s=3.0, started_at=100.0)
    with pytest.raises(ApiError) as err:
        reg.admit("m", now=100.5)
    assert err.value.status == 503 and err.value.code == "no_worker"
    with pytest.raises(ApiError) as err:
        reg.admit("m", now=103.5)
    assert err.value.status == 404


def test_vllm_sampling_extensions_reach_the_request():
    raw = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "ignore_eos": True,
            "top_k": 5,
            "repetition_penalty": 1.2,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stop_token_ids": [7],
        }
    ).encode()
    _, sampling, _ = parse_chat(raw, 16)
    assert (
        sampling.ignore_eos,
        sampling.top_k,
        sampling.repetition_penalty,
        sampling.presence_penalty,
        sampling.frequency_penalty,
        sampling.stop_token_ids,
    ) == (True, 5, 1.2, 0.5, -0.5, [7])
    bad = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}
    ).encode()
    with pytest.raises(ApiError) as exc:
        parse_chat(bad, 16)
    assert exc.value.param == "presence_penalty"


@pytest.mark.parametrize("chat", [True, False])
def test_fast_sse_events_equal_the_full_encoding(chat):
    fast = Shapes(chat=chat, request_id="r9", model='m "quoted"', created=5)
    slow = Shapes(chat=chat, request_id="r9", model='m "quoted"', created=5)
    for text in ["first", 'a "b"\n', "ünï ✓", ""]:
        event = fast.chunk_event(tc(text))
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        assert json.loads(event[6:]) == slow.chunk(tc(text))


def test_engine_refusals_are_client_errors():
    long = error_for(
        RequestFailed(request_id="r", code="context_length_exceeded", reason="too long")
    )
    assert long.status == 400 and long.type == "invalid_request_error"
    assert (
        error_for(RequestFailed(request_id="r", code="model_not_found", reason="x")).status == 404
    )


def test_integral_floats_are_taken_as_integers_but_strings_are_not():
    _req, sampling, _ = parse_chat(
        body(
            model="m",
            max_tokens=16.0,
            top_k=5.0,
            temperature=1,
            messages=[{"role": "user", "content": "x"}],
        ),
        8,
    )
    assert (sampling.max_tokens, sampling.top_k) == (16, 5)
    e = api_error(
        parse_chat, body(model="m", max_tokens=16.5, messages=[{"role": "user", "content": "x"}])
    )
    assert e.param == "max_tokens"
    e = api_error(
        parse_chat, body(model="m", max_tokens="16", messages=[{"role": "user", "content": "x"}])
    )
    assert e.param == "max_tokens"


def test_echo_puts_the_prompt_before_each_choice_s_text():
    req, sampling, prompts = parse_completion(
        body(model="m", prompt=["Once", "Twice"], echo=True, n=2), 16
    )
    echo = echoed(req, prompts, None, sampling.n)
    assert echo == {0: "Once", 1: "Once", 2: "Twice", 3: "Twice"}
    s = Shapes(chat=False, request_id="r1", model="m", created=1, echo=echo)
    assert s.chunk(tc(" upon", 1))["choices"][0]["text"] == "Once upon"
    assert s.chunk(tc(" more", 1))["choices"][0]["text"] == " more"
    fin = RequestFinished(
        request_id="r1",
        finish_reason="stop",
        usage=Usage(),
        chunks=1,
        choices=[ChoiceEnd(index=i, finish_reason="stop") for i in range(4)],
    )
    finals = s.final_chunks(fin)  # a choice that said nothing still gets its prompt
    assert [f["choices"][0]["text"] for f in finals] == ["Once", "", "Twice", "Twice"]
    whole = Shapes(chat=False, request_id="r1", model="m", created=1, echo=echo)
    texts = [c["text"] for c in whole.complete(answer(tc(" upon", 1)), fin)["choices"]]
    assert texts == ["Once", "Once upon", "Twice", "Twice"]


def test_chat_echo_repeats_the_assistant_s_last_message_only():
    history = [*USER, {"role": "assistant", "content": "Hel"}]
    req, _, messages = parse_chat(body(model="m", messages=history, echo=True), 16)
    assert echoed(req, [None], messages, 1) == {0: "Hel"}
    req, _, messages = parse_chat(body(model="m", messages=USER, echo=True), 16)
    assert echoed(req, [None], messages, 1) == {}
    e = api_error(parse_chat, body(model="m", messages=USER, echo=True, logprobs=True))
    assert (e.status, e.param, e.code) == (400, "echo", "unsupported_parameter")


# -- tools ------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _chat_body(**fields) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def test_tools_and_tool_choice_become_the_contract_s_tool_use():
    req, _, _ = parse_chat(_chat_body(tools=[WEATHER_TOOL]), 16)
    use = tool_use(req)
    assert use is not None and use.choice == "auto" and use.parallel
    assert use.tools[0].name == "get_weather" and use.tools[0].parameters["type"] == "object"
    named = {"type": "function", "function": {"name": "get_weather"}}
    req, _, _ = parse_chat(
        _chat_body(tools=[WEATHER_TOOL], tool_choice=named, parallel_tool_calls=False), 16
    )
    use = tool_use(req)
    assert (use.choice, use.function, use.parallel) == ("function", "get_weather", False)
    req, _, _ = parse_chat(_chat_body(tools=[WEATHER_TOOL], tool_choice="required"), 16)
    assert tool_use(req).choice == "required"
    req, _, _ = parse_chat(_chat_body(tool_choice="none"), 16)
    assert tool_use(req) is None


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "tool_choice",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, None),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_tools_get_400_naming_the_field(fields, param):
    with pytest.raises(ApiError) as e:
        req, _, _ = parse_chat(_chat_body(**fields), 16)
        tool_use(req)
    assert e.value.status == 400
    if param is not None:
        assert e.value.param == param
    else:
        assert e.value.param.startswith("tools[0]")


def test_streamed_tool_calls_are_openai_deltas_and_end_tool_calls():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    first = s.chunk(
        TokenChunk(
            request_id="r1",
            seq=0,
            text="",
            tool_calls=[ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"ci')],
        )
    )
    delta = first["choices"][0]["delta"]
    assert delta == {
        "role": "assistant",
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"ci'},
            }
        ],
    }
    later = s.chunk_event(
        TokenChunk(
            request_id="r1",
            seq=1,
            text="",
            tool_calls=[ToolCallDelta(index=0, arguments='ty": "Oslo"}')],
        )
    )
    body = json.loads(later[len(b"data: ") :])
    assert body["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]
    }
    fin = msgspec.structs.replace(
        FIN, finish_reason="stop", choices=[ChoiceEnd(index=0, finish_reason="tool_calls")]
    )
    assert s.final_chunks(fin)[0]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_whole_answer_carries_its_calls_and_reasoning():
    s = Shapes(chat=True, request_id="r1", model="m", created=100)
    chunks = [
        TokenChunk(request_id="r1", seq=0, text="", reasoning="Need the "),
        TokenChunk(request_id="r1", seq=1, text="", reasoning="weather."),
        TokenChunk(
            request_id="r1",
            seq=2,
            text="",
            tool_calls=[ToolCallDelta(index=0, id="a", name="get_weather", arguments='{"city":')],
        ),
        TokenChunk(
            request_id="r1",
            seq=3,
            text="",
            tool_calls=[
                ToolCallDelta(index=0, arguments=' "Oslo"}'),
                ToolCallDelta(index=1, id="b", name="get_time", arguments="{}"),
            ],
        ),
    ]
    fin = msgspec.structs.replace(FIN, choices=[ChoiceEnd(index=0, finish_reason="tool_calls")])
    message = s.complete(answer(*chunks), fin)["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": None,
        "reasoning": "Need the weather.",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }


def test_include_reasoning_false_leaves_the_reasoning_out():
    s = Shapes(chat=True, request_id="r1", model="m", created=100, reasoning=False)
    chunk = TokenChunk(request_id="r1", seq=0, text="4", reasoning="2+2")
    assert s.chunk(chunk)["choices"][0]["delta"] == {"role": "assistant", "content": "4"}
    whole = s.complete(answer(chunk), FIN)["choices"][0]["message"]
    assert whole == {"role": "assistant", "content": "4"}


# -- embeddings -------------------------------------------------------------------------


def test_embedding_inputs_and_their_refusals():
    from inferbus.services.gateway.torequest import parse_embeddings

    _, embed, inputs = parse_embeddings(b'{"model": "e", "input": ["a", "b"], "dimensions": 8}')
    assert inputs == ["a", "b"] and embed.dimensions == 8 and embed.normalize is None
    _, embed, inputs = parse_embeddings(b'{"model": "e", "input": [1, 2], "use_activation": false}')
    assert inputs == [[1, 2]] and embed.normalize is False
    for body, param in [
        (b'{"model": "e", "input": ""}', "input"),
        (b'{"model": "e", "input": []}', "input"),
        (b'{"model": "e", "input": "a", "encoding_format": "hex"}', "encoding_format"),
        (b'{"model": "e", "input": "a", "priority": 3}', "priority"),
        (b'{"model": "e", "input": "a", "truncation_side": "right"}', "truncation_side"),
    ]:
        with pytest.raises(ApiError) as e:
            parse_embeddings(body)
        assert (e.value.status, e.value.param) == (400, param), body


def test_embeddings_in_both_encodings():
    import base64
    import struct

    from inferbus.services.gateway.shapes import EmbeddingShapes

    fin = RequestFinished(
        request_id="r",
        finish_reason="stop",
        usage=Usage(prompt_tokens=6),
        chunks=0,
        choices=[
            ChoiceEnd(index=0, finish_reason="stop", embedding=[0.5, -0.25]),
            ChoiceEnd(index=1, finish_reason="stop", embedding=[1.0, 0.0]),
        ],
    )
    floats = EmbeddingShapes(request_id="r", model="e", created=1, base64=False)
    body = floats.complete(Answer(), fin)
    assert [d["embedding"] for d in body["data"]] == [[0.5, -0.25], [1.0, 0.0]]
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    packed = EmbeddingShapes(request_id="r", model="e", created=1, base64=True)
    raw = base64.b64decode(packed.complete(Answer(), fin)["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (0.5, -0.25)


# -- the prompt's logprobs --------------------------------------------------------------


def test_echo_with_logprobs_scores_the_prompt_first():
    _, sampling, _ = parse_completion(
        b'{"model": "m", "prompt": "ab", "echo": true, "logprobs": 1, "max_tokens": 0}', 16
    )
    assert sampling.prompt_logprobs == 1 and sampling.max_tokens == 1  # one step, not shown
    prompt = [
        TokenLogprob(token="a", logprob=None, token_id=1),
        TokenLogprob(
            token="b",
            logprob=-1.5,
            token_id=2,
            top=[TopLogprob(token="c", logprob=-0.5, token_id=3)],
        ),
    ]
    fin = msgspec.structs.replace(
        FIN, choices=[ChoiceEnd(index=0, finish_reason="length", prompt_logprobs=prompt)]
    )
    s = Shapes(
        chat=False, request_id="r1", model="m", created=1, logprobs=True, echo={0: "ab"},
        score_only=True, prompt_logprobs=True,
    )  # fmt: skip
    choice = s.complete(answer(tc("zz", logprobs=[TokenLogprob(token="zz", logprob=-3.0)])), fin)[
        "choices"
    ][0]
    assert choice["text"] == "ab"  # the generated step is not shown
    assert choice["logprobs"]["tokens"] == ["a", "b"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5]
    assert choice["logprobs"]["top_logprobs"] == [None, {"c": -0.5, "b": -1.5}]
    assert choice["prompt_logprobs"] == [
        None,
        {
            "3": {"logprob": -0.5, "decoded_token": "c"},
            "2": {"logprob": -1.5, "decoded_token": "b"},
        },
    ]


@pytest.mark.parametrize(
    "body, param",
    [
        (b'{"model": "m", "prompt": "a", "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "prompt": "a", "echo": true, "logprobs": 1, "stream": true}', "echo"),
        (b'{"model": "m", "prompt": "a", "prompt_logprobs": 21}', "prompt_logprobs"),
    ],
)
def test_what_scoring_cannot_be_is_refused(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, 16)
    assert (e.value.status, e.value.param) == (400, param)


# -- /tokenize and /detokenize ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from inferbus.shared.prompttokens import load_tokenizer
    from inferbus.tinymodel import build_tokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out, 2048, 2048)
    return load_tokenizer(str(out))


def test_tokenize_as_the_worker_renders_and_detokenize_back(tiny_tokenizer):
    from inferbus.services.gateway.tokenize import detokenize, read_tokenize, tokenize
    from inferbus.shared.prompttokens import prompt_token_ids

    text = tokenize(tiny_tokenizer, read_tokenize(b'{"model": "m", "prompt": "Hello there"}'), 2048)
    assert text["count"] == len(text["tokens"]) and text["max_model_len"] == 2048
    assert text["tokens"] == list(tiny_tokenizer.encode("Hello there"))
    assert detokenize(
        tiny_tokenizer, json.dumps({"model": "m", "tokens": text["tokens"]}).encode()
    ) == {"prompt": tiny_tokenizer.decode(text["tokens"])}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],  # _chat_body's
        "tools": [WEATHER_TOOL],
        "return_token_strs": True,
    }
    chat = tokenize(tiny_tokenizer, read_tokenize(json.dumps(body).encode()), 0)
    # the ids the worker runs (and the sanitizer routes by): tools rendered in
    req, _, messages = parse_chat(_chat_body(tools=[WEATHER_TOOL]), 16)
    assert chat["tokens"] == prompt_token_ids(tiny_tokenizer, None, messages, None, tool_use(req))
    assert len(chat["token_strs"]) == chat["count"]


@pytest.mark.parametrize(
    "body, param",
    [
        (b'{"model": "m"}', "prompt"),
        (b'{"model": "m", "prompt": "a", "messages": []}', "prompt"),
        (b'{"model": "m", "prompt": "a", "chat_template": "{{x}}"}', "chat_template"),
    ],
)
def test_a_tokenize_body_that_asks_for_nothing_or_too_much_is_refused(body, param):
    from inferbus.services.gateway.tokenize import read_tokenize

    with pytest.raises(ApiError) as e:
        read_tokenize(body)
    assert (e.value.status, e.value.param) == (400, param)


def test_detokenize_refuses_ids_outside_the_vocabulary(tiny_tokenizer):
    from inferbus.services.gateway.tokenize import detokenize

    with pytest.raises(ApiError) as e:
        detokenize(tiny_tokenizer, b'{"model": "m", "tokens": [1, 99999]}')
    assert e.value.param == "tokens"
