"""What a worker's engine can serve here, asked before any engine starts."""

from __future__ import annotations

import pytest

from inferbus.services.worker.capability import quantization_refusal


def test_unquantized_weights_and_the_sim_engine_need_no_kernel():
    assert quantization_refusal("vllm", "") == ""
    assert quantization_refusal("sim", "awq-4bit-g32") == ""
    assert quantization_refusal("vllm", "fp8") == ""


def test_awq_on_vllm_is_served_exactly_where_the_4bit_kernel_exists():
    pytest.importorskip("vllm", reason="the vLLM engine is not installed")
    import torch

    why = quantization_refusal("vllm", "awq-4bit-g32")
    has_kernel = hasattr(torch.ops._C, "cpu_gemm_wna16")  # loaded by the call above
    assert (why == "") == has_kernel, why
    if why:
        assert "cpu_gemm_wna16" in why and "AVX-512" in why
