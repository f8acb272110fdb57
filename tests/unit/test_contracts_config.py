"""Contracts (events, codec, schema, subjects) and settings loading."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest

from inferbus.contracts import (
    ALL_EVENTS,
    SUBMIT,
    TERMINAL_TYPES,
    CanaryWeights,
    CancelRequest,
    ChatMessage,
    ChunkBatch,
    ChunkTo,
    DeadLetter,
    DecidedRequest,
    KvAllCleared,
    KvBlocksRemoved,
    KvBlocksStored,
    KvEventBatch,
    KvResync,
    ModelLoad,
    ProgressBatch,
    ReplyEvent,
    RequestAccepted,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestProgress,
    RequestRejected,
    RequestStarted,
    RequestSubmitted,
    Resume,
    SamplingParams,
    SchedulerLoad,
    TenantPolicy,
    Terminal,
    TokenChunk,
    TraceDecided,
    Usage,
    WorkAssigned,
    WorkerHeartbeat,
    heartbeat_subject,
    reply_subject,
    subject_token,
    work_subject,
)
from inferbus.contracts.schema import document
from inferbus.shared import codec
from inferbus.shared.config import (
    DEFAULT_NATS_URL,
    ServiceSettings,
    group,
    load_settings,
    settings_of,
)
from inferbus.shared.errors import ConfigError

CONTRACTS_DIR = Path(__file__).resolve().parents[2] / "contracts"

SUBMITTED = RequestSubmitted(
    request_id="r1",
    model="m",
    reply_to="ib.reply.g.r1",
    messages=[ChatMessage(role="user", content="héllo ✓", name="u")],
    sampling=SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, stop=["\n"], seed=3),
    tenant="t1",
    created_at=1.5,
)

SAMPLES = {
    RequestSubmitted: SUBMITTED,
    RequestAccepted: RequestAccepted(request=SUBMITTED, accepted_at=2.0),
    RequestRejected: RequestRejected(
        request_id="r1", code="prompt_too_long", reason="long", param="messages"
    ),
    WorkAssigned: WorkAssigned(
        request=SUBMITTED,
        worker_id="w1",
        attempt=2,
        assigned_at=3.0,
        migratable=True,
        resume=Resume(
            from_attempt=1,
            output_ids=[5, 6],
            next_seq=2,
            last_chunk=TokenChunk(request_id="r1", seq=1, text="b", token_ids=[6]),
        ),
    ),
    RequestStarted: RequestStarted(request_id="r1", worker_id="w1", attempt=2, resumed=True),
    RequestProgress: RequestProgress(
        worker_id="w1", chunk=TokenChunk(request_id="r1", seq=0, text="a", token_ids=[5])
    ),
    ProgressBatch: ProgressBatch(
        worker_id="w1",
        progress=[
            RequestProgress(
                worker_id="w1", chunk=TokenChunk(request_id="r1", seq=1, text="b", token_ids=[6])
            ),
            RequestProgress(
                worker_id="w1",
                chunk=TokenChunk(request_id="r2", seq=0, text="c", token_ids=[2]),
                finish_reason="stop",
            ),
        ],
    ),
    TokenChunk: TokenChunk(request_id="r1", seq=4, text="tok ", token_ids=[1, 2], attempt=2),
    RequestFinished: RequestFinished(
        request_id="r1",
        finish_reason="stop",
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        chunks=5,
        worker_id="w1",
        attempt=2,
    ),
    RequestFailed: RequestFailed(
        request_id="r1", code="worker_lost", reason="gone", retryable=True
    ),
    RequestCancelled: RequestCancelled(request_id="r1", reason="bye"),
    CancelRequest: CancelRequest(request_id="r1", reason="bye"),
    WorkerHeartbeat: WorkerHeartbeat(
        worker_id="w1",
        models=["m"],
        engine="sim",
        state="draining",
        reason="shutdown",
        max_num_seqs=4,
        running=1,
        waiting=2,
        inflight=["r1"],
        interval_s=0.5,
        sent_at=9.0,
    ),
    DeadLetter: DeadLetter(
        service="sanitizer",
        subject="ib.req.submitted",
        reason="undecodable",
        payload=b"\x00\xffnot json",
        headers={"Ib-Request-Id": "r1"},
        received_at=7.0,
    ),
    KvBlocksStored: KvBlocksStored(
        worker_id="w1",
        block_hashes=[2**63 + 5, 7],
        parent_block_hash=-3,
        token_ids=[1, 2, 3, 4],
        block_size=2,
        lora_name="ad",
        medium="CPU",
    ),
    KvBlocksRemoved: KvBlocksRemoved(worker_id="w1", block_hashes=[7], medium="CPU"),
    KvAllCleared: KvAllCleared(worker_id="w1"),
    KvResync: KvResync(worker_id="w1", seen_seq=41),
    KvEventBatch: KvEventBatch(
        worker_id="w1",
        events=[
            KvBlocksStored(worker_id="w1", block_hashes=[2**64 - 1], block_size=16, seq=1),
            KvBlocksRemoved(worker_id="w1", block_hashes=[7], seq=2),
            KvAllCleared(worker_id="w1", seq=3),
        ],
    ),
    ChunkBatch: ChunkBatch(
        chunks=[
            ChunkTo(
                subject="ib.reply.gw.g1.r1",
                chunk=TokenChunk(request_id="r1", seq=0, text="Hi", token_ids=[5]),
            ),
            ChunkTo(
                subject="ib.reply.gw.g1.r2", chunk=TokenChunk(request_id="r2", seq=3, text="!")
            ),
        ]
    ),
    CanaryWeights: CanaryWeights(model="m", weights={"m-v2": 0.1}),
    TenantPolicy: TenantPolicy(tenant="acme", priority="batch", models=["m"], mask_pii=True),
    TraceDecided: TraceDecided(
        kept=[DecidedRequest(trace_id="0af7651916cd43dd8448eb211c80319c", request_id="r1")],
        service="worker",
    ),
    SchedulerLoad: SchedulerLoad(
        scheduler_id="s1",
        models={
            "m": ModelLoad(
                queued=3,
                queue_limit=10,
                ready_workers=1,
                free_slots=0,
                oldest_wait_s=0.5,
                dispatch_per_s=12.0,
            )
        },
    ),
}


def test_samples_cover_every_event():
    assert set(SAMPLES) == set(ALL_EVENTS)
    assert len(ALL_EVENTS) == len(set(ALL_EVENTS))


@pytest.mark.parametrize("cls", ALL_EVENTS, ids=lambda c: c.__name__)
def test_every_event_round_trips_with_its_type_tag(cls):
    event = SAMPLES[cls]
    data = codec.encode(event)
    assert isinstance(data, bytes)
    obj = json.loads(data)
    assert obj["type"] == cls.__struct_config__.tag
    back = codec.decode(data, cls)
    assert type(back) is cls
    assert back == event


def test_event_tags_are_unique():
    tags = [c.__struct_config__.tag for c in ALL_EVENTS]
    assert len(tags) == len(set(tags))
    assert all(isinstance(t, str) and t for t in tags)


def test_defaults_are_on_the_wire():
    obj = json.loads(codec.encode(RequestStarted(request_id="r", worker_id="w")))
    assert obj == {
        "type": "request.started",
        "request_id": "r",
        "worker_id": "w",
        "attempt": 1,
        "resumed": False,
        "migratable": False,
    }


def test_decoding_a_reply_event_picks_the_right_class():
    for cls in (TokenChunk, RequestFinished, RequestFailed, RequestCancelled, RequestRejected):
        back = codec.decode(codec.encode(SAMPLES[cls]), ReplyEvent)
        assert type(back) is cls
        assert back == SAMPLES[cls]


def test_decoding_a_terminal_picks_the_right_class():
    for cls in TERMINAL_TYPES:
        assert type(codec.decode(codec.encode(SAMPLES[cls]), Terminal)) is cls


def test_decoding_an_event_not_in_the_union_fails():
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.encode(SAMPLES[WorkerHeartbeat]), ReplyEvent)


def test_decoding_garbage_fails_with_a_decode_error():
    with pytest.raises(codec.DecodeError):
        codec.decode(b"{not json", TokenChunk)
    with pytest.raises(codec.DecodeError):
        codec.decode(b'{"type": "token.chunk", "request_id": "r"}', TokenChunk)  # no seq
    # issue 42: msgspec raises RecursionError on deep nesting, which no handler caught
    deep = b'{"type": "request.cancelled", "request_id": "r", "x": ' + b"[" * 100_000
    with pytest.raises(codec.DecodeError, match="nested too deeply"):
        codec.decode(deep + b"]" * 100_000 + b"}", RequestCancelled)


def test_an_older_reader_ignores_new_fields():
    data = json.dumps(
        {"type": "request.cancelled", "request_id": "r", "reason": "x", "added_later": 1}
    ).encode()
    assert codec.decode(data, RequestCancelled) == RequestCancelled(request_id="r", reason="x")


def test_to_builtins_has_the_tag():
    assert codec.to_builtins(SAMPLES[RequestFailed])["type"] == "request.failed"


def test_usage_total():
    assert Usage(prompt_tokens=3, completion_tokens=4).total_tokens == 7


# -- schema -----------------------------------------------------------------------------------


def test_schema_document_has_every_event_and_the_submit_subject():
    doc = document()
    json.dumps(doc)  # serialisable as is
    tags = {c.__struct_config__.tag for c in ALL_EVENTS}
    assert set(doc["events"]) == tags
    for tag, ref in doc["events"].items():
        name = ref["$ref"].removeprefix("#/$defs/")
        schema = doc["$defs"][name]
        assert schema["properties"]["type"]["enum"] == [tag]
    assert doc["subjects"]["submit"] == SUBMIT
    assert doc["headers"]["submit"] == {"Nats-Msg-Id": "the request id (idempotent submission)"}


def test_schema_validates_required_fields():
    doc = document()
    name = doc["events"]["request.submitted"]["$ref"].removeprefix("#/$defs/")
    required = set(doc["$defs"][name]["required"])
    assert {"request_id", "model", "reply_to", "type"} <= required
    assert "prompt" not in required


# -- contracts depend on msgspec and the standard library alone -----------------------------


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mods = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.append(node.module or "")
    return mods


def test_contracts_import_only_msgspec_and_the_standard_library():
    files = sorted(CONTRACTS_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "events.py", "subjects.py", "schema.py"}
    allowed = set(sys.stdlib_module_names) | {"msgspec"}
    for f in files:
        for mod in _imported_modules(f):
            assert mod.split(".")[0] in allowed, f"{f.name} imports {mod}"


def test_import_checker_would_notice_a_third_party_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom nats.aio import client\nfrom . import events\n")
    assert _imported_modules(bad) == ["os", "nats.aio"]


# -- subjects ---------------------------------------------------------------------------------


def test_subject_token_replaces_dots_and_other_characters():
    assert subject_token("host.example.com") == "host-example-com"
    assert subject_token("a b*c>d") == "a-b-c-d"
    assert subject_token("ok_Name-1") == "ok_Name-1"
    assert subject_token("") == "-"
    assert "." not in subject_token("w.1.2")


def test_subject_builders():
    assert work_subject("w1") == "ib.work.w1"
    assert heartbeat_subject("w1") == "ib.hb.w1"
    assert reply_subject("gw1", "r1") == "ib.reply.gw1.r1"


# -- load_settings ----------------------------------------------------------------------------


class DemoSettings(ServiceSettings, kw_only=True):
    """a demo service"""

    ratio: float = 1.0
    count: int = 3
    verbose: bool = False


def test_defaults_without_env_or_flags():
    s = load_settings(DemoSettings, argv=[], environ={})
    assert s.nats_url == DEFAULT_NATS_URL
    assert (s.ratio, s.count, s.verbose) == (1.0, 3, False)
    assert s.instance_id  # filled in as <hostname>-<pid>


def test_env_prefix_sets_fields_with_conversion():
    s = load_settings(
        DemoSettings,
        argv=[],
        environ={
            "INFERBUS_RATIO": "0.25",
            "INFERBUS_COUNT": "7",
            "INFERBUS_VERBOSE": "true",
            "INFERBUS_HTTP_PORT": "8080",
            "INFERBUS_INSTANCE_ID": "me",
        },
    )
    assert s.ratio == 0.25 and isinstance(s.ratio, float)
    assert s.count == 7 and isinstance(s.count, int)
    assert s.verbose is True
    assert s.http_port == 8080
    assert s.instance_id == "me"


def test_nats_url_env():
    s = load_settings(DemoSettings, argv=[], environ={"NATS_URL": "nats://a:1"})
    assert s.nats_url == "nats://a:1"
    s = load_settings(DemoSettings, argv=[], environ={"INFERBUS_NATS_URL": "nats://b:2"})
    assert s.nats_url == "nats://b:2"


def test_flags_win_over_env():
    env = {"INFERBUS_COUNT": "7", "NATS_URL": "nats://env:1", "INFERBUS_RATIO": "0.5"}
    s = load_settings(
        DemoSettings, argv=["--count", "9", "--nats-url", "nats://flag:2"], environ=env
    )
    assert s.count == 9
    assert s.nats_url == "nats://flag:2"
    assert s.ratio == 0.5  # not given as a flag: env still applies


def test_overrides_win_over_flags():
    s = load_settings(DemoSettings, argv=["--count", "9"], environ={}, count=11)
    assert s.count == 11


def test_env_is_read_from_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("INFERBUS_COUNT", "42")
    assert load_settings(DemoSettings, argv=[]).count == 42


def test_bad_env_value_raises_a_config_error_with_a_clear_message():
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings, argv=[], environ={"INFERBUS_COUNT": "lots"})
    msg = str(info.value)
    assert "DemoSettings" in msg
    assert "count" in msg


def test_bad_flag_value_raises_a_config_error_with_a_clear_message():
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings, argv=["--ratio", "fast"], environ={})
    msg = str(info.value)
    assert "DemoSettings" in msg and "ratio" in msg


def test_unknown_flag_is_refused():
    with pytest.raises(SystemExit):  # argparse's own exit, with its usage line
        load_settings(DemoSettings, argv=["--no-such-flag", "1"], environ={})


def test_settings_are_plain_msgspec_structs():
    s = load_settings(DemoSettings, argv=[], environ={"INFERBUS_INSTANCE_ID": "x"})
    assert msgspec.to_builtins(s)["instance_id"] == "x"


# -- settings groups: a core's policy or an engine's options nested once ------------------


class DemoPolicy(msgspec.Struct, kw_only=True, frozen=True):
    routing: Literal["kv", "round_robin"] = "kv"
    weight: float = 1.0


class DemoTiming(msgspec.Struct, kw_only=True, frozen=True):
    step_s: float = 0.0


class GroupedSettings(ServiceSettings, kw_only=True):
    policy: DemoPolicy = DemoPolicy()
    timing: Annotated[DemoTiming, group("sim_")] = DemoTiming()
    modules: dict[str, str] = {}


def test_a_group_is_set_by_flat_flags_and_env():
    s = load_settings(
        GroupedSettings,
        argv=["--routing", "round_robin", "--sim-step-s", "0.5"],
        environ={"INFERBUS_WEIGHT": "2.5"},
    )
    assert s.policy == DemoPolicy(routing="round_robin", weight=2.5)
    assert s.timing == DemoTiming(step_s=0.5)
    assert load_settings(GroupedSettings, argv=[], environ={}).policy == DemoPolicy()


def test_a_bad_value_in_a_group_names_where_it_is():
    with pytest.raises(ConfigError) as info:
        load_settings(GroupedSettings, argv=["--routing", "fastest"], environ={})
    assert "policy.routing" in str(info.value)


def test_overrides_use_the_flat_names_and_unknown_ones_are_refused():
    assert load_settings(GroupedSettings, argv=[], environ={}, weight=3.0).policy.weight == 3.0
    with pytest.raises(TypeError, match="no setting"):
        load_settings(GroupedSettings, argv=[], environ={}, wieght=3.0)


def test_dict_settings_take_pairs_or_json():
    def modules(text: str) -> dict[str, str]:
        return load_settings(GroupedSettings, argv=["--modules", text], environ={}).modules

    assert modules("a=/x, b=/y") == {"a": "/x", "b": "/y"}
    assert modules('{"a": "/x"}') == {"a": "/x"}
    with pytest.raises(ConfigError, match="name=value"):
        modules("just-a-path")


def test_a_setting_two_groups_claim_is_refused_at_start():
    class Twice(ServiceSettings, kw_only=True):
        policy: DemoPolicy = DemoPolicy()
        weight: float = 0.0

    with pytest.raises(TypeError, match="'weight' is declared twice"):
        settings_of(Twice)


def test_the_real_services_settings_each_declare_every_flag_once():
    from inferbus import servicetable

    for entry in servicetable.SERVICES:
        names = [s.name for s in settings_of(entry.settings_class())]
        assert len(names) == len(set(names)), entry.name
    worker = {s.name: s.path for s in settings_of(servicetable.get("worker").settings_class())}
    assert worker["model"] == ("engine_options", "model")
    assert worker["sim_decode_s_per_step"] == ("sim", "decode_s_per_step")
    scheduler = {
        s.name: s.path for s in settings_of(servicetable.get("scheduler").settings_class())
    }
    assert scheduler["routing"] == ("policy", "routing")
