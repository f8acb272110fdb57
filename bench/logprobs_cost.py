"""CPU cost of logprobs in the token path, per 1,000 tokens, against the same path
without them: the platform's own work on each token, with the engine left out.

Each token goes the way the services take it, in this process, one token a chunk
(what vLLM's engine yields a streamed request): the worker turns vLLM's per-position
logprob dicts into the contract's (``vllm_params.logprobs_of``; absent without
logprobs) and its chunk (``RequestStream.chunk``), encodes it; the sanitizer decodes
it, masks it (``FilteredStream``: text, and with logprobs the tokens and their
alternatives) and encodes what it passes on; the gateway decodes that, reads it
(``ReplyReader``) and writes the SSE event (``Shapes.chunk_event``). The text is
ordinary prose with a card number and an email in every 400 characters, so the
masking runs. Both modes run in the same process, interleaved, best of ``--rounds``.

    python bench/logprobs_cost.py [--tokens 1000] [--top 5] [--rounds 7]

Prints CPU microseconds per 1,000 tokens for each stage and in all, the bytes a token
costs on the bus, and the ratio to the path without logprobs; the last line is the
same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

from inferbus.contracts import (
    ReplyReader,
    RequestSubmitted,
    SamplingParams,
    TokenChunk,
    WorkAssigned,
)
from inferbus.services.gateway.shapes import Shapes
from inferbus.services.sanitizer.core import FilteredStream
from inferbus.services.worker.core import RequestStream
from inferbus.services.worker.engine import EngineOutput
from inferbus.services.worker.vllm_params import logprobs_of
from inferbus.shared.codec import decode, encode

PROSE = (
    "The scheduler routes each request to the worker whose cache holds the longest "
    "prefix, and the sanitizer masks what must not leave: card 4111 1111 1111 1111, "
    "mail li.wei@example.cn. Then the stream goes on with ordinary words about queues, "
    "batches and budgets, the way a model writes an answer to a question it was asked. "
)


@dataclass
class Logprob:
    """vLLM's ``Logprob`` as the engine hands it over."""

    logprob: float
    rank: int
    decoded_token: str


def tokens(n: int) -> list[str]:
    """``n`` tokens of about four characters, cut from the prose."""
    text = PROSE * (n * 4 // len(PROSE) + 2)
    return [text[i * 4 : i * 4 + 4] for i in range(n)]


def vllm_steps(pieces: list[str], top: int) -> list[dict[int, Logprob]]:
    """One dict a position, as vLLM gives them: the sampled token and the top ones."""
    steps = []
    for i, piece in enumerate(pieces):
        step = {i: Logprob(-0.1, 1, piece)}
        for r in range(2, top + 1):
            step[10_000 + r] = Logprob(-0.1 * r, r, f"alt{r}")
        steps.append(step)
    return steps


def run(pieces: list[str], top: int | None) -> dict[str, float]:
    """CPU seconds of each stage over all tokens, and the bytes on the bus."""
    request = RequestSubmitted(
        request_id="r1",
        model="m",
        reply_to="ib.reply.g.r1",
        prompt="x",
        sampling=SamplingParams(max_tokens=len(pieces), logprobs=top),
    )
    worker = RequestStream(WorkAssigned(request=request, worker_id="w"), "w", 0.0)
    steps = vllm_steps(pieces, top or 0)
    sanitizer = FilteredStream("r1", "ib.reply.g.r1", 0.0)
    reader = ReplyReader("r1")
    shapes = Shapes(chat=True, request_id="r1", model="m", created=1, logprobs=top is not None)
    clock = time.process_time
    spent = {"worker": 0.0, "sanitizer": 0.0, "gateway": 0.0, "bytes": 0.0}
    for i, piece in enumerate(pieces):
        t0 = clock()
        lps = logprobs_of([i], steps[i : i + 1], top, lambda t: "?") if top is not None else []
        chunk = worker.chunk(
            EngineOutput(
                text=piece,
                token_ids=[i],
                prompt_tokens=1,
                completion_tokens=i + 1,
                logprobs=lps,
            )
        )
        assert chunk is not None
        wire = encode(chunk)
        t1 = clock()
        out, _ = sanitizer.on_event(decode(wire, TokenChunk), 0.0)
        passed = [encode(ev) for ev in out]
        t2 = clock()
        for raw in passed:
            reading = reader.read(decode(raw, TokenChunk))
            for c in reading.chunks:
                shapes.chunk_event(c)
        t3 = clock()
        spent["worker"] += t1 - t0
        spent["sanitizer"] += t2 - t1
        spent["gateway"] += t3 - t2
        spent["bytes"] += len(wire)
    return spent


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--top", type=int, default=5, help="alternatives a token (top_logprobs)")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    pieces = tokens(a.tokens)
    best: dict[str, dict[str, float]] = {}
    for _ in range(a.rounds):
        for mode, top in (("plain", None), (f"logprobs={a.top}", a.top)):
            got = run(pieces, top)
            was = best.get(mode)
            total = got["worker"] + got["sanitizer"] + got["gateway"]
            if was is None or total < was["total"]:
                best[mode] = {**got, "total": total}
    per_k = 1000 / a.tokens
    result: dict[str, Any] = {"tokens": a.tokens, "top": a.top, "rounds": a.rounds}
    for mode, got in best.items():
        result[mode] = {
            k: round(v * per_k * 1e6, 1) if k != "bytes" else round(v / a.tokens, 1)
            for k, v in got.items()
        }
        print(
            f"{mode:>12}: {result[mode]['total']:9.1f} µs CPU per 1000 tokens "
            f"(worker {result[mode]['worker']:.1f}, sanitizer {result[mode]['sanitizer']:.1f}, "
            f"gateway {result[mode]['gateway']:.1f}); {result[mode]['bytes']:.0f} bytes a token"
        )
    plain, lp = best["plain"]["total"], best[f"logprobs={a.top}"]["total"]
    result["ratio"] = round(lp / plain, 2)
    result["added_us_per_1000_tokens"] = round((lp - plain) * per_k * 1e6, 1)
    print(
        f"logprobs={a.top} costs {result['ratio']}x the plain path's CPU: "
        f"+{result['added_us_per_1000_tokens']} µs per 1000 tokens"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
