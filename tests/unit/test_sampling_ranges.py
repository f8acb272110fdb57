"""The sampling parameters' ranges are declared once (contracts/sampling.py): the
gateway's HTTP body types and the sanitizer's check refuse exactly the same values."""

from __future__ import annotations

import json

import msgspec
import pytest

from inferbus.contracts import (
    RequestRejected,
    RequestSubmitted,
    SamplingParams,
    StructuredOutput,
)
from inferbus.contracts.sampling import SAMPLING_RANGES, out_of_range
from inferbus.services.gateway.protocol import ChatCompletionRequest, CompletionRequest
from inferbus.services.sanitizer.core import InputLimits, check

INTEGERS = {"top_k", "n", "min_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"}
BIG = 2**31 - 1


def probes(name: str) -> list[float]:
    r = SAMPLING_RANGES[name]
    step = 1 if name in INTEGERS else 0.5  # an integer: its neighbours
    edges = [x for x in (r.low, r.high) if x is not None]
    return sorted({v for e in edges for v in (e - step, e, e + step)} | {1.0})


def gateway_takes(body_cls: type, name: str, value: float) -> bool:
    value = int(value) if name in INTEGERS else value
    body: dict = {"model": "m", name: value}
    if name == "logprobs" and body_cls is ChatCompletionRequest:  # chat's count
        body = {"model": "m", "logprobs": True, "top_logprobs": value}
    if name == "min_tokens":  # within max_tokens, which has its own bound
        body["max_tokens"] = BIG
    body.update(
        {"messages": [{"role": "user", "content": "hi"}]}
        if body_cls is ChatCompletionRequest
        else {"prompt": "hi"}
    )
    try:
        msgspec.json.decode(json.dumps(body), type=body_cls)
    except msgspec.ValidationError:
        return False
    return True


def sanitizer_takes(name: str, value: float) -> bool:
    value = int(value) if name in INTEGERS else value
    fields: dict = {name: value}
    if name == "min_tokens":
        fields["max_tokens"] = BIG
    request = RequestSubmitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.t.r1",
        prompt="hi",
        sampling=SamplingParams(**fields),
    )
    verdict = check(request, InputLimits(max_tokens=BIG))
    assert verdict is None or (isinstance(verdict, RequestRejected) and verdict.param == name)
    return verdict is None


@pytest.mark.parametrize("name", sorted(SAMPLING_RANGES))
def test_the_gateway_and_the_sanitizer_refuse_the_same_values(name):
    for value in probes(name):
        expected = SAMPLING_RANGES[name].holds(value)
        for body_cls in (ChatCompletionRequest, CompletionRequest):
            assert gateway_takes(body_cls, name, value) == expected, (body_cls, name, value)
        assert sanitizer_takes(name, value) == expected, (name, value)


def test_a_nats_client_s_penalty_out_of_range_is_refused_with_the_reason():
    # the sanitizer checked temperature and top_p only: a NATS client's presence
    # penalty of 3 went on to the engine
    assert out_of_range(SamplingParams(presence_penalty=3.0)) == (
        "presence_penalty",
        "presence_penalty must be between -2 and 2, got 3.0",
    )
    assert out_of_range(SamplingParams(top_p=0.0))[1] == "top_p must be in (0, 1], got 0.0"
    assert out_of_range(SamplingParams(repetition_penalty=0.0))[1].startswith(
        "repetition_penalty must be greater than 0"
    )
    assert out_of_range(SamplingParams()) is None


def test_what_spans_fields_is_refused_by_name_too():
    assert out_of_range(SamplingParams(max_tokens=4, min_tokens=5)) == (
        "min_tokens",
        "min_tokens (5) must not exceed max_tokens (4)",
    )
    two = StructuredOutput(regex="a", choice=["b"])
    param, why = out_of_range(SamplingParams(structured=two))
    assert param == "structured_outputs" and "got 2: regex, choice" in why
    param, why = out_of_range(SamplingParams(structured=StructuredOutput()))
    assert param == "structured_outputs" and "got 0" in why
    assert out_of_range(SamplingParams(structured=StructuredOutput(json_object=True))) is None
