"""API keys, scopes and rate limits end to end: a gateway with keys on the shared
platform, the OpenAI SDK as the client, tenants checked on the submitted events."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai import OpenAI
from testkit.procs import ServiceProcess, start_all
from testkit.simplatform import MODEL, SLOW_MODEL

from inferbus.contracts import SUBMIT, RequestSubmitted
from inferbus.services.gateway.auth import digest
from inferbus.shared.codec import decode

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("platform")]

KEYS = {
    "full": "ib-full-secret",
    "limited": "ib-limited-secret",
    "tpm": "ib-tpm-secret",
    "tpm-cut": "ib-tpm-cut-secret",
    "scrape": "ib-scrape-secret",
    "globex": "ib-globex-secret",
}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def keyed_gateway(nats_url, log_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(f"""
[[keys]]
name = "full"
sha256 = "{digest(KEYS["full"])}"
tenant = "acme"
priority = "interactive"

[[keys]]
name = "limited"
sha256 = "{digest(KEYS["limited"])}"
models = ["{MODEL}"]
max_tokens = 50
requests_per_s = 2

[[keys]]
name = "tpm"
sha256 = "{digest(KEYS["tpm"])}"
tokens_per_min = 600

[[keys]]
name = "tpm-cut"
sha256 = "{digest(KEYS["tpm-cut"])}"
tokens_per_min = 600

[[keys]]
name = "globex"
sha256 = "{digest(KEYS["globex"])}"
tenant = "globex"

[[keys]]
name = "scrape"
sha256 = "{digest(KEYS["scrape"])}"
models = []
metrics = true
""")
    gw = ServiceProcess(
        "gateway",
        nats_url,
        log_dir,
        "--api-keys-file",
        str(path),
        "--worker-stale-s",
        "1.5",
        name="keyed-gateway",
    )
    start_all([gw])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # it learns the models from heartbeats
        req = urllib.request.Request(
            f"{gw.base}/v1/models", headers={"Authorization": f"Bearer {KEYS['full']}"}
        )
        with urllib.request.urlopen(req) as r:
            if {MODEL, SLOW_MODEL} <= {m["id"] for m in json.loads(r.read())["data"]}:
                break
        time.sleep(0.1)
    yield gw
    gw.stop()


def sdk(gw, key: str | None) -> OpenAI:
    return OpenAI(base_url=gw.base + "/v1", api_key=KEYS.get(key, key or "none"), max_retries=0)


def test_requests_without_a_valid_key_get_401(keyed_gateway):
    for key in ("ib-wrong", None):
        with pytest.raises(openai.AuthenticationError) as e:
            sdk(keyed_gateway, key).chat.completions.create(model=MODEL, messages=MESSAGES)
        assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        sdk(keyed_gateway, "ib-wrong").models.list()


async def test_the_key_sets_tenant_and_priority_on_the_request(keyed_gateway, client):
    sub = await client.nc.subscribe(SUBMIT)
    await client.nc.flush()  # subscribed at the server before the blocking SDK call
    r = sdk(keyed_gateway, "full").chat.completions.with_raw_response.create(
        model=SLOW_MODEL, messages=MESSAGES, max_tokens=2
    )
    rid = r.headers["x-request-id"]
    while True:
        ev = decode((await sub.next_msg(timeout=5)).data, RequestSubmitted)
        if ev.request_id == rid:
            break
    assert (ev.tenant, ev.priority) == ("acme", "interactive")
    await sub.unsubscribe()


def test_a_tenant_s_request_ids_and_stored_responses_are_its_own(keyed_gateway):
    """A client chooses its ids (x-request-id): another tenant's request with the same
    id was refused ``duplicate_request`` (telling it the id is in use, and taking the
    id from whoever came second), and a stored response, kept by id, was any key's to
    read, continue, delete or overwrite (issue 42 item 11, over HTTP)."""
    acme, globex = sdk(keyed_gateway, "full"), sdk(keyed_gateway, "globex")
    rid = f"shared-{uuid.uuid4().hex[:8]}"
    for client in (acme, globex):
        r = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": rid}
        )
        assert r.headers["x-request-id"] == rid and r.parse().choices
    with pytest.raises(openai.ConflictError) as e:  # its own id again: its to be told
        acme.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": rid}
        )
    assert e.value.code == "duplicate_request"

    rid = f"turn-{uuid.uuid4().hex[:8]}"
    own = acme.responses.create(
        model=MODEL,
        input="My name is Ada.",
        max_output_tokens=5,
        extra_headers={"x-request-id": rid},
    )
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(own.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.create(model=MODEL, input="Who?", previous_response_id=own.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.delete(own.id)
    theirs = globex.responses.create(  # the same id: a response of globex's own
        model=MODEL, input="Something else entirely", max_output_tokens=5,
        extra_headers={"x-request-id": rid},
    )  # fmt: skip
    assert theirs.id == own.id
    kept = acme.responses.retrieve(own.id)
    assert kept.output_text == own.output_text and kept.created_at == own.created_at
    assert globex.responses.retrieve(own.id).output_text == theirs.output_text


def test_scopes_limit_models_and_max_tokens(keyed_gateway):
    c = sdk(keyed_gateway, "limited")
    assert {m.id for m in c.models.list()} == {MODEL}  # only what the key may use
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.chat.completions.create(model=SLOW_MODEL, messages=MESSAGES, max_tokens=2)
    assert e.value.code == "model_not_allowed"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=51)
    assert e.value.param == "max_tokens"


def test_requests_per_second_limit_gives_429_with_retry_after(keyed_gateway):
    time.sleep(1.1)  # a full bucket (2 requests/s, burst 2)
    c = sdk(keyed_gateway, "limited")

    def one(_: int) -> openai.RateLimitError | None:
        try:
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        except openai.RateLimitError as exc:
            return exc
        return None

    # at once: one after another, two slow answers would let a token refill
    with ThreadPoolExecutor(3) as pool:
        refused = [e for e in pool.map(one, range(3)) if e is not None]
    assert len(refused) == 1
    assert refused[0].code == "rate_limit_exceeded"
    assert int(refused[0].response.headers["retry-after"]) >= 1
    time.sleep(0.6)
    c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)


def test_tokens_per_minute_are_settled_against_real_usage(keyed_gateway):
    c = sdk(keyed_gateway, "tpm")  # 600 tokens a minute
    # each request is charged 2 + 250 up front; it uses about 10, so the rest comes back
    for _ in range(5):
        r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=250, stop=["the"])
        assert r.usage.total_tokens < 250
    with pytest.raises(openai.RateLimitError) as e:  # more than the whole minute's budget
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=599)
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=599)
    assert "tokens per minute" in e.value.message


def test_tokens_delivered_before_a_cut_are_charged(keyed_gateway):
    c = sdk(keyed_gateway, "tpm-cut")  # 600 tokens a minute, 10 a second
    with pytest.raises(openai.InternalServerError):  # 504 at the deadline, after ~100 tokens
        c.chat.completions.create(
            model=SLOW_MODEL,
            messages=MESSAGES,
            max_tokens=500,
            extra_headers={"X-Request-Timeout": "2"},
        )
    # what was generated stays charged: the whole minute's budget is not there again
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=598)
    c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=300)


def test_metrics_on_the_public_port_take_a_scrape_key(keyed_gateway):
    """/metrics answered anyone on the gateway's API port."""

    def get(key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        req = urllib.request.Request(f"{keyed_gateway.base}/metrics", headers=headers)
        try:
            with urllib.request.urlopen(req) as r:
                assert b"inferbus_requests_total" in r.read()
                return r.status
        except urllib.error.HTTPError as err:
            assert json.loads(err.read())["error"]["code"]
            return err.code

    assert get(None) == 401
    assert get(KEYS["full"]) == 403  # a key for the API is not a key for its metrics
    assert get(KEYS["scrape"]) == 200
    with urllib.request.urlopen(f"{keyed_gateway.base}/healthz") as r:  # probes stay open
        assert r.status == 200
