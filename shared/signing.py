"""Model signatures in the OpenSSF model-signing format, key-based and offline.

``inferbus model push`` signs a version's folder with an ECDSA private key (P-256,
P-384 or P-521); a worker verifies the folder it fetched against the public keys its
operator configured (``--trusted-keys``) before any byte reaches the engine. The keys
are configuration only: nothing in a delivery event can add one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

CURVES = ("P-256", "P-384", "P-521")


class SignatureError(Exception):
    """The folder does not verify against any trusted key (or there is none)."""


def preload() -> None:
    """Import the verifier now (0.3 s or more, once), not on the first delivery's
    clock."""
    from model_signing import verifying  # noqa: F401


def generate_key(private_path: str | Path, curve: str = "P-256") -> Path:
    """Write a new private key (PEM, PKCS#8, mode 0600) and its public key beside it
    (``<private>.pub``); return the public key's path."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    curves = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}
    if curve not in curves:
        raise ValueError(f"curve {curve!r}: use one of {', '.join(CURVES)}")
    key = ec.generate_private_key(curves[curve])
    private = Path(private_path)
    private.parent.mkdir(parents=True, exist_ok=True)
    private.touch(mode=0o600)
    private.write_bytes(
        key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    public = private.with_name(private.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
    return public


def sign_folder(
    folder: str | Path, signature: str | Path, private_key: str | Path, password: str | None = None
) -> None:
    """Sign every file under ``folder``; the bundle goes to ``signature`` (keep it out
    of the folder: a file in the folder that the signature does not cover fails
    verification)."""
    from model_signing import signing

    signing.Config().use_elliptic_key_signer(private_key=private_key, password=password).sign(
        Path(folder), Path(signature)
    )


def verify_folder(
    folder: str | Path, signature: str | Path, public_keys: Sequence[str | Path]
) -> tuple[str, float]:
    """Check that ``folder`` holds exactly what ``signature`` covers, signed by one of
    ``public_keys``. Returns the key that verified and the seconds it took; raises
    SignatureError with every key's reason otherwise."""
    from model_signing import verifying

    if not public_keys:
        raise SignatureError("no trusted keys are configured (--trusted-keys): nothing verifies")
    if not Path(signature).is_file():
        raise SignatureError(f"unsigned: no signature at {signature}")
    started = time.perf_counter()
    reasons = []
    for key in public_keys:
        try:
            verifying.Config().use_elliptic_key_verifier(public_key=key).verify(
                Path(folder), Path(signature)
            )
            return str(key), time.perf_counter() - started
        except Exception as exc:  # model_signing raises ValueError and its own errors
            reasons.append(f"{Path(key).name}: {_short(exc)}")
    raise SignatureError("signature does not verify: " + "; ".join(reasons))


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"
