"""`make test-lab`: a real `vagrant up` of one node VM of the lab (vagrant/Vagrantfile) under QEMU software
emulation, joined to a control plane on this host, a deployment on it, and nothing left afterwards.

The module's fixture walks the lab as a user would, with the host's preconditions checked first (libvirt, memory:
a clear message and nothing made): the box (vagrant/box/build.sh, cached under ~/.cache/pynode/lab), what the
guest is provisioned from (vagrant/provision/lab.py prepare), the lab's private libvirt network made before
`vagrant up` (the control plane binds to its host side), the control plane and the test registry (the node's
image mirror) on that address, then `vagrant up node-1` with LAB_CONTROL_PLANE=host. The guest reaches nothing
but that network. Its finalizer destroys the VM, removes the network, the pool's volumes, the routes and the
daemons it started, and fails if libvirt still holds a domain, network or volume of the lab or a qemu process runs.
Times go to the terminal summary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pynode_cluster import components, hosts
from tests.kit import cluster_registry
from tests.kit.cluster_admin import http
from tests.kit.cri_images import HTTPD
from tests.leakcheck import reap_orphans

CHECKOUT = Path(__file__).resolve().parents[2]
VAGRANT = CHECKOUT / "vagrant"
LAB_PY = VAGRANT / "provision" / "lab.py"
HOST_PY = VAGRANT / "host.py"
CACHE = Path.home() / ".cache" / "pynode" / "lab"
LAB_DIR = VAGRANT / ".lab"  # lab.py's default: `control-plane up` reads its lab.json there
SUBNET = "10.207.0"  # the Vagrantfile's
HOST_IP, NODE, NODE_IP = f"{SUBNET}.1", "node-1", f"{SUBNET}.21"
NETWORK = "pynode-lab-net"  # the Vagrantfile's private network, made here first so the control plane can bind
MEMORY = 1536  # MiB of the VM; qemu takes up to 1 GiB more under TCG, and the control plane about 1 GiB
HOST_MEMORY = MEMORY + 1024 + 1024
ADMIN = Path("/var/lib/pynode/lab-host/admin.kubeconfig")  # lab_host's
TIMES: dict[str, float] = {}  # printed by conftest.py's terminal summary
pytestmark = [pytest.mark.timeout(3000),  # the first test's setup holds the whole bring-up
              # the registry's Popen (hosts.Daemons) is dropped while it runs: a daemon, stopped by pid
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def run(argv: list[str], timeout: float = 600, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})}, cwd=VAGRANT)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([components.peer("kubectl"), "--kubeconfig", str(ADMIN), *args], timeout=60, check=check)


class Lab:
    def __init__(self, dotfile: Path):
        self.env = {"VAGRANT_HOME": str(CACHE / "vagrant.d"), "VAGRANT_DOTFILE_PATH": str(dotfile),
                    "LAB_CONTROL_PLANE": "host", "LAB_NODES": "1", "LAB_MEMORY": str(MEMORY),
                    "LAB_PREPARE": "0", "LAB_DIR": str(LAB_DIR),
                    "LAB_SUBNET": SUBNET}
        self.route = ""
        self.registry = hosts.Daemons(dotfile.parent / "registry-pids")

    def vagrant(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run(["vagrant", *args], timeout=timeout, env=self.env)

    def ssh(self, command: str) -> str:
        return self.vagrant("ssh", NODE, "-c", command, timeout=300).stdout

    def up(self) -> None:
        """`vagrant up node-1 --no-provision` (the boot), then `vagrant up node-1` again, which provisions it (the
        provisioners run at every `up`: what finishes an interrupted one), each timed."""
        started = time.monotonic()
        self.vagrant("up", NODE, "--no-provision")
        TIMES["vagrant up (boot)"] = time.monotonic() - started
        started = time.monotonic()
        self.vagrant("up", NODE)
        TIMES["vagrant up (provisioning)"] = time.monotonic() - started


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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    check = run([sys.executable, str(HOST_PY), "check", "--memory", str(HOST_MEMORY)], check=False)
    if check.returncode != 0:
        pytest.fail(check.stderr.strip(), pytrace=False)  # nothing made yet
    begun = time.monotonic()
    tmp = tmp_path_factory.mktemp("lab")
    lab = Lab(tmp / "dot")
    left: list[str] = []
    try:
        run([sys.executable, str(HOST_PY), "setup"])
        _box(lab.env)
        started = time.monotonic()
        run([sys.executable, str(LAB_PY), "prepare", "--out", str(LAB_DIR), "--control-plane-ip", HOST_IP,
             "--node", f"{NODE}={NODE_IP}", "--registry-mirror", f"{HOST_IP}:{cluster_registry.PORT}"],
            timeout=1800)
        TIMES["lab.py prepare"] = time.monotonic() - started
        _network()
        started = time.monotonic()
        run([sys.executable, str(LAB_PY), "control-plane", "up", "--config", str(LAB_DIR / "lab.json"),
             "--ip", HOST_IP])
        cluster_registry.start(lab.registry, "", HOST_IP, tmp / "registry", tmp / "certs.d",
                               tmp / "registry.log")  # the nodes' mirror (lab.json's registry_mirror)
        TIMES["control plane and registry on the host"] = time.monotonic() - started
        lab.up()
        yield lab
    finally:
        started = time.monotonic()
        # powered off first: destroy's graceful shutdown waits a minute for an emulated guest, for nothing
        run(["vagrant", "halt", "--force"], env=lab.env, timeout=300, check=False)
        destroyed = run(["vagrant", "destroy", "-f"], env=lab.env, timeout=600, check=False)
        TIMES["vagrant halt --force, destroy -f"] = time.monotonic() - started
        if lab.route:
            hosts.ip("route", "del", lab.route, "via", NODE_IP, check=False)
        for name in lab.registry.names():
            lab.registry.stop(name)
        down = run([sys.executable, str(LAB_PY), "control-plane", "down"], check=False)
        if down.returncode != 0:
            left.append(f"control-plane down: {down.stdout}{down.stderr}")
        _remove_networks()
        teardown = run([sys.executable, str(HOST_PY), "teardown"], check=False)
        reap_orphans()  # the daemons it stopped were orphans of this process (a subreaper: tests/conftest.py)
        left += teardown.stdout.split("\n") if teardown.returncode != 0 else []
        TIMES["teardown"] = time.monotonic() - started
        TIMES["test-lab in all"] = time.monotonic() - begun
        if destroyed.returncode != 0:
            left.append(f"vagrant destroy -f exited {destroyed.returncode}: {destroyed.stderr[-2000:]}")
    left = [thing for thing in left if thing]
    assert not left, "the lab left behind:\n" + "\n".join(left)


def test_provisioned(lab):
    """The upload reached /opt/pynode-lab and provision.sh ran as ROLE NAME."""
    assert "pynode" in lab.ssh("ls /opt/pynode-lab/wheelhouse")
    assert lab.ssh("systemctl is-system-running || true").strip() in ("running", "degraded")


def test_node_ready_and_deployment(lab):
    started = time.monotonic()
    hosts.wait_for(f"{NODE} Ready", lambda: kubectl(
        "get", "node", NODE, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
        check=False).stdout == "True", 300)
    TIMES["node Ready after vagrant up"] = time.monotonic() - started
    cidr = kubectl("get", "node", NODE, "-o", "jsonpath={.spec.podCIDR}").stdout
    assert cidr, f"{NODE} has no pod CIDR"
    lab.route = cidr
    hosts.ip("route", "replace", cidr, "via", NODE_IP)  # into our own network: the pods answer the host

    hosts.wait_for("the default ServiceAccount",
                   lambda: kubectl("get", "serviceaccount", "default", check=False).returncode == 0, 120)
    started = time.monotonic()
    kubectl("create", "deployment", "web", f"--image={HTTPD}", "--port=80")

    def running() -> dict | None:
        pods = json.loads(kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
        ready = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return ready[0] if ready else None

    pod = hosts.wait_for("the web pod Running", running, 600, interval=2)
    assert pod["spec"]["nodeName"] == NODE
    answer = hosts.wait_for("the pod's answer", lambda: http(f"http://{pod['status']['podIP']}/"), 120)
    assert "It works!" in answer
    TIMES["deployment to an answering pod"] = time.monotonic() - started


def test_provision_again_changes_nothing(lab):
    """A second `vagrant provision` leaves every service running as it was (same main pids)."""
    # less the ones that come and go with a login or a D-Bus call (vagrant ssh's user manager, hostnamed)
    snapshot = ("systemctl list-units --type=service --state=running --no-legend --plain | cut -d' ' -f1 | "
                "grep -vE '^(user@|systemd-(hostnamed|localed|timedated))' | xargs systemctl show -p Id,MainPID")
    before = lab.ssh(snapshot)
    started = time.monotonic()
    lab.vagrant("provision", NODE)
    TIMES["vagrant provision again"] = time.monotonic() - started
    assert lab.ssh(snapshot) == before
    assert kubectl("get", "node", NODE, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
                   ).stdout == "True"
