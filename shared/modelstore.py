"""The model registry on JetStream: manifests in a KV bucket, artifacts in the Object
Store (or on a shared volume), and a worker's local cache of fetched versions.

Versions are immutable: pushing a version that exists with other files is refused.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy, KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from inferbus.contracts import (
    MODEL_ARTIFACTS,
    MODEL_REGISTRY,
    ModelCurrent,
    ModelFile,
    ModelVersion,
    subject_token,
)
from inferbus.shared.codec import decode, encode
from inferbus.shared.kvwrite import put_until_stored

_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SHAPE_KEYS = (
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "quantization_config",
)


class RegistryError(Exception):
    pass


def check_ref(name: str, version: str) -> None:
    if subject_token(name) != name or "@" in name:
        raise RegistryError(f"model name {name!r}: use letters, digits, '-' and '_'")
    if not _VERSION.fullmatch(version):
        raise RegistryError(f"version {version!r}: use letters, digits, '.', '-' and '_'")


def version_key(name: str, version: str) -> str:
    return f"v.{name}.{version}"


def current_key(name: str) -> str:
    return f"current.{name}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def quantization_of(config: dict[str, object]) -> str:
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return ""
    method = str(q.get("quant_method", "quantized"))
    bits, group = q.get("bits") or q.get("w_bit"), q.get("group_size") or q.get("q_group_size")
    return f"{method}-{bits}bit-g{group}" if bits else method


_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


class Shape(msgspec.Struct, kw_only=True, frozen=True):
    kind: str
    """``model`` or ``adapter``."""
    shape: str
    """Equal for two folders whose weights load into the same engine in place: same
    tensor shapes, same quantization, same tokenizer (a reload keeps the engine's
    tokenizer)."""
    architecture: str = ""
    quantization: str = ""


def shape_of(folder: str | Path) -> Shape | None:
    """The shape of a model or adapter folder; None when it is neither."""
    root = Path(folder)
    adapter = (root / "adapter_config.json").is_file()
    config_path = root / ("adapter_config.json" if adapter else "config.json")
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    if adapter:
        key: dict[str, object] = {
            "r": config.get("r"),
            "target_modules": sorted(config.get("target_modules") or []),
        }
    else:
        key = {k: config.get(k) for k in _SHAPE_KEYS}
        key["tokenizer"] = {n: _sha256(root / n) for n in _TOKENIZER_FILES if (root / n).is_file()}
    return Shape(
        kind="adapter" if adapter else "model",
        shape=hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16],
        architecture="" if adapter else str((config.get("architectures") or [""])[0]),
        quantization="" if adapter else quantization_of(config),
    )


def manifest_of(
    folder: str | Path, name: str, version: str, *, base_model: str = "", pushed_by: str = ""
) -> ModelVersion:
    """The manifest of a model or adapter folder (hashes every file)."""
    check_ref(name, version)
    root = Path(folder)
    if not root.is_dir():
        raise RegistryError(f"no folder at {root}")
    shape = shape_of(root)
    if shape is None:
        raise RegistryError(
            f"{root} has no config.json (a model) or adapter_config.json (a LoRA adapter)"
        )
    if shape.kind == "adapter" and not base_model:
        raise RegistryError(f"{root} is a LoRA adapter: name its base model (--base)")
    files = [
        ModelFile(path=p.relative_to(root).as_posix(), size=p.stat().st_size, sha256=_sha256(p))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]
    return ModelVersion(
        name=name,
        version=version,
        kind=shape.kind,
        files=files,
        size_bytes=sum(f.size for f in files),
        architecture=shape.architecture,
        shape=shape.shape,
        quantization=shape.quantization,
        base_model=base_model if shape.kind == "adapter" else "",
        pushed_at=time.time(),
        pushed_by=pushed_by,
    )


# -- the registry on the bus ----------------------------------------------------------------


async def registry(js: JetStreamContext, create: bool = False) -> KeyValue:
    try:
        return await js.key_value(MODEL_REGISTRY)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            raise RegistryError("the model registry does not exist yet (push a model)") from None
        return await js.create_key_value(
            KeyValueConfig(bucket=MODEL_REGISTRY, history=16, storage=StorageType.FILE)
        )


async def artifacts(js: JetStreamContext, create: bool = False) -> ObjectStore:
    try:
        return await js.object_store(MODEL_ARTIFACTS)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            raise RegistryError("the model artifact store does not exist yet") from None
        return await js.create_object_store(
            MODEL_ARTIFACTS, ObjectStoreConfig(storage=StorageType.FILE)
        )


def object_name(mv: ModelVersion, path: str) -> str:
    return f"{mv.name}/{mv.version}/{path}"


async def get_version(js: JetStreamContext, name: str, version: str) -> ModelVersion | None:
    try:
        entry = await (await registry(js)).get(version_key(name, version))
    except (KeyNotFoundError, RegistryError):
        return None
    return decode(entry.value or b"", ModelVersion)


async def get_current(js: JetStreamContext, name: str) -> ModelCurrent | None:
    try:
        entry = await (await registry(js)).get(current_key(name))
    except (KeyNotFoundError, RegistryError):
        return None
    return decode(entry.value or b"", ModelCurrent)


async def set_current(js: JetStreamContext, current: ModelCurrent) -> None:
    kv = await registry(js, create=True)
    await put_until_stored(kv, current_key(current.name), encode(current))


async def list_versions(js: JetStreamContext, name: str = "") -> list[ModelVersion]:
    kv = await registry(js)
    out = []
    for key in await keys(js, f"v.{name}." if name else "v."):
        if (value := await value_of(kv, key)) is not None:
            out.append(decode(value, ModelVersion))
    return sorted(out, key=lambda v: (v.name, v.pushed_at))


async def keys(js: JetStreamContext, prefix: str = "") -> list[str]:
    """The registry's keys starting with ``prefix`` (deleted ones too: read them with
    ``value_of``), from the bucket stream's subject list: one request. nats-py's
    ``KeyValue.keys()`` walks a watcher instead, and a worker restarted in CI once got
    a list without the key it needed (its current adapter) and served without it."""
    root = f"$KV.{MODEL_REGISTRY}."
    try:
        info = await js.stream_info(f"KV_{MODEL_REGISTRY}", subjects_filter=f"{root}{prefix}>")
    except NotFoundError:
        return []
    return sorted(s.removeprefix(root) for s in info.state.subjects or {})


async def value_of(kv: KeyValue, key: str) -> bytes | None:
    """A key's value, or None when it was deleted."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value or b""


async def push(
    js: JetStreamContext,
    folder: str | Path,
    manifest: ModelVersion,
    signature: bytes,
    *,
    store: str = "object",
    location: str = "",
) -> ModelVersion:
    """Upload the files (``store="object"``) or record where they are (``"path"``), the
    signature, then the manifest: a version is listed only once all of it is there."""
    kv = await registry(js, create=True)
    obs = await artifacts(js, create=True)
    known = await get_version(js, manifest.name, manifest.version)
    if known is not None:
        if known.files != manifest.files:
            raise RegistryError(
                f"{manifest.ref} exists with other files: versions are immutable, push a new one"
            )
        # the same files again: signed anew (another key, a rotation); nothing else changes
        await obs.put(object_name(known, known.signature), signature)
        return known
    if store == "path":
        if not location or not Path(location).is_absolute():
            raise RegistryError(
                "--store path needs --location, an absolute folder every "
                "worker mounts at the same path"
            )
    elif store == "object":
        root = Path(folder)
        for f in manifest.files:
            with (root / f.path).open("rb") as data:
                await obs.put(object_name(manifest, f.path), data)
    else:
        raise RegistryError(f"store {store!r}: use object or path")
    await obs.put(object_name(manifest, manifest.signature), signature)
    pushed = msgspec.structs.replace(manifest, store=store, location=location)
    await put_until_stored(kv, version_key(manifest.name, manifest.version), encode(pushed))
    return pushed


# -- a worker's cache ------------------------------------------------------------------------


class Fetched:
    """A version on local disk: its folder (what the engine loads) and signature."""

    def __init__(self, folder: Path, signature: Path, took_s: float, cached: bool = False) -> None:
        self.folder, self.signature, self.took_s = folder, signature, took_s
        self.cached = cached
        """Found complete in the cache (fetched earlier), not read from the bus now."""


async def fetch(js: JetStreamContext, mv: ModelVersion, cache_dir: str | Path) -> Fetched:
    """Bring a version to ``cache_dir/<name>/<version>/`` (the signature beside its
    ``files/``), reusing a complete earlier fetch. Nothing here is trusted: the caller
    verifies the signature before loading."""
    started = time.perf_counter()
    home = Path(cache_dir) / mv.name / mv.version
    signature = home / mv.signature
    folder = Path(mv.location) if mv.store == "path" else home / "files"
    if (home / ".complete").is_file():
        return Fetched(folder, signature, time.perf_counter() - started, cached=True)
    obs = await artifacts(js)
    partial = home.with_name(f".{mv.version}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "files").mkdir(parents=True)
    try:
        if mv.store == "object":
            for f in mv.files:
                target = partial / "files" / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                await get_object(js, obs, object_name(mv, f.path), target)
        await get_object(js, obs, object_name(mv, mv.signature), partial / mv.signature)
        (partial / ".complete").touch()
        shutil.rmtree(home, ignore_errors=True)
        partial.rename(home)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Fetched(folder, signature, time.perf_counter() - started)


async def get_object(js: JetStreamContext, obs: ObjectStore, name: str, target: Path) -> None:
    """Stream an object's chunks straight to ``target``, checking its size and SHA-256.

    nats-py's ``ObjectStore.get`` reads its chunks one iterator step at a time (260 ms
    for 3.3 MB here); an ordered consumer with a callback takes 5 ms."""
    info = await obs.get_info(name)
    size = info.size or 0
    h = hashlib.sha256()
    received = 0
    done = asyncio.Event()
    with target.open("wb") as out:
        if size:

            async def on_chunk(msg: Msg) -> None:
                nonlocal received
                out.write(msg.data)
                h.update(msg.data)
                received += len(msg.data)
                if msg.metadata.num_pending == 0 or received >= size:
                    done.set()

            chunks = f"$O.{MODEL_ARTIFACTS}.C.{info.nuid}"
            sub = await js.subscribe(
                chunks,
                stream=f"OBJ_{MODEL_ARTIFACTS}",
                cb=on_chunk,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
            try:
                await asyncio.wait_for(done.wait(), timeout=60 + size / 1e6)
            finally:
                await sub.unsubscribe()
    digest = "SHA-256=" + base64.urlsafe_b64encode(h.digest()).decode()
    if received != size or (info.digest and info.digest != digest):
        raise RegistryError(
            f"{name}: got {received} of {size} bytes, digest {digest}, expected {info.digest}"
        )


def evict(cache_dir: str | Path, mv: ModelVersion) -> None:
    """Drop a version's local copy (residency ``cold``)."""
    shutil.rmtree(Path(cache_dir) / mv.name / mv.version, ignore_errors=True)
