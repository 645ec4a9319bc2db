"""The Vagrant lab's provisioning without VMs: the control plane on the host (`lab.py control-plane up`, bound to
the host side of a bridge of the test's own) and two nodes provisioned by `pynode_cluster.lab apply node`, each a
network namespace on that bridge. What apply writes is real (certificates, kubeconfigs, kubelet.json, the CNI
plugins and network, the systemd units); only systemd is stood in for: a unit's start runs its ExecStartPre and
ExecStart lines, as written in the unit file, as a daemon in the node's namespace (its `ip` commands go there
too). So the test checks the units' command lines bring up a node that joins, and the issue's cross-node test: a
deployment of 4 replicas spreads over both nodes, and a pod on node 1 reaches a pod on node 2 by IP and through
a Service. A second apply on a running node changes nothing. One node's kubelet registers before the control
plane gave its Node lab.json's CIDR (a parallel `vagrant up`): the CIDR is set when the control plane's
provisioning applies it.

Its names are its own (bridge pylab0, 10.205.0.0/24, namespaces pylab-*, nodes lab-*, pod CIDRs in 10.246/16),
so it runs beside `make cluster` and the integration tests. The nodes are torn down by `make cluster`'s own
down (pynode_cluster.cluster._down, pointed at this test's directories), the control plane by
`control-plane down`.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pynode_cluster import cluster, components, hosts, lab, lab_host
from tests.kit import cluster_registry
from tests.kit.cluster_admin import answers_from
from tests.kit.cri_images import HTTPD
from tests.kit.kubelet_node import wait_for

BRIDGE = "pylab0"
CP = "10.205.0.1"
NODES = [("lab-1", "10.205.0.21"), ("lab-2", "10.205.0.22")]
CLUSTER_CIDR = "10.246.0.0/16"

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="makes namespaces and links"),
              # the daemons' Popen objects go while the daemons run: detached on purpose
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


@dataclass
class NamespaceSystem(lab.System):
    """A node's machine as a network namespace: `ip` runs in it, systemd's start is a daemon in it."""
    netns: str = ""
    node: str = ""
    units: Path = Path()
    daemons: hosts.Daemons = field(default_factory=lambda: hosts.Daemons(Path()))
    logs: Path = Path()

    def run(self, argv, check=True, input=None, timeout=120):
        if argv[0] == "ip":
            argv = ["ip", "-n", self.netns, *argv[1:]]
        elif argv[0] == "systemctl":
            return self._systemctl(argv[1], argv[-1])
        return super().run(argv, check, input)

    def _systemctl(self, verb: str, unit: str) -> subprocess.CompletedProcess:
        name = f"{self.node}-{unit.removeprefix('pynode-').removesuffix('.service')}"  # make cluster's names
        rc = 0
        if verb == "is-active":  # a daemon that runs, a oneshot that ran (RemainAfterExit)
            rc = 0 if self.daemons.process(name) or (self.units / f"{unit}.ran").exists() else 3
        elif verb in ("start", "restart"):
            lines = (self.units / unit).read_text().splitlines()
            for pre in (x.removeprefix("ExecStartPre=") for x in lines if x.startswith("ExecStartPre=")):
                subprocess.run(_words(pre), check=True)
            starts = [_words(x.removeprefix("ExecStart=")) for x in lines if x.startswith("ExecStart=")]
            if "Type=oneshot" in lines:  # each command once, in the namespace
                for argv in starts:
                    subprocess.run(["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv], check=True)
                (self.units / f"{unit}.ran").touch()
                return subprocess.CompletedProcess([verb, unit], 0, "", "")
            (argv,) = starts
            self.daemons.stop(name)
            self.daemons.start(name, argv, self.logs / f"{name}.log", self.netns)
        return subprocess.CompletedProcess([verb, unit], rc, "", "")


def _words(line: str) -> list[str]:
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


@pytest.fixture
def lab_env(tmp_path: Path, monkeypatch):
    """lab.json and the PKI (prepare's), the bridge, make cluster's state dirs pointed here; torn down whatever
    happens."""
    config = lab.Lab.make(CP, NODES, cluster_cidr=CLUSTER_CIDR, registry_mirror=f"{CP}:{cluster_registry.PORT}")
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "lab.json").write_text(config.to_json())
    lab.prepare_pki(config, lab_dir / "pki")
    (lab_dir / "bin").mkdir()
    for name in lab.PEERS:  # the peers in place already: apply finds them equal and copies nothing
        (lab_dir / "bin" / name).symlink_to(components.PEERS / name)
    monkeypatch.setattr(cluster, "STATE", tmp_path / "state")
    monkeypatch.setattr(cluster, "RUN", tmp_path / "run")
    monkeypatch.setattr(lab_host, "STATE", tmp_path / "cp")
    record = cluster.Record(bridge=BRIDGE, netns=[f"pylab-{name}" for name, _ in NODES],
                            nodes=[cluster.NodeRecord(name, ip, f"pylab-{name}", "pykubelet", "pyruntime-cri")
                                   for name, ip in NODES])
    record.save()
    hosts.make_bridge(BRIDGE, f"{CP}/24")
    try:
        yield config, lab_dir
    finally:
        problems = cluster._down()  # the nodes: kubelets, pods, runtimes, cgroups, namespaces, the bridge
        down = lab_host.down()
        assert problems == [] and down == 0
        assert not lab_host.STATE.exists() and not cluster.STATE.exists()
        assert not Path(f"/sys/class/net/{BRIDGE}").exists()


def kubectl(*args: str, input: str | None = None, check: bool = True, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    return cluster.kubectl(*args, kubeconfig=lab_host.STATE / "admin.kubeconfig", input=input, check=check,
                           timeout=timeout)


def get(kind: str, *args: str) -> list[dict]:
    return json.loads(kubectl("get", kind, *args, "-o", "json").stdout).get("items", [])


@pytest.mark.timeout(600)
def test_two_provisioned_nodes_join_the_hosts_control_plane_and_their_pods_reach_each_other(lab_env, tmp_path):
    config, lab_dir = lab_env
    assert lab_host.up(lab_dir / "lab.json", CP) == 0
    assert "node/lab-2" in kubectl("get", "nodes", "-o", "name").stdout  # made with its pod CIDR, before its kubelet
    kubectl("delete", "node", "lab-2")  # its kubelet registers first, as in a parallel `vagrant up`
    registry_daemons = hosts.Daemons(cluster.STATE / "pids")  # cluster._down stops it with the rest
    host = cluster_registry.start(registry_daemons, "", CP, tmp_path / "registry", tmp_path / "certs.d",
                                  tmp_path / "registry.log")
    assert host == config.registry_mirror  # apply writes the nodes' certs.d for it

    for name, ip in NODES:
        netns = f"pylab-{name}"
        hosts.make_host(netns, BRIDGE, f"{ip}/24")
        hosts.sysctl(netns, "net.ipv4.ip_forward", "1")
        layout = node_layout(tmp_path, name)
        (tmp_path / "logs").mkdir(exist_ok=True)
        system = NamespaceSystem(netns=netns, node=name, units=layout.units,
                                 daemons=hosts.Daemons(cluster.STATE / "pids"), logs=tmp_path / "logs")
        started = time.monotonic()
        changes = lab.apply("node", name, lab_dir / "lab.json", system, layout)
        print(f"apply node {name}: {len(changes)} changes in {time.monotonic() - started:.1f} s")
        assert "started pynode-pykubelet.service" in changes and "started pynode-routes.service" in changes
    started = time.monotonic()
    for name, _ip in NODES:
        wait_for(f"{name} Ready", lambda name=name: kubectl(
            "get", "node", name, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            check=False).stdout == "True", 90)
    print(f"both nodes Ready {time.monotonic() - started:.1f} s after their apply")
    assert not next(n for n in get("nodes") if n["metadata"]["name"] == "lab-2")["spec"].get("podCIDR")
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",  # the control plane's
                                                  "items": lab.node_objects(config)}))  # provisioning, later
    spec = {n["metadata"]["name"]: n["spec"].get("podCIDR") for n in get("nodes")}
    assert spec == {n.name: n.pod_cidr for n in config.nodes}  # lab.json's: the controller manager allocates none

    # provisioning a running node again changes nothing
    started = time.monotonic()
    again = NamespaceSystem(netns="pylab-lab-1", node="lab-1", units=node_layout(tmp_path, "lab-1").units,
                            daemons=hosts.Daemons(cluster.STATE / "pids"), logs=tmp_path / "logs")
    assert lab.apply("node", "lab-1", lab_dir / "lab.json", again, node_layout(tmp_path, "lab-1")) == []
    print(f"apply node lab-1 again: no change in {time.monotonic() - started:.2f} s")

    wait_for("the default ServiceAccount", lambda: kubectl("get", "serviceaccount", "default",
                                                           check=False).returncode == 0, 60)
    started = time.monotonic()
    kubectl("create", "deployment", "web", f"--image={HTTPD}", "--replicas=4")
    kubectl("rollout", "status", "deployment/web", "--timeout=180s", timeout=200)
    print(f"4 replicas available in {time.monotonic() - started:.1f} s")
    pods = get("pods", "-l", "app=web")
    assert {p["spec"]["nodeName"] for p in pods} == {"lab-1", "lab-2"}, "the 4 replicas spread over both nodes"
    kubectl("expose", "deployment", "web", "--port=80")
    service_ip = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)["spec"]["clusterIP"]
    on_2 = [p["status"]["podIP"] for p in pods if p["spec"]["nodeName"] == "lab-2"]
    assert all(ip.startswith("10.246.2.") for ip in on_2), on_2
    answers = answers_from(kubectl, "lab-1", [*on_2, service_ip])
    for target in [*on_2, service_ip]:
        assert f"ok {target}\n" in answers, answers


def node_layout(tmp_path: Path, name: str) -> lab.Layout:
    """A node's files where cluster._down looks for them (STATE/nodes/NAME, RUN/NAME), its /etc and systemd's
    directory under the test's."""
    etc = tmp_path / "etc" / name
    proc_sys = etc / "proc-sys"  # the knobs are the namespace's (set above), not the host's
    for knob in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
        (proc_sys / knob).parent.mkdir(parents=True, exist_ok=True)
        if not (proc_sys / knob).exists():
            (proc_sys / knob).write_text("0\n")
    return lab.Layout(etc=etc, state=cluster.STATE, run=cluster.RUN, units=etc / "systemd",
                      sysctl_conf=etc / "sysctl.conf", modules_conf=etc / "modules.conf", proc_sys=proc_sys,
                      root_kubeconfig=etc / "root-kubeconfig", kubectl_link=etc / "kubectl")
