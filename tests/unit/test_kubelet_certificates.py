"""pykubelet's TLS bootstrap and rotation, the pure part and the files: what a CSR asks for, its name, the
rotation deadline in 70-90% of a certificate's life, whether a certificate still serves, the pem files'
modes and the atomic swap of the current symlink, and a rotation against a fake certificates API that signs
with a test CA. The API server and the controller manager's signer: tests/e2e/test_kubelet_tls_bootstrap.py."""
from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import random
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykubelet import config
from pykubelet.certificates import csr, manager, policy
from pykubelet.certificates.store import FileStore, PemError, StoreError
from pykubelet.errors import DeadlineExceededError, FailedPreconditionError

NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
NODE = "node-a"


class CA:
    """A test signer, as the controller manager's csrsigning controller: the CSR's subject and SANs, its key."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])

    def sign(self, csr_pem: bytes, *, start: datetime.datetime = NOW, days: float = 1.0, server: bool = False) -> bytes:
        req = x509.load_pem_x509_csr(csr_pem)
        builder = (x509.CertificateBuilder().subject_name(req.subject).issuer_name(self.name)
                   .public_key(req.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        try:
            builder = builder.add_extension(req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value,
                                            critical=False)
        except x509.ExtensionNotFound:
            pass
        return builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def cert_pem(self) -> bytes:
        return (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                .public_key(self.key.public_key()).serial_number(1)
                .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=365))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    def pair(self, template: policy.Template, **kw) -> tuple[bytes, bytes, ec.EllipticCurvePrivateKey]:
        key = policy.new_key()
        return self.sign(policy.make_csr(key, template), **kw), policy.key_pem(key), key


@pytest.fixture
def ca() -> CA:
    return CA()


# --- what a CSR asks for ---------------------------------------------------------------------------------

def test_client_csr_is_the_kubelets():
    key = policy.new_key()
    template = policy.client_template(NODE)
    req = x509.load_pem_x509_csr(policy.make_csr(key, template))
    assert req.is_signature_valid
    assert [a.value for a in req.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["system:node:node-a"]
    assert [a.value for a in req.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:nodes"]
    with pytest.raises(x509.ExtensionNotFound):  # the client signer refuses any SAN
        req.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    public = req.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    assert template.usages == ("digital signature", "client auth")
    assert policy.CLIENT_SIGNER == "kubernetes.io/kube-apiserver-client-kubelet"


def test_serving_csr_names_the_nodes_addresses():
    template = policy.serving_template(NODE, [{"type": "InternalIP", "address": "10.0.0.5"},
                                              {"type": "Hostname", "address": NODE},
                                              {"type": "InternalDNS", "address": "node-a.internal"},
                                              {"type": "Hostname", "address": "192.168.1.9"}])
    assert template is not None
    assert template.usages == ("digital signature", "server auth")
    req = x509.load_pem_x509_csr(policy.make_csr(policy.new_key(), template))
    san = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(san.get_values_for_type(x509.DNSName)) == ["node-a", "node-a.internal"]
    assert sorted(map(str, san.get_values_for_type(x509.IPAddress))) == ["10.0.0.5", "192.168.1.9"]
    # no IP address, no request: the kubelet does not ask what a signer's approver would refuse
    assert policy.serving_template(NODE, [{"type": "Hostname", "address": NODE}]) is None


def test_bootstrap_csr_name_is_the_kubelets_digest():
    key = policy.new_key()
    template = policy.client_template(NODE)
    name = policy.bootstrap_csr_name(key.public_key(), template)
    # sha512/256 over base64url(pkix key)|cn|org|usages|, base64url without padding, as digestedName
    digest = hashes.Hash(hashes.SHA512_256())
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    for part in (der, b"system:node:node-a", b"system:nodes", b"digital signature", b"client auth"):
        digest.update(base64.urlsafe_b64encode(part).rstrip(b"=") + b"|")
    assert name == "node-csr-" + base64.urlsafe_b64encode(digest.finalize()).rstrip(b"=").decode()
    assert name == policy.bootstrap_csr_name(key.public_key(), template)  # a restart finds its request
    assert name != policy.bootstrap_csr_name(policy.new_key().public_key(), template)


# --- when to rotate --------------------------------------------------------------------------------------

def test_rotation_falls_in_70_to_90_percent_of_the_life(ca):
    cert = x509.load_pem_x509_certificate(ca.pair(policy.client_template(NODE), days=10)[0])
    rng = random.Random(7)
    fractions = [policy.rotation_fraction(rng) for _ in range(2000)]
    assert 0.7 <= min(fractions) < 0.72 and 0.88 < max(fractions) < 0.9
    for f in (0.7, 0.8, 0.9):
        assert policy.rotation_deadline(cert, f) == NOW + datetime.timedelta(days=10 * f)


def test_manager_keeps_its_deadline_per_certificate_and_rotates_at_once_without_one(tmp_path, ca):
    store = FileStore("kubelet-client", tmp_path)
    cert, key, _ = ca.pair(policy.client_template(NODE), days=10)
    pair = store.update(cert, key, now=NOW)
    m = manager.CertificateManager(None, store, policy.CLIENT_SIGNER, lambda: policy.client_template(NODE),
                                   lambda p: None, rng=random.Random(1), now=lambda: NOW)
    first = m.deadline()
    assert NOW + datetime.timedelta(days=7) <= first < NOW + datetime.timedelta(days=9)
    assert m.deadline() == first  # drawn once per certificate, not per look
    m.template = lambda: policy.client_template("node-b")
    assert m.deadline() == NOW  # another name: the certificate no longer serves
    m.current, m.template = None, lambda: policy.client_template(NODE)
    assert m.deadline() == NOW
    assert pair.path.exists()


def test_unsatisfied_names_why(ca):
    serving = policy.serving_template(NODE, [{"type": "InternalIP", "address": "10.0.0.5"},
                                             {"type": "Hostname", "address": NODE}])
    assert serving is not None
    cert = x509.load_pem_x509_certificate(ca.pair(serving, server=True)[0])
    assert policy.unsatisfied(cert, serving, NOW + datetime.timedelta(hours=1)) is None
    assert "expired" in (policy.unsatisfied(cert, serving, NOW + datetime.timedelta(days=2)) or "")
    moved = policy.serving_template(NODE, [{"type": "InternalIP", "address": "10.0.0.6"}])
    assert moved is not None
    assert policy.unsatisfied(cert, moved, NOW) == "IP address 10.0.0.6 missing"
    assert "common name" in (policy.unsatisfied(cert, policy.client_template("node-b"), NOW) or "")


# --- the files -------------------------------------------------------------------------------------------

def test_store_writes_0600_and_swaps_the_symlink(tmp_path, ca):
    cert_dir = tmp_path / "pki"
    store = FileStore("kubelet-client", cert_dir)
    old_umask = os.umask(0)  # the modes are the store's own, whatever the umask
    try:
        cert, key, _ = ca.pair(policy.client_template(NODE))
        first = store.update(cert, key, now=NOW)
        cert2, key2, key_obj2 = ca.pair(policy.client_template(NODE))
        second = store.update(cert2, key2, now=NOW + datetime.timedelta(seconds=1))
    finally:
        os.umask(old_umask)
    assert first.path.name == "kubelet-client-2026-12-06-12-00-00.pem"
    assert second.path.name == "kubelet-client-2026-12-06-12-00-01.pem"
    assert stat.S_IMODE(cert_dir.stat().st_mode) == 0o700
    for p in (first.path, second.path):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    current = store.current_path
    assert current.is_symlink() and os.readlink(current) == second.path.name  # relative: the dir may move
    assert sorted(p.name for p in cert_dir.iterdir()) == ["kubelet-client-2026-12-06-12-00-00.pem",
                                                          "kubelet-client-2026-12-06-12-00-01.pem",
                                                          "kubelet-client-current.pem"]  # no temporary left
    got = store.current()
    assert got is not None and got.leaf == x509.load_pem_x509_certificate(cert2)
    data = current.read_bytes()
    assert data.index(b"CERTIFICATE") < data.index(b"PRIVATE KEY")  # the chain, then the key
    assert isinstance(got.key, ec.EllipticCurvePrivateKey)
    assert got.key.private_numbers() == key_obj2.private_numbers()


def test_store_refuses_what_it_must_not_write(tmp_path, ca):
    store = FileStore("kubelet-client", tmp_path)
    cert, _, _ = ca.pair(policy.client_template(NODE))
    with pytest.raises(PemError, match="not the certificate's"):
        store.update(cert, policy.key_pem(policy.new_key()))
    assert list(tmp_path.iterdir()) == []
    store.current_path.write_text("an admin's file")
    cert, key, _ = ca.pair(policy.client_template(NODE))
    with pytest.raises(StoreError, match="regular file"):
        store.update(cert, key)
    assert store.current() is None  # unreadable: asked for again


def kubeconfig(path: Path, cert: bytes | None, key: bytes | None) -> Path:
    user = {"client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key or b"").decode()} if cert else {"token": "abcdef.0123456789abcdef"}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_client_config_problem(tmp_path, ca):
    assert manager.client_config_problem(tmp_path / "none") == "missing"
    cert, key, _ = ca.pair(policy.client_template(NODE))
    path = kubeconfig(tmp_path / "kubeconfig", cert, key)
    assert manager.client_config_problem(path, NOW + datetime.timedelta(hours=1)) is None
    assert "expired" in (manager.client_config_problem(path, NOW + datetime.timedelta(days=2)) or "")
    assert manager.client_config_problem(kubeconfig(tmp_path / "k2", None, None)) == "no client certificate"
    (tmp_path / "k3").write_text("{not yaml")
    assert (manager.client_config_problem(tmp_path / "k3") or "").startswith("unreadable")


def test_kubeconfig_written_after_bootstrap_names_the_current_pem():
    doc = policy.kubeconfig("https://10.0.0.1:6443", "/etc/kubernetes/pki/ca.crt", None, False,
                            "/var/lib/kubelet/pki/kubelet-client-current.pem")
    user = doc["users"][0]["user"]
    assert user == {"client-certificate": "/var/lib/kubelet/pki/kubelet-client-current.pem",
                    "client-key": "/var/lib/kubelet/pki/kubelet-client-current.pem"}
    assert doc["clusters"][0]["cluster"] == {"server": "https://10.0.0.1:6443",
                                             "certificate-authority": "/etc/kubernetes/pki/ca.crt"}
    assert doc["current-context"] == "default-context"


# --- a rotation against a fake certificates API -----------------------------------------------------------

class FakeCSRs:
    """client.create/get of CertificateSigningRequests: approves and signs with `ca` after `polls` reads,
    or denies."""

    def __init__(self, ca: CA, polls: int = 1, deny: bool = False, approve: bool = True) -> None:
        self.ca, self.polls, self.deny, self.approve = ca, polls, deny, approve
        self.created: list = []

    def create(self, obj):
        obj.metadata.name = obj.metadata.name or f"csr-{len(self.created)}"
        self.created.append(obj)
        return obj

    def get(self, _kind, name):
        obj = next(o for o in self.created if o.metadata.name == name)
        self.polls -= 1
        conditions = []
        certificate = None
        if self.polls <= 0 and self.deny:
            conditions = [SimpleNamespace(type="Denied", status="True", reason="AutoDenied", message="no")]
        elif self.polls <= 0 and self.approve:
            conditions = [SimpleNamespace(type="Approved", status="True")]
            start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
            certificate = base64.b64encode(self.ca.sign(base64.b64decode(obj.spec.request), start=start)).decode()
        return SimpleNamespace(spec=obj.spec, status=SimpleNamespace(conditions=conditions, certificate=certificate))


def test_rotation_posts_a_csr_stores_the_pair_and_hands_it_over(tmp_path, ca, monkeypatch):
    monkeypatch.setattr(csr, "POLL", 0.0)
    api = FakeCSRs(ca, polls=2)
    handed: list = []
    store = FileStore("kubelet-client", tmp_path)
    m = manager.CertificateManager(api, store, policy.CLIENT_SIGNER, lambda: policy.client_template(NODE),
                                   handed.append)
    assert m.rotate(threading.Event())
    (posted,) = api.created
    assert posted.metadata.generateName == "csr-" and posted.spec.signerName == policy.CLIENT_SIGNER
    assert posted.spec.usages == ["digital signature", "client auth"]
    assert handed == [m.current] and m.current is not None and store.current_path.resolve() == m.current.path
    assert m.current.leaf.subject.rfc4514_string() == "CN=system:node:node-a,O=system:nodes"


def test_a_denied_or_unapproved_csr_is_named(ca, monkeypatch):
    monkeypatch.setattr(csr, "POLL", 0.0)
    pem = policy.make_csr(policy.new_key(), policy.client_template(NODE))
    api = FakeCSRs(ca, deny=True)
    name = csr.request(api, pem, policy.CLIENT_SIGNER, policy.CLIENT_USAGES, name="node-csr-x")
    with pytest.raises(FailedPreconditionError, match="CSR node-csr-x denied: AutoDenied"):
        csr.wait(api, name, 5, threading.Event())
    api = FakeCSRs(ca, approve=False)
    name = csr.request(api, pem, policy.CLIENT_SIGNER, policy.CLIENT_USAGES, name="node-csr-y")
    with pytest.raises(DeadlineExceededError, match="kubectl certificate approve node-csr-y"):
        csr.wait(api, name, 0, threading.Event())


def test_settings_of_the_bootstrap(tmp_path):
    boot = tmp_path / "bootstrap-kubelet.conf"
    boot.write_text("{}")
    flags = {**dict.fromkeys(config.FLAGS), "hostname_override": NODE}
    doc = tmp_path / "kubelet.yaml"
    doc.write_text(json.dumps({"apiVersion": config.API_VERSION, "kind": config.KIND,
                               "rotateCertificates": True, "serverTLSBootstrap": True}))
    s = config.build({**flags, "kubeconfig": str(tmp_path / "kubelet.conf"), "bootstrap_kubeconfig": str(boot),
                      "cert_dir": str(tmp_path / "pki")}, doc)
    # --kubeconfig need not exist yet: the bootstrap writes it
    assert (s.rotate_certificates, s.server_tls_bootstrap, s.cert_dir) == (True, True, tmp_path / "pki")
    assert config.build(flags).cert_dir == Path("/var/lib/kubelet/pki")
    with pytest.raises(config.ConfigError, match="--bootstrap-kubeconfig needs --kubeconfig"):
        config.build({**flags, "bootstrap_kubeconfig": str(boot)})
    # a node `kubeadm init` made, or one `kubeadm join` deleted the file of: read only if --kubeconfig won't do
    gone = config.build({**flags, "kubeconfig": str(boot), "bootstrap_kubeconfig": str(tmp_path / "none")})
    assert gone.bootstrap_kubeconfig == tmp_path / "none"
    doc.write_text(json.dumps({"apiVersion": config.API_VERSION, "kind": config.KIND, "rotateCertificates": "yes"}))
    with pytest.raises(config.ConfigError, match="rotateCertificates: expected true or false"):
        config.build(flags, doc)


def test_ip_sans_are_canonical():
    template = policy.serving_template(NODE, [{"type": "InternalIP", "address": "fd00:0::1"}])
    assert template is not None and template.ips == (str(ipaddress.ip_address("fd00::1")),)


def test_the_api_transport_uses_the_new_certificate_after_a_reload(tmp_path, ca):
    """New connections present the rotated certificate; the old connections are closed, not left to expire."""
    import http.server
    import ssl

    import httpx2

    from pykubelet.api.client import ReloadingTransport

    server_template = policy.Template("127.0.0.1", organization=(), ips=("127.0.0.1",), usages=policy.SERVING_USAGES)
    cert, key, _ = ca.pair(server_template, server=True, start=datetime.datetime.now(datetime.UTC))
    (tmp_path / "server.pem").write_bytes(cert + key)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem())
    seen: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            seen.append(x509.load_der_x509_certificate(self.connection.getpeercert(binary_form=True)).serial_number)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.pem")
    ctx.load_verify_locations(tmp_path / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
        store = FileStore("kubelet-client", tmp_path / "pki")
        first = store.update(*ca.pair(policy.client_template(NODE), start=start)[:2])
        (tmp_path / "kubeconfig").write_text(json.dumps(policy.kubeconfig(
            f"https://127.0.0.1:{server.server_address[1]}", str(tmp_path / "ca.crt"), None, False,
            str(store.current_path))))
        transport = ReloadingTransport(tmp_path / "kubeconfig")
        with httpx2.Client(transport=transport, base_url=f"https://127.0.0.1:{server.server_address[1]}") as c:
            assert c.get("/").status_code == 200
            second = store.update(*ca.pair(policy.client_template(NODE), start=start)[:2])
            assert c.get("/").status_code == 200  # the kept-alive connection: still the old certificate
            transport.reload()
            assert c.get("/").status_code == 200
        assert seen == [first.leaf.serial_number, first.leaf.serial_number, second.leaf.serial_number]
    finally:
        server.shutdown()
        server.server_close()


def test_bootstrap_writes_the_pair_and_a_kubeconfig_naming_it(tmp_path, ca, monkeypatch):
    from pykubelet.api import client as api_client

    monkeypatch.setattr(csr, "POLL", 0.0)
    api = FakeCSRs(ca, polls=2)
    api.close = lambda: None  # type: ignore[attr-defined]  # the bootstrap closes its client
    monkeypatch.setattr(api_client, "make_client", lambda _path: api)
    boot = tmp_path / "bootstrap-kubelet.conf"
    boot.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {"token": "abcdef.0123456789abcdef"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    kubeconfig_path, cert_dir = tmp_path / "kubelet.conf", tmp_path / "pki"
    assert manager.bootstrap_client(kubeconfig_path, boot, cert_dir, NODE, threading.Event())
    (posted,) = api.created
    assert posted.metadata.name.startswith("node-csr-") and posted.spec.signerName == policy.CLIENT_SIGNER
    assert not (cert_dir / manager.TMP_KEY).exists()  # the pending request's key, gone once it is in the pem
    assert stat.S_IMODE(kubeconfig_path.stat().st_mode) == 0o600
    doc = json.loads(kubeconfig_path.read_text())
    assert doc["users"][0]["user"]["client-certificate"] == str(cert_dir / "kubelet-client-current.pem")
    assert doc["clusters"][0]["cluster"] == {"server": "https://10.0.0.1:6443",
                                             "certificate-authority": str(tmp_path / "ca.crt")}
    assert manager.client_config_problem(kubeconfig_path) is None
    assert manager.bootstrap_client(kubeconfig_path, boot, cert_dir, NODE, threading.Event())
    assert len(api.created) == 1  # valid: no second request


def test_a_missing_bootstrap_file_matters_only_without_a_valid_kubeconfig(tmp_path, ca):
    cert, key, _ = ca.pair(policy.client_template(NODE), start=datetime.datetime.now(datetime.UTC))
    valid = kubeconfig(tmp_path / "kubelet.conf", cert, key)
    assert manager.bootstrap_client(valid, tmp_path / "none", tmp_path / "pki", NODE, threading.Event())
    with pytest.raises(manager.BootstrapError, match=r"--kubeconfig .*/other.conf: missing; "
                       r"--bootstrap-kubeconfig .*/none, which would ask for a new credential, does not exist"):
        manager.bootstrap_client(tmp_path / "other.conf", tmp_path / "none", tmp_path / "pki", NODE,
                                 threading.Event())
    assert not (tmp_path / "pki").exists()


def test_bootstrap_never_reuses_an_expired_pairs_key(tmp_path, ca, monkeypatch):
    """Its CSR name would find the request that issued the expired certificate, and get that one again."""
    from pykubelet.api import client as api_client

    monkeypatch.setattr(csr, "POLL", 0.0)
    api = FakeCSRs(ca)
    api.close = lambda: None  # type: ignore[attr-defined]  # the bootstrap closes its client
    monkeypatch.setattr(api_client, "make_client", lambda _path: api)
    cert_dir = tmp_path / "pki"
    old_cert, old_key, old = ca.pair(policy.client_template(NODE), start=NOW - datetime.timedelta(days=30))
    FileStore("kubelet-client", cert_dir).update(old_cert, old_key)
    boot = kubeconfig(tmp_path / "bootstrap.conf", None, None)
    assert manager.bootstrap_client(tmp_path / "kubelet.conf", boot, cert_dir, NODE, threading.Event())
    (posted,) = api.created
    assert posted.metadata.name != policy.bootstrap_csr_name(old.public_key(), policy.client_template(NODE))
    assert manager.client_config_problem(tmp_path / "kubelet.conf") is None
