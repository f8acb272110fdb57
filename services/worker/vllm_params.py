"""What the worker asks of vLLM for one request: the contract's sampling parameters,
output constraint and prompt as vLLM takes them, and vLLM's logprobs as the contract's.
vLLM is imported only inside these functions (the worker runs without it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferbus.contracts import (
    FailureCode,
    SamplingParams,
    StructuredOutput,
    TokenLogprob,
    TopLogprob,
)

from .engine import EngineError, EngineOptions


def request_errors() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it refuses (its 4xx errors), as opposed to a fault."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: plain ValueError
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)


def structured_params(c: StructuredOutput | None) -> Any:
    """Our output constraint as vLLM's StructuredOutputsParams (None: none)."""
    if c is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(
        json=c.json_schema,
        json_object=True if c.json_object else None,
        regex=c.regex,
        choice=c.choice,
        grammar=c.grammar,
        structural_tag=c.structural_tag,
    )


def engine_wide_only(c: StructuredOutput | None, o: EngineOptions) -> None:
    """Refuse a constraint's option that vLLM takes per engine, not per request, when it
    asks for other than this engine's (vLLM would ignore it)."""
    if c is None:
        return
    asked = {
        "disable_any_whitespace": (
            c.disable_any_whitespace,
            o.structured_outputs_disable_any_whitespace,
        ),
        "disable_additional_properties": (
            c.disable_additional_properties,
            o.structured_outputs_disable_additional_properties,
        ),
    }
    for name, (wanted, engine) in asked.items():
        if wanted and not engine:
            raise EngineError(
                FailureCode.UNSUPPORTED_BY_ENGINE,
                f"structured_outputs.{name} is set per engine: this worker runs without it "
                f"(start it with --structured-outputs-{name.replace('_', '-')})",
            )
    if c.whitespace_pattern is not None:
        raise EngineError(
            FailureCode.UNSUPPORTED_BY_ENGINE,
            "structured_outputs.whitespace_pattern is not supported by vLLM's "
            "structured-output backends",
        )


def sampling_params(s: SamplingParams, kv_namespace: str = "") -> Any:
    """Every field of ours as vLLM's field of the same name (the contract mirrors it)."""
    from vllm import SamplingParams as VllmSampling
    from vllm.sampling_params import RequestOutputKind

    from .spill.names import NAMESPACE_PARAM

    try:
        return VllmSampling(
            n=s.n,
            max_tokens=s.max_tokens,
            min_tokens=s.min_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            stop=list(s.stop) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            seed=s.seed,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            ignore_eos=s.ignore_eos,
            logprobs=s.logprobs,
            prompt_logprobs=s.prompt_logprobs,
            logit_bias=dict(s.logit_bias) or None,
            allowed_token_ids=list(s.allowed_token_ids) or None,
            bad_words=list(s.bad_words) or None,
            include_stop_str_in_output=s.include_stop_str_in_output,
            skip_special_tokens=s.skip_special_tokens,
            spaces_between_special_tokens=s.spaces_between_special_tokens,
            structured_outputs=structured_params(s.structured),
            output_kind=RequestOutputKind.DELTA,
            # the KV spill connector keys blocks by the weights that computed them
            extra_args={"kv_transfer_params": {NAMESPACE_PARAM: kv_namespace}}
            if kv_namespace
            else None,
        )
    except request_errors() as exc:
        raise EngineError(
            FailureCode.INVALID_REQUEST, f"invalid sampling parameters: {exc}"
        ) from None


def logprobs_of(
    token_ids: Any, steps: Any, top: int, decode: Callable[[int], str]
) -> list[TokenLogprob]:
    """vLLM's per-position logprobs (a dict of token id to ``Logprob`` per output
    token) as ours: the token chosen, and the ``top`` most likely at its position."""
    out: list[TokenLogprob] = []
    for tid, step in zip(token_ids, steps or (), strict=False):
        chosen = step.get(tid)

        def text(token_id: int, lp: Any) -> str:
            return lp.decoded_token if lp.decoded_token is not None else decode(token_id)

        alternatives = sorted(
            ((t, lp) for t, lp in step.items() if lp.rank is not None and lp.rank <= top),
            key=lambda item: item[1].rank,
        )
        out.append(
            TokenLogprob(
                token=text(tid, chosen) if chosen is not None else decode(tid),
                logprob=max(chosen.logprob, -9999.0) if chosen is not None else -9999.0,
                token_id=tid,
                top=[
                    TopLogprob(token=text(t, lp), logprob=max(lp.logprob, -9999.0), token_id=t)
                    for t, lp in alternatives[:top]
                ],
            )
        )
    return out


def prompt_logprobs_of(
    token_ids: Any, steps: Any, top: int, decode: Callable[[int], str]
) -> list[TokenLogprob]:
    """vLLM's prompt logprobs as ours, token by token (vLLM's None for the first,
    which nothing comes before: the token with no logprob)."""
    out: list[TokenLogprob] = []
    for tid, step in zip(token_ids, steps or (), strict=False):
        if step is None:
            out.append(TokenLogprob(token=decode(tid), logprob=None, token_id=tid))
        else:
            out.append(logprobs_of([tid], [step], top, decode)[0])
    return out


def truncated(ids: list[int], keep: int | None, max_len: int, max_tokens: int) -> list[int]:
    """The prompt's last ``keep`` tokens (vLLM's ``truncate_prompt_tokens``, left side;
    -1: as many as leave room for ``max_tokens``)."""
    if keep is None:
        return ids
    if keep < 0:
        keep = max(0, max_len - max_tokens)
    return ids[-keep:] if keep else []
