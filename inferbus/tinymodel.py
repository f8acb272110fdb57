"""``inferbus model make-tiny``: a tiny random-weight Llama with a locally trained tokenizer.

No model can be downloaded on the machines this project is built and tested on,
so it makes one: a byte-level BPE tokenizer trained on the Python standard
library's own sources (always present), a chat template, and Llama weights drawn
from a seeded RNG, saved with safetensors. Deterministic for a given Python
install, and built in seconds. Real deployments pass a real model instead.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    # tools as Hermes-style models are shown them: vLLM's hermes tool parser reads the
    # <tool_call> blocks back out of the output
    "{% if tools %}<|system|>You may call one or more functions. Their signatures:"
    "<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    ' For each call write <tool_call>{"name": <name>, "arguments": <arguments>}'
    "</tool_call><|end|>{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set args = call['function']['arguments'] %}"
    "<tool_call>{\"name\": {{ call['function']['name'] | tojson }}, \"arguments\": "
    "{% if args is string %}{{ args }}{% else %}{{ args | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
REASONING_MARKERS = ("<think>", "</think>")
"""A reasoning model's markers (vLLM's deepseek_r1 reasoning parser reads them)."""
BUILD = 2
"""Bumped when the build changes what the model is (its vocabulary, its template)."""
SPECIAL_TOKENS = [
    "<s>",
    "</s>",
    "<pad>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|developer|>",
    "<|end|>",
    *REASONING_MARKERS,
]

ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
}
# A Llama-3.2-1B-shaped model (about 1.2B parameters) for GPU benchmarks: random
# weights, the same local tokenizer (a large vocabulary table, mostly unused).
ARCH_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32768,
    "max_position_embeddings": 16384,
}
# The tiny model at twice the depth: another architecture of the same family (a swap
# to it starts a new engine) that is slower per token, for delivery tests.
ARCH_DEEP = {**ARCH, "num_hidden_layers": 4}
ARCHS = {"tiny": ARCH, "tiny-deep": ARCH_DEEP, "1b": ARCH_1B}


def _corpus(max_bytes: int = 3_000_000) -> list[str]:
    """The standard library's sources, in a fixed order, up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def build_tokenizer(out: Path, vocab_size: int, max_len: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    # the reasoning markers are text a reader sees (as in DeepSeek-R1's and Qwen3's
    # vocabularies), not special tokens that decoding drops
    spec = json.loads((out / "tokenizer.json").read_text())
    for added in spec["added_tokens"]:
        if added["content"] in REASONING_MARKERS:
            added["special"] = False
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "<|end|>",
                "pad_token": "<pad>",
                "unk_token": None,
                "model_max_length": max_len,
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
                "inferbus_build": BUILD,
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "<|end|>", "pad_token": "<pad>"}, indent=2)
    )


def _weights(arch: dict[str, int], seed: int, dtype: type) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i, v = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    heads, kv = arch["num_attention_heads"], arch["num_key_value_heads"]
    head_dim = h // heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype)

    out = {
        "model.embed_tokens.weight": w(v, h),
        "model.norm.weight": ones(h),
        "lm_head.weight": w(v, h),
    }
    for n in range(arch["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out |= {
            p + "self_attn.q_proj.weight": w(heads * head_dim, h),
            p + "self_attn.k_proj.weight": w(kv * head_dim, h),
            p + "self_attn.v_proj.weight": w(kv * head_dim, h),
            p + "self_attn.o_proj.weight": w(h, heads * head_dim),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
    return out


def is_current(path: str | Path) -> bool:
    """Whether ``path`` holds the tiny model as this release builds it (its chat
    template too: a state dir kept across upgrades gets the new one)."""
    p = Path(path)
    try:
        config = json.loads((p / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (p / "model.safetensors").exists() and config.get("inferbus_build") == BUILD


def make_tiny(out_dir: str | Path, seed: int = 0, arch: str = "tiny") -> Path:
    """Write the model to ``out_dir`` (created if needed) and return its path.

    ``arch`` is "tiny" (float32, 3 MB, for CPUs and tests), "tiny-deep" (its four-layer
    sibling) or "1b" (float16, ~2.4 GB, for GPU benchmarks).
    """
    from safetensors.numpy import save_file

    shape = ARCHS[arch]
    dtype = np.float16 if arch == "1b" else np.float32
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, shape["vocab_size"], shape["max_position_embeddings"])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **shape,
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKENS.index("<s>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|end|>"),
        "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
        "torch_dtype": "float32" if dtype is np.float32 else "float16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    save_file(
        _weights(shape, seed, dtype), str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    return out


def make_tiny_lora(base_dir: str | Path, out_dir: str | Path, rank: int = 8, seed: int = 1) -> Path:
    """A PEFT-format LoRA adapter on every attention projection of the tiny model.

    Its B matrices are not zero (unlike a fresh PEFT init), so it visibly changes
    the base model's output, which is what tests of LoRA routing need.
    """
    from safetensors.numpy import save_file

    base = json.loads((Path(base_dir) / "config.json").read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h = base["hidden_size"]
    head_dim = base["head_dim"]
    dims = {
        "q_proj": base["num_attention_heads"] * head_dim,
        "k_proj": base["num_key_value_heads"] * head_dim,
        "v_proj": base["num_key_value_heads"] * head_dim,
        "o_proj": h,
    }
    tensors = {}
    for n in range(base["num_hidden_layers"]):
        for name, out_features in dims.items():
            p = f"base_model.model.model.layers.{n}.self_attn.{name}."
            tensors[p + "lora_A.weight"] = (rng.standard_normal((rank, h)) * 0.5).astype(np.float32)
            tensors[p + "lora_B.weight"] = (rng.standard_normal((out_features, rank)) * 0.5).astype(
                np.float32
            )
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": 2 * rank,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": sorted(dims),
                "base_model_name_or_path": str(Path(base_dir).resolve()),
                "fan_in_fan_out": False,
                "inference_mode": True,
            },
            indent=2,
        )
    )
    return out
