"""The sanitizer's check(): None lets a request through, else a RequestRejected."""

from __future__ import annotations

import msgspec
import pytest

from inferbus.contracts import (
    ChatMessage,
    LLMServiceSettings,
    RequestRejected,
    RequestSubmitted,
    SamplingParams,
)
from inferbus.services.sanitizer.core import (
    InputLimits,
    check,
    masks_output,
    model_settings,
    parse_policies,
    prompt_chars,
    with_models,
)

LIMITS = InputLimits(max_prompt_chars=100, max_tokens=1000, max_messages=4)


def prompt_req(prompt: str | None = "Tell me a story.", **sampling) -> RequestSubmitted:
    return RequestSubmitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.t.r1",
        prompt=prompt,
        sampling=SamplingParams(**sampling),
    )


def chat_req(messages: list[ChatMessage] | None, **sampling) -> RequestSubmitted:
    return RequestSubmitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.t.r1",
        messages=messages,
        sampling=SamplingParams(**sampling),
    )


def msgs(*contents: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=c) for c in contents]


def rejected(result, code: str, param: str | None) -> RequestRejected:
    assert isinstance(result, RequestRejected), result
    assert result.request_id == "r1"
    assert result.code == code
    assert result.param == param
    assert result.reason  # a human-readable reason is always given
    return result


def test_accepts_a_normal_prompt():
    assert check(prompt_req(), LIMITS) is None


def test_accepts_normal_messages():
    m = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]
    assert check(chat_req(m), LIMITS) is None


def test_accepts_default_limits_with_a_normal_request():
    assert check(prompt_req(), InputLimits()) is None


def test_accepts_prompt_exactly_at_the_limit():
    assert check(prompt_req("x" * 100), LIMITS) is None


def test_rejects_prompt_over_the_limit():
    r = rejected(check(prompt_req("x" * 101), LIMITS), "prompt_too_long", "prompt")
    assert "101" in r.reason and "100" in r.reason


def test_rejects_messages_over_the_limit_in_total():
    # each message is short; together they are over
    r = rejected(check(chat_req(msgs("a" * 60, "b" * 41)), LIMITS), "prompt_too_long", "messages")
    assert "101" in r.reason
    assert check(chat_req(msgs("a" * 60, "b" * 40)), LIMITS) is None


def test_prompt_chars_counts_prompt_or_message_contents():
    assert prompt_chars(prompt_req("abcd")) == 4
    assert prompt_chars(chat_req(msgs("ab", "cde"))) == 5


def test_rejects_both_prompt_and_messages():
    both = RequestSubmitted(
        request_id="r1", model="m", reply_to="x", prompt="p", messages=msgs("m")
    )
    rejected(check(both, LIMITS), "invalid_request", "messages")


def test_rejects_neither_prompt_nor_messages():
    rejected(check(prompt_req(None), LIMITS), "invalid_request", "messages")


def test_empty_prompt_string_is_a_prompt():
    assert check(prompt_req(""), LIMITS) is None


def test_rejects_empty_messages():
    rejected(check(chat_req([]), LIMITS), "invalid_request", "messages")


def test_rejects_too_many_messages():
    rejected(check(chat_req(msgs("a", "b", "c", "d", "e")), LIMITS), "invalid_request", "messages")
    assert check(chat_req(msgs("a", "b", "c", "d")), LIMITS) is None


def test_rejects_empty_request_id_or_model():
    no_id = RequestSubmitted(request_id="", model="m", reply_to="x", prompt="p")
    r = check(no_id, LIMITS)
    assert isinstance(r, RequestRejected) and r.code == "invalid_request"
    no_model = RequestSubmitted(request_id="r1", model="", reply_to="x", prompt="p")
    rejected(check(no_model, LIMITS), "invalid_request", "model")


@pytest.mark.parametrize("max_tokens", [0, -1, 1001])
def test_rejects_bad_max_tokens(max_tokens):
    r = rejected(check(prompt_req(max_tokens=max_tokens), LIMITS), "invalid_request", "max_tokens")
    assert str(max_tokens) in r.reason


@pytest.mark.parametrize("max_tokens", [1, 1000])
def test_accepts_max_tokens_at_the_bounds(max_tokens):
    assert check(prompt_req(max_tokens=max_tokens), LIMITS) is None


@pytest.mark.parametrize("temperature", [-0.1, 2.01, float("nan")])
def test_rejects_bad_temperature(temperature):
    rejected(check(prompt_req(temperature=temperature), LIMITS), "invalid_request", "temperature")


@pytest.mark.parametrize("temperature", [0.0, 2.0])
def test_accepts_temperature_at_the_bounds(temperature):
    assert check(prompt_req(temperature=temperature), LIMITS) is None


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01, float("nan")])
def test_rejects_bad_top_p(top_p):
    rejected(check(prompt_req(top_p=top_p), LIMITS), "invalid_request", "top_p")


def test_accepts_top_p_of_one_and_a_small_one():
    assert check(prompt_req(top_p=1.0), LIMITS) is None
    assert check(prompt_req(top_p=1e-6), LIMITS) is None


def test_shape_errors_come_before_size_errors():
    # a request with a bad max_tokens and a huge prompt is refused for max_tokens
    rejected(check(prompt_req("x" * 1000, max_tokens=0), LIMITS), "invalid_request", "max_tokens")


# -- the output filter ------------------------------------------------------------------

from inferbus.contracts import RequestFailed, RequestFinished, TokenChunk, Usage  # noqa: E402
from inferbus.services.sanitizer.core import END_GRACE_S, FilteredStream, PassedEnds  # noqa: E402


def chunk(seq: int, text: str, attempt: int = 1) -> TokenChunk:
    return TokenChunk(request_id="r", seq=seq, text=text, token_ids=[seq], attempt=attempt)


def test_filtered_stream_masks_renumbers_and_ends_with_the_held_text():
    s = FilteredStream("r", "ib.reply.gw.r", 0.0)
    out = []
    for i, piece in enumerate(["Card ", "4111 11", "11 1111 ", "1111", " ok"]):
        events, over = s.on_event(chunk(i, piece), 0.0)
        assert not over
        out += events
    fin = RequestFinished(
        request_id="r",
        finish_reason="stop",
        chunks=5,
        usage=Usage(prompt_tokens=1, completion_tokens=5),
    )
    events, over = s.on_event(fin, 1.0)
    assert over
    out += events
    chunks = [e for e in out if isinstance(e, TokenChunk)]
    assert "".join(c.text for c in chunks) == "Card ****1111 ok"
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.token_ids == [] for c in chunks) and sum(c.tokens for c in chunks) == 5
    assert out[-1].chunks == len(chunks)  # the terminal event counts what the client got


def test_filtered_stream_restarts_on_a_new_attempt_and_drops_stragglers():
    s = FilteredStream("r", "c", 0.0)
    s.on_event(chunk(0, "hello "), 0.0)
    events, _ = s.on_event(chunk(0, "again and ", attempt=2), 0.0)
    assert events[0].seq == 0 and events[0].attempt == 2
    assert s.on_event(chunk(1, "late", attempt=1), 0.0) == ([], False)
    events, over = s.on_event(RequestFailed(request_id="r", code="worker_lost", reason="x"), 0.0)
    assert over and isinstance(events[-1], RequestFailed)


def test_a_stale_attempts_finish_does_not_end_the_live_stream():
    s = FilteredStream("r", "c", 0.0)
    s.on_event(chunk(0, "x ", attempt=2), 0.0)
    s.on_event(chunk(1, "card 4111 1111", attempt=2), 0.0)
    late = RequestFinished(
        request_id="r",
        finish_reason="length",
        chunks=3,
        attempt=1,
        usage=Usage(prompt_tokens=1, completion_tokens=3),
    )
    assert s.on_event(late, 0.0) == ([], False)
    out, _ = s.on_event(chunk(2, " 1111 1111 ok", attempt=2), 0.0)
    fin = RequestFinished(
        request_id="r",
        finish_reason="stop",
        chunks=3,
        attempt=2,
        usage=Usage(prompt_tokens=1, completion_tokens=3),
    )
    events, over = s.on_event(fin, 0.0)
    text = "".join(e.text for e in [*out, *events] if isinstance(e, TokenChunk))
    assert over and "4111" not in text and "****1111" in text


def test_chunks_lost_before_the_filter_end_the_stream_interrupted():
    s = FilteredStream("r", "c", 0.0)
    for seq in (0, 2):  # chunk 1 never arrived
        s.on_event(chunk(seq, f"word{seq} "), 0.0)
    fin = RequestFinished(
        request_id="r",
        finish_reason="stop",
        chunks=3,
        usage=Usage(prompt_tokens=1, completion_tokens=3),
    )
    events, over = s.on_event(fin, 0.0)
    end = events[-1]
    assert over and isinstance(end, RequestFailed)
    assert end.code == "stream_interrupted" and end.retryable


def test_a_filter_restarted_after_the_chunks_passed_does_not_vouch_for_the_text():
    """The filter before it passed every chunk, holding back the last word, and died;
    the worker's finish reaches a new one that saw none of them. Ending the stream with
    a finish counting its own chunks plus those it lost (as many as the client got)
    would hand the client text short of that word (the fault suite's killed
    sanitizer)."""
    before = FilteredStream("r", "c", 0.0)
    got = []
    for seq, word in enumerate(("one ", "two ", "three ")):
        got += before.on_event(chunk(seq, word), 0.0)[0]
    assert "".join(c.text for c in got) != "one two three "  # a word held back
    fin = RequestFinished(
        request_id="r",
        finish_reason="length",
        chunks=3,
        usage=Usage(prompt_tokens=1, completion_tokens=3),
    )
    after = FilteredStream("r", "c", 1.0)  # the restarted filter
    events, over = after.on_event(fin, 1.0)
    assert over and [type(e) for e in events] == [RequestFailed]
    assert events[0].code == "stream_interrupted"


def test_an_llmservice_sets_its_models_checks_over_the_flags_and_under_an_api_key():
    flags = parse_policies("block", "code=flag")
    record = LLMServiceSettings(
        service="chat", model="chat", input_policy="off", mask_output_pii=False
    )
    ms = model_settings(record)
    assert ms is not None
    models = {"chat": ms}
    policies = with_models(flags, models)
    assert policies.by_model == {"code": "flag", "chat": "off"}
    chat = msgspec.structs.replace(prompt_req(), model="chat")
    assert policies.for_request(chat) == "off"
    assert policies.for_request(prompt_req()) == "block"  # another model: the flags'
    # the API key's (or tenant's) choice still wins
    assert policies.for_request(msgspec.structs.replace(chat, input_policy="block")) == "block"
    assert masks_output(chat, models, default=True) is False
    assert masks_output(msgspec.structs.replace(chat, mask_pii=True), models, True) is True
    assert masks_output(prompt_req(), models, default=True) is True
    # an empty policy keeps the flags'; a removed record gives the model back to them
    keep = model_settings(msgspec.structs.replace(record, input_policy=""))
    assert keep is not None and with_models(flags, {"code": keep}).by_model["code"] == "flag"
    assert model_settings(msgspec.structs.replace(record, removed=True)) is None
    with pytest.raises(ValueError, match="choose block, flag or off"):
        model_settings(msgspec.structs.replace(record, input_policy="allow"))


def test_a_stream_is_live_until_silent_too_long_or_past_its_deadline():
    wall = 1_000_000.0
    s = FilteredStream("r", "c", 100.0, deadline=wall + 30)
    assert s.live(100.0, wall, quiet_s=10)
    s.on_event(chunk(0, "hi "), 108.0)  # a chunk resets the silence
    assert s.live(117.0, wall + 17, quiet_s=10)
    assert not s.live(118.5, wall + 18.5, quiet_s=10)  # silent past quiet_s
    # past its deadline the platform has ended it: an end not here after the grace was
    # lost on the way, however recently a chunk came
    assert s.live(108.0, wall + 30 + END_GRACE_S, quiet_s=900)
    assert not s.live(108.0, wall + 30 + END_GRACE_S + 0.1, quiet_s=900)
    # no deadline: only the silence counts
    forever = FilteredStream("r", "c", 0.0)
    assert forever.live(899.0, wall + 10**6, quiet_s=900)
    assert not forever.live(901.0, wall, quiet_s=900)


# -- the input decision in one call ---------------------------------------------------

from inferbus.contracts import TenantPolicy  # noqa: E402
from inferbus.services.sanitizer.core import (  # noqa: E402
    InputPolicies,
    InputRules,
    ModelSettings,
    through_filter,
)

RULES = InputRules(limits=LIMITS, tenants={"acme": TenantPolicy(tenant="acme", models=["m"])})
PAYLOAD = "' OR 1=1 --"


def test_the_input_decision_checks_the_tenant_then_the_shape_then_injections():
    tenant_req = msgspec.structs.replace(
        prompt_req(PAYLOAD, max_tokens=0), reply_to="ib.reply.tenant.acme.r1"
    )
    # a tenant with no record is refused before its (also bad) shape is looked at
    verdict = RULES.decide(tenant_req, "nobody")
    rejected(verdict.rejection, "permission_denied", None)
    # a known tenant's bad shape is refused before its payload is inspected
    verdict = RULES.decide(tenant_req, "acme")
    rejected(verdict.rejection, "invalid_request", "max_tokens")
    assert verdict.findings == [] and verdict.request.tenant == "acme"
    # a good shape: the payload blocks under the default policy
    verdict = RULES.decide(prompt_req(PAYLOAD), None)
    rejected(verdict.rejection, "input_blocked", "prompt")
    assert verdict.decision == "block" and verdict.findings
    assert not verdict.mask_output


def test_a_request_that_goes_on_carries_its_findings_and_whether_its_output_is_masked():
    flagging = msgspec.structs.replace(
        RULES,
        policies=InputPolicies(default="flag"),
        models={"m": ModelSettings(mask_output_pii=False)},
    )
    verdict = flagging.decide(prompt_req(PAYLOAD), None)
    assert verdict.rejection is None and verdict.decision == "flag" and verdict.findings
    assert not verdict.mask_output  # the model's LLMService turned masking off
    clean = RULES.decide(prompt_req("Tell me a story."), None)
    assert (clean.rejection, clean.decision, clean.mask_output) == (None, "pass", True)
    # a tenant's record, not its payload, says what its request may do
    tenant_req = msgspec.structs.replace(
        prompt_req(), reply_to="ib.reply.tenant.acme.r1", tenant="someone-else", mask_pii=False
    )
    verdict = RULES.decide(tenant_req, "acme")
    assert verdict.request.tenant == "acme" and verdict.mask_output


def test_a_masked_request_replies_through_the_filter():
    req = through_filter(prompt_req(), "ib.filter.s1.")
    assert (req.reply_to, req.client_reply_to) == ("ib.filter.s1.ib.reply.t.r1", "ib.reply.t.r1")


# -- prompts as token ids --------------------------------------------------------------


def token_req(ids: list[int], policy: str = "") -> RequestSubmitted:
    return RequestSubmitted(
        request_id="r1", model="m", reply_to="ib.reply.t.r1", token_prompt=ids, input_policy=policy
    )


def test_a_token_prompt_is_checked_as_the_text_it_spells():
    rules = InputRules()
    assert rules.decide(token_req([1, 2]), None, "Tell me a story.").rejection is None
    v = rules.decide(token_req([1, 2]), None, "username: ' OR 1=1 --")
    assert v.rejection is not None and v.rejection.code == "input_blocked"
    assert v.rejection.param == "prompt"


def test_a_token_prompt_nobody_can_read_passes_only_a_policy_that_lets_it():
    rules = InputRules()
    v = rules.decide(token_req([1, 2]), None, None)
    assert v.rejection is not None and v.rejection.code == "input_blocked"
    assert "no tokenizer" in v.rejection.reason and v.rejection.param == "prompt"
    for policy in ("flag", "off"):
        assert rules.decide(token_req([1, 2], policy), None, None).rejection is None


@pytest.mark.parametrize(
    "fields",
    [
        {"token_prompt": []},
        {"token_prompt": [-1]},
        {"token_prompt": [1], "prompt": "x"},
    ],
)
def test_a_bad_token_prompt_is_refused(fields):
    req = RequestSubmitted(request_id="r1", model="m", reply_to="ib.reply.t.r1", **fields)
    v = InputRules().decide(req, None, "x")
    assert v.rejection is not None and v.rejection.code == "invalid_request"


def test_an_end_passed_on_is_remembered_for_a_while_then_forgotten():
    ends = PassedEnds(keep_s=60.0)
    a, b, c, d, e = (("ib.reply.x", f"r{i}") for i in range(5))
    ends.passed(a, now=0.0)
    ends.passed(b, now=30.0)
    assert a in ends and b in ends
    assert ("ib.reply.x", "another request") not in ends  # a subject's other streams
    ends.passed(c, now=61.0)  # a is a minute old: gone; b stays
    assert a not in ends and b in ends and len(ends) == 2
    ends.passed(b, now=80.0)  # passed again: kept from then on
    ends.passed(d, now=100.0)
    assert b in ends
    ends.forget(d)  # a new stream under that name: its end is yet to come
    assert d not in ends
    ends.passed(e, now=200.0)
    assert len(ends) == 1
