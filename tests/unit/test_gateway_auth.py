"""API keys, scopes and rate limits; backpressure from the scheduler's load; OpenAPI."""

from __future__ import annotations

import json

import msgspec
import pytest

from inferbus.contracts import ModelLoad, SchedulerLoad
from inferbus.services.gateway.admission import LoadView, retry_after
from inferbus.services.gateway.auth import (
    OPEN_KEY,
    AccessControl,
    ApiKey,
    digest,
    load_keys,
    new_key,
)
from inferbus.services.gateway.errors import ApiError
from inferbus.services.gateway.openapi import openapi_document
from inferbus.services.gateway.protocol import request_timeout
from inferbus.shared.errors import ConfigError

SECRET = "ib-test-secret"


def key(**kw) -> ApiKey:
    return ApiKey(name=kw.pop("name", "team-a"), sha256=digest(SECRET), **kw)


def raises(status: int, code: str, fn, *a, **kw) -> ApiError:
    with pytest.raises(ApiError) as err:
        fn(*a, **kw)
    assert (err.value.status, err.value.code) == (status, code), err.value.message
    return err.value


def test_open_mode_when_no_keys_are_configured():
    ac = AccessControl([])
    assert ac.open and ac.authenticate(None) is OPEN_KEY
    assert OPEN_KEY.tenant_id == "default"


def test_keys_are_checked_by_digest_from_bearer_or_x_api_key():
    ac = AccessControl([key(tenant="acme")])
    assert ac.authenticate(f"Bearer {SECRET}").tenant_id == "acme"
    assert ac.authenticate(None, SECRET).name == "team-a"
    raises(401, "invalid_api_key", ac.authenticate, None)
    raises(401, "invalid_api_key", ac.authenticate, "Bearer ")
    raises(401, "invalid_api_key", ac.authenticate, "Bearer wrong")
    raises(401, "invalid_api_key", ac.authenticate, f"Basic {SECRET}")


def test_scopes_limit_models_and_max_tokens():
    ac = AccessControl([key(models=["small"], max_tokens=100)])
    k = ac.authenticate(f"Bearer {SECRET}")
    ac.admit(k, model="small", max_tokens=100, prompt_chars=10, now=0.0)
    raises(
        403, "model_not_allowed", ac.admit, k, model="big", max_tokens=10, prompt_chars=1, now=0.0
    )
    err = raises(
        400,
        "max_tokens_over_limit",
        ac.admit,
        k,
        model="small",
        max_tokens=101,
        prompt_chars=1,
        now=0.0,
    )
    assert err.param == "max_tokens"


def test_requests_per_second_limit_with_retry_after():
    ac = AccessControl([key(requests_per_s=2)])
    k = ac.authenticate(f"Bearer {SECRET}")
    for _ in range(2):
        ac.admit(k, model="m", max_tokens=1, prompt_chars=1, now=0.0)
    err = raises(
        429, "rate_limit_exceeded", ac.admit, k, model="m", max_tokens=1, prompt_chars=1, now=0.0
    )
    assert err.retry_after == 1 and "requests per second" in err.message
    ac.admit(k, model="m", max_tokens=1, prompt_chars=1, now=0.5)  # one more after 0.5 s


def test_tokens_per_minute_are_charged_up_front_and_settled_on_usage():
    ac = AccessControl([key(tokens_per_min=600)])  # 10 tokens/s
    k = ac.authenticate(f"Bearer {SECRET}")
    a = ac.admit(k, model="m", max_tokens=399, prompt_chars=0, now=0.0)
    assert a.charged_tokens == 400  # prompt estimate 1 + 399
    ac.admit(k, model="m", max_tokens=199, prompt_chars=0, now=0.0)
    err = raises(
        429, "rate_limit_exceeded", ac.admit, k, model="m", max_tokens=99, prompt_chars=0, now=0.0
    )
    assert err.retry_after == 10 and "tokens per minute" in err.message
    ac.settle(a, used_tokens=50, now=0.0)  # the first used 50: 350 come back
    ac.admit(k, model="m", max_tokens=99, prompt_chars=0, now=0.0)


def test_a_request_bigger_than_the_minute_budget_waits_for_a_full_bucket():
    ac = AccessControl([key(tokens_per_min=60)])
    k = ac.authenticate(f"Bearer {SECRET}")
    a = ac.admit(k, model="m", max_tokens=1000, prompt_chars=0, now=0.0)
    assert a.charged_tokens == 60
    ac.settle(a, None, now=0.0)  # failed before any use: all of it back
    ac.admit(k, model="m", max_tokens=1000, prompt_chars=0, now=0.0)


def test_keys_load_from_toml_json_and_env(tmp_path):
    secret = new_key()
    toml = tmp_path / "keys.toml"
    toml.write_text(
        f'[[keys]]\nname = "a"\nsha256 = "{digest(secret)}"\n'
        'models = ["m"]\nrequests_per_s = 5\npriority = "interactive"\n'
    )
    jfile = tmp_path / "keys.json"
    jfile.write_text(json.dumps({"keys": [{"name": "b", "sha256": digest("x")}]}))
    inline = json.dumps([{"name": "c", "sha256": digest("y"), "tenant": "t"}])
    keys = load_keys(str(toml), inline) + load_keys(str(jfile))
    assert [k.name for k in keys] == ["a", "c", "b"]
    assert keys[0].priority == "interactive" and keys[0].models == ["m"]
    assert AccessControl(keys).authenticate(f"Bearer {secret}").name == "a"


@pytest.mark.parametrize(
    "text",
    [
        '[[keys]]\nname = "a"\nsha256 = "nothex"\n',
        '[[keys]]\nname = "a"\n',
        "not toml [",
        # typos must not open the gateway or widen a key
        f'[[key]]\nname = "a"\nsha256 = "{"0" * 64}"\n',
        f'[[keys]]\nname = "a"\nsha256 = "{"0" * 64}"\nmodel = ["m"]\n',
        "",
    ],
)
def test_bad_key_files_stop_the_gateway_with_a_clear_message(tmp_path, text):
    f = tmp_path / "keys.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_keys(str(f))
    assert "API key" in str(err.value)


def test_load_view_pushes_back_only_on_a_fresh_full_queue():
    view = LoadView(min_stale_s=2.0)
    view.admit("m", 0.0)  # nothing heard: the scheduler enforces its own limit
    full = ModelLoad(queued=10, queue_limit=10, ready_workers=1, dispatch_per_s=4.0)
    view.on_load(
        SchedulerLoad(
            scheduler_id="s", models={"m": full, "n": ModelLoad(queued=1, queue_limit=10)}
        ),
        now=1.0,
    )
    err = raises(429, "queue_full", view.admit, "m", 1.5)
    assert err.retry_after == 1.0 and err.type == "rate_limit_error"
    view.admit("n", 1.5)
    view.admit("m", 3.5)  # the report is stale
    workerless = ModelLoad(queued=10, queue_limit=10, ready_workers=0)
    view.on_load(SchedulerLoad(scheduler_id="s", models={"m": workerless}), now=4.0)
    raises(503, "no_worker", view.admit, "m", 4.0)


def test_load_view_sums_scheduler_replicas_and_drops_quiet_ones():
    view = LoadView(min_stale_s=2.0)
    half = ModelLoad(queued=6, queue_limit=10, ready_workers=2, dispatch_per_s=2.0)
    view.on_load(SchedulerLoad(scheduler_id="a", models={"m": half}), now=0.0)
    view.on_load(SchedulerLoad(scheduler_id="b", models={"m": half}, interval_s=5.0), now=0.0)
    view.admit("m", 0.5)  # 12 of 20 queued
    full = ModelLoad(queued=10, queue_limit=10, ready_workers=2, dispatch_per_s=2.0)
    view.on_load(SchedulerLoad(scheduler_id="a", models={"m": full}), now=1.0)
    view.on_load(SchedulerLoad(scheduler_id="b", models={"m": full}, interval_s=5.0), now=1.0)
    err = raises(429, "queue_full", view.admit, "m", 1.5)
    assert err.retry_after == 1.0  # (20 - 20 + 1) / 4 per second, at least 1
    assert view.model("m", 3.5).queued == 10  # a is quiet past 2 s; b reports every 5 s
    assert view.model("m", 25.0) is None


def test_retry_after_follows_the_dispatch_rate():
    assert retry_after(ModelLoad(queued=100, queue_limit=10, dispatch_per_s=10.0)) == 9.1
    assert retry_after(ModelLoad(queued=10, queue_limit=10, dispatch_per_s=0.0)) == 5.0
    assert retry_after(ModelLoad(queued=10_000, queue_limit=10, dispatch_per_s=1.0)) == 60.0


def test_request_timeout_header():
    assert request_timeout(None) is None
    assert request_timeout("2.5") == 2.5
    for bad in ("abc", "0", "-1", "1e9", "", "nan"):
        raises(400, "invalid_value", request_timeout, bad)


def test_openapi_document_describes_the_request_structs():
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert set(chat["required"]) == {"model", "messages"}
    assert chat["properties"]["temperature"]["maximum"] == 2.0
    post = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"200", "400", "401", "429", "503"} <= set(post["responses"])
    msgspec.json.encode(doc)  # serialisable as served
    live = openapi_document(("m1", "m2"))
    assert live["components"]["schemas"]["CompletionRequest"]["properties"]["model"][
        "examples"
    ] == ["m1", "m2"]
    assert (
        "examples"
        not in openapi_document()["components"]["schemas"]["CompletionRequest"]["properties"][
            "model"
        ]
    )  # the cached document is untouched


# -- the gate list: admission.Gates holds the order ----------------------------------------


def test_the_gates_run_in_order_and_a_refusal_charges_nothing():
    from inferbus.contracts import WorkerHeartbeat
    from inferbus.services.gateway.admission import Gates, ModelRegistry

    registry = ModelRegistry(stale_after_s=3.0, started_at=-100.0)
    registry.on_heartbeat(WorkerHeartbeat(worker_id="w", models=["m"], engine="sim"), 0.0)
    load = LoadView()
    full = ModelLoad(queued=10, queue_limit=10, ready_workers=1, dispatch_per_s=4.0)
    load.on_load(SchedulerLoad(scheduler_id="s", models={"m": full}), now=0.0)
    access = AccessControl([key(models=["m", "gone"], tokens_per_min=100)])
    gates = Gates(access, registry, load)
    scoped = access.authenticate(f"Bearer {SECRET}")

    def admit(model: str = "m", in_flight: bool = False, max_tokens: int = 10):
        return gates.admit(scoped, request_id="r", model=model, max_tokens=max_tokens,
                           prompt_chars=8, in_flight=in_flight, now=0.5)  # fmt: skip

    # the key's scope first: no probing for other models' existence
    raises(403, "model_not_allowed", admit, "unknown-model")
    # then live workers (before a duplicate), then a duplicate in flight, then the queue
    raises(404, "model_not_found", admit, "gone", in_flight=True)
    raises(409, "duplicate_request", admit, in_flight=True)
    raises(429, "queue_full", admit)
    # nothing above charged the key: with room in the queue its whole budget is there
    load.on_load(SchedulerLoad(scheduler_id="s", models={"m": ModelLoad(queue_limit=10)}), 1.0)
    assert admit(max_tokens=90).charged_tokens > 0
