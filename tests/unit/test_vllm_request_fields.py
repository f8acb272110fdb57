"""Every field of vLLM's own OpenAI request models is honoured by the gateway or
refused by name: generated from vLLM's classes, so a field a new vLLM release adds
fails here until it is handled (the defect: msgspec dropped unknown fields, and
min_tokens, structured_outputs or chat_template_kwargs changed nothing, in silence)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as VllmChat,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest as VllmCompletion,
)
from vllm.sampling_params import StructuredOutputsParams

from inferbus.contracts import SamplingParams, StructuredOutput
from inferbus.services.gateway.errors import ApiError
from inferbus.services.gateway.protocol import REFUSED, StructuredOutputsIn
from inferbus.services.gateway.torequest import (
    chat_template,
    parse_chat,
    parse_completion,
    tool_use,
)

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def chat(**fields: Any):
    body = {"model": "m", "messages": USER, **fields}
    req, sampling, messages = parse_chat(json.dumps(body).encode(), 16)
    return req, sampling, messages, chat_template(req)


def completion(**fields: Any):
    body = {"model": "m", "prompt": "hi", **fields}
    req, sampling, prompt = parse_completion(json.dumps(body).encode(), 16)
    return req, sampling, prompt, None


def s(check):
    """A check on the SamplingParams the request became."""
    return lambda parsed: check(parsed[1])


HONOURED_BOTH: dict[str, tuple[Any, Any]] = {
    # field: (a value other than the default, what it must change in the contract)
    "model": ("other", lambda p: p[0].model == "other"),
    "frequency_penalty": (0.5, s(lambda x: x.frequency_penalty == 0.5)),
    "presence_penalty": (0.5, s(lambda x: x.presence_penalty == 0.5)),
    "repetition_penalty": (1.2, s(lambda x: x.repetition_penalty == 1.2)),
    "temperature": (0.3, s(lambda x: x.temperature == 0.3)),
    "top_p": (0.5, s(lambda x: x.top_p == 0.5)),
    "top_k": (5, s(lambda x: x.top_k == 5)),
    "min_p": (0.1, s(lambda x: x.min_p == 0.1)),
    "seed": (7, s(lambda x: x.seed == 7)),
    "stop": (["x"], s(lambda x: x.stop == ["x"])),
    "stop_token_ids": ([3], s(lambda x: x.stop_token_ids == [3])),
    "max_tokens": (9, s(lambda x: x.max_tokens == 9)),
    "min_tokens": (2, s(lambda x: x.min_tokens == 2)),
    "n": (3, s(lambda x: x.n == 3)),
    "logit_bias": ({"5": 2.0}, s(lambda x: x.logit_bias == {5: 2.0})),
    "allowed_token_ids": ([1, 2], s(lambda x: x.allowed_token_ids == [1, 2])),
    "bad_words": (["no"], s(lambda x: x.bad_words == ["no"])),
    "ignore_eos": (True, s(lambda x: x.ignore_eos)),
    "include_stop_str_in_output": (True, s(lambda x: x.include_stop_str_in_output)),
    "skip_special_tokens": (False, s(lambda x: not x.skip_special_tokens)),
    "spaces_between_special_tokens": (False, s(lambda x: not x.spaces_between_special_tokens)),
    "prompt_logprobs": (2, s(lambda x: x.prompt_logprobs == 2)),
    "truncate_prompt_tokens": (20, s(lambda x: x.truncate_prompt_tokens == 20)),
    "truncation_side": ("left", s(lambda x: x.truncate_prompt_tokens is None)),
    "structured_outputs": (
        {"regex": "[a-z]+"},
        s(lambda x: x.structured == StructuredOutput(regex="[a-z]+")),
    ),
    "response_format": (
        {"type": "json_object"},
        s(lambda x: x.structured == StructuredOutput(json_object=True)),
    ),
    "stream": (True, lambda p: p[0].stream),
    "stream_options": ({"include_usage": True}, lambda p: p[0].stream_options.include_usage),
    # vLLM takes it and does nothing with it either
    "user": ("u1", lambda p: p[0].user == "u1"),
    "echo": (True, lambda p: p[0].echo),
}
HONOURED_CHAT: dict[str, tuple[Any, Any]] = {
    "messages": (
        [{"role": "system", "content": "be"}, *USER],
        lambda p: [m.role for m in p[2]] == ["system", "user"],
    ),
    "logprobs": (True, s(lambda x: x.logprobs == 0)),
    "top_logprobs": (4, s(lambda x: x.logprobs == 4)),  # sent with logprobs (below)
    "max_completion_tokens": (11, s(lambda x: x.max_tokens == 11)),
    "add_generation_prompt": (False, lambda p: not p[3].add_generation_prompt),
    "continue_final_message": (True, lambda p: p[3].continue_final_message),
    "chat_template_kwargs": ({"enable_thinking": False}, lambda p: p[3].kwargs),
    "documents": ([{"title": "t"}], lambda p: p[3].kwargs["documents"] == [{"title": "t"}]),
    "reasoning_effort": ("low", lambda p: p[3].kwargs["enable_thinking"] is True),
    "add_special_tokens": (True, lambda p: p[3].add_special_tokens),
    # the gateway then leaves the worker's reasoning out (test_gateway_core)
    "include_reasoning": (False, lambda p: p[0].include_reasoning is False),
    "tools": (TOOLS, lambda p: tool_use(p[0]).tools[0].name == "f"),
    "tool_choice": ("none", lambda p: p[0].tool_choice == "none"),
    "parallel_tool_calls": (False, lambda p: p[0].parallel_tool_calls is False),
}
HONOURED_COMPLETION: dict[str, tuple[Any, Any]] = {
    "prompt": (["a", "b"], lambda p: p[2] == ["a", "b"]),
    "logprobs": (3, s(lambda x: x.logprobs == 3)),
    "add_special_tokens": (True, lambda p: True),  # the default: a prompt gets BOS
}
REFUSED_CHAT: dict[str, Any] = {}
REFUSED_COMPLETION = {"suffix": "x"}
"""vLLM refuses it too."""

EXTRA = {
    "parallel_tool_calls": {"tools": TOOLS},
    "continue_final_message": {"add_generation_prompt": False},
    "top_logprobs": {"logprobs": True},
}


def vllm_fields(model: type) -> set[str]:
    return set(model.model_fields)


@pytest.mark.parametrize(
    "vllm_model, honoured, refused_here",
    [
        (VllmChat, {**HONOURED_BOTH, **HONOURED_CHAT}, REFUSED_CHAT),
        (VllmCompletion, {**HONOURED_BOTH, **HONOURED_COMPLETION}, REFUSED_COMPLETION),
    ],
    ids=["chat", "completion"],
)
def test_every_vllm_request_field_is_honoured_or_refused_by_name(
    vllm_model, honoured, refused_here
):
    fields = vllm_fields(vllm_model)
    handled = set(honoured) | set(refused_here) | (set(REFUSED) & fields)
    assert fields - handled == set(), "vLLM fields neither honoured nor refused"
    assert set(honoured) - fields == set(), "honoured fields vLLM does not have"


@pytest.mark.parametrize(
    "parse, name, value, check",
    [
        *[(chat, n, v, c) for n, (v, c) in {**HONOURED_BOTH, **HONOURED_CHAT}.items()],
        *[(completion, n, v, c) for n, (v, c) in {**HONOURED_BOTH, **HONOURED_COMPLETION}.items()],
    ],
)
def test_an_honoured_field_reaches_the_request(parse, name, value, check):
    assert check(parse(**{name: value, **EXTRA.get(name, {})})), (name, value)


REFUSED_VALUE = {"prompt_embeds": "aGk=", "priority": 5, "length_penalty": 0.5}


@pytest.mark.parametrize(
    "parse, vllm_model, name",
    [
        *[(chat, VllmChat, n) for n in sorted(set(REFUSED) | set(REFUSED_CHAT))],
        *[(completion, VllmCompletion, n) for n in sorted(set(REFUSED) | set(REFUSED_COMPLETION))],
    ],
)
def test_a_refused_field_gets_400_naming_it(parse, vllm_model, name):
    if name not in vllm_model.model_fields:
        pytest.skip(f"{vllm_model.__name__} has no {name}")
    value = {**REFUSED_CHAT, **REFUSED_COMPLETION}.get(name, REFUSED_VALUE.get(name, "on"))
    with pytest.raises(ApiError) as e:
        parse(**{name: value})
    assert (e.value.status, e.value.param) == (400, name)
    assert e.value.code == "unsupported_parameter"
    # and its neutral values are taken: a client that sends the default is served
    for neutral in REFUSED[name][1] if name in REFUSED else ():
        parse(**{name: neutral})


def test_vllm_s_structured_outputs_fields_are_all_read():
    theirs = {
        f.name for f in dataclasses.fields(StructuredOutputsParams) if not f.name.startswith("_")
    }
    ours = set(StructuredOutputsIn.__struct_fields__)
    assert theirs == ours


def test_the_contract_carries_vllm_s_sampling_fields_or_says_why_not():
    from vllm import SamplingParams as VllmSampling

    theirs = {f for f in VllmSampling.__struct_fields__ if not f.startswith("_")}
    ours = set(SamplingParams.__struct_fields__) - {"structured"}
    not_carried = {
        # set by the worker, not the client
        "output_kind": "the worker streams deltas",
        "extra_args": "the worker's KV spill namespace rides here",
        "detokenize": "clients always get text",
        "skip_clone": "an engine-internal copy switch",
        "output_text_buffer_length": "engine-internal",
        # refused at the gateway, by name (REFUSED)
        "prompt_logprob_token_ids": "logprob_token_ids' prompt twin: refused with it",
        "prompt_logprob_start": "the whole prompt's are returned",
        "logprob_token_ids": "refused",
        "flat_logprobs": "an output layout switch",
        "watermarking": "refused",
        "stream_interval": "refused",
        "thinking_token_budget": "refused",
        "repetition_detection": "refused",
        "routed_experts_prompt_start": "refused",
        "trace_decode_token_ids": "engine tracing",
        "skip_reading_prefix_cache": "the platform routes by the prefix cache",
        "structured_outputs": "carried as ``structured``",
    }
    missing = theirs - ours - set(not_carried)
    assert missing == set(), (
        f"vLLM sampling fields the contract neither carries nor explains: {missing}"
    )
