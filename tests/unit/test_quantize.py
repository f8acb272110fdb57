"""The AWQ packer on real tensors: the nibble layout vLLM's kernels unpack, the
round-to-nearest bound, and the activation-aware search on the tiny model."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from inferbus.quantize import (  # noqa: E402
    AWQ_ORDER,
    awq_quantize,
    dequantize,
    pack,
    quantize_groups,
    unpack,
)
from inferbus.shared import modelstore  # noqa: E402
from inferbus.tinymodel import make_tiny  # noqa: E402


def test_eight_values_pack_into_one_int32_in_the_awq_order():
    row = torch.arange(8, dtype=torch.int32)[None, :]  # output channels 0..7 hold 0..7
    packed = int(pack(row)[0, 0]) & 0xFFFFFFFF
    nibbles = [(packed >> (4 * i)) & 0xF for i in range(8)]
    assert nibbles == list(AWQ_ORDER)  # nibble i holds channel AWQ_ORDER[i]
    many = torch.randint(0, 16, (64, 256), dtype=torch.int32)
    assert torch.equal(unpack(pack(many)), many)
    assert pack(torch.full((1, 8), 15, dtype=torch.int32)).dtype == torch.int32  # sign bit


def test_round_to_nearest_stays_within_half_a_step_per_group():
    w = torch.randn(64, 256) * 0.02
    q, scales, zeros = quantize_groups(w, 128)
    assert int(q.min()) >= 0 and int(q.max()) <= 15 and scales.shape == (64, 2)
    err = (dequantize(q, scales, zeros, 128) - w).abs().reshape(64, 2, 128)
    assert bool((err <= scales[..., None] / 2 + 1e-6).all())


def test_the_tiny_model_quantizes_to_a_checkpoint_vllm_reads(tmp_path):
    src = make_tiny(tmp_path / "m")
    report = awq_quantize(src, tmp_path / "awq", group_size=128, samples=8, grid=10)
    assert report and all(0 < r <= 1.0 for r in report.values())  # never worse than RTN
    config = json.loads((tmp_path / "awq" / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
        "version": "gemm",
    }
    assert config["torch_dtype"] == "bfloat16"
    t = load_file(str(tmp_path / "awq" / "model.safetensors"))
    q = t["model.layers.0.mlp.down_proj.qweight"]  # [in 256, out 128 / 8]
    assert q.shape == (256, 16) and q.dtype == torch.int32
    assert t["model.layers.0.mlp.down_proj.scales"].shape == (2, 128)
    assert t["model.layers.0.mlp.down_proj.qzeros"].shape == (2, 16)
    assert "model.embed_tokens.weight" in t and "model.layers.0.mlp.down_proj.weight" not in t
    # read back as float weights (scales folded into the norms and up_proj included),
    # the checkpoint computes what the original model did, up to 4 bits
    orig, back = _logits(src, None), _logits(src, t)
    assert torch.corrcoef(torch.stack([orig.flatten(), back.flatten()]))[0, 1] > 0.95
    # a different quantization is another shape: a swap to it starts a new engine
    a = modelstore.manifest_of(src, "m", "v1")
    b = modelstore.manifest_of(tmp_path / "awq", "m", "awq")
    assert b.quantization == "awq-4bit-g128" and b.shape != a.shape


def _logits(src, awq_tensors):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    if awq_tensors is not None:
        state = {}
        for name, tensor in awq_tensors.items():
            if name.endswith(".qweight"):
                m = name.removesuffix(".qweight")
                state[m + ".weight"] = dequantize(
                    unpack(tensor).T,
                    awq_tensors[m + ".scales"].float().T,
                    unpack(awq_tensors[m + ".qzeros"]).T,
                    128,
                )
            elif not name.endswith((".scales", ".qzeros")):
                state[name] = tensor.float()
        model.load_state_dict(state)
    tok = AutoTokenizer.from_pretrained(src)
    ids = tok("def main(argv):\n    for line in open(argv[1]):", return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


def test_sizes_the_kernel_cannot_take_are_refused(tmp_path):
    src = make_tiny(tmp_path / "m")
    with pytest.raises(ValueError, match="multiple of the group size"):
        awq_quantize(src, tmp_path / "x", group_size=96)
