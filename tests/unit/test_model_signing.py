"""Manifests and signatures on real folders: the tiny model, signed with real ECDSA
keys (model-signing), checked as a worker checks them."""

from __future__ import annotations

import json
import shutil

import pytest

from inferbus.contracts import ModelDelivery, ModelSwapped, ModelVersion, RolloutDecision
from inferbus.services.worker.delivery import trusted_keys
from inferbus.shared import modelstore
from inferbus.shared.codec import decode, encode
from inferbus.shared.signing import SignatureError, generate_key, sign_folder, verify_folder
from inferbus.tinymodel import make_tiny, make_tiny_lora


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return make_tiny(root / "m1"), make_tiny(root / "m2", seed=1), root


@pytest.fixture()
def keys(tmp_path):
    return generate_key(tmp_path / "keys" / "release.key"), generate_key(tmp_path / "rogue.key")


def test_manifest_same_shape_for_new_weights_other_for_a_new_tokenizer(tiny, tmp_path):
    m1, m2, _ = tiny
    a = modelstore.manifest_of(m1, "m", "v1")
    b = modelstore.manifest_of(m2, "m", "v2")
    assert a.kind == "model" and a.architecture == "LlamaForCausalLM"
    assert a.shape == b.shape  # other weights, same shapes: a warm swap
    assert {f.path for f in a.files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert a.size_bytes == sum(f.size for f in a.files) and len(a.files[0].sha256) == 64
    other_tok = tmp_path / "m3"
    shutil.copytree(m1, other_tok)
    (other_tok / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 7}))
    # the engine keeps its tokenizer through a reload: another one needs a new engine
    assert modelstore.manifest_of(other_tok, "m", "v3").shape != a.shape


def test_manifest_refuses_what_is_not_a_model_and_adapters_without_a_base(tiny, tmp_path):
    m1, _, _root = tiny
    lora = make_tiny_lora(m1, tmp_path / "lora")
    with pytest.raises(modelstore.RegistryError, match="--base"):
        modelstore.manifest_of(lora, "ad", "a1")
    ad = modelstore.manifest_of(lora, "ad", "a1", base_model="m")
    assert ad.kind == "adapter" and ad.base_model == "m"
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.bin").write_bytes(b"x")
    with pytest.raises(modelstore.RegistryError, match=r"config\.json"):
        modelstore.manifest_of(tmp_path / "junk", "m", "v1")
    for name, version in (("a.b", "v1"), ("m@x", "v1"), ("m", "v 1"), ("m", "")):
        with pytest.raises(modelstore.RegistryError):
            modelstore.check_ref(name, version)


def test_a_signed_folder_verifies_and_every_change_to_it_is_refused(tiny, keys, tmp_path):
    release, rogue = keys
    folder = tmp_path / "v"
    shutil.copytree(tiny[0], folder)
    sig = tmp_path / "model.sig"
    sign_folder(folder, sig, release.with_suffix(""))
    key, took = verify_folder(folder, sig, [rogue, release])
    assert key == str(release) and took < 5
    with pytest.raises(SignatureError, match="Key mismatch"):
        verify_folder(folder, sig, [rogue])
    with pytest.raises(SignatureError, match="no trusted keys"):
        verify_folder(folder, sig, [])
    with pytest.raises(SignatureError, match="unsigned"):
        verify_folder(folder, tmp_path / "none.sig", [release])
    (folder / "extra.bin").write_bytes(b"not signed")
    with pytest.raises(SignatureError, match="mismatch"):
        verify_folder(folder, sig, [release])
    (folder / "extra.bin").unlink()
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the weights
    weights.write_bytes(bytes(data))
    with pytest.raises(SignatureError, match=r"model\.safetensors"):
        verify_folder(folder, sig, [release])


def test_trusted_keys_from_files_and_folders(keys, tmp_path):
    release, rogue = keys
    assert trusted_keys(f"{release.parent},{rogue}") == [release, rogue]
    assert trusted_keys("") == []
    with pytest.raises(FileNotFoundError, match="nowhere"):
        trusted_keys(str(tmp_path / "nowhere"))


def test_a_key_is_never_overwritten_and_curves_are_checked(tmp_path):
    with pytest.raises(ValueError, match="curve"):
        generate_key(tmp_path / "k", curve="P-999")
    pub = generate_key(tmp_path / "k384", curve="P-384")
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert oct((tmp_path / "k384").stat().st_mode & 0o777) == "0o600"


def test_delivery_events_round_trip_and_ignore_fields_they_do_not_know():
    mv = ModelVersion(name="m", version="v2", files=[], shape="s")
    for ev in (
        ModelDelivery(delivery_id="d", model=mv, role="candidate", workers=["w"]),
        ModelSwapped(delivery_id="d", worker_id="w", model="m@v2", ok=False, code="signature"),
        RolloutDecision(model="m", version="v2", action="rollback", reason="x"),
    ):
        assert decode(encode(ev), type(ev)) == ev
    newer = json.loads(encode(mv))
    newer["added_later"] = 1
    assert decode(json.dumps(newer).encode(), ModelVersion) == mv
