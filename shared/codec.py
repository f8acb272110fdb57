"""JSON codec for contracts events: one encoder, cached decoders per target type."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar, overload

import msgspec

from inferbus.contracts import Event

_encoder = msgspec.json.Encoder()
encode = _encoder.encode

DecodeError = (msgspec.DecodeError, msgspec.ValidationError)


T = TypeVar("T")


@lru_cache(maxsize=64)
def _decoder(target: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(target)


@overload
def decode(data: bytes, target: type[T]) -> T: ...
@overload
def decode(data: bytes, target: Any) -> Any: ...
def decode(data: bytes, target: Any) -> Any:
    """Decode ``data`` as ``target`` (an Event type or a union of them). JSON nested
    deeper than the interpreter's recursion allows is a ``DecodeError`` like any other
    bad input (msgspec raises RecursionError: the sanitizer let one escape five times
    and the request was never answered, nor dead-lettered)."""
    try:
        return _decoder(target).decode(data)
    except RecursionError:
        raise msgspec.DecodeError("JSON is nested too deeply") from None


def to_builtins(event: Event) -> Any:
    return msgspec.to_builtins(event)


def decode_or_none(data: bytes, cls: Any) -> Any | None:
    """For events another service answers for (it dead-letters them): None when ``data``
    is not a ``cls``."""
    try:
        return decode(data, cls)
    except DecodeError:
        return None
