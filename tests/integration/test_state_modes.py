"""pyruntime-cri's socket and state directories have containerd's modes whatever the umask it is started with
(issue 22, items 2 and 11): a daemon started under umask 000 served a socket any host user could connect to,
which is root on the node; and a root left wider by an older version is narrowed at start."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.kit.cri_server import CriNode


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_cri_socket_is_0660_and_its_state_closed_under_umask_000(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    hosts.mkdir()
    work = tmp_path / "cri"
    old_root = work / "root"
    (old_root / "images").mkdir(parents=True)
    os.chmod(old_root, 0o755)  # as an older version left them
    os.chmod(old_root / "images", 0o755)
    node = CriNode(hosts, bridge="pyt-modes0", subnet="10.239.0.0/16", work=work)
    try:
        previous = os.umask(0)
        try:
            node.start()
        finally:
            os.umask(previous)
        assert stat.S_ISSOCK(os.lstat(node.sock).st_mode) and mode(node.sock) == 0o660
        state = work / "state"
        assert {str(p.relative_to(work)): oct(mode(p)) for p in (
            old_root, old_root / "images", old_root / "containers", old_root / "sandboxes", old_root / "cni-cache",
            state, state / "runtime", state / "containers", state / "sandboxes")} == {
            "root": "0o711", "root/images": "0o700", "root/containers": "0o711", "root/sandboxes": "0o711",
            "root/cni-cache": "0o700", "state": "0o711", "state/runtime": "0o711", "state/containers": "0o700",
            "state/sandboxes": "0o711"}
    finally:
        node.cleanup()


def test_pod_files_stay_readable_under_a_hardened_umask(tmp_path: Path) -> None:
    """A daemon started from a shell with umask 077 wrote a pod's resolv.conf, hosts and hostname 0600: a
    container running as any user but root could resolve no name."""
    hosts = tmp_path / "certs.d"
    hosts.mkdir()
    work = tmp_path / "cri"
    node = CriNode(hosts, bridge="pyt-modes1", subnet="10.238.0.0/16", work=work)
    try:
        previous = os.umask(0o077)
        try:
            node.start()
        finally:
            os.umask(previous)
        pod = node.run_pod("umask", share_pid=False)
        files = {p.name: oct(mode(p)) for p in (work / "root" / "sandboxes" / pod).iterdir()
                 if p.name in ("resolv.conf", "hosts", "hostname")}
        assert files == {"resolv.conf": "0o644", "hosts": "0o644", "hostname": "0o644"}
        node.remove_pod(pod)
    finally:
        node.cleanup()
