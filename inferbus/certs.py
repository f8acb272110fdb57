"""Certificates for NATS over TLS: a private CA and a server certificate it signs.

``inferbus certs make DIR`` writes ``ca.pem``, ``ca-key.pem``, ``server-cert.pem`` and
``server-key.pem`` (keys mode 0600); ``inferbus up --nats-tls-dir DIR`` serves its
embedded NATS with the server pair and gives every client the CA to verify it. A real
deployment brings its own (the same four files, from its PKI).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

CA = "ca.pem"
SERVER_CERT = "server-cert.pem"
SERVER_KEY = "server-key.pem"


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make(folder: Path, hosts: list[str], days: int = 365) -> Path:
    """A CA and a server certificate for ``hosts`` (names or IP addresses) in ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=days)

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inferbus NATS CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(folder / CA, ca.public_bytes(serialization.Encoding.PEM))
    _write(folder / "ca-key.pem", pem_key(ca_key), private=True)
    _write(folder / SERVER_CERT, cert.public_bytes(serialization.Encoding.PEM))
    _write(folder / SERVER_KEY, pem_key(key), private=True)
    return folder
