"""/v1/embeddings through the bus, on a real vLLM pooling engine (the tiny model made an
embedding model, last-token pooling), as the official SDK calls it: one vector per
input in order, in either encoding; a task a model is not served for refused."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm", reason="the vLLM engine is not installed (pip install -e '.[cpu]')")

import openai
from testkit.procs import ServiceProcess

from inferbus.tinymodel import make_tiny

pytestmark = [
    pytest.mark.engine(seconds=40),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.usefixtures("platform"),
]

MODEL = "tiny-embed"


@pytest.fixture(scope="module")
def pooling_worker(nats_url, log_dir, tmp_path_factory):
    model = make_tiny(tmp_path_factory.mktemp("models") / MODEL)
    worker = ServiceProcess(
        "worker",
        nats_url,
        log_dir,
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--runner",
        "pooling",
        "--convert",
        "embed",
        "--enforce-eager",
        "true",
        "--max-model-len",
        "512",
        "--heartbeat-interval-s",
        "0.3",
        "--state-dir",
        str(log_dir / "vllm-embed-state"),
        name="vllm-embed-worker",
    )
    worker.start().wait_ready(timeout=300)
    yield worker
    assert worker.stop(timeout=60) == 0, worker.logs()


@pytest.fixture
async def sdk(pooling_worker, platform):
    async with openai.AsyncOpenAI(
        base_url=platform["gateway"].base + "/v1", api_key="x", max_retries=0
    ) as client:
        yield client


async def test_one_vector_per_input_in_order(sdk):
    # the SDK asks for base64 by default and decodes it
    texts = ["The cat sat.", "A dog ran far away.", "The cat sat."]
    got = await sdk.embeddings.create(model=MODEL, input=texts)
    assert got.object == "list" and got.model == MODEL
    assert [d.index for d in got.data] == [0, 1, 2]
    vectors = [d.embedding for d in got.data]
    assert {len(v) for v in vectors} == {128}  # the tiny model's hidden size
    for v in vectors:  # vLLM's embed task normalizes by default
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    assert vectors[0] == pytest.approx(vectors[2], abs=1e-5)  # the same text, the same vector
    assert vectors[0] != pytest.approx(vectors[1], abs=1e-3)
    assert got.usage.prompt_tokens == got.usage.total_tokens > 0
    floats = await sdk.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)


async def test_token_id_inputs_are_checked_like_prompts(sdk):
    # the fixture's sanitizer has no tokenizer for this model (inferbus up gives it
    # one): token ids it cannot read are refused, as a completion's are
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.embeddings.create(model=MODEL, input=[[5, 17, 42], [7, 8]])
    assert "no tokenizer" in e.value.message


async def test_a_task_a_model_is_not_served_for_is_refused(sdk, platform):
    with pytest.raises(openai.BadRequestError) as e:  # text from an embedding model
        await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert e.value.code == "unsupported_by_engine"
    with pytest.raises(openai.BadRequestError) as e:  # a dimension it was not trained for
        await sdk.embeddings.create(model=MODEL, input="hi", dimensions=16)
    assert e.value.code in ("invalid_request", "unsupported_by_engine")


async def test_the_python_client_embeds_over_nats(pooling_worker, client, sdk):
    vector = await client.embed(MODEL, "The cat sat.")
    over_http = await sdk.embeddings.create(model=MODEL, input="The cat sat.")
    assert vector == pytest.approx(over_http.data[0].embedding, abs=1e-5)
