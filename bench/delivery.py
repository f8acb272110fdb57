"""Model delivery on the real engine: how long each swap takes against restarting the
worker, what fails meanwhile, and how fast a canary that breaches its SLO is undone.

    python bench/delivery.py [--clients 2] [--cold-swap auto|overlap|replace]
        [--rollback-engine vllm|sim] [--skip-rollback]

Swaps (``inferbus up``, one vLLM worker with the tiny model, LoRA on; a steady load of
``--clients`` callers on the base model the whole time): for each mode, the time
from the delivery event (as the delivery service publishes it) to the first token a
client gets from the new version, signature check included:

- hot: the first version of a LoRA adapter (a request for it waits in the queue
  from just before the deploy);
- warm: new weights of the same shapes (``make-tiny --seed 1``);
- cold: another architecture (``make-tiny --arch tiny-deep``).

Its reference is restarting the worker process on that version: the worker is killed
(-9) once the version is current, ``inferbus up`` restarts it, and it starts on the
registry's current version; the time from the kill to the first token from it. The
load's requests that failed during each swap are counted (goal 0; the restarts' are
shown apart: a killed worker's requests fail by design).

Rollback: two workers, a canary of new weights at 50% with ``ttft_p95`` as its SLO
and a 10 s window; once traffic is on it, its worker is starved of CPU (stopped 1.5 s
of every 1.6 s). The time from then to the rollback decision, and to the last answer
from the canary. Goals (tiny model): hot < 0.1 s; warm < 1 s and <= 0.1x a restart;
cold <= 1.2x a restart; 0 failed during swaps; breach to rollback <= 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import testkit_path  # noqa: F401  (before testkit)
from testkit.delivery import SteadyLoad, canary_instance, cli, ready_workers, throttle, trail
from testkit.faults import Platform

from inferbus.contracts import DELIVERY_LOADS, SWAPPED, ModelDelivery, ModelSwapped
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import load_credentials
from inferbus.shared.codec import decode_or_none
from inferbus.tinymodel import make_tiny, make_tiny_lora

MODEL, LORA = "tiny-llama", "tiny-lora"


class Deliveries:
    """When each delivery event went out, as a subscriber on the bus saw it, and the
    worker's account of each swap (fetch, signature check, swap, total)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.swapped: dict[str, ModelSwapped] = {}

    async def open(self, p: Platform) -> Deliveries:
        self.nc = await connect(p.nats_url, "bench-deliveries", load_credentials(p.operator))

        async def on(msg) -> None:
            ev = decode_or_none(msg.data, ModelDelivery)
            if ev is not None:
                self.at.setdefault(ev.model.ref, time.monotonic())

        async def on_swapped(msg) -> None:
            ev = decode_or_none(msg.data, ModelSwapped)
            if ev is not None and ev.ok:
                self.swapped.setdefault(ev.model, ev)

        await self.nc.subscribe(DELIVERY_LOADS, cb=on)
        await self.nc.subscribe(SWAPPED, cb=on_swapped)
        return self


def first_token_on(load: SteadyLoad, ref: str, after: float) -> float | None:
    firsts = [
        a.first_token
        for a in load.answers
        if a.kind == "ok" and a.served_model == ref and a.first_token >= after
    ]
    return min(firsts) if firsts else None


def failed_between(load: SteadyLoad, start: float, end: float) -> int:
    return sum(1 for a in load.answers if a.kind != "ok" and start <= a.ended <= end)


async def restart_reference(p: Platform, prober: SteadyLoad, ref: str) -> float:
    """Kill the worker (-9); seconds until a client's first token from ``ref`` served by
    the restarted process (``prober`` asks for it from the kill on)."""
    pid = (await p.pids())["worker-0"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while time.monotonic() < killed + 300:
        a = await prober.one(f"restart probe {time.monotonic()}")
        if a.kind == "ok" and a.served_model == ref:
            return a.first_token - killed
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no answer from {ref} within 300 s of the restart")


async def swaps(args: argparse.Namespace, root: Path) -> dict:
    extra = (
        "--worker-arg=--enable-lora=true",
        "--worker-arg=--max-lora-rank=8",
        f"--worker-arg=--cold-swap={args.cold_swap}",
    )
    p = Platform(root / "swaps", workers=1, engine="vllm", extra=extra)
    out: dict = {}
    try:
        base, key = p.state / "models" / MODEL, str(p.state / "signing" / "release.key")
        folders = {
            (LORA, "a1"): make_tiny_lora(base, root / "a1", seed=3),
            (MODEL, "v2"): make_tiny(root / "v2", seed=1),
            (MODEL, "deep"): make_tiny(root / "deep", arch="tiny-deep"),
        }
        for (name, version), folder in folders.items():
            more = ("--base", MODEL) if name == LORA else ()
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
                *more,
            )
        events = await Deliveries().open(p)
        async with SteadyLoad(p.nats_url, str(p.tenant), MODEL, clients=args.clients) as load:
            await asyncio.sleep(3)
            for mode, ref in (
                ("hot", f"{LORA}@a1"),
                ("warm", f"{MODEL}@v2"),
                ("cold", f"{MODEL}@deep"),
            ):
                name = ref.split("@")[0]
                began = time.monotonic()
                if mode == "hot":  # a caller for the adapter, waiting from before the deploy
                    async with SteadyLoad(
                        p.nats_url, str(p.tenant), LORA, clients=0, tokens=4
                    ) as probe:
                        asked = asyncio.create_task(probe.one("hot probe"))
                        await asyncio.sleep(0.5)
                        await asyncio.to_thread(
                            cli,
                            p.nats_url,
                            p.operator,
                            "model",
                            "deploy",
                            ref,
                            "--wait",
                            "--timeout",
                            "120s",
                        )
                        answer = await asked
                    first = answer.first_token if answer.served_model == ref else None
                else:
                    deploy = ("model", "deploy", ref, "--no-canary", "--wait", "--timeout", "300s")
                    await asyncio.to_thread(cli, p.nats_url, p.operator, *deploy)
                    await asyncio.sleep(2)
                    first = first_token_on(load, ref, began)
                event = events.at[ref]
                swap_s = None if first is None else first - event
                failed = failed_between(load, began, time.monotonic())
                await asyncio.sleep(2)
                async with SteadyLoad(
                    p.nats_url, str(p.tenant), name, clients=0, tokens=4
                ) as prober:
                    restart_s = await restart_reference(p, prober, ref)
                await asyncio.sleep(3)
                w = events.swapped.get(ref)
                parts = {}
                if w is not None:  # the worker's own account of its swap
                    parts = {
                        "fetch_s": w.fetch_s,
                        "verify_s": w.verify_s,
                        "engine_s": w.swap_s,
                        "worker_total_s": w.total_s,
                    }
                out[mode] = {
                    "swap_s": swap_s,
                    "restart_s": restart_s,
                    "ratio": None if swap_s is None else swap_s / restart_s,
                    "failed_during_swap": failed,
                    **parts,
                }
                worker = "  ".join(f"{k} {v:.3f}" for k, v in parts.items())
                print(
                    f"{mode:<5} swap {swap_s:.3f} s   restart {restart_s:.2f} s   ratio "
                    f"{out[mode]['ratio']:.4f}   failed during swap {failed}   worker: "
                    f"{worker}",
                    flush=True,
                )
        out["restart_failures"] = len(load.failures()) - sum(
            v["failed_during_swap"] for v in out.values() if isinstance(v, dict)
        )
        await events.nc.close()
    finally:
        p.stop()
    return out


async def rollback(args: argparse.Namespace, root: Path) -> dict:
    engine = args.rollback_engine
    p = Platform(
        root / "rollback",
        workers=2,
        engine=engine,
        extra=("--worker-arg=--sim-prefill-s-per-token=0.0005",) if engine == "sim" else (),
    )
    try:
        name = MODEL if engine == "vllm" else "sim-model"
        make_tiny(root / "slow", seed=7)
        cli(
            p.nats_url,
            p.operator,
            "model",
            "push",
            str(root / "slow"),
            "--name",
            name,
            "--version",
            "v-slow",
            "--key",
            str(p.state / "signing" / "release.key"),
        )
        await ready_workers(p.nats_url, p.operator, name, 2)  # a canary needs both
        async with SteadyLoad(p.nats_url, str(p.tenant), name, clients=3) as load:
            await asyncio.sleep(3)
            cmd = asyncio.create_task(
                asyncio.to_thread(
                    cli,
                    p.nats_url,
                    p.operator,
                    "model",
                    "deploy",
                    f"{name}@v-slow",
                    "--steps",
                    "50",
                    "--interval",
                    "300s",
                    "--min-samples",
                    "5",
                    "--slo",
                    "ttft_p95=1.0",
                    "--wait",
                    "--timeout",
                    "300s",
                    timeout=400,
                    rc=1,
                )
            )
            canary = await canary_instance(p.nats_url, p.operator, name, "v-slow")
            stop = asyncio.Event()
            slowed, slowed_wall = time.monotonic(), time.time()
            slow = asyncio.create_task(throttle((await p.pids())[canary], 1.5, 0.1, stop))
            await cmd
            stop.set()
            await slow
            await asyncio.sleep(2)
        decided = next(d for d in trail(p.nats_url, p.operator, name) if d["action"] == "rollback")
        on_canary = [a.ended for a in load.answers if a.served_model == f"{name}@v-slow"]
        return {
            "engine": engine,
            "breach_to_rollback_s": decided["decided_at"] - slowed_wall,
            "breach_to_last_canary_answer_s": max(on_canary) - slowed if on_canary else None,
            "reason": decided["reason"],
            "failed": len(load.failures()),
        }
    finally:
        p.stop()


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result = {"bench": "delivery", "swaps": await swaps(args, Path(tmp))}
        if not args.skip_rollback:
            result["rollback"] = await rollback(args, Path(tmp))
            r = result["rollback"]
            print(
                f"rollback ({r['engine']}): breach to decision "
                f"{r['breach_to_rollback_s']:.1f} s, to the canary's last answer "
                f"{r['breach_to_last_canary_answer_s']:.1f} s, failed {r['failed']}"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--cold-swap", choices=["auto", "overlap", "replace"], default="auto")
    ap.add_argument("--rollback-engine", choices=["vllm", "sim"], default="vllm")
    ap.add_argument("--skip-rollback", action="store_true")
    asyncio.run(main(ap.parse_args()))
