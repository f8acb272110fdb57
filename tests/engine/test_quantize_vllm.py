"""vLLM serves the AWQ checkpoint ``inferbus model quantize`` writes, and its output
tracks the unquantized model's (one engine at a time, in a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from inferbus.quantize import awq_quantize
from inferbus.services.worker.capability import quantization_refusal
from inferbus.tinymodel import make_tiny

pytestmark = [
    pytest.mark.engine(seconds=65),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(600),
]

CHECK = Path(__file__).parent.parent / "testkit" / "awqcheck.py"


def test_vllm_serves_the_awq_checkpoint_and_its_logprobs_track_the_original(tmp_path):
    if why := quantization_refusal("vllm", "awq"):
        pytest.skip(why)  # an AVX2-only CPU: workers refuse AWQ (test_worker_capability.py)
    src = make_tiny(tmp_path / "m")
    awq_quantize(src, tmp_path / "awq")
    done = subprocess.run(
        [sys.executable, str(CHECK), str(src), "float32", str(tmp_path / "awq")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])[str(tmp_path / "awq")]
    assert stats["positions"] > 1000
    # the random tiny model's next-token distributions are nearly flat, so greedy
    # continuations diverge at the first near-tie; log probabilities are what track
    assert stats["pearson"] > 0.95, stats
    assert stats["mean_abs_logprob_diff"] < 0.1, stats
