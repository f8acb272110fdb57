"""Run vLLM here as on a CPU without AVX-512 (issue 41): on PYTHONPATH with
INFERBUS_SIM_AVX2=1, every Python process (the services ``inferbus up`` starts and
vLLM's engine processes inherit both) tells vLLM's CPU platform that AVX-512 is
missing before it imports its kernels, so it loads ``_C_AVX2.abi3.so``, which lacks
the 4-bit AWQ GEMM, as an AVX2-only EPYC does:

    INFERBUS_SIM_AVX2=1 PYTHONPATH=tests/testkit/avx2only python -m pytest -rs tests/engine

Only the kernel library changes, not the instructions the CPU runs."""

import os

if os.environ.get("INFERBUS_SIM_AVX2") == "1":
    import importlib.abc
    import sys

    class _NoAvx512(importlib.abc.MetaPathFinder):
        """Patches torch's CPU probe the moment vLLM's CPU platform is imported."""

        def find_spec(self, name, path, target=None):
            if name != "vllm.platforms.cpu":
                return None
            sys.meta_path.remove(self)
            import torch

            torch.cpu._is_avx512_supported = lambda: False
            torch.cpu._is_avx512_bf16_supported = lambda: False
            return None  # the normal import goes on

    sys.meta_path.insert(0, _NoAvx512())
