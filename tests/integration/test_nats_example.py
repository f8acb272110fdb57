"""docs/examples/nats_client.py, the plain nats-py client of docs/nats-api.md, end to end."""

from __future__ import annotations

import ast
import asyncio
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from testkit.simplatform import MODEL, SLOW_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "nats_client.py"
USAGE = re.compile(
    r"usage: prompt_tokens=(\d+) completion_tokens=(\d+) "
    r"cached_prompt_tokens=(\d+) finish_reason=(\w+)"
)


async def run_example(nats_url: str, *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--nats-url",
        nats_url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


def test_the_example_needs_only_nats_py_and_the_standard_library():
    tree = ast.parse(EXAMPLE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add((node.module or "").split(".")[0])
    assert "inferbus" not in imported
    assert imported - set(sys.stdlib_module_names) == {"nats"}
    assert "__import__" not in EXAMPLE.read_text() and "importlib" not in imported


async def test_the_example_streams_what_the_python_client_gets(nats_url, client):
    prompt = "tell me about subjects"
    expected = await client.generate(MODEL, prompt, max_tokens=30, seed=11)
    rc, out, err = await run_example(
        nats_url, "--model", MODEL, "--max-tokens", "30", "--seed", "11", prompt
    )
    assert rc == 0, err
    assert expected.text and out == expected.text + "\n"
    usage = USAGE.search(err)
    assert usage, err
    assert int(usage[1]) == expected.outcome.usage.prompt_tokens
    assert int(usage[2]) == expected.outcome.usage.completion_tokens == 30
    assert usage[4] == expected.outcome.finish_reason == "length"

    # chat form: the prompt as one user message
    expected = await client.generate(
        MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=12, seed=11
    )
    rc, out, err = await run_example(
        nats_url, "--model", MODEL, "--max-tokens", "12", "--seed", "11", "--chat", prompt
    )
    assert rc == 0, err
    assert out == expected.text + "\n"


async def test_an_unknown_model_fails_no_worker_after_the_queue_timeout(nats_url):
    # the NATS entry has no model list to check against: the scheduler queues the
    # request, and with no worker for the model it fails after queue_timeout_s (5 s here)
    start = time.monotonic()
    rc, out, err = await run_example(nats_url, "--model", "no-such-model", "hello")
    assert rc == 1 and out == ""
    assert "error: no_worker:" in err and "(retryable)" in err
    assert 4 < time.monotonic() - start < 30


async def test_timeout_sets_a_deadline_that_ends_the_request(nats_url):
    start = time.monotonic()
    rc, out, err = await run_example(
        nats_url, "--model", SLOW_MODEL, "--max-tokens", "2000", "--timeout", "2", "a long story"
    )
    assert rc == 1
    assert "error: deadline_exceeded:" in err
    assert out.strip()  # some tokens came before the deadline, far from 2000 of them
    assert len(out.split()) < 500
    assert time.monotonic() - start < 15


async def test_a_reused_request_id_is_refused(nats_url):
    args = ("--model", MODEL, "--max-tokens", "2", "--request-id", "example-reused-1", "hi")
    rc, _, err = await run_example(nats_url, *args)
    assert rc == 0, err
    rc, out, err = await run_example(nats_url, *args, timeout=15)
    assert rc == 1 and out == ""
    assert "error: duplicate_request:" in err


async def test_ctrl_c_cancels_the_request(nats_url):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--nats-url",
        nats_url,
        "--model",
        SLOW_MODEL,
        "--max-tokens",
        "2000",
        "go on and on",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        first = await asyncio.wait_for(proc.stdout.read(1), 30)  # streaming has begun
        assert first
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130
    assert "cancelled: cancelled by client" in err.decode()
    assert len((first + rest).split()) < 500  # stopped long before 2000 tokens
