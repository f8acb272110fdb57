"""Exact prefix routing against text blocks, on the real engine.

Two runs of ``inferbus up --engine vllm`` (tiny model, two workers, a bounded KV cache
so engines evict): "exact", where the sanitizer tokenizes every prompt and the
scheduler matches the engine's own block hashes against its KV events, and "text",
with the tokenizer off (``--sanitizer-arg=--tokenizers=``), where the scheduler
hashes 256-character blocks of the text and remembers what it routed where.

The same multi-turn chat workload goes through both: conversations with long system
prompts of their own and a few turns each, interleaved, a few in flight at once.
Per run: the engine's prefix hit rate (cached prompt tokens / prompt tokens, as the
engines report them), what the scheduler expected each worker to hold
(``WorkAssigned.expected_cached_tokens``), false hits (expected but not cached,
in tokens and requests), and TTFT. The last line is JSON.

    VLLM_CPU_KVCACHE_SPACE=1 python bench/prefix_routing.py [--conversations 48]
        [--turns 4] [--concurrency 4] [--kv-cache-blocks 96] [--workers 2] [--order exact,text]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import testkit_path  # noqa: F401  (before testkit)
from platform_up import new_tenant, start_up
from testkit.delivery import ready_workers

from inferbus.client import Client
from inferbus.contracts import WorkAssigned, status_subject
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode_or_none

MODEL = "tiny-llama"
TOPICS = ["compilers", "tides", "bread", "orbits", "chess", "glaciers", "radio", "ferns"]


@dataclass
class Served:
    prompt: int
    cached: int
    ttft_s: float


@dataclass
class Run:
    served: dict[str, Served] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=dict)
    failed: int = 0

    def row(self) -> dict[str, float | int]:
        rows = list(self.served.values())
        expected = [self.expected.get(rid, 0) for rid in self.served]
        prompt = sum(s.prompt for s in rows) or 1
        false = [max(0, e - s.cached) for e, s in zip(expected, rows, strict=True)]
        return {
            "requests": len(rows),
            "failed": self.failed,
            "engine_hit_rate": round(sum(s.cached for s in rows) / prompt, 4),
            "expected_hit_rate": round(sum(expected) / prompt, 4),
            "false_hit_tokens": sum(false),
            "false_hit_requests": sum(1 for f in false if f),
            "ttft_p50_ms": round(statistics.median(s.ttft_s for s in rows) * 1000, 1),
        }


def conversations(n: int, words: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        body = " ".join(rng.choice(TOPICS) + str(rng.randrange(1000)) for _ in range(words))
        out.append(f"You are assistant {i}, an expert on {topic}. Reference notes: {body}")
    return out


async def run_workload(client: Client, run: Run, systems: list[str], turns: int, conc: int):
    histories = [[{"role": "system", "content": s}] for s in systems]
    # turn t of every conversation before turn t+1 of any: each return is a cache test
    order = [(t, c) for t in range(turns) for c in range(len(systems))]
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for item in order:
        queue.put_nowait(item)
    turns: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def one(t: int, c: int) -> None:
        msgs = [*histories[c], {"role": "user", "content": f"Question {t}: and then?"}]
        sent = time.perf_counter()
        first = 0.0
        try:
            stream = client.stream(MODEL, messages=msgs, max_tokens=8, temperature=0.0)
            text = ""
            async for chunk in stream:
                first = first or time.perf_counter() - sent
                text += chunk.text
        except Exception:
            run.failed += 1
            return
        usage = stream.outcome.usage if stream.outcome else None
        if usage is None:
            run.failed += 1
            return
        run.served[stream.request.request_id] = Served(
            usage.prompt_tokens, usage.cached_prompt_tokens, first
        )
        histories[c] = [*msgs, {"role": "assistant", "content": text}]

    async def lane() -> None:
        while not queue.empty():
            t, c = queue.get_nowait()
            async with turns[c]:  # a conversation's turns run one after another
                await one(t, c)

    await asyncio.gather(*(lane() for _ in range(conc)))


async def measure(mode: str, a: argparse.Namespace, systems: list[str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"ib-prefix-{mode}-") as tmp:
        state = Path(tmp)
        args = [
            "--engine",
            "vllm",
            "--workers",
            str(a.workers),
            f"--worker-arg=--kv-cache-blocks={a.kv_cache_blocks}",
            "--worker-arg=--max-num-seqs=8",
        ]
        if mode == "text":
            args.append("--sanitizer-arg=--tokenizers=")
        proc, nats_url, _ = start_up(state, *args)
        try:
            tenant = new_tenant(state, nats_url)
            operator_path = state / "auth" / "creds" / "operator.json"
            watch = await connect(nats_url, "prefix-bench-watch", load_credentials(operator_path))
            run = Run()

            async def on_work(msg) -> None:
                ev = decode_or_none(msg.data, WorkAssigned)
                if ev is not None:
                    run.expected[ev.request.request_id] = ev.expected_cached_tokens

            await watch.subscribe("ib.work.>", cb=on_work)
            await ready_workers(nats_url, operator_path, MODEL, a.workers)
            client = await Client.connect(nats_url, f"prefix-bench-{mode}", creds=tenant)
            began = time.perf_counter()
            await run_workload(client, run, systems, a.turns, a.concurrency)
            wall = time.perf_counter() - began
            await client.close()
            status = json.loads(
                (await watch.request(status_subject("scheduler"), b"", timeout=5)).data
            )
            await watch.close()
            row = run.row()
            routing = status.get("routing", {})
            exact_share = routing.get("prefix_blocks_exact", 0) / max(
                1, routing.get("prefix_blocks_routed", 0)
            )
            return {**row, "exact_block_share": round(exact_share, 3), "wall_s": round(wall, 1)}
        finally:
            proc.send_signal(2)
            proc.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=48)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=120)
    ap.add_argument("--kv-cache-blocks", type=int, default=96)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--order", default="exact,text", help="which run goes first")
    a = ap.parse_args()
    systems = conversations(a.conversations, a.system_words)
    results = {}
    for mode in a.order.split(","):
        results[mode] = asyncio.run(measure(mode, a, systems))
        print(mode, results[mode], flush=True)
    e, t = results["exact"], results["text"]
    ratio = e["engine_hit_rate"] / t["engine_hit_rate"] if t["engine_hit_rate"] else None
    shown = None if ratio is None else round(ratio, 3)
    print(
        f"engine hit rate exact/text: {shown}; false hits (requests): "
        f"exact {e['false_hit_requests']}, text {t['false_hit_requests']}"
    )
    print(json.dumps({"results": results, "hit_rate_ratio": ratio}))


if __name__ == "__main__":
    main()
