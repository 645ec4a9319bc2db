"""Certificates for trust bundles and pod certificates: self-signed CAs, as PEM (ClusterTrustBundle objects and
what pods read of them) or with their key (a test that signs as a PodCertificateRequest signer would)."""
from __future__ import annotations

import datetime
from typing import Any


def new_ca(name: str) -> tuple[Any, Any]:
    """(private key, certificate) of a fresh self-signed EC CA named `name`, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def ca_pem(name: str) -> bytes:
    """A fresh self-signed CA certificate named `name`, PEM-encoded (64 columns, as Go's encoding/pem)."""
    from cryptography.hazmat.primitives import serialization

    return new_ca(name)[1].public_bytes(serialization.Encoding.PEM)
