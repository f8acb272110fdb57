"""SimEngine: deterministic output, stop strings, max_tokens, timing and slots."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferbus.contracts import ChatMessage, SamplingParams, StructuredOutput
from inferbus.services.worker.engine import EngineError, EngineOutput, EngineRequest
from inferbus.services.worker.sim import (
    VOCAB,
    SimEngine,
    SimTiming,
    count_tokens,
    merge,
    prompt_text,
)

FAST = SimTiming()


def request(rid: str = "r1", prompt: str = "Tell me about queues.", **sampling) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt=prompt, sampling=SamplingParams(**sampling))


async def collect(engine: SimEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


def text_of(outs: list[EngineOutput]) -> str:
    return "".join(o.text for o in outs)


class Running:
    """An engine started for one test and always stopped."""

    def __init__(self, timing: SimTiming = FAST, max_num_seqs: int = 256) -> None:
        self.engine = SimEngine("sim-model", timing, max_num_seqs=max_num_seqs)

    async def __aenter__(self) -> SimEngine:
        await self.engine.start()
        return self.engine

    async def __aexit__(self, *exc) -> None:
        await self.engine.stop()


# -- SimTiming -------------------------------------------------------------------------------


def test_prefill_seconds():
    t = SimTiming(prefill_s_per_token=0.002)
    assert t.prefill_seconds(0) == 0
    assert t.prefill_seconds(100) == pytest.approx(0.2)


def test_decode_step_seconds():
    t = SimTiming(decode_s_per_step=0.01, decode_s_per_seq=0.001)
    assert t.decode_step_seconds(0) == pytest.approx(0.01)
    assert t.decode_step_seconds(1) == pytest.approx(0.011)
    assert t.decode_step_seconds(32) == pytest.approx(0.042)


def test_default_timing_is_free():
    assert SimTiming().prefill_seconds(1000) == 0 and SimTiming().decode_step_seconds(64) == 0


# -- helpers -------------------------------------------------------------------------------


def test_prompt_text_of_messages_and_prompt():
    msgs = EngineRequest(request_id="r", messages=[ChatMessage(role="user", content="hi")])
    assert prompt_text(msgs) == "<|user|>hi\n<|assistant|>"
    assert prompt_text(request(prompt="plain")) == "plain"


def test_count_tokens_counts_words_and_punctuation_at_least_one():
    assert count_tokens("hello, world!") == 4
    assert count_tokens("") == 1


def test_merge_coalesces_outputs():
    a = EngineOutput(text="a ", token_ids=[1], prompt_tokens=3, completion_tokens=1)
    b = EngineOutput(
        text="b ",
        token_ids=[2],
        prompt_tokens=3,
        completion_tokens=2,
        choice_finish_reason="length",
    )
    [m] = merge([a, b])
    assert (m.text, m.token_ids, m.completion_tokens, m.choice_finish_reason) == (
        "a b ",
        [1, 2],
        2,
        "length",
    )
    assert merge([a]) == [a]


def test_merge_keeps_each_choice_s_run_apart():
    a0 = EngineOutput(text="a", token_ids=[1], prompt_tokens=3, completion_tokens=1)
    b1 = EngineOutput(text="b", token_ids=[2], prompt_tokens=3, completion_tokens=2, index=1)
    c1 = EngineOutput(text="c", token_ids=[3], prompt_tokens=3, completion_tokens=3, index=1)
    assert [(o.index, o.text) for o in merge([a0, b1, c1])] == [(0, "a"), (1, "bc")]


# -- generation ------------------------------------------------------------------------------


async def test_generate_needs_a_started_engine():
    engine = SimEngine("m", FAST)
    with pytest.raises(RuntimeError):
        await collect(engine, request())


async def test_same_prompt_and_seed_give_the_same_output_another_seed_differs():
    async with Running() as engine:
        a = await collect(engine, request("a", seed=7, max_tokens=24))
        b = await collect(engine, request("b", seed=7, max_tokens=24))
        c = await collect(engine, request("c", seed=8, max_tokens=24))
        d = await collect(engine, request("d", prompt="Something else", seed=7, max_tokens=24))
    assert text_of(a) == text_of(b)
    assert [t for o in a for t in o.token_ids] == [t for o in b for t in o.token_ids]
    assert text_of(a) != text_of(c)
    assert text_of(a) != text_of(d)
    # the text is made of vocabulary words
    assert all(w in VOCAB for w in text_of(a).split())


async def test_max_tokens_finishes_with_length():
    async with Running() as engine:
        outs = await collect(engine, request(max_tokens=10))
    last = outs[-1]
    assert last.finish_reason == "length"
    assert all(o.finish_reason is None for o in outs[:-1])
    assert last.completion_tokens == 10
    assert len([t for o in outs for t in o.token_ids]) == 10
    assert len(text_of(outs).split()) == 10
    assert last.prompt_tokens == count_tokens("Tell me about queues.")


async def test_chat_messages_generate_too():
    req = EngineRequest(
        request_id="r",
        messages=[ChatMessage(role="user", content="hi")],
        sampling=SamplingParams(max_tokens=3),
    )
    async with Running() as engine:
        outs = await collect(engine, req)
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 3


async def test_stop_string_spanning_two_tokens_ends_with_stop_and_is_never_emitted():
    async with Running() as engine:
        full = text_of(await collect(engine, request(seed=3, max_tokens=30)))
        words = full.split()
        # the end of word 4, the space and the start of word 5: crosses a token boundary
        boundary = len(" ".join(words[:5]))
        stop = full[boundary - 2 : boundary + 3]
        assert " " in stop and len(stop) == 5
        outs = await collect(engine, request(seed=3, max_tokens=30, stop=[stop]))
    text = text_of(outs)
    assert outs[-1].finish_reason == "stop"
    assert stop not in text
    assert text == full[: full.find(stop)]
    # generation stopped at the token that completed the stop string
    assert outs[-1].completion_tokens < 30
    # no chunk ever carried part of the stop string beyond what was finally kept
    assert all(stop not in o.text for o in outs)


async def test_stop_string_is_held_back_until_it_cannot_match():
    """A prefix of the stop string is not streamed early (it might become the stop)."""
    async with Running() as engine:
        full = text_of(await collect(engine, request(seed=5, max_tokens=20)))
        words = full.split()
        # a stop that starts like word 3 but never occurs
        stop = words[2] + "QQQ"
        assert stop not in full
        outs = await collect(engine, request(seed=5, max_tokens=20, stop=[stop]))
    assert outs[-1].finish_reason == "length"
    assert text_of(outs) == full
    words_all = full.split()
    emitted = ""
    for o in outs[:-1]:
        emitted += o.text
        generated = "".join(w + " " for w in words_all[: o.completion_tokens])
        # everything but the last len(stop)-1 generated characters is out, no more
        assert emitted == generated[: max(0, len(generated) - (len(stop) - 1))]


async def test_two_stop_strings_in_one_token_cut_at_the_earliest():
    async with Running() as engine:
        full = text_of(await collect(engine, request(seed=11, max_tokens=20)))
        word = next(w for w in full.split() if len(w) >= 4)
        first, later = word[2:4], word[0:2]  # `later` occurs before `first` in the word
        outs = await collect(engine, request(seed=11, max_tokens=20, stop=[first, later]))
    text = text_of(outs)
    assert outs[-1].finish_reason == "stop"
    assert later not in text and first not in text


async def test_decode_time_per_token():
    timing = SimTiming(decode_s_per_step=0.01)
    async with Running(timing) as engine:
        t0 = time.monotonic()
        outs = await collect(engine, request(max_tokens=10))
        elapsed = time.monotonic() - t0
    assert outs[-1].completion_tokens == 10
    assert elapsed >= 0.09


async def test_prefill_time_is_paid_once():
    timing = SimTiming(prefill_s_per_token=0.01)
    prompt = "one two three four five six seven eight nine ten"  # 10 tokens -> 0.1 s
    async with Running(timing) as engine:
        t0 = time.monotonic()
        await collect(engine, request(prompt=prompt, max_tokens=3))
        elapsed = time.monotonic() - t0
    assert 0.09 <= elapsed < 1.0


async def first_and_finish_order(max_num_seqs: int) -> list[tuple[str, str]]:
    """Two 8-token requests at once: when each one's first and last token came."""
    events: list[tuple[str, str]] = []

    async def consume(engine: SimEngine, name: str) -> None:
        first = True
        async for out in engine.generate(request(name, max_tokens=8)):
            if first:
                events.append((name, "first"))
                first = False
            if out.finish_reason is not None:
                events.append((name, "finish"))

    async with Running(SimTiming(decode_s_per_step=0.002), max_num_seqs=max_num_seqs) as engine:
        await asyncio.wait_for(asyncio.gather(consume(engine, "a"), consume(engine, "b")), 10)
    return events


async def test_max_num_seqs_one_runs_requests_one_after_the_other():
    events = await first_and_finish_order(1)
    assert events == [("a", "first"), ("a", "finish"), ("b", "first"), ("b", "finish")]


async def test_two_slots_run_requests_together():
    events = await first_and_finish_order(2)
    # b's first token comes before a finished: they share a batch
    assert events.index(("b", "first")) < events.index(("a", "finish"))


async def test_closing_the_generator_early_frees_the_slot():
    timing = SimTiming(decode_s_per_step=0.001)
    async with Running(timing, max_num_seqs=1) as engine:
        gen = engine.generate(request("long", max_tokens=8000))
        await gen.__anext__()
        await gen.__anext__()
        await gen.aclose()
        outs = await asyncio.wait_for(collect(engine, request("next", max_tokens=3)), 2.0)
        assert outs[-1].finish_reason == "length"
        # nothing left running or waiting once it is done
        await asyncio.sleep(0.01)
        assert engine.stats().running == 0 and engine.stats().waiting == 0


async def test_stats_report_running_and_waiting():
    timing = SimTiming(decode_s_per_step=0.005)
    async with Running(timing, max_num_seqs=1) as engine:
        a = engine.generate(request("a", max_tokens=1000))
        b = engine.generate(request("b", max_tokens=1000))
        await a.__anext__()
        task = asyncio.ensure_future(b.__anext__())
        await asyncio.sleep(0.02)
        assert engine.stats().running == 1
        assert engine.stats().waiting == 1
        await a.aclose()
        await asyncio.wait_for(task, 2.0)
        await b.aclose()


async def test_a_request_over_the_context_is_refused():
    async with Running(SimTiming()) as engine:
        with pytest.raises(EngineError) as err:
            await collect(engine, request("big", max_tokens=engine.max_model_len))
        assert err.value.code == "context_length_exceeded"


async def test_echo_prompts_are_answered_with_their_text():
    async with Running(SimTiming()) as engine:
        outs = await collect(
            engine, request("e", prompt="/echo card 4111 1111 1111 1111.", max_tokens=100)
        )
    assert "".join(o.text for o in outs) == "card 4111 1111 1111 1111."
    assert outs[-1].finish_reason == "stop" and len(outs) > 5


# -- n, logprobs, constraints ------------------------------------------------------------------


async def test_n_choices_each_end_and_differ_and_the_last_end_is_the_request_s():
    async with Running() as engine:
        outs = await collect(engine, request(n=3, max_tokens=6, seed=1))
    by_index = {i: [o for o in outs if o.index == i] for i in range(3)}
    texts = {i: text_of(o) for i, o in by_index.items()}
    assert len(set(texts.values())) == 3  # three samples, not one copied
    for runs in by_index.values():
        assert [o.choice_finish_reason for o in runs][-1] == "length"
        assert sum(len(o.token_ids) for o in runs) == 6
    assert outs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outs[:-1])
    assert outs[-1].completion_tokens == 18
    # choice 0 is the same text as the request with n=1
    async with Running() as engine:
        single = await collect(engine, request(max_tokens=6, seed=1))
    assert texts[0] == text_of(single)


async def test_logprobs_come_one_a_token_with_the_alternatives_asked_for():
    async with Running() as engine:
        outs = await collect(engine, request(max_tokens=5, logprobs=2))
        plain = await collect(engine, request(max_tokens=5))
    lps = [lp for o in outs for lp in o.logprobs]
    ids = [t for o in outs for t in o.token_ids]
    assert [lp.token_id for lp in lps] == ids
    assert "".join(lp.token for lp in lps) == text_of(outs)
    assert all(len(lp.top) == 2 and lp.top[0].token == lp.token for lp in lps)
    assert all(lp.logprob < 0 for lp in lps)
    assert all(not o.logprobs for o in plain)


async def test_an_output_constraint_is_refused_not_ignored():
    async with Running() as engine:
        with pytest.raises(EngineError, match="structured outputs"):
            await collect(
                engine, request(structured=StructuredOutput(regex="[a-z]+"), max_tokens=3)
            )
