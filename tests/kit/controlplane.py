"""A stock control plane for the kubelet and cluster tests: etcd and kube-apiserver (built from their Go
modules by scripts/peers/kubernetes.sh) with a real PKI, the Node and RBAC authorizers and the
NodeRestriction admission plugin, so a kubelet runs as `system:node:NAME` exactly as in a real cluster.

Each ControlPlane is a set of child processes of the test session in a directory of its own; stop()
ends them by pid (kube-apiserver may take more than 15 s to exit on SIGTERM once etcd is gone, so it is
killed after a grace period) and reaps them. Nothing listens beyond 127.0.0.1.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.kit.pki import CA, KeyPair, kubeconfig, service_account_keys

PEERS = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "kubernetes"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the apiserver's cert must name it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer(name: str) -> str:
    path = PEERS / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: run `make setup` (scripts/peers/kubernetes.sh builds it)")
    return str(path)


@dataclass
class ControlPlane:
    dir: Path
    address: str = "127.0.0.1"
    port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ca: CA | None = None
    admin: Path | None = None  # the admin kubeconfig (system:masters)
    _apiserver_keys: tuple[KeyPair, KeyPair, KeyPair] | None = field(default=None, repr=False)

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    def start(self) -> ControlPlane:
        pki = self.dir / "pki"
        self.ca = CA(pki)
        self.port = self.port or free_port()
        serving = self.ca.issue("apiserver", "kube-apiserver", client=False, server=True,
                                hosts=(self.address, SERVICE_IP, "localhost", "kubernetes", "kubernetes.default",
                                       "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"))
        kubelet_client = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                       groups=("kubeadm:cluster-admins",))
        sa = service_account_keys(pki)
        self.admin = kubeconfig(self.dir / "admin.kubeconfig", server=self.server, ca=self.ca.pair.cert,
                                client=self.ca.issue("admin", "kubernetes-admin", groups=("system:masters",)),
                                user="kubernetes-admin")
        try:
            self._start_etcd()
            self._apiserver_keys = (serving, kubelet_client, sa)
            self._start_apiserver(serving, kubelet_client, sa)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def node_kubeconfig(self, node: str) -> Path:
        """A kubeconfig for the kubelet of `node`, as the Node authorizer expects it."""
        assert self.ca is not None
        pair = self.ca.issue(f"kubelet-{node}", f"system:node:{node}", groups=("system:nodes",))
        return kubeconfig(self.dir / f"kubelet-{node}.kubeconfig", server=self.server, ca=self.ca.pair.cert,
                          client=pair, user=f"system:node:{node}")

    def kubectl(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([peer("kubectl"), "--kubeconfig", str(self.admin), *args], capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")[-4000:]

    def _start_etcd(self) -> None:
        self.etcd_port, peer_port = free_port(), free_port()
        self._spawn("etcd", [peer("etcd"), "--name", "pynode", "--data-dir", str(self.dir / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                             "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-cluster", f"pynode=http://127.0.0.1:{peer_port}",
                             "--unsafe-no-fsync", "--log-level", "warn"])

    def _start_apiserver(self, serving: KeyPair, kubelet_client: KeyPair, sa: KeyPair) -> None:
        assert self.ca is not None
        self._spawn("kube-apiserver", [
            peer("kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", self.address, "--secure-port", str(self.port),
            "--advertise-address", self.address, "--endpoint-reconciler-type", "none",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(self.ca.pair.cert),
            "--kubelet-client-certificate", str(kubelet_client.cert),
            "--kubelet-client-key", str(kubelet_client.key),
            "--kubelet-certificate-authority", str(self.ca.pair.cert),
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(sa.cert),
            "--service-account-signing-key-file", str(sa.key),
            "--allow-privileged=true",
            "--profiling=false",
        ])

    def _wait_ready(self, timeout: float = 90) -> None:
        assert self.ca is not None
        deadline = time.monotonic() + timeout
        admin = self.dir / "pki" / "admin"
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.log(name)}")
            try:
                r = requests.get(f"{self.server}/readyz", timeout=2, verify=str(self.ca.pair.cert),
                                 cert=(f"{admin}.crt", f"{admin}.key"))
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready in {timeout} s:\n{self.log('kube-apiserver')}")

    def stop_apiserver(self) -> None:
        """kube-apiserver alone, etcd keeping the cluster's state: an API server outage as a kubelet sees it."""
        self._stop("kube-apiserver")

    def start_apiserver(self) -> None:
        """kube-apiserver again, on the same port and certificates, once it answers ready."""
        assert self._apiserver_keys is not None, "start() first"
        self._start_apiserver(*self._apiserver_keys)
        self._wait_ready()

    def stop(self) -> None:
        """kube-apiserver first (it writes to etcd until the end), then etcd."""
        for name in ("kube-apiserver", "etcd"):
            self._stop(name)

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
