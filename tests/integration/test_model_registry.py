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


async def test_push_fetch_resign_and_versions_are_immutable(nats_url, tmp_path):
    folder = make_tiny(tmp_path / "m")
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    generate_key(a), generate_key(b)
    nc = await connect(nats_url, "registry-test")
    js = nc.jetstream()
    try:
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
    finally:
        await nc.close()
