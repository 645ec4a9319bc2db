"""The certificates a stock control plane and its nodes need, made as kubeadm makes them, with the
`cryptography` package (never shelled-out openssl).

Identities are what the authorizers read: a client cert's CN is the user and its O the groups, so a
kubelet's cert says `system:node:NAME` in `system:nodes` (what the Node authorizer and NodeRestriction
admit) and the admin's says `system:masters`. Keys are ECDSA P-256: as strong as kubeadm's RSA-2048
default for a test cluster and made without RSA's search for primes, which matters when every test
run makes a fresh PKI.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pynode_cluster.components import APISERVER_NAMES, METRICS_SERVER_NAMES, SERVICE_IP
from pynode_os.files import atomic_write


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Whole or not at all: a key half written by a killed run would be kept by the lab's next one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, mode=mode)
    return path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Cert:
    """What a certificate says (CA.issue's arguments), to compare with one on disk."""
    name: str
    common_name: str
    groups: tuple[str, ...] = ()
    client: bool = True
    server: bool = False
    hosts: tuple[str, ...] = ()


def _identity(cert: x509.Certificate) -> tuple:
    """The parts of `cert` an authenticator or a TLS client reads: CN, groups, usages, SANs."""
    subject = cert.subject
    cn = [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    groups = sorted(str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    try:
        usages = sorted(u.dotted_string for u in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = sorted([str(ip) for ip in san.get_values_for_type(x509.IPAddress)] +
                       san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        hosts = []
    return cn, groups, usages, hosts


def _identity_of(cert: Cert) -> tuple:
    usages = sorted(([ExtendedKeyUsageOID.CLIENT_AUTH.dotted_string] if cert.client else []) +
                    ([ExtendedKeyUsageOID.SERVER_AUTH.dotted_string] if cert.server else []))
    hosts = sorted(str(ipaddress.ip_address(h)) if _is_ip(h) else h for h in cert.hosts)
    return [cert.common_name], sorted(cert.groups), usages, hosts


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CA:
    """A self-signed CA in `dir` (ca.crt, ca.key) that signs the serving and client certificates."""

    def __init__(self, dir: Path, name: str = "kubernetes") -> None:
        """A new CA, written to `dir` (replacing any there)."""
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

    @classmethod
    def load(cls, dir: Path) -> CA:
        """The CA already in `dir` (ca.crt, ca.key): a lab keeps one CA for its life, so the certs the VMs
        hold stay valid when it is provisioned again."""
        ca = cls.__new__(cls)
        ca.dir = dir
        ca.pair = KeyPair(dir / "ca.crt", dir / "ca.key")
        ca.cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
        key = serialization.load_pem_private_key(ca.pair.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca.pair.key}: not an EC private key")
        ca.key = key
        return ca

    def ensure(self, cert: Cert) -> bool:
        """`cert` issued unless DIR/NAME.crt already is: signed by this CA, for the same user, groups, usages
        and hosts, and valid for 30 more days. Whether it was (re-)issued."""
        try:
            have = x509.load_pem_x509_certificate((self.dir / f"{cert.name}.crt").read_bytes())
            have_key = (self.dir / f"{cert.name}.key").exists()
        except (OSError, ValueError):
            return self._issue(cert)
        if have_key and have.issuer == self.cert.subject and _identity(have) == _identity_of(cert) and \
                have.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30):
            try:
                have.verify_directly_issued_by(self.cert)
                return False
            except (ValueError, TypeError, InvalidSignature):
                pass
        return self._issue(cert)

    def _issue(self, cert: Cert) -> bool:
        self.issue(cert.name, cert.common_name, groups=cert.groups, client=cert.client, server=cert.server,
                   hosts=cert.hosts)
        return True

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


def apiserver_certs(address: str, service_ip: str = SERVICE_IP) -> tuple[Cert, ...]:
    """What kube-apiserver reads in its pki dir besides the CA (components.apiserver_argv's names): its serving
    cert for `address` and the `kubernetes` Service, its client cert for the kubelets (kubeadm's group,
    which kubeadm binds to cluster-admin)."""
    return (Cert("apiserver", "kube-apiserver", client=False, server=True,
                 hosts=(address, service_ip, *APISERVER_NAMES)),
            Cert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", groups=("kubeadm:cluster-admins",)))


def front_proxy(dir: Path) -> CA:
    """kubeadm's front-proxy CA in `dir` and the client cert it issues the aggregator (front-proxy-client,
    components.apiserver_argv's names): an extension API server trusts the user the aggregator names in its
    headers only from this client, so a client cert of the cluster CA cannot pass as it."""
    ca = CA(dir, "front-proxy-ca")
    ca.ensure(Cert("front-proxy-client", "front-proxy-client"))
    return ca


def metrics_server_serving(address: str) -> Cert:
    """metrics-server's serving cert for its address and the name the aggregator verifies it by (the
    Service's), so that its APIService carries the cluster CA as caBundle instead of skipping verification."""
    return Cert("metrics-server-serving", "metrics-server", client=False, server=True,
                hosts=(address, *METRICS_SERVER_NAMES))


def kubelet_serving(node: str, address: str) -> Cert:
    """A kubelet's :10250 serving cert, named as Node.kubelet_config reads it."""
    return Cert(f"kubelet-{node}-serving", f"system:node:{node}", groups=("system:nodes",), client=False,
                server=True, hosts=(address, node))


def service_account_keys(dir: Path) -> KeyPair:
    """sa.pub and sa.key: the key pair kube-apiserver signs service-account tokens with (the controller
    manager signs with the same key). Returned as cert=public key, key=private key."""
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(_write(dir / "sa.pub", pub, 0o644), _write(dir / "sa.key", _key_pem(key), 0o600))


def kubeconfig_text(*, server: str, ca: Path, client: KeyPair, user: str) -> bytes:
    """A kubeconfig for one user of one cluster. JSON is YAML, so every client reads it."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "default",
        "clusters": [{"name": "default", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": user}}],
    }
    return json.dumps(config, indent=2).encode()


def kubeconfig(path: Path, *, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    return _write(path, kubeconfig_text(server=server, ca=ca, client=client, user=user), 0o600)


def control_plane(pki: Path, address: str) -> CA:
    """A fresh CA in `pki`, the apiserver's certs (apiserver_certs) and the service-account key pair."""
    ca = CA(pki)
    for cert in apiserver_certs(address):
        ca.ensure(cert)
    service_account_keys(pki)
    return ca


# The kubeconfigs of a control plane, by file stem: the user and its groups, as kubeadm names them
CONTROL_PLANE_USERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "super-admin": ("kubernetes-super-admin", ("system:masters",)),
    "admin": ("kubernetes-admin", ("kubeadm:cluster-admins",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    "kube-proxy": ("system:kube-proxy", ()),
}


def kubelet_client(node: str) -> Cert:
    """The client cert of a kubelet's kubeconfig: the Node authorizer's `system:node:NAME`."""
    return Cert(f"kubelet-{node}", f"system:node:{node}", groups=("system:nodes",))


def user_kubeconfig(ca: CA, path: Path, server: str, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig at `path` for `user` in `groups`, its key pair in the CA's directory named after the file
    (so each user's kubeconfig needs a file name of its own)."""
    pair = ca.issue(path.stem, user, groups=groups)
    return kubeconfig(path, server=server, ca=ca.pair.cert, client=pair, user=user)
