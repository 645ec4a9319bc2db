"""The lab's guest half without a VM: `vagrant/provision/lab.py prepare` on this host, then the provision.sh it
writes, run twice as a VM would, in a bare Debian 12 (debootstrap's minbase: no Python, no iproute2) chrooted
in a mount and network namespace of its own, with no network at all: the packages come from prepare's local
repository, the project from its wheelhouse. The second run must change nothing.

systemd is the one stand-in (minbase has none, and a chroot could not run it): a `systemctl` that remembers which
units were enabled and started. The node's address is on a veth pair inside the namespace, so apply's routes to
the other node have a link to go through. What the units run is checked by test_lab.py, against a control plane.

The minbase tree is made once (about a minute, from Debian's mirror) and kept as a tarball under
~/.cache/pynode; prepare's output is kept there too (prepare is idempotent: a second run reuses it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.busybox import CACHE

ENTRY = Path(__file__).resolve().parents[2] / "vagrant" / "provision" / "lab.py"
MINBASE = CACHE / "debian12-minbase.tar"
PREPARED = CACHE / "lab-offline"
SYSTEMCTL = """#!/bin/sh
# systemd's stand-in: remembers enabled and started units, logs every call
S=/var/lib/fake-systemd; mkdir -p $S; echo "systemctl $*" >> $S/calls
verb=$1; for unit; do :; done
case $verb in
  is-enabled) [ -e $S/enabled.$unit ] ;;
  is-active) [ -e $S/active.$unit ] ;;
  enable) touch $S/enabled.$unit ;;
  start|restart) touch $S/active.$unit ;;
esac
"""

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="chroot and namespaces"),
              pytest.mark.skipif(not shutil.which("debootstrap"), reason="needs debootstrap")]


def minbase(root: Path) -> None:
    if not MINBASE.exists():
        tree = MINBASE.with_suffix(".d")
        shutil.rmtree(tree, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(tree), "http://deb.debian.org/debian"],
                       check=True, capture_output=True, timeout=600)
        tmp = MINBASE.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(tree), "-cf", str(tmp), "."], check=True)
        tmp.rename(MINBASE)
        shutil.rmtree(tree)
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(MINBASE)], check=True)


@pytest.mark.timeout(900)
def test_provision_sh_installs_offline_on_a_bare_debian_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    args = ["prepare", "--out", str(PREPARED), "--control-plane-ip", "10.205.0.1",
            "--node", "node-1=10.205.0.21", "--node", "node-2=10.205.0.22"]
    subprocess.run([sys.executable, str(ENTRY), *args], check=True, capture_output=True, text=True, timeout=600)
    again = subprocess.run([sys.executable, str(ENTRY), *args], check=True, capture_output=True, text=True)
    assert again.stdout.rstrip().endswith("no change(s)"), again.stdout

    root = tmp_path / "root"
    minbase(root)
    assert not (root / "usr/bin/python3").exists()  # nothing but what provision.sh brings
    shutil.copytree(PREPARED, root / "opt/pynode-lab", symlinks=True)
    (root / "usr/local/bin/systemctl").write_text(SYSTEMCTL)
    (root / "usr/local/bin/systemctl").chmod(0o755)
    provision = (f"chroot {root} /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                 "sh /opt/pynode-lab/provision.sh node node-1")
    script = f"""set -e
ip link add d0 type veth peer name d1
ip addr add 10.205.0.21/24 dev d0
ip link set d0 up; ip link set d1 up; ip link set lo up
mount -t proc proc {root}/proc
mount -t sysfs sys {root}/sys
{provision}
echo '--- second run'
{provision}
chroot {root} ip route show
"""
    result = subprocess.run(["unshare", "--mount", "--net", "--fork", "sh", "-c", script], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first, second = result.stdout.split("--- second run")
    assert "installing from /opt/pynode-lab/debs: python3-venv" in first
    assert "started pynode-pykubelet.service" in first
    assert "lab apply node node-1: no change(s)" in second and "installing" not in second
    assert "10.244.2.0/24 via 10.205.0.22 dev d0" in second
    calls = (root / "var/lib/fake-systemd/calls").read_text().splitlines()
    assert calls.count("systemctl start pynode-pyruntime-cri.service") == 1
    assert (root / "etc/systemd/system/pynode-kube-proxy.service").exists()
    assert (root / "opt/pynode/bin/kubernetes/kube-proxy").exists()
