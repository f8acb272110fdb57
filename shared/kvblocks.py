"""KV blocks as files: the format and layout the worker's spill tiers write and the
kvspill service reads.

A block is a header (magic, format version, crc32 of the payload, payload length,
sha256 of its key) and the payload (the block's bytes of every layer). Its key is
``namespace:hash`` (the weights' namespace and vLLM's block hash, hex), and its file
``<root>/<namespace>/<first two hex digits>/<hash>.kv``, written under a temporary
name and renamed, so a reader sees a whole block or none.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

_MAGIC = b"IBKV"
_HEADER = struct.Struct("<4sBxxxIQ32s")
"""magic, format version, crc32 of the payload, payload length, the block's key."""
_VERSION = 1
HEADER_BYTES = _HEADER.size


class CorruptBlock(Exception):
    """A stored block failed its checks (length, checksum or key)."""


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


Buffer = bytes | bytearray | memoryview


def block_header(key: str, payload: Buffer) -> bytes:
    return _HEADER.pack(_MAGIC, _VERSION, zlib.crc32(payload), len(payload), key_digest(key))


def encode_block(key: str, payload: Buffer) -> bytes:
    return block_header(key, payload) + bytes(payload)


def write_block(path: Path, key: str, payload: Buffer) -> None:
    """The block's file, written whole (header, then the payload without a copy)."""
    with open(path, "wb") as f:
        f.write(block_header(key, payload))
        f.write(payload)


def decode_block(key: str, data: Buffer, expected_len: int = 0) -> memoryview:
    """The payload of a block's file contents, checked; a view, not a copy."""
    view = memoryview(data)
    if len(view) < _HEADER.size:
        raise CorruptBlock(f"{key}: {len(view)} bytes, shorter than the header")
    magic, version, crc, length, digest = _HEADER.unpack_from(view)
    payload = view[_HEADER.size :]
    if magic != _MAGIC or version != _VERSION:
        raise CorruptBlock(f"{key}: not a block file (magic {magic!r}, version {version})")
    if digest != key_digest(key):
        raise CorruptBlock(f"{key}: the file holds another block")
    if length != len(payload) or (expected_len and length != expected_len):
        want = expected_len or length
        raise CorruptBlock(f"{key}: {len(payload)} payload bytes, expected {want}")
    if zlib.crc32(payload) != crc:
        raise CorruptBlock(f"{key}: checksum mismatch")
    return payload


def block_path(root: Path, key: str) -> Path:
    namespace, _, digest = key.partition(":")
    return root / namespace / digest[:2] / f"{digest}.kv"


class StoredBlock(NamedTuple):
    key: str
    path: Path
    size: int
    """Payload bytes."""
    atime: float
    mtime: float


def scan_blocks(root: Path) -> list[StoredBlock]:
    """The blocks a folder holds (``namespace/xx/hash.kv``), oldest first."""
    found = []
    try:
        namespaces = list(os.scandir(root))
    except FileNotFoundError:
        return []
    for ns in namespaces:
        if not ns.is_dir():
            continue
        for sub in os.scandir(ns.path):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                if not entry.name.endswith(".kv"):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue  # removed meanwhile
                found.append(
                    StoredBlock(
                        f"{ns.name}:{entry.name[:-3]}",
                        Path(entry.path),
                        st.st_size - HEADER_BYTES,
                        st.st_atime,
                        st.st_mtime,
                    )
                )
    found.sort(key=lambda b: b.mtime)
    return found


def stored_on_disk(root: Path) -> list[tuple[str, int]]:
    """The blocks a disk tier holds, oldest first: (key, payload bytes)."""
    return [(b.key, b.size) for b in scan_blocks(root)]
