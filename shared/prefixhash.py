"""vLLM's prefix-cache block hashes, computed outside the engine. No I/O.

vLLM (0.32, ``prefix_caching_hash_algo`` sha256, the default) names each full block
of ``block_size`` prompt tokens by ``sha256(pickle((parent, tokens, extra_keys)))``,
chained from the previous block; the first block's parent is ``sha256(pickle(seed))``
with the seed ``"vllm-none-hash"``, or ``PYTHONHASHSEED`` when the engine's
environment sets it. Its KV events carry the low 64 bits of each digest. Computing
the same chain from a request's token ids lets the scheduler match a request against
what each engine says it holds, exactly.

Requests with extra keys (a LoRA adapter, multimodal inputs, a cache salt) hash
differently in the engine; callers hash only plain base-model prompts.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Sequence
from functools import lru_cache

DEFAULT_SEED = "vllm-none-hash"
_MASK = (1 << 64) - 1


def _sha256(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


@lru_cache(maxsize=8)
def _root(seed: str) -> bytes:
    return _sha256(seed)


def engine_seed() -> str:
    """The seed an engine started with this process's environment uses."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_SEED)


def event_hash(digest: bytes | int) -> int:
    """A block hash as KV events carry it: the digest's low 64 bits, big-endian."""
    if isinstance(digest, int):
        return digest & _MASK
    return int.from_bytes(digest, "big") & _MASK


def block_hashes(
    token_ids: Sequence[int], block_size: int, seed: str = DEFAULT_SEED, limit: int = 0
) -> list[int]:
    """The event hashes of the full ``block_size`` blocks of ``token_ids`` (at most
    ``limit`` of them when ``limit`` > 0), as a vLLM engine with ``seed`` names them."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    n = len(token_ids) // block_size
    if limit > 0:
        n = min(n, limit)
    out: list[int] = []
    parent = _root(seed)
    for i in range(n):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        parent = _sha256((parent, block, None))
        out.append(event_hash(parent))
    return out
