"""What the kubelet asks its certificates for and when it asks again, with no I/O: the CSR's subject,
SANs and usages, its name, the rotation deadline, and whether a certificate still satisfies the request.
"""
from __future__ import annotations

import base64
import datetime
import ipaddress
import random
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
# the kubelet's usages for its ECDSA keys: key encipherment goes with RSA keys only, as the stock kubelet asks
CLIENT_USAGES = ("digital signature", "client auth")
SERVING_USAGES = ("digital signature", "server auth")
NODES_GROUP = "system:nodes"


@dataclass(frozen=True)
class Template:
    """The subject and SANs a certificate is asked for."""
    common_name: str
    organization: tuple[str, ...] = (NODES_GROUP,)
    dns_names: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    usages: tuple[str, ...] = field(default=CLIENT_USAGES)


def client_template(node: str) -> Template:
    return Template(f"system:node:{node}")


def serving_template(node: str, addresses: list[dict[str, str]]) -> Template | None:
    """From the Node's addresses, as the kubelet's newGetTemplateFn: a Hostname or a *DNS address is a DNS
    SAN (a Hostname that parses as an IP is an IP SAN), an InternalIP/ExternalIP an IP SAN; None without any
    IP address (the signer's approvers require one, so the kubelet does not ask)."""
    dns: set[str] = set()
    ips: set[str] = set()
    for a in addresses:
        kind, value = a.get("type", ""), a.get("address", "")
        if not value:
            continue
        ip = _ip(value)
        if kind in ("Hostname", "InternalIP", "ExternalIP") and ip is not None:
            ips.add(ip)
        elif kind in ("Hostname", "InternalDNS", "ExternalDNS"):
            dns.add(value)
    if not ips:
        return None
    return Template(f"system:node:{node}", dns_names=tuple(sorted(dns)), ips=tuple(sorted(ips)),
                    usages=SERVING_USAGES)


def _ip(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """SEC 1 ("EC PRIVATE KEY"), the block the kubelet writes after the certificates."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def make_csr(key: ec.EllipticCurvePrivateKey, template: Template) -> bytes:
    """The PKCS#10 request in PEM, signed by `key` (which proves the requester holds it)."""
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in template.organization]
                        + [x509.NameAttribute(NameOID.COMMON_NAME, template.common_name)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in template.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in template.ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def bootstrap_csr_name(public_key: ec.EllipticCurvePublicKey, template: Template) -> str:
    """node-csr-<digest of the key, subject and usages>, as the kubelet's digestedName: a kubelet restarted
    while it waits asks again under the same name with the same key, and finds its request instead of
    leaving a second one behind."""
    digest = hashes.Hash(hashes.SHA512_256())
    for part in [public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo),
                 template.common_name.encode(), *(o.encode() for o in template.organization),
                 *(u.encode() for u in template.usages)]:
        digest.update(_b64(part).encode() + b"|")
    return f"node-csr-{_b64(digest.finalize())}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def rotation_fraction(rng: random.Random | None = None) -> float:
    """A point in [0.7, 0.9) of a certificate's life, drawn per certificate: nodes that joined together
    do not all renew at once for the rest of the cluster's life."""
    return 0.7 + 0.2 * (rng or random).random()


def rotation_deadline(cert: x509.Certificate, fraction: float) -> datetime.datetime:
    """When to ask for the next certificate: `fraction` of the way from notBefore to notAfter."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * fraction


def unsatisfied(cert: x509.Certificate, template: Template, now: datetime.datetime) -> str | None:
    """Why `cert` no longer serves `template` (expired, another name, a requested SAN or organization
    missing), or None when it does, as the kubelet's certSatisfiesTemplate plus the expiry check."""
    if now >= cert.not_valid_after_utc:
        return f"expired at {cert.not_valid_after_utc.isoformat()}"
    if now < cert.not_valid_before_utc:
        return f"not valid before {cert.not_valid_before_utc.isoformat()}"
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns != [template.common_name]:
        return f"common name {cns[0] if cns else ''!r}, not {template.common_name!r}"
    orgs = {a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = set(san.get_values_for_type(x509.DNSName))
        ips = {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    except x509.ExtensionNotFound:
        dns, ips = set(), set()
    for what, missing in (("organization", set(template.organization) - orgs),
                          ("DNS name", set(template.dns_names) - dns), ("IP address", set(template.ips) - ips)):
        if missing:
            return f"{what} {', '.join(sorted(missing))} missing"
    return None


def kubeconfig(server: str, ca_file: str | None, ca_data: str | None, insecure: bool, pem: str) -> dict:
    """The kubeconfig the kubelet writes after its bootstrap: the bootstrap kubeconfig's cluster, and the
    current pem (certificate and key in one file) as its credential, in the kubelet's own names."""
    cluster: dict = {"server": server}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    elif ca_data:
        cluster["certificate-authority-data"] = ca_data
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "default-cluster", "cluster": cluster}],
            "users": [{"name": "default-auth", "user": {"client-certificate": pem, "client-key": pem}}],
            "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster",
                                                                 "user": "default-auth", "namespace": "default"}}],
            "current-context": "default-context"}
