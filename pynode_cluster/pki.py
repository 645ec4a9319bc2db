"""The certificates a stock control plane and its nodes need, made as kubeadm makes them, with the
`cryptography` package (never shelled-out openssl).

Identities are what the authorizers read: a client cert's CN is the user and its O the groups, so a
kubelet's cert says `system:node:NAME` in `system:nodes` (what the Node authorizer and NodeRestriction
admit) and the admin's says `system:masters`. Keys are ECDSA P-256: as strong as kubeadm's RSA-2048
default for a test cluster and a hundred times faster to make, which matters when every test run
makes a fresh PKI.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pynode_cluster.components import APISERVER_NAMES, SERVICE_IP


def _write(path: Path, data: bytes, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CA:
    """A self-signed CA in `dir` (ca.crt, ca.key) that signs the serving and client certificates."""

    def __init__(self, dir: Path, name: str = "kubernetes") -> None:
        self.dir = dir
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=10 * 365))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pair = KeyPair(_write(dir / "ca.crt", self.cert.public_bytes(serialization.Encoding.PEM), 0o644),
                            _write(dir / "ca.key", _key_pem(self.key), 0o600))

    def issue(self, name: str, common_name: str, *, groups: tuple[str, ...] = (), client: bool = True,
              server: bool = False, hosts: tuple[str, ...] = ()) -> KeyPair:
        """NAME.crt and NAME.key: a certificate for `common_name` in `groups`, for client and/or server
        use; `hosts` are the server's DNS names and IP addresses."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=365))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return KeyPair(_write(self.dir / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644),
                       _write(self.dir / f"{name}.key", _key_pem(key), 0o600))


def service_account_keys(dir: Path) -> KeyPair:
    """sa.pub and sa.key: the key pair kube-apiserver signs service-account tokens with (the controller
    manager signs with the same key). Returned as cert=public key, key=private key."""
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(_write(dir / "sa.pub", pub, 0o644), _write(dir / "sa.key", _key_pem(key), 0o600))


def kubeconfig(path: Path, *, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    """A kubeconfig for one user of one cluster. JSON is YAML, so every client reads it."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "default",
        "clusters": [{"name": "default", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": user}}],
    }
    return _write(path, json.dumps(config, indent=2).encode(), 0o600)


def control_plane(pki: Path, address: str) -> CA:
    """A fresh CA in `pki` and what kube-apiserver reads there (components.apiserver_argv's names): its serving
    cert for `address` and the `kubernetes` Service, its client cert for the kubelets (kubeadm's group,
    which kubeadm binds to cluster-admin), the service-account key pair."""
    ca = CA(pki)
    ca.issue("apiserver", "kube-apiserver", client=False, server=True, hosts=(address, SERVICE_IP, *APISERVER_NAMES))
    ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", groups=("kubeadm:cluster-admins",))
    service_account_keys(pki)
    return ca


def user_kubeconfig(ca: CA, path: Path, server: str, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig at `path` for `user` in `groups`, its key pair in the CA's directory named after the file
    (so each user's kubeconfig needs a file name of its own)."""
    pair = ca.issue(path.stem, user, groups=groups)
    return kubeconfig(path, server=server, ca=ca.pair.cert, client=pair, user=user)
