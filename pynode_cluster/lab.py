"""The Vagrant lab (vagrant/): a control-plane VM and node VMs, provisioned from one settings file, lab.json.

`vagrant/provision/lab.py prepare` writes lab.json and the lab's PKI on the host (prepare_lab); each VM then runs
`python -m pynode_cluster.lab apply ROLE NAME --config lab.json` (from vagrant/provision/provision.sh), which
makes the VM what lab.json says: the peers in place, its certificates and kubeconfigs, a systemd unit per daemon
with the command lines `make cluster` runs (components.control_plane_argvs, node.Node), the node's pod network,
routes to the other nodes' pod CIDRs, the kernel knobs a node needs. A second apply changes nothing: every file
is compared before it is written (atomically), units are reloaded only when one changed, a daemon is restarted
only when its unit or a file it reads changed, a route or knob is set only when it differs.

Pod CIDRs come from lab.json, not from the controller manager's allocation order: the routes between nodes
must be known when a node is provisioned, before the other nodes register. The control plane creates each
Node with its spec.podCIDR (a kubelet adopts an existing Node), and its controller manager allocates none: a
kubelet that registers first (a parallel `vagrant up`) leaves the CIDR empty until the control plane sets
lab.json's, where an allocation would have raced it (a Node's podCIDR cannot change once set).

Every system change goes through System, so the unit tests run apply against a temporary layout with a fake
of the commands (systemctl, ip, modprobe). This module runs in the VMs from the installed wheel: it imports
nothing that only the test extra brings (psutil).

Trust: lab.json and the PKI come from the host that made the VMs; every VM receives the whole PKI (the CA key
included) in /opt/pynode-lab, and apply installs into /etc/pynode/pki only what the role needs. It is a lab:
whoever is root on one VM is root on the cluster.
"""
from __future__ import annotations

import argparse
import dataclasses
import filecmp
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cni_plugins.install import launchers
from pykubelet.api.names import is_dns1123_label
from pynode_cluster import components, lab_kubeadm, pki
from pynode_cluster.node import Node
from pynode_os.files import atomic_write

SCHEMA = 1
ETCD_PORTS = (2379, 2380)
APISERVER_PORT = 6443
ROLES = ("control-plane", "node")
CONTROL_PLANE_PEERS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
NODE_PEERS = ("kube-proxy", "kubectl")
KUBEADM_PEERS = ("kubeadm", "kubectl")  # every VM of a kubeadm lab: its control plane comes as images
PEERS = tuple(dict.fromkeys(CONTROL_PLANE_PEERS + NODE_PEERS + KUBEADM_PEERS))
CONTROL_PLANE_NAME = "cp"  # the control plane's VM, a node of a kubeadm lab
# the kernel knobs a node needs: forwarding between the pods' bridge and eth0, and bridged pod-to-pod traffic
# through kube-proxy's iptables rules (a Service whose endpoint is on the same bridge)
NODE_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1"}
NODE_MODULES = ("br_netfilter",)  # what makes net.bridge.* exist
IP = "/bin/ip"  # iproute2's, where Debian 12 installs it (systemd wants an absolute path)


class LabError(RuntimeError):
    """lab.json or a step of apply is wrong; the message names the field, file or command."""


# ---- lab.json ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabNode:
    name: str
    ip: str
    pod_cidr: str


@dataclass(frozen=True)
class KubeadmJoin:
    """What every VM of a kubeadm lab knows of the cluster before the control plane exists (lab_kubeadm.py)."""
    token: str
    ca_cert_hash: str


@dataclass(frozen=True)
class Lab:
    """lab.json: the control plane's address, the nodes (name, address, pod CIDR), the cluster's CIDRs; with
    `kubeadm`, the lab is made by kubeadm init and join (lab_kubeadm.py)."""
    control_plane_ip: str
    nodes: tuple[LabNode, ...]
    apiserver_port: int = APISERVER_PORT
    service_cidr: str = components.SERVICE_CIDR
    cluster_cidr: str = components.CLUSTER_CIDR
    registry_mirror: str = ""  # host:port of a plain-HTTP registry the nodes pull every image from ("": none)
    kubeadm: KubeadmJoin | None = None

    @classmethod
    def make(cls, control_plane_ip: str, nodes: list[tuple[str, str]], cluster_cidr: str = components.CLUSTER_CIDR,
             **kw) -> Lab:
        """Node i (from 1, in the order given) gets the i-th /24 of the cluster CIDR."""
        subnets = ipaddress.ip_network(cluster_cidr).subnets(new_prefix=24)
        next(subnets)  # the .0.0/24 stays free, as the controller manager's first allocation
        lab = cls(control_plane_ip, tuple(LabNode(name, ip, str(next(subnets))) for name, ip in nodes),
                  cluster_cidr=cluster_cidr, **kw)
        lab.validate("the command line")
        return lab

    @property
    def server(self) -> str:
        return f"https://{self.control_plane_ip}:{self.apiserver_port}"

    @property
    def control_plane_node(self) -> LabNode | None:
        """A kubeadm lab's control plane is a node too, on the cluster CIDR's first /24 (which make leaves free)."""
        if self.kubeadm is None:
            return None
        first = next(ipaddress.ip_network(self.cluster_cidr).subnets(new_prefix=24))
        return LabNode(CONTROL_PLANE_NAME, self.control_plane_ip, str(first))

    def pod_routes(self, name: str | None) -> list[tuple[str, str]]:
        """(pod CIDR, via) of every node but `name`'s: each node's pods are reached through it."""
        nodes = [*self.nodes, *([self.control_plane_node] if self.control_plane_node else [])]
        return [(n.pod_cidr, n.ip) for n in nodes if n.name != name]

    @property
    def service_ip(self) -> str:
        """The `kubernetes` Service's address: the service CIDR's first."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def node(self, name: str) -> LabNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LabError(f"node {name!r} is not in lab.json's nodes ({', '.join(n.name for n in self.nodes)})")

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "control_plane": {"ip": self.control_plane_ip},
                           "apiserver_port": self.apiserver_port, "service_cidr": self.service_cidr,
                           "cluster_cidr": self.cluster_cidr, "registry_mirror": self.registry_mirror or None,
                           "kubeadm": dataclasses.asdict(self.kubeadm) if self.kubeadm else None,
                           "nodes": [dataclasses.asdict(n) for n in self.nodes]}, indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> Lab:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise LabError(f"{path}: {e}") from e
        where = str(path)
        try:
            if data.get("schema") != SCHEMA:
                raise LabError(f"{where}: schema is {data.get('schema')!r}, this code reads {SCHEMA}")
            lab = cls(control_plane_ip=_field(data["control_plane"], "ip", str, f"{where}: control_plane"),
                      nodes=tuple(LabNode(_field(n, "name", str, f"{where}: nodes[{i}]"),
                                          _field(n, "ip", str, f"{where}: nodes[{i}]"),
                                          _field(n, "pod_cidr", str, f"{where}: nodes[{i}]"))
                                  for i, n in enumerate(data["nodes"])),
                      apiserver_port=_field(data, "apiserver_port", int, where),
                      service_cidr=_field(data, "service_cidr", str, where),
                      cluster_cidr=_field(data, "cluster_cidr", str, where),
                      registry_mirror=_field(data, "registry_mirror", str, where) if data.get("registry_mirror")
                      else "",
                      kubeadm=KubeadmJoin(_field(data["kubeadm"], "token", str, f"{where}: kubeadm"),
                                          _field(data["kubeadm"], "ca_cert_hash", str, f"{where}: kubeadm"))
                      if data.get("kubeadm") else None)
        except (KeyError, TypeError, AttributeError) as e:
            raise LabError(f"{where}: missing or malformed {e}") from e
        lab.validate(where)
        return lab

    def validate(self, where: str) -> None:
        def network(value: str, what: str) -> ipaddress.IPv4Network:
            try:
                net = ipaddress.ip_network(value)
            except ValueError as e:
                raise LabError(f"{where}: {what} {value!r}: {e}") from e
            if not isinstance(net, ipaddress.IPv4Network):
                raise LabError(f"{where}: {what} {value!r}: IPv4 only")
            return net

        def address(value: str, what: str) -> None:
            try:
                ipaddress.IPv4Address(value)
            except ValueError as e:
                raise LabError(f"{where}: {what} {value!r}: not an IPv4 address") from e

        address(self.control_plane_ip, "control_plane.ip")
        cluster, service = network(self.cluster_cidr, "cluster_cidr"), network(self.service_cidr, "service_cidr")
        if cluster.overlaps(service):
            raise LabError(f"{where}: cluster_cidr {cluster} overlaps service_cidr {service}")
        if not self.nodes:
            raise LabError(f"{where}: nodes: at least one node")
        seen: dict[str, str] = {}
        cidrs: list[ipaddress.IPv4Network] = []
        for i, n in enumerate(self.nodes):
            what = f"nodes[{i}]"
            if not is_dns1123_label(n.name):  # a Node's name and a part of its units' names
                raise LabError(f"{where}: {what}.name {n.name!r}: lower-case letters, digits and '-' (a DNS label)")
            address(n.ip, f"{what}.ip")
            for key, value in ((n.name, "name"), (n.ip, "ip")):
                if key in seen:
                    raise LabError(f"{where}: {what}.{value} {key!r} is also {seen[key]}'s")
                seen[key] = n.name
            if n.ip == self.control_plane_ip:
                raise LabError(f"{where}: {what}.ip {n.ip} is the control plane's")
            cidr = network(n.pod_cidr, f"{what}.pod_cidr")
            if not cidr.subnet_of(cluster):
                raise LabError(f"{where}: {what}.pod_cidr {cidr} is not inside cluster_cidr {cluster}")
            if any(cidr.overlaps(c) for c in cidrs):
                raise LabError(f"{where}: {what}.pod_cidr {cidr} overlaps another node's")
            cidrs.append(cidr)
        if not 0 < self.apiserver_port < 65536:
            raise LabError(f"{where}: apiserver_port {self.apiserver_port}: not a port")
        if self.registry_mirror and not re.fullmatch(r"[A-Za-z0-9.-]+:[0-9]{1,5}", self.registry_mirror):
            raise LabError(f"{where}: registry_mirror {self.registry_mirror!r}: HOST:PORT")
        if self.kubeadm is not None:
            if not re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", self.kubeadm.token):
                raise LabError(f"{where}: kubeadm.token: [a-z0-9]{{6}}.[a-z0-9]{{16}}, as kubeadm token generate")
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", self.kubeadm.ca_cert_hash):
                raise LabError(f"{where}: kubeadm.ca_cert_hash {self.kubeadm.ca_cert_hash!r}: sha256:HEX")
            if any(n.name == CONTROL_PLANE_NAME for n in self.nodes):
                raise LabError(f"{where}: a node is named {CONTROL_PLANE_NAME!r}, the control plane's node")


def _field(data: dict, key: str, kind: type, where: str):
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise LabError(f"{where}: {key} is {value!r}, not a {kind.__name__}")
    return value


# ---- the PKI (made once on the host by prepare) ------------------------------------------------------------

def certs(lab: Lab) -> tuple[pki.Cert, ...]:
    """Every certificate of the lab: the apiserver's, the control plane's users', each kubelet's pair."""
    users = tuple(pki.Cert(stem, user, groups) for stem, (user, groups) in pki.CONTROL_PLANE_USERS.items())
    kubelets = tuple(c for n in lab.nodes for c in (pki.kubelet_client(n.name), pki.kubelet_serving(n.name, n.ip)))
    return pki.apiserver_certs(lab.control_plane_ip, lab.service_ip) + users + kubelets


def prepare_pki(lab: Lab, dir: Path) -> list[str]:
    """The lab's CA in `dir`, made on the first run and kept after it, and each certificate issued unless an
    equal one is there (a node added or an address changed re-issues only what names it); the names of the
    files written."""
    written = []
    if (dir / "ca.crt").exists() and (dir / "ca.key").exists():
        ca = pki.CA.load(dir)
    else:
        ca = pki.CA(dir)
        written.append("ca")
    written += [c.name for c in certs(lab) if ca.ensure(c)]
    if not ((dir / "sa.key").exists() and (dir / "sa.pub").exists()):
        pki.service_account_keys(dir)
        written.append("sa")
    return written


# ---- what each role runs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where apply puts things in a VM (a temporary tree in the tests)."""
    etc: Path = Path("/etc/pynode")  # pki/, the kubeconfigs, certs.d/
    state: Path = Path("/var/lib/pynode/lab")  # etcd/, nodes/NAME/
    run: Path = Path("/run/pynode/lab")  # nodes' sockets and CRI state: gone at a reboot, as the containers
    units: Path = Path("/etc/systemd/system")
    sysctl_conf: Path = Path("/etc/sysctl.d/90-pynode-lab.conf")
    modules_conf: Path = Path("/etc/modules-load.d/pynode-lab.conf")
    proc_sys: Path = Path("/proc/sys")
    root_kubeconfig: Path = Path("/root/.kube/config")  # `sudo kubectl` on the control plane
    kubectl_link: Path = Path("/usr/local/bin/kubectl")
    kubernetes: Path = Path("/etc/kubernetes")  # a kubeadm lab's: kubeadm's own files
    kubelet_binary: Path = Path(lab_kubeadm.KUBELET_BINARY)

    @property
    def pki(self) -> Path:
        return self.etc / "pki"

    @property
    def certs_d(self) -> Path:
        return self.etc / "certs.d"

    def node(self, lab: Lab, name: str) -> Node:
        n = lab.node(name)
        return Node(n.name, n.ip, self.state / "nodes" / n.name, self.run / n.name)


@dataclass(frozen=True)
class Unit:
    """One daemon as a systemd service `pynode-NAME.service`; `inputs` are the files it reads at start, so a
    change of one restarts it. A `oneshot` unit runs `argv` and then each of `more` once, at boot."""
    name: str
    argv: list[str]
    description: str
    after: tuple[str, ...] = ()
    service: tuple[str, ...] = ()  # more [Service] lines
    inputs: tuple[Path, ...] = ()
    oneshot: bool = False
    more: tuple[list[str], ...] = ()

    @property
    def file(self) -> str:
        return f"pynode-{self.name}.service"

    def render(self) -> str:
        after = " ".join(["network-online.target", *(f"pynode-{a}.service" for a in self.after)])
        kind = ["Type=oneshot", "RemainAfterExit=yes"] if self.oneshot else ["Restart=always", "RestartSec=2"]
        lines = ["# written by `python -m pynode_cluster.lab apply` (vagrant/provision): edits are overwritten",
                 "[Unit]", f"Description={self.description}", "Wants=network-online.target", f"After={after}",
                 "", "[Service]", *kind, *("ExecStart=" + " ".join(map(_exec_arg, a)) for a in (self.argv, *self.more)),
                 *self.service, "", "[Install]", "WantedBy=multi-user.target", ""]
        return "\n".join(lines)


def _exec_arg(arg: str) -> str:
    """One ExecStart word: `%` and `$` escaped (systemd expands both), quoted when it holds anything else."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def control_plane_units(lab: Lab, layout: Layout) -> list[Unit]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler with make cluster's command lines."""
    argvs = components.control_plane_argvs(
        address=lab.control_plane_ip, port=lab.apiserver_port, pki=layout.pki, etcd_dir=layout.state / "etcd",
        etcd_ports=ETCD_PORTS, kubeconfigs=layout.etc, cluster_cidr=lab.cluster_cidr, service_cidr=lab.service_cidr,
        allocate_node_cidrs=False)  # lab.json's, set by _api_objects
    pki_files = tuple(layout.pki / f for f in ("ca.crt", "ca.key", "sa.key", "sa.pub", "apiserver.crt", "apiserver.key",
                                               "apiserver-kubelet-client.crt", "apiserver-kubelet-client.key"))
    return [
        Unit("etcd", argvs["etcd"], "etcd for the lab's kube-apiserver", service=("LimitNOFILE=65536",)),
        Unit("kube-apiserver", argvs["kube-apiserver"], "kube-apiserver", after=("etcd",),
             service=("LimitNOFILE=65536", "TimeoutStopSec=30"), inputs=pki_files),
        Unit("kube-controller-manager", argvs["kube-controller-manager"], "kube-controller-manager",
             after=("kube-apiserver",), inputs=(*pki_files, *_kubeconfig_inputs(layout, "controller-manager"))),
        Unit("kube-scheduler", argvs["kube-scheduler"], "kube-scheduler", after=("kube-apiserver",),
             inputs=_kubeconfig_inputs(layout, "scheduler")),
    ]


def runtime_unit(node: Node, layout: Layout, *more: str) -> Unit:
    """pyruntime-cri with make cluster's command line and `more`. Its unit leaves the containers' processes
    alone when it stops (KillMode=process, as containerd's unit): a restart of the runtime must not kill the
    pods; their cgroups are under the node's own cgroup root (Delegate=yes)."""
    return Unit(node.runtime, [*node.runtime_command(layout.certs_d), *more], "pyruntime-cri, the node's CRI server",
                service=(f"ExecStartPre=/bin/mkdir -p {_exec_arg(str(node.run))}", "KillMode=process", "Delegate=yes",
                         "TimeoutStopSec=30"))


def node_units(lab: Lab, name: str, layout: Layout) -> list[Unit]:
    """pyruntime-cri, pykubelet and kube-proxy with make cluster's command lines."""
    node = layout.node(lab, name)
    kubelet_kubeconfig = layout.etc / f"{pki.kubelet_client(name).name}.kubeconfig"
    proxy_kubeconfig = layout.etc / "kube-proxy.kubeconfig"
    return [
        runtime_unit(node, layout),
        Unit(node.kubelet, node.kubelet_command(kubelet_kubeconfig), "pykubelet", after=(node.runtime,),
             inputs=(node.kubelet_config_file, *_kubeconfig_inputs(layout, pki.kubelet_client(name).name),
                     *(layout.pki / f"{pki.kubelet_serving(name, node.address).name}.{e}" for e in ("crt", "key")))),
        Unit("kube-proxy", components.kube_proxy_argv(kubeconfig=proxy_kubeconfig, node=name,
                                                      cluster_cidr=lab.cluster_cidr),
             "kube-proxy", after=(node.kubelet,), inputs=_kubeconfig_inputs(layout, "kube-proxy")),
    ]


def routes_unit(lab: Lab, name: str | None) -> list[Unit]:
    """The routes to the other nodes' pod CIDRs (every node's for the control plane, `name` None), set again at
    each boot (apply sets them at once too)."""
    routes = [[IP, "route", "replace", cidr, "via", via] for cidr, via in lab.pod_routes(name)]
    if not routes:
        return []
    return [Unit("routes", routes[0], "routes to the lab's pod CIDRs through their nodes", oneshot=True,
                 more=tuple(routes[1:]))]


def _kubeconfig_inputs(layout: Layout, stem: str) -> tuple[Path, ...]:
    return layout.etc / f"{stem}.kubeconfig", layout.pki / f"{stem}.crt", layout.pki / f"{stem}.key"


def kubeconfig(lab: Lab, pki_dir: Path, stem: str, user: str) -> bytes:
    """The kubeconfig of `user` whose pair is PKI_DIR/STEM.{crt,key}, for the lab's apiserver."""
    return pki.kubeconfig_text(server=lab.server, ca=pki_dir / "ca.crt", user=user,
                               client=pki.KeyPair(pki_dir / f"{stem}.crt", pki_dir / f"{stem}.key"))


def node_objects(lab: Lab) -> list[dict]:
    """The Nodes with their pod CIDRs, made before their kubelets register (a kubeadm lab's control plane's,
    which kubeadm init registered, given its CIDR); then kubeadm's RBAC, which a kubeadm lab's kubeadm made."""
    nodes: list[dict] = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name},
                          "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]}}
                         for n in (*lab.nodes, *([lab.control_plane_node] if lab.control_plane_node else []))]
    return nodes + ([] if lab.kubeadm else components.KUBEADM_RBAC)


# ---- the system, behind one interface ----------------------------------------------------------------------

@dataclass
class System:
    """Files and commands: the real machine. `changes` lists what apply changed, in order."""
    changes: list[str] = field(default_factory=list)

    def run(self, argv: list[str], check: bool = True, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise LabError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def write(self, path: Path, data: bytes, mode: int = 0o644) -> bool:
        """`data` into `path` atomically, unless it holds it already with `mode`; whether it wrote."""
        try:
            if path.read_bytes() == data and path.stat().st_mode & 0o7777 == mode:
                return False
        except OSError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, mode=mode)
        self.changes.append(f"wrote {path}")
        return True

    def copy(self, source: Path, path: Path, mode: int = 0o755) -> bool:
        """A peer binary: copied (through a temporary file, renamed) unless the same bytes are there. The same
        size and mtime count as the same bytes; an upload that did not keep the mtime (Vagrant's file
        provisioner) is compared byte for byte."""
        try:
            if path.stat().st_mode & 0o7777 == mode and filecmp.cmp(source, path, shallow=True):
                return False
        except OSError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        shutil.copy2(source, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        self.changes.append(f"installed {path}")
        return True

    def symlink(self, path: Path, target: Path) -> bool:
        if path.is_symlink() and os.readlink(path) == str(target):
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, path)
        self.changes.append(f"linked {path} -> {target}")
        return True

    def remove(self, path: Path) -> bool:
        if not path.exists():
            return False
        path.unlink()
        self.changes.append(f"removed {path}")
        return True

    def sysctl(self, proc_sys: Path, key: str, value: str) -> bool:
        path = proc_sys / key.replace(".", "/")
        if path.read_text().strip() == value:
            return False
        path.write_text(value)
        self.changes.append(f"sysctl {key}={value}")
        return True


# ---- apply -------------------------------------------------------------------------------------------------

def apply(role: str, name: str, config: Path, system: System, layout: Layout = Layout(),
          ready_timeout: float = 180, code_changed: bool = False) -> list[str]:
    """Makes this machine the lab's `role` (`name` is the node's for a node); returns what changed.
    `code_changed`: the project was installed anew (provision.sh says so), so the daemons that run its code
    (the ones started by this interpreter's launchers) restart, as do those whose peer binary was replaced."""
    if role not in ROLES:
        raise LabError(f"role {role!r}: one of {', '.join(ROLES)}")
    lab = Lab.load(config)
    lab_dir = config.parent
    if role == "node":
        lab.node(name)  # names the nodes if it is not one
    if lab.kubeadm is not None:
        return _apply_kubeadm(lab, role, name, lab_dir, system, layout, ready_timeout, code_changed)
    replaced: set[str] = set()  # programs whose file changed
    for peer in CONTROL_PLANE_PEERS if role == "control-plane" else NODE_PEERS:
        source = lab_dir / "bin" / peer
        if not source.is_file():
            raise LabError(f"{source} is missing: `lab.py prepare` copies the peers there")
        if system.copy(source, components.PEERS / peer):
            replaced.add(str(components.PEERS / peer))
    if code_changed:
        replaced |= {str(Path(sys.executable).with_name(n)) for n in ("pyruntime-cri", "pykubelet")}
    system.symlink(layout.kubectl_link, components.PEERS / "kubectl")
    if role == "control-plane":
        units = _control_plane_files(lab, lab_dir, layout, system)
    else:
        units = _node_files(lab, name, lab_dir, layout, system)
    _routes(lab, None if role == "control-plane" else name, system)
    _units([(u, changed or u.argv[0] in replaced) for u, changed in units], layout, system)
    if role == "control-plane":
        _api_objects(lab, layout, system, ready_timeout)
    return system.changes


def _apply_kubeadm(lab: Lab, role: str, name: str, lab_dir: Path, system: System, layout: Layout,
                   ready_timeout: float, code_changed: bool) -> list[str]:
    """A VM of a kubeadm lab (lab_kubeadm.py): the node's runtime, CNI and kernel as any lab node's; the kubelet
    as kubeadm's packaging installs it; then `kubeadm init` (the control plane) or `kubeadm join` (a node),
    once: a VM kubeadm has made keeps what it made. The control plane then gives every Node its lab.json
    CIDR."""
    lab_node = lab.control_plane_node if role == "control-plane" else lab.node(name)
    assert lab_node is not None and lab.kubeadm is not None  # a kubeadm lab's control plane is a node
    for peer in KUBEADM_PEERS:
        source = lab_dir / "bin" / peer
        if not source.is_file():
            raise LabError(f"{source} is missing: `lab.py prepare` copies the peers there")
        system.copy(source, components.PEERS / peer)
    system.symlink(layout.kubectl_link, components.PEERS / "kubectl")
    node = Node(lab_node.name, lab_node.ip, layout.state / "nodes" / lab_node.name, layout.run / lab_node.name)
    _node_system(lab, node, lab_node.pod_cidr, layout, system)
    runtime = runtime_unit(node, layout, "--cgroup-driver", "systemd")
    system.write(layout.kubelet_binary,
                 lab_kubeadm.kubelet_wrapper(str(Path(sys.executable).with_name("pykubelet"))).encode(), 0o755)
    kubelet_unit = layout.units / "kubelet.service"
    written = [system.write(kubelet_unit, lab_kubeadm.KUBELET_SERVICE.encode()),
               system.write(layout.units / "kubelet.service.d" / "10-kubeadm.conf",
                            lab_kubeadm.KUBEADM_DROP_IN.encode())]
    _routes(lab, lab_node.name, system)
    units = [runtime, *routes_unit(lab, lab_node.name)]
    _units([(u, code_changed and u is runtime) for u in units], layout, system)
    if any(written):
        system.run(["systemctl", "daemon-reload"])
    if system.run(["systemctl", "is-enabled", "--quiet", kubelet_unit.name], check=False).returncode != 0:
        system.run(["systemctl", "enable", "--quiet", kubelet_unit.name])  # kubeadm starts it
        system.changes.append(f"enabled {kubelet_unit.name}")
    config = layout.etc / "kubeadm.yaml"
    if role == "control-plane":
        text = lab_kubeadm.init_config(
            name=lab_node.name, address=lab_node.ip, port=lab.apiserver_port, cri_socket=node.endpoint,
            token=lab.kubeadm.token, service_cidr=lab.service_cidr, cluster_cidr=lab.cluster_cidr)
        done = layout.kubernetes / "admin.conf"
        argv = ["init", "--config", str(config)]
        for file in ("ca.crt", "ca.key"):  # the lab's CA, whose hash the nodes' joins name
            system.write(layout.kubernetes / "pki" / file, (lab_dir / "pki" / file).read_bytes(),
                         0o600 if file.endswith(".key") else 0o644)
    else:
        text = lab_kubeadm.join_config(
            name=lab_node.name, address=lab_node.ip, cri_socket=node.endpoint,
            server=f"{lab.control_plane_ip}:{lab.apiserver_port}", token=lab.kubeadm.token,
            ca_hash=lab.kubeadm.ca_cert_hash)
        done = layout.kubernetes / "kubelet.conf"
        argv = ["join", "--config", str(config)]
    system.write(config, text.encode(), 0o600)
    if not done.exists():
        result = system.run([str(components.PEERS / "kubeadm"), *argv], timeout=3600, check=False)
        if result.returncode != 0:
            raise LabError(f"kubeadm {argv[0]} exited {result.returncode}: {(result.stdout + result.stderr)[-3000:]}")
        system.changes.append(f"kubeadm {argv[0]}")
    if role == "control-plane":
        system.symlink(layout.root_kubeconfig, layout.kubernetes / "admin.conf")
        _api_objects(lab, layout, system, ready_timeout, layout.kubernetes / "super-admin.conf")
    return system.changes


def _install_pki(names: list[str], lab_dir: Path, layout: Layout, system: System) -> set[Path]:
    changed = set()
    for file in names:
        path = layout.pki / file
        if system.write(path, (lab_dir / "pki" / file).read_bytes(), 0o600 if file.endswith(".key") else 0o644):
            changed.add(path)
    return changed


def _pairs(*stems: str) -> list[str]:
    return [f"{s}.{e}" for s in stems for e in ("crt", "key")]


def _control_plane_files(lab: Lab, lab_dir: Path, layout: Layout, system: System) -> list[tuple[Unit, bool]]:
    users = list(pki.CONTROL_PLANE_USERS)
    files = ["ca.crt", "ca.key", "sa.key", "sa.pub", *_pairs("apiserver", "apiserver-kubelet-client", *users)]
    changed = _install_pki(files, lab_dir, layout, system)
    for stem, (user, _groups) in pki.CONTROL_PLANE_USERS.items():
        if system.write(layout.etc / f"{stem}.kubeconfig", kubeconfig(lab, layout.pki, stem, user), 0o600):
            changed.add(layout.etc / f"{stem}.kubeconfig")
    admin = kubeconfig(lab, layout.pki, "admin", pki.CONTROL_PLANE_USERS["admin"][0])
    system.write(layout.root_kubeconfig, admin, 0o600)
    return [(u, any(p in changed for p in u.inputs)) for u in control_plane_units(lab, layout) + routes_unit(lab, None)]


def _node_files(lab: Lab, name: str, lab_dir: Path, layout: Layout, system: System) -> list[tuple[Unit, bool]]:
    n = lab.node(name)
    node = layout.node(lab, name)
    client, serving = pki.kubelet_client(name), pki.kubelet_serving(name, n.ip)
    changed = _install_pki(["ca.crt", *_pairs(client.name, serving.name, "kube-proxy")], lab_dir, layout, system)
    for stem, user in ((client.name, client.common_name), ("kube-proxy", pki.CONTROL_PLANE_USERS["kube-proxy"][0])):
        if system.write(layout.etc / f"{stem}.kubeconfig", kubeconfig(lab, layout.pki, stem, user), 0o600):
            changed.add(layout.etc / f"{stem}.kubeconfig")
    if system.write(node.kubelet_config_file, json.dumps(node.kubelet_config(layout.pki), indent=2).encode()):
        changed.add(node.kubelet_config_file)
    _node_system(lab, node, n.pod_cidr, layout, system)
    return [(u, any(p in changed for p in u.inputs)) for u in node_units(lab, name, layout) + routes_unit(lab, name)]


def _node_system(lab: Lab, node: Node, pod_cidr: str, layout: Layout, system: System) -> None:
    """What any node of the lab needs of its VM: the CNI plugins and its pod network, the registry mirror,
    the kernel modules and knobs."""
    for plugin, text in launchers().items():
        system.write(node.cni_bin / plugin, text.encode(), 0o755)
    system.symlink(node.cni_bin / "loopback", node.cni_bin / "pyloopback")  # the CRI server's lo (node.py)
    # the runtime reads its CNI conf dir again when it changes: no restart
    system.write(node.network_file, node.network(pod_cidr).encode())
    layout.certs_d.mkdir(parents=True, exist_ok=True)
    for path, text in components.mirror_hosts(lab.registry_mirror or "-").items():
        if lab.registry_mirror:
            system.write(layout.certs_d / path, text.encode())
        else:
            system.remove(layout.certs_d / path)
    system.write(layout.modules_conf, "".join(f"{m}\n" for m in NODE_MODULES).encode())
    for module in NODE_MODULES:
        if not (layout.proc_sys / "net" / "bridge").is_dir():
            system.run(["modprobe", module])
            system.changes.append(f"loaded {module}")
    system.write(layout.sysctl_conf, "".join(f"{k} = {v}\n" for k, v in NODE_SYSCTLS.items()).encode())
    for key, value in NODE_SYSCTLS.items():
        system.sysctl(layout.proc_sys, key, value)


def _routes(lab: Lab, name: str | None, system: System) -> None:
    """A route to each other node's pod CIDR through that node (the control plane routes to every node's,
    so the apiserver reaches pods)."""
    for cidr, via in lab.pod_routes(name):
        shown = json.loads(system.run(["ip", "-j", "route", "show", "exact", cidr]).stdout or "[]")
        if [(r.get("dst"), r.get("gateway")) for r in shown] != [(cidr, via)]:
            system.run(["ip", "route", "replace", cidr, "via", via])
            system.changes.append(f"route {cidr} via {via}")


def _units(units: list[tuple[Unit, bool]], layout: Layout, system: System) -> None:
    """Writes the units; reloads systemd if one changed; enables each, restarts it if it or an input changed,
    starts it if it is not running."""
    written = {u.name: system.write(layout.units / u.file, u.render().encode()) for u, _ in units}
    if any(written.values()):
        system.run(["systemctl", "daemon-reload"])
    for unit, inputs_changed in units:
        if system.run(["systemctl", "is-enabled", "--quiet", unit.file], check=False).returncode != 0:
            system.run(["systemctl", "enable", "--quiet", unit.file])
            system.changes.append(f"enabled {unit.file}")
        active = system.run(["systemctl", "is-active", "--quiet", unit.file], check=False).returncode == 0
        if active and (written[unit.name] or inputs_changed):
            system.run(["systemctl", "restart", unit.file])
            system.changes.append(f"restarted {unit.file}")
        elif not active:
            system.run(["systemctl", "start", unit.file])
            system.changes.append(f"started {unit.file}")


def _api_objects(lab: Lab, layout: Layout, system: System, timeout: float, admin: Path | None = None) -> None:
    """Once the apiserver is ready: the Nodes with their pod CIDRs and kubeadm's RBAC (kubectl apply says
    `unchanged` for each object that is as given). `admin`: the kubeconfig (the lab's super-admin's)."""
    kubectl = [str(components.PEERS / "kubectl"), "--kubeconfig",
               str(admin or layout.etc / "super-admin.kubeconfig")]
    deadline = time.monotonic() + timeout
    while system.run([*kubectl, "get", "--raw", "/readyz"], check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise LabError(f"kube-apiserver not ready after {timeout:.0f} s: `journalctl -u pynode-kube-apiserver`")
        time.sleep(1)
    out = system.run([*kubectl, "apply", "-f", "-"],
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": node_objects(lab)})).stdout
    system.changes += [f"kubectl apply: {line}" for line in out.splitlines() if not line.endswith(" unchanged")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pynode_cluster.lab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply", help="make this VM the lab's ROLE (idempotent)")
    a.add_argument("role", choices=ROLES)
    a.add_argument("name", help="the node's name in lab.json (the control plane's is informational)")
    a.add_argument("--config", type=Path, required=True, help="lab.json; its directory holds bin/ and pki/")
    a.add_argument("--code-changed", action="store_true",
                   help="the project was just (re)installed: restart the daemons that run its code")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        changes = apply(args.role, args.name, args.config.resolve(), System(), code_changed=args.code_changed)
    except LabError as e:
        print(f"lab apply {args.role} {args.name}: {e}", file=sys.stderr)
        return 1
    for change in changes:
        print(f"  {change}")
    print(f"lab apply {args.role} {args.name}: {len(changes) or 'no'} change(s) in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
