"""The TLS side of the kubelet's HTTPS server, through Python's ssl module: the serving certificate
(--tls-cert-file/--tls-private-key-file, else a self-signed one the kubelet makes once under ROOT/pki as
the stock kubelet does: kubelet.crt/kubelet.key, named after the node's host name and addresses) and
client certificates verified against --client-ca-file when the client offers one (a client without one
goes on to token or anonymous authentication, as with Go's VerifyClientCertIfGiven).

The private key is written 0600 into a new file renamed over the old one, in ROOT/pki 0700, whatever the
umask and whatever mode an older version left (an O_TRUNC open kept a wider file's mode), and never
logged. A self-signed certificate is kept across restarts (an API server pinned to it keeps working) and
remade only when it is missing or expired. With serverTLSBootstrap the certificate is the one the
cluster's kubelet-serving signer issued (pykubelet.certificates), swapped in on each rotation (ServingTLS).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path

from pykubelet.config import Settings
from pykubelet.dirs import make_dirs
from pynode_os.files import DATA, atomic_write

PKI_MODE = 0o700
KEY_MODE = 0o600


def self_signed(pki: Path, host: str, addresses: list[str]) -> tuple[Path, Path]:
    """pki/kubelet.crt and pki/kubelet.key, made now unless a valid pair is there already."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    cert_path, key_path = pki / "kubelet.crt", pki / "kubelet.key"
    make_dirs(pki, PKI_MODE)
    now = datetime.datetime.now(datetime.UTC)
    if cert_path.exists() and key_path.exists():
        try:
            if x509.load_pem_x509_certificate(cert_path.read_bytes()).not_valid_after_utc > now:
                if os.stat(key_path).st_mode & 0o077:
                    os.chmod(key_path, KEY_MODE)
                return cert_path, key_path
        except ValueError:
            pass  # unreadable: made again below
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{host}@{int(now.timestamp())}")])
    sans: list[x509.GeneralName] = [x509.DNSName(host)]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=True,
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(key, hashes.SHA256()))
    # exact modes, so no older file's mode survives; DATA: a key lost to a power cut is made again
    atomic_write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), mode=KEY_MODE, sync=DATA, exact=True)
    atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644, sync=DATA, exact=True)
    return cert_path, key_path


def serving_context(settings: Settings, pair: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """The server's SSLContext: tlsMinVersion (TLS 1.2) and up, with tlsCipherSuites if given (they choose
    among the suites of TLS 1.2 and below; TLS 1.3's are always on, as with Go), HTTP/1.1 only: the streaming
    upgrades need it. It serves `pair` (certificate, key) when given: the one serverTLSBootstrap obtained."""
    if pair is not None:
        cert, key = pair
    elif settings.tls_cert_file is not None and settings.tls_private_key_file is not None:
        cert, key = settings.tls_cert_file, settings.tls_private_key_file
    else:
        addresses = [a for a in (settings.node_ip,) if a]
        cert, key = self_signed(settings.root_dir / "pki", settings.node_name, addresses)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = settings.tls_min_version
    if settings.tls_cipher_suites:
        ctx.set_ciphers(":".join(settings.tls_cipher_suites))
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    if settings.client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(settings.client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class ServingTLS:
    """The context each new connection's handshake uses. A rotated serving certificate comes in as a new
    context swapped in whole (an attribute write, atomic under the GIL), so a handshake sees the old pair or
    the new one and connections already made keep theirs; loading a chain into a context other threads are
    wrapping sockets with is not something OpenSSL promises to be safe."""

    def __init__(self, settings: Settings, pair: tuple[Path, Path] | None = None) -> None:
        self.settings = settings
        self.context = serving_context(settings, pair)

    def load(self, cert: Path, key: Path) -> None:
        self.context = serving_context(self.settings, (cert, key))
