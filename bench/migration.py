"""What a migration costs on the real engine: restore against recompute.

`inferbus up --engine vllm --workers 2` (the tiny model), a chat with a long system
prompt (a new one each run, so no cache holds it before) streamed greedily; at its
first chunk the serving worker is killed with SIGKILL and the stream goes on on the
other worker as a continuation. Once with the KV spill tiers on (the default: the
first worker saved the prompt's blocks to the shared tier, so the continuation
restores them), once with `--kv-spill false` (the continuation computes the prompt
again). For each: the client-visible gap (its longest wait between two chunks after
the kill), the
continuation's prefill as its engine timed it, and the prompt tokens it found cached.

    python bench/migration.py [--runs 3] [--system-words 100] [--tokens 1000]

The last line is the same as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import testkit_path  # noqa: F401  (before testkit)
from testkit.delivery import ready_workers
from testkit.faults import Platform, Starts

from inferbus.client import Client

MODEL = "tiny-llama"


async def one_run(p: Platform, words: int, tokens: int) -> dict[str, float]:
    starts = await Starts().open(p, "migration-bench")
    client = await Client.connect(p.nats_url, "migration-bench-client", creds=p.tenant)
    try:
        await ready_workers(p.nats_url, p.operator, MODEL, 2, timeout=300)
        tag = uuid.uuid4().hex[:8]  # no cache holds this prompt yet
        system = f"Session {tag}. " + " ".join(f"rule{i % 97} holds" for i in range(words))
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": "Tell me a long story."},
        ]
        pids = await p.pids()
        stream = client.stream(
            MODEL, messages=messages, max_tokens=tokens, temperature=0.0, ignore_eos=True
        )
        await stream.__anext__()
        instance = await starts.instance(stream.request_id)
        await asyncio.sleep(0.5)  # its blocks reach the shared tier behind the steps
        os.kill(pids[instance], signal.SIGKILL)
        # the client may hold chunks the worker sent ahead: the gap is its longest wait
        last, gap = time.monotonic(), 0.0
        async for _ in stream:
            now = time.monotonic()
            gap, last = max(gap, now - last), now
        end = stream.outcome
        assert end is not None and end.resumed, "the stream ended before the kill"
        return {
            "gap_s": gap,
            "prefill_s": end.timings.prefill_s,
            "cached_prompt_tokens": end.usage.cached_prompt_tokens,
            "prompt_tokens": end.usage.prompt_tokens,
        }
    finally:
        await client.close()
        await starts.close()


async def measure(label: str, extra: tuple[str, ...], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        p = Platform(Path(tmp) / "state", workers=2, engine="vllm", extra=extra)
        try:
            runs = [await one_run(p, args.system_words, args.tokens) for _ in range(args.runs)]
        finally:
            p.stop()
    out = {
        "tiers": label,
        "runs": len(runs),
        **{k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]},
    }
    print(json.dumps(out), flush=True)
    return out


async def main(args: argparse.Namespace) -> None:
    restore = await measure("spill on (restore)", (), args)
    recompute = await measure("spill off (recompute)", ("--worker-arg=--kv-spill=false",), args)
    ratio = restore["prefill_s"] / recompute["prefill_s"] if recompute["prefill_s"] else None
    print(
        f"\ncontinuation prefill: restore {restore['prefill_s']:.3f}s, recompute "
        f"{recompute['prefill_s']:.3f}s (ratio {ratio:.2f}); gap {restore['gap_s']:.2f}s "
        f"against {recompute['gap_s']:.2f}s; cached prompt tokens "
        f"{restore['cached_prompt_tokens']} against {recompute['cached_prompt_tokens']} "
        f"of {restore['prompt_tokens']}"
        if ratio is not None
        else "no prefill time reported"
    )
    print(json.dumps({"bench": "migration", "restore": restore, "recompute": recompute}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=1000)
    asyncio.run(main(ap.parse_args()))
