"""The model registry on a real nats-server: push, fetch to a worker's cache, the
immutability of versions, and re-signing."""

from __future__ import annotations

import shutil

import pytest

from inferbus.shared import modelstore
from inferbus.shared.bus import connect
from inferbus.shared.signing import SignatureError, generate_key, sign_folder, verify_folder
from inferbus.tinymodel import make_tiny

pytestmark = pytest.mark.integration


def signed(folder, key, tmp_path) -> bytes:
    sig = tmp_path / f"sig-{key.name}"
    sign_folder(folder, sig, key)
    return sig.read_bytes()


def keys(tmp_path, *names: str) -> list:
    """A signing key per name (its public half beside it, ``<name>.key.pub``)."""
    paths = [tmp_path / f"{name}.key" for name in names]
    for path in paths:
        generate_key(path)
    return paths


@pytest.fixture
async def js(nats_url):
    nc = await connect(nats_url, "registry-test")
    yield nc.jetstream()
    await nc.close()


async def test_push_fetch_resign_and_versions_are_immutable(js, tmp_path):
    folder = make_tiny(tmp_path / "m")
    a, b = keys(tmp_path, "a", "b")
    manifest = modelstore.manifest_of(folder, "reg-model", "v1")
    pushed = await modelstore.push(js, folder, manifest, signed(folder, a, tmp_path))
    assert pushed.store == "object"
    assert [v.ref for v in await modelstore.list_versions(js, "reg-model")] == ["reg-model@v1"]
    got = await modelstore.fetch(js, pushed, tmp_path / "cache")
    for f in manifest.files:  # every byte, as pushed
        assert (got.folder / f.path).read_bytes() == (folder / f.path).read_bytes()
    verify_folder(got.folder, got.signature, [a.with_name("a.key.pub")])
    # the same files signed with another key: the signature is replaced (a rotation)
    await modelstore.push(js, folder, manifest, signed(folder, b, tmp_path))
    modelstore.evict(tmp_path / "cache", pushed)
    again = await modelstore.fetch(js, pushed, tmp_path / "cache")
    verify_folder(again.folder, again.signature, [b.with_name("b.key.pub")])
    with pytest.raises(SignatureError, match="Key mismatch"):
        verify_folder(again.folder, again.signature, [a.with_name("a.key.pub")])
    # other files under the same version: refused
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    (changed / "config.json").write_text("{}" + " " * 10)
    other = modelstore.manifest_of(changed, "reg-model", "v1")
    with pytest.raises(modelstore.RegistryError, match="immutable"):
        await modelstore.push(js, changed, other, signed(changed, a, tmp_path))


async def test_a_worker_fetches_again_a_cached_copy_signed_with_a_key_it_no_longer_trusts(
    js, tmp_path
):
    from types import SimpleNamespace

    from inferbus.services.worker.delivery import Deliveries

    folder = make_tiny(tmp_path / "m")
    old, new = keys(tmp_path, "old", "new")
    manifest = modelstore.manifest_of(folder, "cached-model", "v1")
    pushed = await modelstore.push(js, folder, manifest, signed(folder, old, tmp_path))
    worker, ctx = SimpleNamespace(), SimpleNamespace(js=js)  # fetching needs only the bus
    cache = tmp_path / "cache"
    trusting_old = Deliveries(worker, ctx, cache, [old.with_name("old.key.pub")])
    await trusting_old._fetch_verified(pushed)  # cached, with the old signature
    await modelstore.push(js, folder, manifest, signed(folder, new, tmp_path))  # rotated
    trusting_new = Deliveries(worker, ctx, cache, [new.with_name("new.key.pub")])
    # the cached copy fails the new key; the worker reads the version again and loads it
    verified = await trusting_new._fetch_verified(pushed)
    verify_folder(
        verified.folder, cache / "cached-model" / "v1" / "model.sig", [new.with_name("new.key.pub")]
    )
