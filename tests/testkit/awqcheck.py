"""How closely vLLM's output on a quantized model tracks the original's: the log
probability each model gives every next token of held-out text (prompt logprobs),
compared position by position, and greedy continuations compared token by token.

Run as a script (vLLM's engine needs the ``__main__`` guard), one engine at a time:
``python tests/testkit/awqcheck.py ORIGINAL DTYPE QUANTIZED [QUANTIZED...]`` prints
one JSON object. Shared by tests/engine/test_quantize_vllm.py and
bench/quantize.py.
"""

from __future__ import annotations

import json
import sys


def logprobs(path: str, dtype: str, prompts: list[str]) -> tuple[list[float], list[list[int]]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, dtype=dtype, enforce_eager=True, max_model_len=1024)
    try:
        res = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, prompt_logprobs=0))
    finally:
        llm.llm_engine.engine_core.shutdown()
    lps = [
        d[t].logprob
        for r in res
        for t, d in zip(r.prompt_token_ids[1:], r.prompt_logprobs[1:], strict=True)
    ]
    return lps, [list(r.outputs[0].token_ids) for r in res]


def main(argv: list[str]) -> None:
    import numpy as np

    from inferbus.quantize import calibration_texts

    original, dtype, *quantized = argv
    # held out: past the texts the quantizer calibrates on
    prompts = [t[:1500] for t in calibration_texts(48)[32:48]]
    ref, ref_tokens = logprobs(original, dtype, prompts)
    out = {}
    for path in quantized:
        lps, tokens = logprobs(path, "bfloat16", prompts)
        a, b = np.array(ref), np.array(lps)
        same = [
            x == y
            for t1, t2 in zip(ref_tokens, tokens, strict=True)
            for x, y in zip(t1, t2, strict=False)
        ]
        out[path] = {
            "pearson": float(np.corrcoef(a, b)[0, 1]),
            "mean_abs_logprob_diff": float(np.abs(a - b).mean()),
            "greedy_same": float(np.mean(same)),
            "positions": len(a),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
