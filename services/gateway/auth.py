"""API keys, their scopes and rate limits: pure decisions with the time passed in.

Keys are stored as SHA-256 digests (they are random 32-byte secrets, so a fast hash
is the right one, as for GitHub's tokens); the plain key is shown once, by
``inferbus keys new``. Limits are token buckets: requests per second, and tokens
per minute charged up front (prompt estimate + max_tokens) and settled against the
real usage when the request ends.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from inferbus.shared.errors import ConfigError

from .errors import ApiError

Priority = Literal["interactive", "standard", "batch"]


class ApiKey(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    name: str
    """Who holds it, for logs and metrics (never the key itself)."""
    sha256: str
    """Hex SHA-256 of the key."""
    tenant: str = ""
    """Tenant for fairness downstream; defaults to ``name``."""
    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Models it may use; ``*`` for all."""
    max_tokens: int = 0
    """Most output tokens per request (0: the model's limit)."""
    requests_per_s: float = 0.0
    """0: unlimited."""
    tokens_per_min: int = 0
    """Prompt + output tokens per minute; 0: unlimited."""
    priority: Priority = "standard"
    input_policy: Literal["", "block", "flag", "off"] = ""
    """Injection findings on this key's input: block, flag or off ("": the deployment's)."""
    data_policy: Literal["", "block", "flag", "spotlight", "off"] = ""
    """Instructions found in the data its agents send back (tool results): block, flag,
    spotlight or off ("": the deployment's)."""
    mask_pii: bool | None = None
    """Mask PII in this key's output (None: the deployment's default, on)."""
    tool_call_policy: Literal["", "mask", "refuse"] = ""
    """PII in its tool calls' arguments that its messages never gave: masked, or the
    call refused ("": the deployment's)."""
    metrics: bool = False
    """It may read the gateway's /metrics (a Prometheus scrape key): with keys on,
    /metrics on the public port answers no one else."""

    def allows(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    @property
    def tenant_id(self) -> str:
        return self.tenant or self.name


class KeyFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    keys: list[ApiKey] = []


OPEN_KEY = ApiKey(name="open", sha256="", tenant="default")
"""Who every request is in open mode (no keys configured)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "ib-" + secrets.token_urlsafe(32)


def load_keys(path: str = "", inline: str = "") -> list[ApiKey]:
    """Keys from a TOML or JSON file (``[[keys]]`` tables) and/or inline JSON
    (``INFERBUS_API_KEYS``: a list of key objects)."""
    keys: list[ApiKey] = []
    try:
        if path:
            raw = Path(path).read_bytes()
            if path.endswith(".json"):
                keys += msgspec.json.decode(raw, type=KeyFile).keys
            else:
                keys += msgspec.convert(tomllib.loads(raw.decode()), KeyFile).keys
        if inline.strip():
            keys += msgspec.json.decode(inline, type=list[ApiKey])
    except (OSError, ValueError, msgspec.ValidationError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot load API keys: {exc}") from None
    if (path or inline.strip()) and not keys:
        # a typo must not turn authentication off
        raise ConfigError("cannot load API keys: keys were configured but none was found")
    for k in keys:
        if len(k.sha256) != 64 or any(c not in "0123456789abcdef" for c in k.sha256):
            raise ConfigError(f"API key {k.name!r}: sha256 must be 64 lowercase hex digits")
    return keys


class Bucket:
    """A token bucket: ``rate`` per second, holding at most ``capacity``."""

    __slots__ = ("at", "capacity", "level", "rate")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate, self.capacity, self.level, self.at = rate, capacity, capacity, now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` can be taken (0 when it can now)."""
        self._refill(now)
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)


class Admission(msgspec.Struct, kw_only=True, frozen=True):
    key: ApiKey
    charged_tokens: int
    """Tokens taken from the per-minute budget, settled when the request ends."""


class AccessControl:
    """Who may call, for which models and how fast."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self.by_digest = {k.sha256: k for k in keys}
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    @property
    def open(self) -> bool:
        return not self.by_digest

    def authenticate(self, authorization: str | None, x_api_key: str | None = None) -> ApiKey:
        if self.open:
            return OPEN_KEY
        token = x_api_key
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                token = value.strip()
        if not token:
            raise ApiError(
                401,
                "no API key: send the header 'Authorization: Bearer <key>'",
                type="invalid_request_error",
                code="invalid_api_key",
            )
        key = self.by_digest.get(digest(token))
        if key is None:
            raise ApiError(
                401,
                "the API key is not valid",
                type="invalid_request_error",
                code="invalid_api_key",
            )
        return key

    @staticmethod
    def authorize_model(key: ApiKey, model: str) -> None:
        if not key.allows(model):
            raise ApiError(
                403,
                f"the API key {key.name!r} may not use the model {model!r}",
                type="permission_error",
                param="model",
                code="model_not_allowed",
            )

    def admit(
        self, key: ApiKey, *, model: str, max_tokens: int, prompt_chars: int, now: float
    ) -> Admission:
        """Check the key's scopes and limits for one request, charging its budgets."""
        self.authorize_model(key, model)
        if key.max_tokens and max_tokens > key.max_tokens:
            raise ApiError(
                400,
                f"max_tokens is {max_tokens}, over this key's limit of {key.max_tokens}",
                param="max_tokens",
                code="max_tokens_over_limit",
            )
        charge = 0
        waits: list[float] = []
        req_bucket = tok_bucket = None
        if key.requests_per_s > 0:
            req_bucket = self._bucket(
                self._requests, key.sha256, key.requests_per_s, max(1.0, key.requests_per_s), now
            )
            waits.append(req_bucket.wait_for(1, now))
        if key.tokens_per_min > 0:
            # a request bigger than the whole budget waits for a full bucket, not forever
            charge = min(estimate_prompt_tokens(prompt_chars) + max_tokens, key.tokens_per_min)
            tok_bucket = self._bucket(
                self._tokens, key.sha256, key.tokens_per_min / 60.0, key.tokens_per_min, now
            )
            waits.append(tok_bucket.wait_for(charge, now))
        wait = max(waits, default=0.0)
        if wait > 0:
            which = (
                "requests per second"
                if req_bucket and req_bucket.wait_for(1, now)
                else "tokens per minute"
            )
            raise ApiError(
                429,
                f"rate limit of the API key {key.name!r} reached ({which}); retry in {wait:.1f}s",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after=math.ceil(wait),
            )
        if req_bucket:
            req_bucket.take(1, now)
        if tok_bucket:
            tok_bucket.take(charge, now)
        return Admission(key=key, charged_tokens=charge)

    def settle(self, admission: Admission, used_tokens: int | None, now: float) -> None:
        """Give back what the request was charged beyond its real usage (everything
        when ``used_tokens`` is None: it ended before any token reached the client)."""
        if not admission.charged_tokens:
            return
        bucket = self._tokens.get(admission.key.sha256)
        if bucket is not None:
            refund = admission.charged_tokens - (used_tokens or 0)
            if refund > 0:
                bucket.give_back(refund, now)
            elif refund < 0:
                bucket.take(-refund, now)

    @staticmethod
    def _bucket(
        table: dict[str, Bucket], name: str, rate: float, capacity: float, now: float
    ) -> Bucket:
        b = table.get(name)
        if b is None:
            b = table[name] = Bucket(rate, capacity, now)
        return b


def estimate_prompt_tokens(chars: int) -> int:
    """About four characters a token in English; settled against the real count later."""
    return chars // 4 + 1
