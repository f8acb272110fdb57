"""The KV spill connector on the real engine, run as a script (vLLM's engine core
starts by spawn, which needs a ``__main__`` guard): the worker's VllmEngine with the
tiny model, three engine lives over one disk tier. Prints a JSON line per request."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from inferbus.contracts import SamplingParams
from inferbus.services.worker.engine import EngineOptions, EngineRequest
from inferbus.services.worker.vllm_engine import VllmEngine, prepare_environment
from inferbus.shared.kvblocks import encode_block, stored_on_disk

PROMPT = " ".join(f"word{i} and more" for i in range(180))


async def run(engine: VllmEngine, label: str, weights: str = "") -> None:
    request = EngineRequest(
        request_id=label,
        prompt=PROMPT,
        sampling=SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        weights=weights,
    )
    text, last = "", None
    async for out in engine.generate(request):
        text += out.text
        last = out
    assert last is not None
    restored = last.restored
    print(
        json.dumps(
            {
                "label": label,
                "text": text,
                "prompt_tokens": last.prompt_tokens,
                "cached_tokens": last.cached_tokens,
                "restored": None
                if restored is None
                else {
                    "tokens": restored.tokens,
                    "tiers": restored.tiers,
                    "failed": restored.failed,
                    "bytes": restored.bytes,
                    "seconds": restored.seconds,
                },
            }
        ),
        flush=True,
    )


async def life(model: str, disk: Path, *labels: str) -> None:
    engine = VllmEngine(
        EngineOptions(
            model=model,
            enforce_eager=True,
            max_model_len=2048,
            max_num_seqs=4,
            kv_spill_host_mb=64,
            kv_spill_disk_dir=str(disk),
            kv_spill_disk_mb=256,
        )
    )
    await engine.start()
    try:
        for label in labels:
            if label == "reset":  # the engine's own prefix cache forgets everything
                await engine._engine.reset_prefix_cache()
            elif label.startswith("other"):
                await run(engine, label, weights="tiny@other-version")
            else:
                await run(engine, label)
    finally:
        await engine.stop()


def damage(disk: Path, forge: bool) -> None:
    """Flip a byte in the oldest block of each namespace (a bad checksum), or rewrite
    every block as zeros under a valid header (only the engine's output can tell)."""
    seen: set[str] = set()
    for key, size in stored_on_disk(disk):
        namespace, _, digest = key.partition(":")
        path = disk / namespace / digest[:2] / f"{digest}.kv"
        if forge:
            path.write_bytes(encode_block(key, bytes(size)))
        elif namespace not in seen:
            seen.add(namespace)
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))


async def main(model: str, disk: Path) -> None:
    prepare_environment(str(disk.parent / "state"), "kv-spill-test")
    await life(model, disk, "first", "again", "reset", "from-host", "other-weights")
    damage(disk, forge=False)
    await life(model, disk, "from-damaged-disk", "reset", "from-host-after-repair")
    damage(disk, forge=True)
    await life(model, disk, "from-forged-disk")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
