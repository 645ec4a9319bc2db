"""What the lab tier's tests share: a lab of vagrant/Vagrantfile brought up as a user would, and everything it
made removed afterwards, with the time each step took.

`brought_up` checks the host first (libvirt, memory: a clear message and nothing made), then builds the box
(vagrant/box/build.sh, cached under ~/.cache/pynode/lab), prepares what the guests are provisioned from
(vagrant/provision/lab.py prepare), makes the lab's private libvirt network before `vagrant up` (a control
plane on the host binds to its host side), starts the test registry there as the guests' image mirror (they
reach nothing but that network), and hands over to the caller's `vagrant up`. Its finalizer powers off and
destroys the VMs, removes the network, the pool's volumes, the routes and the daemons it started, and fails if
libvirt still holds a domain, network or volume of the lab or a qemu process runs.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynode_cluster import components, hosts, lab
from tests.kit import cluster_registry
from tests.leakcheck import reap_orphans

CHECKOUT = Path(__file__).resolve().parents[2]
VAGRANT = CHECKOUT / "vagrant"
LAB_PY = VAGRANT / "provision" / "lab.py"
HOST_PY = VAGRANT / "host.py"
CACHE = Path.home() / ".cache" / "pynode" / "lab"
LAB_DIR = VAGRANT / ".lab"  # lab.py's default: `control-plane up` reads its lab.json there
SUBNET = "10.207.0"  # the Vagrantfile's: the host .1, the control plane .10, node-i .20+i
HOST_IP, CP_VM_IP = f"{SUBNET}.1", f"{SUBNET}.10"
NETWORK = "pynode-lab-net"  # the Vagrantfile's private network, made here first so the control plane can bind
MEMORY = 1536  # MiB of a VM; qemu takes up to 1 GiB more under TCG
QEMU_OVERHEAD = 1024
HOST_CONTROL_PLANE_MEMORY = 1024
KUBEADM_CP_MEMORY = 2048  # the Vagrantfile's CP_MEMORY with LAB_KUBEADM=1: kubeadm init wants 1700 MB
ADMIN_ON_HOST = Path("/var/lib/pynode/lab-host/admin.kubeconfig")  # lab_host's
TIMES: dict[str, float] = {}  # printed by conftest.py's terminal summary
GUEST_RESULTS: list[str] = []  # test_lab_v2's pytest in the VM: its counts and what it skipped, printed there too


def run(argv: list[str], timeout: float = 600, env: dict[str, str] | None = None,
        check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                            env={**os.environ, **(env or {})}, cwd=VAGRANT)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


class Lab:
    """A lab being brought up: `vagrant` and `kubectl` as its user runs them, the routes the test added."""

    def __init__(self, dotfile: Path, nodes: list[tuple[str, str]], control_plane: str, admin: Path,
                 kubeadm: bool = False):
        self.nodes, self.control_plane, self.admin = nodes, control_plane, admin
        self.env = {"VAGRANT_HOME": str(CACHE / "vagrant.d"), "VAGRANT_DOTFILE_PATH": str(dotfile),
                    "LAB_CONTROL_PLANE": control_plane, "LAB_NODES": str(len(nodes)), "LAB_MEMORY": str(MEMORY),
                    "LAB_PREPARE": "0", "LAB_DIR": str(LAB_DIR), "LAB_SUBNET": SUBNET,
                    "LAB_KUBEADM": "1" if kubeadm else "0"}
        self.routes: list[tuple[str, str]] = []  # (CIDR, via)
        self.registry = hosts.Daemons(dotfile.parent / "registry-pids")

    def vagrant(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run(["vagrant", *args], timeout=timeout, env=self.env)

    def ssh(self, machine: str, command: str, timeout: float = 300) -> str:
        return self.vagrant("ssh", machine, "-c", command, timeout=timeout).stdout

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
        return run([components.peer("kubectl"), "--kubeconfig", str(self.admin), *args], timeout=timeout,
                   check=check, input=input)

    def route(self, cidr: str, via: str) -> None:
        """Into the lab's own network: the pods behind `via` answer the host."""
        self.routes.append((cidr, via))
        hosts.ip("route", "replace", cidr, "via", via)

    def timed(self, step: str, *args: str, timeout: float = 900) -> None:
        started = time.monotonic()
        self.vagrant(*args, timeout=timeout)
        TIMES[step] = time.monotonic() - started


def host_memory(nodes: int, control_plane: str, kubeadm: bool = False) -> int:
    """MiB the host needs: each VM and its qemu, and a control plane on the host or in a VM of its own (the
    Vagrantfile's CP_MEMORY for kubeadm's)."""
    vms = nodes + (control_plane == "vm")
    return vms * (MEMORY + QEMU_OVERHEAD) + (HOST_CONTROL_PLANE_MEMORY if control_plane == "host" else 0) + (
        KUBEADM_CP_MEMORY - MEMORY if kubeadm else 0)


def _box(env: dict[str, str]) -> None:
    """The box, built when its recipe changed, and added to Vagrant when it is not the one added."""
    started = time.monotonic()
    run([str(VAGRANT / "box" / "build.sh"), "--add", str(CACHE)], timeout=1800, env=env)
    TIMES["box (build or cache)"] = time.monotonic() - started


def _network() -> None:
    """Persistent, as Vagrant's own: `vagrant destroy` undefines it with the last VM on it."""
    xml = (f"<network><name>{NETWORK}</name><bridge name='pynodelab0' stp='off'/>"
           f"<ip address='{HOST_IP}' netmask='255.255.255.0'/></network>")
    path = CACHE / "net.xml"
    path.write_text(xml)
    run(["virsh", "-c", "qemu:///system", "net-define", str(path)])
    run(["virsh", "-c", "qemu:///system", "net-start", NETWORK])


def _remove_networks() -> None:
    for net in (NETWORK, "pynode-lab-mgmt"):
        run(["virsh", "-c", "qemu:///system", "net-destroy", net], check=False)
        run(["virsh", "-c", "qemu:///system", "net-undefine", net], check=False)


@contextlib.contextmanager
def brought_up(tmp: Path, nodes: list[tuple[str, str]], control_plane: str, with_tests: bool = False,
               kubeadm: bool = False) -> Iterator[Lab]:
    """The lab of `nodes` (name, address) with its control plane on the host or in the `cp` VM, ready for the
    caller's `vagrant up`; everything removed when the caller is done, and an AssertionError for what stayed.
    `with_tests`: the guests also get what running the project's tests in them takes (prepare --with-tests);
    `kubeadm`: the lab kubeadm makes (LAB_KUBEADM=1), its images in the registry too."""
    memory = host_memory(len(nodes), control_plane, kubeadm)
    check = run([sys.executable, str(HOST_PY), "check", "--memory", str(memory)], check=False)
    if check.returncode != 0:
        pytest.fail(check.stderr.strip(), pytrace=False)  # nothing made yet
    begun = time.monotonic()
    cp_ip = HOST_IP if control_plane == "host" else CP_VM_IP
    admin = ADMIN_ON_HOST if control_plane == "host" else tmp / "admin.kubeconfig"
    lab_ = Lab(tmp / "dot", nodes, control_plane, admin, kubeadm)
    left: list[str] = []
    try:
        run([sys.executable, str(HOST_PY), "setup"])
        _box(lab_.env)
        started = time.monotonic()
        run([sys.executable, str(LAB_PY), "prepare", "--out", str(LAB_DIR), "--control-plane-ip", cp_ip,
             *(a for name, ip in nodes for a in ("--node", f"{name}={ip}")),
             "--registry-mirror", f"{HOST_IP}:{cluster_registry.PORT}", *(["--with-tests"] if with_tests else []),
             *(["--kubeadm"] if kubeadm else [])],
            timeout=1800)
        TIMES["lab.py prepare"] = time.monotonic() - started
        if control_plane == "vm":  # kubectl from the host as vagrant/README.md says, with prepare's admin pair
            config = lab.Lab.load(LAB_DIR / "lab.json")
            admin.write_bytes(lab.kubeconfig(config, LAB_DIR / "pki", "admin", "kubernetes-admin"))
        _network()
        started = time.monotonic()
        if control_plane == "host":
            run([sys.executable, str(LAB_PY), "control-plane", "up", "--config", str(LAB_DIR / "lab.json"),
                 "--ip", HOST_IP])
        registry = cluster_registry.start_kubeadm if kubeadm else cluster_registry.start
        registry(lab_.registry, "", HOST_IP, tmp / "registry", tmp / "certs.d",
                 tmp / "registry.log")  # the nodes' mirror (lab.json's registry_mirror)
        TIMES[f"{'control plane and ' if control_plane == 'host' else ''}registry on the host"] = \
            time.monotonic() - started
        yield lab_
    finally:
        started = time.monotonic()
        # powered off first: destroy's graceful shutdown waits a minute for an emulated guest, for nothing
        run(["vagrant", "halt", "--force"], env=lab_.env, timeout=300, check=False)
        destroyed = run(["vagrant", "destroy", "-f"], env=lab_.env, timeout=600, check=False)
        TIMES["vagrant halt --force, destroy -f"] = time.monotonic() - started
        for cidr, via in lab_.routes:
            hosts.ip("route", "del", cidr, "via", via, check=False)
        for name in lab_.registry.names():
            lab_.registry.stop(name)
        if control_plane == "host":
            down = run([sys.executable, str(LAB_PY), "control-plane", "down"], check=False)
            if down.returncode != 0:
                left.append(f"control-plane down: {down.stdout}{down.stderr}")
        _remove_networks()
        teardown = run([sys.executable, str(HOST_PY), "teardown"], check=False)
        reap_orphans()  # the daemons it stopped were orphans of this process (a subreaper: tests/conftest.py)
        left += teardown.stdout.split("\n") if teardown.returncode != 0 else []
        TIMES["teardown"] = time.monotonic() - started
        TIMES["in all"] = time.monotonic() - begun
        if destroyed.returncode != 0:
            left.append(f"vagrant destroy -f exited {destroyed.returncode}: {destroyed.stderr[-2000:]}")
    left = [thing for thing in left if thing]
    assert not left, "the lab left behind:\n" + "\n".join(left)


def node_ready(lab_: Lab, node: str, timeout: float) -> None:
    hosts.wait_for(f"{node} Ready", lambda: lab_.kubectl(
        "get", "node", node, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
        check=False).stdout == "True", timeout)
