"""The PII filter on the whole answer: each of ``n`` choices masked on its own, and the
token logprobs (a token and its alternatives) never give back what the text masked."""

from __future__ import annotations

import json

import msgspec

from inferbus.contracts import (
    RequestFinished,
    TokenChunk,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from inferbus.services.sanitizer.core import FilteredStream

CARD = "4111 1111 1111 1111"


def lp(token: str, *alternatives: str) -> TokenLogprob:
    return TokenLogprob(
        token=token,
        logprob=-0.5,
        token_id=7,
        top=[TopLogprob(token=a, logprob=-1.0 - i, token_id=9) for i, a in enumerate(alternatives)],
    )


def run(chunks: list[TokenChunk]) -> list[TokenChunk]:
    s = FilteredStream("r", "c", 0.0)
    out = []
    for c in chunks:
        events, _ = s.on_event(c, 0.0)
        out += events
    fin = RequestFinished(
        request_id="r", finish_reason="stop", chunks=len(chunks), usage=Usage(completion_tokens=9)
    )
    events, over = s.on_event(fin, 0.0)
    assert over and events[-1].finish_reason == "stop"
    return [*out, *events[:-1]]


def tokens_of(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_each_choice_is_masked_apart():
    chunks = [
        TokenChunk(request_id="r", seq=0, text="one ", index=0),
        TokenChunk(request_id="r", seq=1, text=f"card {CARD[:7]}", index=1),
        TokenChunk(request_id="r", seq=2, text="two", index=0),
        TokenChunk(request_id="r", seq=3, text=f"{CARD[7:]} end", index=1),
    ]
    out = run(chunks)
    texts = {i: "".join(c.text for c in out if c.index == i) for i in (0, 1)}
    assert texts == {0: "one two", 1: "card ****1111 end"}
    assert [c.seq for c in out] == list(range(len(out)))


def test_a_card_number_is_masked_in_the_tokens_and_their_alternatives():
    text = f"pay {CARD} now"
    pieces = tokens_of(text)
    chunks = [
        TokenChunk(
            request_id="r",
            seq=i,
            text=p,
            n_tokens=1,
            # the alternatives at each position: digits the model nearly wrote
            logprobs=[lp(p, p, "4111", "9")],
        )
        for i, p in enumerate(pieces)
    ]
    out = run(chunks)
    shown = "".join(c.text for c in out)
    assert shown == "pay ****1111 now"
    lps = [x for c in out for x in c.logprobs]
    assert len(lps) == len(pieces)  # one a token, none lost or doubled
    assert "".join(x.token for x in lps) == shown  # the tokens spell the masked text
    everything = msgspec.json.encode([c.logprobs for c in out]).decode()
    for digits in ("4111 1", "1111 1111", " 41", "11 "):
        assert digits not in everything
    inside = [x for x in lps if "*" in x.token or not x.token.strip()]
    assert len(inside) >= 5
    for x in inside:  # a masked position: no token id, alternatives shown as the token
        assert x.token_id == -1 and [t.token for t in x.top] == [x.token] * 3
    # outside the card the tokens and alternatives are as they came
    assert lps[0] == lp("pay", "pay", "4111", "9")


def test_an_alternative_that_is_pii_on_its_own_is_masked():
    chunks = [
        TokenChunk(
            request_id="r",
            seq=0,
            text="mail ",
            logprobs=[lp("mail ", "mail ", "bob@example.com")],
        )
    ]
    # the first chunk goes at once, empty while the masker holds "mail " back
    first, c = run(chunks)
    assert (first.text, first.logprobs) == ("", [])
    assert c.text == "mail "
    assert [t.token for t in c.logprobs[0].top] == ["mail ", "b***@example.com"]


def test_logprobs_that_do_not_spell_their_chunk_stay_with_it():
    # the engine held text back for a stop string: the chunk's tokens and its text
    # differ, so its logprobs go out with the chunk's whole span
    chunks = [
        TokenChunk(request_id="r", seq=0, text="", logprobs=[lp("a"), lp("b")]),
        TokenChunk(request_id="r", seq=1, text="ab c", logprobs=[lp(" c")]),
    ]
    out = run(chunks)
    assert "".join(c.text for c in out) == "ab c"
    assert [x.token for c in out for x in c.logprobs] == ["a", "b", " c"]


def test_masking_keeps_a_json_answer_valid_json():
    """A json_schema answer: a card number written as a string stays a masked string,
    one written as an integer stays an integer (a masked string there broke the
    document: ``{"card": ****1111}``), escapes and split chunks included."""
    doc = (
        '{"card": "4111 1111 1111 1111", "number": 4111111111111111, '
        '"phone": 13800138000, "note": "say \\"4111 1111 1111 1111\\"", "n": -1.5e3}'
    )
    s = FilteredStream("r", "c", 0.0, json_output=True)
    out = []
    for i, piece in enumerate(tokens_of(doc, 5)):
        events, _ = s.on_event(TokenChunk(request_id="r", seq=i, text=piece), 0.0)
        out += events
    fin = RequestFinished(request_id="r", finish_reason="stop", chunks=99, usage=Usage())
    events, _ = s.on_event(fin, 0.0)
    text = "".join(c.text for c in [*out, *events[:-1]])
    parsed = json.loads(text)
    assert parsed["card"] == "****1111"
    assert isinstance(parsed["number"], int) and str(parsed["number"]).endswith("1111")
    assert "4111111111" not in text and parsed["number"] != 4111111111111111
    assert isinstance(parsed["phone"], int) and parsed["phone"] != 13800138000
    assert parsed["note"] == 'say "****1111"' and parsed["n"] == -1500.0


def test_outside_json_a_masked_number_stays_masked_with_stars():
    s = FilteredStream("r", "c", 0.0)
    events, _ = s.on_event(TokenChunk(request_id="r", seq=0, text="n: 4111111111111111 ok"), 0.0)
    fin = RequestFinished(request_id="r", finish_reason="stop", chunks=1, usage=Usage())
    rest, _ = s.on_event(fin, 0.0)
    assert "".join(c.text for c in [*events, *rest[:-1]]) == "n: ****1111 ok"


def test_tool_call_arguments_are_masked_and_stay_json():
    """What an agent's tool would be sent passes the same masking as the text: a card
    number split across argument pieces, as a string and as a JSON number."""
    args = json.dumps({"card": CARD, "amount": 4111111111111111, "to": "bob@example.com"})
    pieces = [args[i : i + 5] for i in range(0, len(args), 5)]
    chunks = [
        TokenChunk(
            request_id="r",
            seq=i,
            text="",
            n_tokens=1,
            tool_calls=[
                ToolCallDelta(
                    index=0,
                    id="call_1" if i == 0 else None,
                    name="pay" if i == 0 else None,
                    arguments=p,
                )
            ],
        )
        for i, p in enumerate(pieces)
    ]
    out = run(chunks)
    calls = [d for c in out for d in c.tool_calls]
    assert calls[0].id == "call_1" and calls[0].name == "pay"
    assert all(d.index == 0 for d in calls)
    joined = "".join(d.arguments for d in calls)
    masked = json.loads(joined)  # still a JSON document
    assert CARD not in joined and "bob@example.com" not in joined
    assert masked["card"].endswith("1111") and "*" in masked["card"]
    assert isinstance(masked["amount"], int) and masked["amount"] != 4111111111111111
    assert sum(c.tokens for c in out) == len(pieces)


def test_reasoning_and_each_tool_call_are_masked_apart():
    chunks = [
        TokenChunk(request_id="r", seq=0, text="", reasoning=f"the card is {CARD[:9]}"),
        TokenChunk(
            request_id="r",
            seq=1,
            text="",
            reasoning=CARD[9:],
            tool_calls=[ToolCallDelta(index=0, id="a", name="f", arguments='{"x": "4111 ')],
        ),
        TokenChunk(
            request_id="r",
            seq=2,
            text="done",
            tool_calls=[
                ToolCallDelta(index=0, arguments='1111 1111 1111"}'),
                ToolCallDelta(index=1, id="b", name="g", arguments='{"y": 1}'),
            ],
        ),
    ]
    out = run(chunks)
    reasoning = "".join(c.reasoning for c in out)
    assert reasoning == "the card is ****1111"
    by_call: dict[int, str] = {}
    for d in (d for c in out for d in c.tool_calls):
        by_call[d.index] = by_call.get(d.index, "") + d.arguments
    assert json.loads(by_call[0]) == {"x": "****1111"}
    assert json.loads(by_call[1]) == {"y": 1}
    assert "".join(c.text for c in out) == "done"


def test_a_choice_s_first_chunk_goes_out_at_once_even_held_back():
    """The client sees the first token when the engine made it, though the masker holds
    its text (a number still being written) or a parser its tool call's name: vLLM's
    server sends its first event then too (the tools workload's TTFT was 3x vLLM's
    while the first piece waited for the call's name)."""
    chunks = [
        TokenChunk(request_id="r", seq=0, text="41", n_tokens=1),
        TokenChunk(request_id="r", seq=1, text="11 1111", n_tokens=1),
    ]
    out = run(chunks)
    assert (out[0].text, out[0].tokens) == ("", 1)
    assert "".join(c.text for c in out) == "4111 1111"
