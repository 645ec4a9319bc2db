"""The images kubeadm's static pods and kube-proxy's DaemonSet run (tests/kit/kubeadm_images.py): each config
runs its binary, found through the PATH as kubeadm's manifests name it; kube-proxy's rootfs runs its iptables
(in a network namespace of its own: the host's firewall is never touched) and kube-proxy itself; and the
images push to a registry under their registry.k8s.io paths.
"""
from __future__ import annotations

import json
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import requests

from tests.integration.registry_server import Registry
from tests.kit import kubeadm_images
from tests.kit.busybox import require_static
from tests.kit.kubeadm_images import ETCD, IMAGES, KUBE_PROXY, KUBERNETES, PATH, PAUSE

BUILT = all((kubeadm_images.BINARIES / name).is_file() for name in
            ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd"))
pytestmark = pytest.mark.skipif(not BUILT, reason="needs `scripts/build-peers.sh kubeadm-images` (make setup)")

# kube-proxy's iptables mode's kind of rules: its chains, comments, random endpoint choice, marks, DNAT, masquerade
RULES = """*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https" -m tcp --dport 443 -j KUBE-SVC-X
-A KUBE-SVC-X -m statistic --mode random --probability 0.5 -j KUBE-SEP-A
-A KUBE-SEP-A -s 10.0.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.0.0.2:6443
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully
COMMIT
*filter
-A FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
"""


@pytest.fixture(scope="module")
def layouts() -> dict[str, Path]:
    return dict(kubeadm_images.cached_layouts())


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def _image(layout: Path) -> tuple[dict, Path]:
    """The image's config and its one layer's blob."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]).read_text())
    [layer] = manifest["layers"]
    return json.loads(_blob(layout, manifest["config"]["digest"]).read_text()), _blob(layout, layer["digest"])


def _unpack(layout: Path, into: Path) -> Path:
    with tarfile.open(_image(layout)[1], "r:gz") as tar:
        tar.extractall(into)
    return into


@pytest.mark.parametrize("ref", IMAGES)
def test_config_runs_the_binary(layouts: dict[str, Path], tmp_path: Path, ref: str) -> None:
    config, _ = _image(layouts[ref])
    rootfs = _unpack(layouts[ref], tmp_path / "rootfs")
    if ref == PAUSE:
        assert config["config"]["Entrypoint"] == ["/pause"]
    else:
        name = ref.rsplit("/", 1)[1].split(":")[0]
        assert config["config"]["Entrypoint"] == [f"/usr/local/bin/{name}"]
        assert PATH in config["config"]["Env"]
    assert config["config"]["Cmd"] == []
    binary = rootfs / config["config"]["Entrypoint"][0].lstrip("/")
    assert binary.stat().st_mode & 0o111
    if ref != KUBE_PROXY:  # kube-proxy's rootfs has Debian's libc too, for iptables
        assert sorted(p.name for p in rootfs.iterdir()) == (["pause"] if ref == PAUSE else ["tmp", "usr"])
    require_static(binary)
    if ref != PAUSE:
        version = subprocess.run(["chroot", str(rootfs), binary.name, "--version"], capture_output=True, text=True,
                                 env={"PATH": PATH.split("=", 1)[1]}, timeout=60)
        assert version.returncode == 0, version.stderr
        assert ("3.7.0" if ref == ETCD else KUBERNETES) in version.stdout


def test_kube_proxy_rootfs_runs_iptables(layouts: dict[str, Path], tmp_path: Path) -> None:
    rootfs = str(_unpack(layouts[KUBE_PROXY], tmp_path / "rootfs"))
    script = (f"chroot {rootfs} /usr/sbin/iptables -t nat -S && "
              f"chroot {rootfs} /usr/sbin/iptables -m comment --comment x -A INPUT -j ACCEPT && "
              f"chroot {rootfs} /usr/sbin/iptables-restore --noflush && "
              f"chroot {rootfs} /usr/sbin/ip6tables -t nat -N KUBE-SERVICES && "
              f"chroot {rootfs} /usr/sbin/iptables-save && chroot {rootfs} /usr/sbin/ip6tables-save -t nat")
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], input=RULES, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "-A INPUT -m comment --comment x -j ACCEPT" in run.stdout
    assert "-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A" in run.stdout
    assert "-j DNAT --to-destination 10.0.0.2:6443" in run.stdout
    assert ":KUBE-SERVICES - [0:0]" in run.stdout.split("ip6tables-save")[1]
    assert (Path(rootfs) / "var/run").readlink() == Path("/run")
    assert stat.S_IMODE((Path(rootfs) / "tmp").stat().st_mode) == 0o1777


def test_push(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry").start()
    try:
        pushed = kubeadm_images.push(registry)
        assert pushed == [ref.split("/", 1)[1] for ref in IMAGES]
        for name in pushed:
            repository, tag = name.rsplit(":", 1)
            assert requests.get(f"{registry.url}/v2/{repository}/tags/list", timeout=10).json()["tags"] == [tag]
    finally:
        registry.stop()
