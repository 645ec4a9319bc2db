"""pykubelet's TLS bootstrap and certificate rotation against the stock control plane, as kubeadm sets it
up: kube-apiserver with --enable-bootstrap-token-auth, a bootstrap token Secret in kube-system, kubeadm's
RBAC bindings for the token's group (system:node-bootstrapper, the nodeclient auto-approval) and for
system:nodes (selfnodeclient, the auto-approval of a renewal), and the stock kube-controller-manager's
csrapproving and csrsigning controllers signing with the cluster CA for a short --cluster-signing-duration,
so rotations come within minutes.

The node starts with only a bootstrap kubeconfig: no --kubeconfig file, no certificate. It must join (its
CSR auto-approved and signed), rotate its client certificate with no restart and keep working after the
first certificate expired (its lease, its node status and a new pod's watch go out with the new one), and,
with serverTLSBootstrap, serve :10250 with a certificate the cluster CA signed once the kubelet-serving
CSR is approved by hand (the stock controller manager never approves those), and serve the next one after
its rotation.
"""
from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pynode_cluster import pki as pki_
from pynode_cluster.components import apiserver_argv, controller_manager_argv
from tests.kit.controlplane import ControlPlane, free_port
from tests.kit.kubelet_node import BUSYBOX, Kubelet, apply, delete, get_pod, pod_spec, wait_for, wait_pod

# Certificates are the kubelet's and the API server's business, not the CRI runtime's: one runtime is enough,
# and each run waits out a certificate's whole life
pytestmark = pytest.mark.parametrize("cri", ["pyruntime-cri"], indirect=True, scope="module")

NODE = "tlsboot-node"
NODE_IP = "127.0.0.1"
SIGNING_DURATION = "3m"  # the signer backdates 5 min: an 8 min life, rotated 0.6 to 2.2 min after it is issued
TOKEN_ID, TOKEN_SECRET = "pyboot", "0123456789abcdef"
BOOTSTRAPPERS = "system:bootstrappers:kubeadm:default-node-token"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"


def _binding(name: str, role: str, group: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}


# kubeadm's bootstrap-token objects (kubeadm init phase bootstrap-token), with its names
BOOTSTRAP_OBJECTS = [
    {"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
     "metadata": {"name": f"bootstrap-token-{TOKEN_ID}", "namespace": "kube-system"},
     "stringData": {"token-id": TOKEN_ID, "token-secret": TOKEN_SECRET, "usage-bootstrap-authentication": "true",
                    "usage-bootstrap-signing": "true", "auth-extra-groups": BOOTSTRAPPERS}},
    _binding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", BOOTSTRAPPERS),
    _binding("kubeadm:node-autoapprove-bootstrap",
             "system:certificates.k8s.io:certificatesigningrequests:nodeclient", BOOTSTRAPPERS),
    _binding("kubeadm:node-autoapprove-certificate-rotation",
             "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"),
]


class BootstrapControlPlane(ControlPlane):
    """The kit's control plane with bootstrap tokens authenticated and a stock kube-controller-manager that
    approves and signs CSRs with the cluster CA."""

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", apiserver_argv(
            etcd=f"http://127.0.0.1:{self.etcd_port}", address=self.address, port=self.port, pki=self.dir / "pki",
            endpoint_reconciler=False) + ["--enable-bootstrap-token-auth"])

    def start_controller_manager(self) -> None:
        assert self.ca is not None
        kubeconfig = pki_.user_kubeconfig(self.ca, self.dir / "controller-manager.kubeconfig", self.server,
                                          "system:kube-controller-manager")
        # no pod CIDRs: the e2e runtimes' pod network is the kit's one bridge and subnet
        self._spawn("kube-controller-manager", controller_manager_argv(
            kubeconfig=kubeconfig, pki=self.dir / "pki", allocate_node_cidrs=False)
            + ["--cluster-signing-duration", SIGNING_DURATION, "--secure-port", str(free_port())])

    def stop(self) -> None:
        self._stop("kube-controller-manager")
        super().stop()


@pytest.fixture(scope="module")
def control_plane(cri, tmp_path_factory):
    cp = BootstrapControlPlane(tmp_path_factory.mktemp("controlplane"))
    cp.start()
    try:
        cp.start_controller_manager()
        manifest = cp.dir / "bootstrap-token.json"
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": BOOTSTRAP_OBJECTS}))
        cp.kubectl("apply", "-f", str(manifest))
        # the controller manager's serviceaccount controller makes it; pods are refused until it is there
        wait_for("the default ServiceAccount", lambda: cp.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0, timeout=90,
            failed=lambda: "kube-controller-manager exited:\n" + cp.log("kube-controller-manager")
            if cp.procs["kube-controller-manager"].poll() is not None else None)
    except BaseException:
        cp.stop()
        raise
    yield cp
    cp.stop()


@dataclass
class Node:
    kubelet: Kubelet
    kubeconfig: Path
    cert_dir: Path
    port: int


def bootstrap_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    """What kubeadm join writes to /etc/kubernetes/bootstrap-kubelet.conf: the cluster and the token."""
    assert cp.ca is not None
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "tls-bootstrap-token-user@kubernetes",
        "clusters": [{"name": "kubernetes", "cluster": {"server": cp.server,
                                                        "certificate-authority": str(cp.ca.pair.cert)}}],
        "users": [{"name": "tls-bootstrap-token-user", "user": {"token": f"{TOKEN_ID}.{TOKEN_SECRET}"}}],
        "contexts": [{"name": "tls-bootstrap-token-user@kubernetes",
                      "context": {"cluster": "kubernetes", "user": "tls-bootstrap-token-user"}}]}))
    return path


@pytest.fixture(scope="module")
def node(control_plane, cri, tmp_path_factory):
    """pykubelet started with --bootstrap-kubeconfig only (its --kubeconfig does not exist yet), with
    rotateCertificates and serverTLSBootstrap, registered; at the end its pods go, then the kubelet."""
    cp = control_plane
    assert cp.ca is not None
    work = tmp_path_factory.mktemp("pykubelet")
    kubeconfig, cert_dir, port = work / "kubelet.conf", work / "pki", free_port()
    config = {"port": port, "rotateCertificates": True, "serverTLSBootstrap": True,
              "authentication": {"x509": {"clientCAFile": str(cp.ca.pair.cert)}, "anonymous": {"enabled": False},
                                 "webhook": {"enabled": True}},
              "authorization": {"mode": "Webhook"}}
    k = Kubelet.for_node(work, NODE, NODE_IP, cri.url, None, config, "--kubeconfig", str(kubeconfig),
                         "--bootstrap-kubeconfig", str(bootstrap_kubeconfig(cp, work / "bootstrap-kubelet.conf")),
                         "--cert-dir", str(cert_dir))
    k.start()
    try:
        wait_for("the node to register", lambda: not k.running() or cp.kubectl(
            "get", "node", NODE, check=False).returncode == 0, timeout=120)
        assert k.running(), k.log_tail()
        yield Node(k, kubeconfig, cert_dir, port)
    finally:
        cp.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
        k.stop()


@pytest.fixture(autouse=True)
def no_pod_left(control_plane, node, kubepods):
    yield
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)


# --- helpers -------------------------------------------------------------------------------------------

def csrs(cp: ControlPlane, signer: str, username: str) -> list[dict]:
    items = json.loads(cp.kubectl("get", "csr", "-o", "json").stdout)["items"]
    return sorted((c for c in items if c["spec"]["signerName"] == signer and c["spec"]["username"] == username),
                  key=lambda c: c["metadata"]["creationTimestamp"])


def condition_of(csr: dict, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in csr.get("status", {}).get("conditions", []))


def requested(csr: dict) -> x509.CertificateSigningRequest:
    return x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))


def issued_by_cluster_ca(cp: ControlPlane, cert: x509.Certificate) -> bool:
    assert cp.ca is not None
    try:
        cert.verify_directly_issued_by(cp.ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def current_client_cert(n: Node) -> x509.Certificate:
    return x509.load_pem_x509_certificate((n.cert_dir / "kubelet-client-current.pem").read_bytes())


def served_cert(port: int) -> x509.Certificate:
    return x509.load_pem_x509_certificate(ssl.get_server_certificate((NODE_IP, port), timeout=5).encode())


def node_ready(cp: ControlPlane) -> bool:
    status = json.loads(cp.kubectl("get", "node", NODE, "-o", "json").stdout)["status"]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def lease_renewed(cp: ControlPlane) -> datetime.datetime:
    lease = json.loads(cp.kubectl("get", "lease", NODE, "-n", "kube-node-lease", "-o", "json").stdout)
    return datetime.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))


def sleeper(name: str) -> dict:
    return pod_spec(NODE, name, {"name": name, "image": BUSYBOX, "command": ["sleep", "3600"]})


def running(cp: ControlPlane, tmp_path: Path, name: str) -> dict:
    apply(cp, tmp_path, sleeper(name))
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running", timeout=120)


def approve_next_serving_csr(cp: ControlPlane, after: set[str]) -> dict:
    """The node's next kubelet-serving CSR (none of `after`), approved as an admin does it."""
    pending = wait_for("a kubelet-serving CSR from the node", lambda: next(
        (c for c in csrs(cp, SERVING_SIGNER, f"system:node:{NODE}") if c["metadata"]["name"] not in after), None),
        timeout=240)
    cp.kubectl("certificate", "approve", pending["metadata"]["name"])
    return pending


# --- the tests -----------------------------------------------------------------------------------------

def test_a_node_joins_with_only_a_bootstrap_kubeconfig(control_plane, node, tmp_path):
    cp = control_plane
    (boot,) = csrs(cp, CLIENT_SIGNER, f"system:bootstrap:{TOKEN_ID}")
    assert boot["metadata"]["name"].startswith("node-csr-")
    assert condition_of(boot, "Approved") and boot["status"].get("certificate"), boot["status"]
    assert sorted(boot["spec"]["usages"]) == ["client auth", "digital signature"]
    req = requested(boot)
    assert req.subject.rfc4514_string() == f"CN=system:node:{NODE},O=system:nodes"
    assert isinstance(req.public_key(), ec.EllipticCurvePublicKey)

    # the files: a pem 0600 in a 0700 cert dir behind the current symlink, and the kubeconfig naming it
    pem = node.cert_dir / "kubelet-client-current.pem"
    assert pem.is_symlink() and stat.S_IMODE(os.stat(pem).st_mode) == 0o600
    assert stat.S_IMODE(node.cert_dir.stat().st_mode) == 0o700
    doc = yaml.safe_load(node.kubeconfig.read_text())
    user = doc["users"][0]["user"]
    assert user == {"client-certificate": str(pem), "client-key": str(pem)}
    assert "token" not in node.kubeconfig.read_text()  # the bootstrap token is not copied on
    leaf = current_client_cert(node)
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"system:node:{NODE}"
    assert issued_by_cluster_ca(cp, leaf)

    wait_for("the node to be Ready", lambda: node_ready(cp), timeout=60)
    running(cp, tmp_path, "joined")
    delete(cp, "joined")


def test_server_tls_bootstrap_serves_a_cluster_signed_certificate(control_plane, node, tmp_path):
    cp = control_plane
    first = approve_next_serving_csr(cp, set())
    assert sorted(first["spec"]["usages"]) == ["digital signature", "server auth"]
    san = requested(first).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [NODE_IP]
    assert san.get_values_for_type(x509.DNSName) == [NODE]

    # new handshakes get the signed certificate, with no restart
    served = wait_for("the kubelet to serve the cluster-signed certificate",
                      lambda: (lambda c: c if issued_by_cluster_ca(cp, c) else None)(served_cert(node.port)),
                      timeout=60)
    assert served.subject.rfc4514_string() == f"CN=system:node:{NODE},O=system:nodes"
    # the API server checks the kubelet's certificate against the cluster CA (--kubelet-certificate-authority):
    # kubectl logs passes through it now
    running(cp, tmp_path, "logged")
    assert cp.kubectl("logs", "logged").returncode == 0

    # the rotation: a new CSR within the first one's life, approved, then served
    second = approve_next_serving_csr(cp, {first["metadata"]["name"]})
    assert second["metadata"]["name"] != first["metadata"]["name"]
    wait_for("the kubelet to serve the rotated certificate",
             lambda: served_cert(node.port).serial_number != served.serial_number, timeout=60)
    assert issued_by_cluster_ca(cp, served_cert(node.port))
    assert cp.kubectl("logs", "logged").returncode == 0


def test_client_certificate_rotates_and_the_node_keeps_working(control_plane, node, tmp_path):
    cp = control_plane
    pid = node.kubelet.proc.pid if node.kubelet.proc is not None else None
    steady = running(cp, tmp_path, "steady")
    before = current_client_cert(node)

    # a renewal within the certificate's life, asked for with the node's own certificate and auto-approved
    # (selfnodeclient); the current symlink moves to it
    rotated = wait_for("the client certificate to rotate", lambda: (lambda c: c if c.serial_number
                       != before.serial_number else None)(current_client_cert(node)), timeout=240)
    assert issued_by_cluster_ca(cp, rotated)
    renewals = [c for c in csrs(cp, CLIENT_SIGNER, f"system:node:{NODE}") if condition_of(c, "Approved")]
    assert renewals, "no renewal CSR from the node itself"
    assert len(list(node.cert_dir.glob("kubelet-client-2*.pem"))) >= 2

    # past the old certificate's end: whatever still used it would be refused now
    expired = before.not_valid_after_utc
    time.sleep(max(0.0, (expired - datetime.datetime.now(datetime.UTC)).total_seconds()) + 5)
    wait_for("a lease renewal after the old certificate expired", lambda: lease_renewed(cp) > expired, timeout=60)
    assert node_ready(cp)
    # a pod made now reaches the kubelet through its pod watch, which reconnected with the new certificate
    running(cp, tmp_path, "after-rotation")
    pod = get_pod(cp, "steady")
    assert pod["metadata"]["uid"] == steady["metadata"]["uid"] and pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert node.kubelet.running() and node.kubelet.proc is not None and node.kubelet.proc.pid == pid, \
        node.kubelet.log_tail()
