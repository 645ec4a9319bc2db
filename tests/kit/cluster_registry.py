"""The test registry as a part of `make cluster` (vagrant/provision/cluster.py, in a checkout): docker-registry in
the control plane's network namespace, holding the test images (busybox, the httpd stand-in, pause;
tests/kit/cri_images.py) and CoreDNS's (tests/kit/coredns.py), and the certs.d mirror config that sends
registry.k8s.io, docker.io ... to it, so the cluster's pods pull their images without leaving the machine.

It lives with the test kit because the images are built by it; pynode_cluster runs from an installed wheel
(the lab's VMs) and takes this as a hook (cluster.up(images=...)).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import requests

from pynode_cluster import hosts
from tests.integration.registry_server import REGISTRY_BIN, Registry
from tests.kit import coredns, kubeadm_images
from tests.kit.cri_images import push_all, write_hosts_dir

PORT = 5000


class _At(Registry):
    """A registry whose daemon another process started: it serves at `served` (host:port)."""

    def __init__(self, root: Path, served: str) -> None:
        super().__init__(root)
        self.served = served

    @property
    def host(self) -> str:
        return self.served


def at(host: str, root: Path) -> Registry:
    """The registry `start` started (its files under `root`, serving at `host`: Record.registry), to push to."""
    return _At(root, host)


def start(daemons: hosts.Daemons, netns: str, address: str, root: Path, hosts_dir: Path, log: Path) -> str:
    """Starts the registry at `address`:PORT in `netns` as the daemon "registry", pushes the test images, writes
    the mirror config into `hosts_dir`; returns the registry's host:port."""
    host = f"{address}:{PORT}"
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n"
                      f"  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
                      f"http:\n  addr: {host}\n  secret: pynode-cluster\n")
    daemons.start("registry", [REGISTRY_BIN, "serve", str(config)], log, netns)

    def answers() -> bool:
        try:
            return requests.get(f"http://{host}/v2/", timeout=1).ok
        except requests.RequestException:
            return False

    hosts.wait_for("the registry", answers, 30,
                   failed=lambda: None if daemons.process("registry") else f"it exited: {daemons.log('registry')}")

    registry = at(host, root)
    push_all(registry, root / "images")
    coredns.push(registry)
    shutil.rmtree(root / "images", ignore_errors=True)
    write_hosts_dir(hosts_dir, host)
    return host


def start_kubeadm(daemons: hosts.Daemons, netns: str, address: str, root: Path, hosts_dir: Path, log: Path) -> str:
    """`start`, and the images `kubeadm init` pulls (tests/kit/kubeadm_images.py)."""
    host = start(daemons, netns, address, root, hosts_dir, log)
    kubeadm_images.push(at(host, root))
    return host
