"""A stock control plane for the kubelet and cluster tests: etcd and kube-apiserver (built from their Go
modules by scripts/peers/kubernetes.sh) with a real PKI, the Node and RBAC authorizers and the
NodeRestriction admission plugin, so a kubelet runs as `system:node:NAME` exactly as in a real cluster.

Each ControlPlane is a set of child processes of the test session in a directory of its own; stop()
ends them by pid (kube-apiserver may take more than 15 s to exit on SIGTERM once etcd is gone, so it is
killed after a grace period) and reaps them. Nothing listens beyond 127.0.0.1.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from pynode_cluster import pki as pki_
from pynode_cluster.components import KUBEADM_RBAC, apiserver_argv, etcd_argv, peer
from pynode_cluster.pki import CA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ControlPlane:
    dir: Path
    address: str = "127.0.0.1"
    port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ca: CA | None = None
    admin: Path | None = None  # the admin kubeconfig (system:masters)

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    def start(self) -> ControlPlane:
        pki = self.dir / "pki"
        self.ca = pki_.control_plane(pki, self.address)
        self.port = self.port or free_port()
        self.admin = pki_.user_kubeconfig(self.ca, self.dir / "admin.kubeconfig", self.server, "kubernetes-admin",
                                          ("system:masters",))
        try:
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready()
            # kubeadm's bindings: the API server's kubelet client (kubectl logs/exec through a kubelet) is
            # in kubeadm:cluster-admins
            subprocess.run([peer("kubectl"), "--kubeconfig", str(self.admin), "apply", "-f", "-"], check=True,
                           capture_output=True, timeout=60,
                           input=json.dumps({"apiVersion": "v1", "kind": "List", "items": KUBEADM_RBAC}).encode())
        except BaseException:
            self.stop()
            raise
        return self

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", apiserver_argv(
            etcd=f"http://127.0.0.1:{self.etcd_port}", address=self.address, port=self.port, pki=self.dir / "pki",
            endpoint_reconciler=False))

    def node_kubeconfig(self, node: str) -> Path:
        """A kubeconfig for the kubelet of `node`, as the Node authorizer expects it."""
        assert self.ca is not None
        return pki_.user_kubeconfig(self.ca, self.dir / f"kubelet-{node}.kubeconfig", self.server,
                                    f"system:node:{node}", ("system:nodes",))

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
        self.etcd_port = free_port()
        self._spawn("etcd", etcd_argv(self.dir / "etcd", self.etcd_port, free_port()))

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
        assert self.ca is not None, "start() first"
        self._start_apiserver()
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
