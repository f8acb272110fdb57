"""The tiny local model: deterministic, loadable by transformers, with a chat template."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from inferbus.tinymodel import ARCH, make_tiny, make_tiny_lora


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("a") / "tiny-llama")


def test_the_build_is_deterministic(tiny, tmp_path):
    again = make_tiny(tmp_path / "tiny-llama")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    other = make_tiny(tmp_path / "seeded", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


def test_config_weights_and_tokenizer_agree(tiny):
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 2048
    weights = load_file(str(tiny / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (ARCH["vocab_size"], ARCH["hidden_size"])
    assert weights["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 32, 128)
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert tok.get_vocab_size() == ARCH["vocab_size"]
    text = "def main():\n    print('héllo')"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.token_to_id("<|end|>") == config["eos_token_id"]


def test_chat_template_renders_with_transformers(tiny):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<s><|user|>hi<|end|><|assistant|>"


def test_lora_adapter_targets_the_attention_projections(tiny, tmp_path):
    from safetensors.numpy import load_file

    lora = make_tiny_lora(tiny, tmp_path / "lora", rank=4)
    cfg = json.loads((lora / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    t = load_file(str(lora / "adapter_model.safetensors"))
    assert t["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 128)
    assert t["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (64, 4)
    assert abs(t["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]).sum() > 0


def test_a_model_of_an_older_build_is_not_current(tiny, tmp_path):
    from inferbus.tinymodel import is_current

    assert is_current(tiny) and not is_current(tmp_path / "absent")
    old = tmp_path / "old"
    shutil.copytree(tiny, old)
    config = json.loads((old / "tokenizer_config.json").read_text())
    del config["inferbus_build"]
    (old / "tokenizer_config.json").write_text(json.dumps(config))
    assert not is_current(old)
