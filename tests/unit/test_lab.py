"""The Vagrant lab's provisioning (pynode_cluster.lab): lab.json, the PKI made once and kept, the systemd units
(make cluster's command lines), and apply's idempotence against a fake of the system's commands."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from pynode_cluster import components, lab, lab_kubeadm, pki

CP = "10.205.0.1"
NODES = [("node-1", "10.205.0.21"), ("node-2", "10.205.0.22")]


@pytest.fixture
def peers(tmp_path: Path, monkeypatch) -> Path:
    """Stand-ins for the Go-built peers where components looks for them."""
    bin_dir = tmp_path / "peers"
    monkeypatch.setattr(components, "PEERS", bin_dir)
    bin_dir.mkdir()
    for name in lab.PEERS:
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))


# ---- lab.json ----

def test_each_node_gets_its_own_pod_cidr_and_lab_json_round_trips(tmp_path: Path) -> None:
    config = lab.Lab.make(CP, NODES)
    assert [(n.name, n.ip, n.pod_cidr) for n in config.nodes] == [
        ("node-1", "10.205.0.21", "10.244.1.0/24"), ("node-2", "10.205.0.22", "10.244.2.0/24")]
    path = tmp_path / "lab.json"
    path.write_text(config.to_json())
    assert lab.Lab.load(path) == config
    data = json.loads(path.read_text())
    assert data["control_plane"] == {"ip": CP} and data["service_cidr"] == "10.96.0.0/16"
    assert data["cluster_cidr"] == "10.244.0.0/16" and data["apiserver_port"] == 6443 and data["schema"] == 1
    assert config.server == "https://10.205.0.1:6443" and config.service_ip == "10.96.0.1"


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["nodes"][1].update(name="node-1"), r"nodes\[1\].name 'node-1' is also node-1's"),
    (lambda d: d["nodes"][0].update(ip="10.205.0.300"), r"nodes\[0\].ip '10.205.0.300': not an IPv4 address"),
    (lambda d: d["nodes"][0].update(pod_cidr="10.10.0.0/24"), r"nodes\[0\].pod_cidr 10.10.0.0/24 is not inside"),
    (lambda d: d["nodes"][1].update(pod_cidr="10.244.1.0/25"), r"nodes\[1\].pod_cidr 10.244.1.0/25 overlaps"),
    (lambda d: d["nodes"][0].update(ip=CP), r"nodes\[0\].ip 10.205.0.1 is the control plane's"),
    (lambda d: d["nodes"][0].update(name="Node_1"), r"nodes\[0\].name 'Node_1'"),
    (lambda d: d.update(apiserver_port="6443"), r"apiserver_port is '6443', not a int"),
    (lambda d: d.pop("nodes"), r"missing or malformed 'nodes'"),
    (lambda d: d.update(schema=2), r"schema is 2"),
    (lambda d: d.update(registry_mirror="http://x:5000"), r"registry_mirror 'http://x:5000': HOST:PORT"),
])
def test_a_wrong_lab_json_is_refused_naming_the_field(tmp_path: Path, change, message) -> None:
    data = json.loads(lab.Lab.make(CP, NODES).to_json())
    change(data)
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(data))
    with pytest.raises(lab.LabError, match=message):
        lab.Lab.load(path)


# ---- the PKI ----

def test_the_pki_is_made_once_and_names_the_addresses(tmp_path: Path) -> None:
    config = lab.Lab.make(CP, NODES)
    first = lab.prepare_pki(config, tmp_path / "pki")
    assert "ca" in first and "sa" in first and "kubelet-node-2-serving" in first
    files = {p.name: p.read_bytes() for p in (tmp_path / "pki").iterdir()}
    assert lab.prepare_pki(config, tmp_path / "pki") == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "pki").iterdir()} == files
    assert {CP, "10.96.0.1", "kubernetes.default.svc"} <= sans(tmp_path / "pki" / "apiserver.crt")
    assert sans(tmp_path / "pki" / "kubelet-node-1-serving.crt") == {"10.205.0.21", "node-1"}
    assert (tmp_path / "pki" / "ca.key").stat().st_mode & 0o777 == 0o600


def test_a_changed_address_reissues_only_what_names_it(tmp_path: Path) -> None:
    lab.prepare_pki(lab.Lab.make(CP, NODES), tmp_path / "pki")
    ca = (tmp_path / "pki" / "ca.crt").read_bytes()
    moved = lab.Lab.make(CP, [NODES[0], ("node-2", "10.205.0.32"), ("node-3", "10.205.0.33")])
    assert sorted(lab.prepare_pki(moved, tmp_path / "pki")) == [
        "kubelet-node-2-serving", "kubelet-node-3", "kubelet-node-3-serving"]
    assert (tmp_path / "pki" / "ca.crt").read_bytes() == ca
    assert sans(tmp_path / "pki" / "kubelet-node-2-serving.crt") == {"10.205.0.32", "node-2"}


def test_a_cert_of_another_ca_is_reissued(tmp_path: Path) -> None:
    pki.CA(tmp_path / "other").issue("admin", "kubernetes-admin", groups=("kubeadm:cluster-admins",))
    ca = pki.CA(tmp_path / "pki")
    (tmp_path / "pki" / "admin.crt").write_bytes((tmp_path / "other" / "admin.crt").read_bytes())
    (tmp_path / "pki" / "admin.key").write_bytes((tmp_path / "other" / "admin.key").read_bytes())
    cert = pki.Cert("admin", "kubernetes-admin", ("kubeadm:cluster-admins",))
    assert ca.ensure(cert) and not ca.ensure(cert)
    assert not pki.CA.load(tmp_path / "pki").ensure(cert)


# ---- the units ----

def exec_start(unit_text: str) -> list[str]:
    """ExecStart's words as systemd reads them (shlex's POSIX rules, then systemd's %% and $$)."""
    line = next(x for x in unit_text.splitlines() if x.startswith("ExecStart="))
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line.removeprefix("ExecStart="))]


def test_the_control_plane_units_run_make_clusters_command_lines(tmp_path: Path, peers: Path) -> None:
    config = lab.Lab.make(CP, NODES)
    layout = lab.Layout(etc=tmp_path / "etc", state=tmp_path / "state")
    units = lab.control_plane_units(config, layout)
    expected = components.control_plane_argvs(address=CP, port=6443, pki=tmp_path / "etc" / "pki",
                                               etcd_dir=tmp_path / "state" / "etcd", etcd_ports=(2379, 2380),
                                               kubeconfigs=tmp_path / "etc", allocate_node_cidrs=False)
    assert [u.name for u in units] == list(components.CONTROL_PLANE)
    for unit in units:
        assert exec_start(unit.render()) == expected[unit.name]
    apiserver = expected["kube-apiserver"]
    assert apiserver[apiserver.index("--advertise-address") + 1] == CP
    assert apiserver[apiserver.index("--bind-address") + 1] == CP
    cm = expected["kube-controller-manager"]
    # lab.json's CIDRs, never raced by an allocation
    assert "--allocate-node-cidrs=false" in cm and cm[cm.index("--cluster-cidr") + 1] == "10.244.0.0/16"


def test_the_node_units_run_make_clusters_command_lines(tmp_path: Path, peers: Path) -> None:
    config = lab.Lab.make(CP, NODES)
    layout = lab.Layout(etc=tmp_path / "etc", state=tmp_path / "state", run=tmp_path / "run")
    node = layout.node(config, "node-2")
    runtime, kubelet, proxy = lab.node_units(config, "node-2", layout)
    assert (runtime.file, kubelet.file, proxy.file) == (
        "pynode-pyruntime-cri.service", "pynode-pykubelet.service", "pynode-kube-proxy.service")
    assert exec_start(runtime.render()) == node.runtime_command(tmp_path / "etc" / "certs.d")
    assert exec_start(kubelet.render()) == node.kubelet_command(tmp_path / "etc" / "kubelet-node-2.kubeconfig")
    assert exec_start(proxy.render()) == components.kube_proxy_argv(
        kubeconfig=tmp_path / "etc" / "kube-proxy.kubeconfig", node="node-2")
    assert "--node-ip" in kubelet.argv and kubelet.argv[kubelet.argv.index("--node-ip") + 1] == "10.205.0.22"
    text = runtime.render()
    assert "KillMode=process" in text and "Delegate=yes" in text  # a runtime restart keeps the pods
    assert "After=network-online.target pynode-pyruntime-cri.service" in kubelet.render()


def test_the_routes_come_back_at_boot_through_a_oneshot_unit() -> None:
    config = lab.Lab.make(CP, NODES)
    (unit,) = lab.routes_unit(config, "node-1")
    text = unit.render()
    assert "Type=oneshot" in text and "RemainAfterExit=yes" in text and "Restart=" not in text
    assert "ExecStart=/bin/ip route replace 10.244.2.0/24 via 10.205.0.22" in text
    (control_plane,) = lab.routes_unit(config, None)
    assert [x for x in control_plane.render().splitlines() if x.startswith("ExecStart=")] == [
        "ExecStart=/bin/ip route replace 10.244.1.0/24 via 10.205.0.21",
        "ExecStart=/bin/ip route replace 10.244.2.0/24 via 10.205.0.22"]
    assert lab.routes_unit(lab.Lab.make(CP, NODES[:1]), "node-1") == []  # one node: nothing to route


def test_exec_start_quotes_what_systemd_would_split_or_expand() -> None:
    argv = ["/bin/x", "a b", "50%", "$HOME", 'say "hi"', "back\\slash", ""]
    unit = lab.Unit("x", argv, "x")
    assert exec_start(unit.render()) == argv
    assert '"a b" 50%% "$$HOME"' in unit.render()


# ---- apply, against a fake system ----

@dataclass
class FakeSystem(lab.System):
    """systemctl, ip and kubectl as state in memory; files are real (under the test's layout)."""
    enabled: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    routes: dict[str, str] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv, check=True, input=None, timeout=120):
        self.calls.append(argv)
        rc, out = 0, ""
        if argv[0] == "systemctl":
            verb, unit = argv[1], argv[-1]
            if verb == "is-enabled":
                rc = 0 if unit in self.enabled else 1
            elif verb == "is-active":
                rc = 0 if unit in self.active else 3
            elif verb == "enable":
                self.enabled.add(unit)
            elif verb in ("start", "restart"):
                self.active.add(unit)
        elif argv[:3] == ["ip", "-j", "route"]:
            dst = argv[-1]
            out = json.dumps([{"dst": dst, "gateway": self.routes[dst]}] if dst in self.routes else [])
        elif argv[:3] == ["ip", "route", "replace"]:
            self.routes[argv[3]] = argv[5]
        elif argv[0].endswith("kubectl") and "apply" in argv:
            lines = []
            for item in json.loads(input)["items"]:
                key, text = f"{item['kind'].lower()}/{item['metadata']['name']}", json.dumps(item, sort_keys=True)
                lines.append(f"{key} {'unchanged' if self.objects.get(key) == text else 'created'}")
                self.objects[key] = text
            out = "\n".join(lines) + "\n"
        return subprocess.CompletedProcess(argv, rc, out, "")

    def fresh(self) -> FakeSystem:
        """The same machine, for the next apply: its changes not yet made."""
        return replace(self, changes=[], calls=[])


@pytest.fixture
def lab_dir(tmp_path: Path) -> Path:
    """What prepare writes, less the wheels and debs apply does not read."""
    config = lab.Lab.make(CP, NODES)
    out = tmp_path / "lab"
    out.mkdir()
    (out / "lab.json").write_text(config.to_json())
    lab.prepare_pki(config, out / "pki")
    (out / "bin").mkdir()
    for name in lab.PEERS:
        (out / "bin" / name).write_text(f"#!/bin/sh\necho {name}\n")
    return out


@pytest.fixture
def layout(tmp_path: Path, monkeypatch) -> lab.Layout:
    monkeypatch.setattr(components, "PEERS", tmp_path / "opt" / "bin" / "kubernetes")
    proc_sys = tmp_path / "proc-sys"
    for knob in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
        (proc_sys / knob).parent.mkdir(parents=True, exist_ok=True)
        (proc_sys / knob).write_text("0\n")
    return lab.Layout(etc=tmp_path / "etc", state=tmp_path / "state", run=tmp_path / "run",
                      units=tmp_path / "units", sysctl_conf=tmp_path / "sysctl.d" / "90-pynode-lab.conf",
                      modules_conf=tmp_path / "modules-load.d" / "pynode-lab.conf", proc_sys=proc_sys,
                      root_kubeconfig=tmp_path / "root" / ".kube" / "config",
                      kubectl_link=tmp_path / "usr-local-bin" / "kubectl", kubernetes=tmp_path / "etc-kubernetes",
                      kubelet_binary=tmp_path / "usr-bin" / "kubelet")


def test_apply_node_then_again_changes_nothing(lab_dir: Path, layout: lab.Layout) -> None:
    system = FakeSystem()
    changes = lab.apply("node", "node-1", lab_dir / "lab.json", system, layout)
    units = {"pynode-pyruntime-cri.service", "pynode-pykubelet.service", "pynode-kube-proxy.service",
             "pynode-routes.service"}
    assert system.enabled == units and system.active == units
    assert system.routes == {"10.244.2.0/24": "10.205.0.22"}  # the other node's pods, not its own
    assert (layout.proc_sys / "net/ipv4/ip_forward").read_text() == "1"
    assert (layout.proc_sys / "net/bridge/bridge-nf-call-iptables").read_text() == "1"
    assert ["systemctl", "daemon-reload"] in system.calls
    assert not any("kubectl" in c[0] for c in system.calls)  # a node needs no apiserver to be provisioned
    assert "route 10.244.2.0/24 via 10.205.0.22" in changes
    node = layout.node(lab.Lab.load(lab_dir / "lab.json"), "node-1")
    network = json.loads(node.network_file.read_text())
    assert network["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}]]
    assert (layout.pki / "kubelet-node-1.key").stat().st_mode & 0o777 == 0o600
    assert not (layout.pki / "ca.key").exists() and not (layout.pki / "kubelet-node-2.crt").exists()
    kubeconfig = json.loads((layout.etc / "kubelet-node-1.kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://10.205.0.1:6443"
    assert (node.cni_bin / "pybridge").stat().st_mode & 0o111
    assert not list(layout.certs_d.iterdir())  # no mirror: images come from the registries their names say

    for peer in (lab_dir / "bin").iterdir():  # uploaded again, as Vagrant's file provisioner does: new mtimes
        os.utime(peer, (1e9, 1e9))
    again = system.fresh()
    assert lab.apply("node", "node-1", lab_dir / "lab.json", again, layout) == []
    assert not any(c[1] in ("daemon-reload", "restart", "start", "enable") for c in again.calls
                   if c[0] == "systemctl")
    assert not any(c[:3] == ["ip", "route", "replace"] for c in again.calls)


def test_apply_restarts_only_the_daemon_whose_file_changed(lab_dir: Path, layout: lab.Layout) -> None:
    system = FakeSystem()
    lab.apply("node", "node-1", lab_dir / "lab.json", system, layout)
    kubelet_json = layout.node(lab.Lab.load(lab_dir / "lab.json"), "node-1").kubelet_config_file
    kubelet_json.write_text("{}")  # someone edited it
    system.routes["10.244.2.0/24"] = "10.205.0.99"  # and a route went astray
    again = system.fresh()
    changes = lab.apply("node", "node-1", lab_dir / "lab.json", again, layout)
    assert changes == [f"wrote {kubelet_json}", "route 10.244.2.0/24 via 10.205.0.22",
                       "restarted pynode-pykubelet.service"]
    assert ["systemctl", "daemon-reload"] not in again.calls

    (lab_dir / "bin" / "kube-proxy").write_text("#!/bin/sh\necho a new kube-proxy\n")
    assert lab.apply("node", "node-1", lab_dir / "lab.json", system.fresh(), layout) == [
        f"installed {components.PEERS / 'kube-proxy'}", "restarted pynode-kube-proxy.service"]
    assert lab.apply("node", "node-1", lab_dir / "lab.json", system.fresh(), layout, code_changed=True) == [
        "restarted pynode-pyruntime-cri.service", "restarted pynode-pykubelet.service"]


def test_apply_control_plane_then_again_changes_nothing(lab_dir: Path, layout: lab.Layout) -> None:
    system = FakeSystem()
    changes = lab.apply("control-plane", "control-plane", lab_dir / "lab.json", system, layout)
    assert system.active == {f"pynode-{n}.service" for n in (*components.CONTROL_PLANE, "routes")}
    assert system.routes == {"10.244.1.0/24": "10.205.0.21", "10.244.2.0/24": "10.205.0.22"}
    assert "kubectl apply: node/node-1 created" in changes
    nodes = {k: json.loads(v) for k, v in system.objects.items() if k.startswith("node/")}
    assert nodes["node/node-2"]["spec"] == {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]}
    assert "clusterrolebinding/kubeadm:node-proxier" in system.objects
    assert (layout.pki / "ca.key").exists() and layout.root_kubeconfig.exists()
    assert not (layout.proc_sys / "net/ipv4/ip_forward").read_text().startswith("1")  # a node's knob
    assert lab.apply("control-plane", "control-plane", lab_dir / "lab.json", system.fresh(), layout) == []


def test_apply_names_what_is_wrong(lab_dir: Path, layout: lab.Layout) -> None:
    with pytest.raises(lab.LabError, match=r"node 'node-9' is not in lab.json's nodes \(node-1, node-2\)"):
        lab.apply("node", "node-9", lab_dir / "lab.json", FakeSystem(), layout)
    (lab_dir / "bin" / "kube-proxy").unlink()
    with pytest.raises(lab.LabError, match=r"bin/kube-proxy is missing"):
        lab.apply("node", "node-1", lab_dir / "lab.json", FakeSystem(), layout)


def test_the_lab_module_runs_without_the_test_extra() -> None:
    """The VMs install the wheel's dependencies only: psutil (the test extra) must not be needed."""
    code = "import sys; sys.modules['psutil'] = None; import pynode_cluster.lab"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_a_registry_mirror_goes_into_the_nodes_certs_d_and_out_again(lab_dir: Path, layout: lab.Layout) -> None:
    config = lab.Lab.load(lab_dir / "lab.json")
    (lab_dir / "lab.json").write_text(replace(config, registry_mirror="10.205.0.1:5000").to_json())
    system = FakeSystem()
    lab.apply("node", "node-1", lab_dir / "lab.json", system, layout)
    hosts_toml = (layout.certs_d / "registry.k8s.io" / "hosts.toml").read_text()
    assert 'server = "http://10.205.0.1:5000"' in hosts_toml and (layout.certs_d / "_default" / "hosts.toml").exists()
    assert lab.apply("node", "node-1", lab_dir / "lab.json", system.fresh(), layout) == []
    (lab_dir / "lab.json").write_text(config.to_json())
    changes = lab.apply("node", "node-1", lab_dir / "lab.json", system.fresh(), layout)
    assert f"removed {layout.certs_d / 'docker.io' / 'hosts.toml'}" in changes
    assert not list(layout.certs_d.rglob("*.toml"))


# ---- a kubeadm lab ----

def kubeadm_lab(lab_dir: Path) -> tuple[lab.Lab, lab.KubeadmJoin]:
    """lab.json of a kubeadm lab, as prepare --kubeadm writes it; and its join settings."""
    config = lab.Lab.load(lab_dir / "lab.json")
    join = lab.KubeadmJoin(lab_kubeadm.new_token(), lab_kubeadm.ca_cert_hash((lab_dir / "pki" / "ca.crt").read_bytes()))
    config = replace(config, kubeadm=join)
    (lab_dir / "lab.json").write_text(config.to_json())
    return config, join


def test_a_kubeadm_lab_json_round_trips_and_names_a_bad_token(lab_dir: Path) -> None:
    config, _ = kubeadm_lab(lab_dir)
    assert lab.Lab.load(lab_dir / "lab.json") == config
    assert config.control_plane_node == lab.LabNode("cp", CP, "10.244.0.0/24")
    assert config.pod_routes("node-1") == [("10.244.2.0/24", "10.205.0.22"), ("10.244.0.0/24", CP)]
    data = json.loads((lab_dir / "lab.json").read_text())
    data["kubeadm"]["token"] = "not-a-token"
    (lab_dir / "lab.json").write_text(json.dumps(data))
    with pytest.raises(lab.LabError, match=r"kubeadm.token: \[a-z0-9\]\{6\}"):
        lab.Lab.load(lab_dir / "lab.json")


class KubeadmSystem(FakeSystem):
    """kubeadm as kubeadm leaves a machine: init writes admin.conf, join kubelet.conf."""
    kubernetes: Path = Path()

    def run(self, argv, check=True, input=None, timeout=120):
        if argv[0].endswith("kubeadm"):
            self.calls.append(argv)
            (self.kubernetes / ("admin.conf" if argv[1] == "init" else "kubelet.conf")).write_text("x")
            return subprocess.CompletedProcess(argv, 0, "", "")
        return super().run(argv, check, input, timeout)


def test_apply_kubeadm_node_joins_once_with_kubeadms_kubelet_unit(lab_dir: Path, layout: lab.Layout) -> None:
    """A node VM of a kubeadm lab: the runtime on the systemd driver, the packaged kubelet.service and its
    drop-in running pykubelet as /usr/bin/kubelet, enabled for kubeadm to start; `kubeadm join` with the
    lab's token and CA hash, once."""
    _, join_settings = kubeadm_lab(lab_dir)
    system = KubeadmSystem()
    system.kubernetes = layout.kubernetes
    layout.kubernetes.mkdir()
    lab.apply("node", "node-1", lab_dir / "lab.json", system, layout)
    assert system.enabled == {"pynode-pyruntime-cri.service", "pynode-routes.service", "kubelet.service"}
    assert "kubelet.service" not in system.active  # kubeadm starts it
    runtime = exec_start((layout.units / "pynode-pyruntime-cri.service").read_text())
    assert runtime[-2:] == ["--cgroup-driver", "systemd"]
    drop_in = (layout.units / "kubelet.service.d" / "10-kubeadm.conf").read_text()
    assert "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env" in drop_in
    assert f"exec {Path(sys.executable).with_name('pykubelet')} " in layout.kubelet_binary.read_text()
    joins = [c for c in system.calls if c[0].endswith("kubeadm")]
    assert [c[1] for c in joins] == ["join"]
    join = yaml.safe_load((layout.etc / "kubeadm.yaml").read_text())
    assert join["discovery"]["bootstrapToken"] == {
        "apiServerEndpoint": f"{CP}:6443", "token": join_settings.token, "caCertHashes": [join_settings.ca_cert_hash]}
    assert join["nodeRegistration"]["kubeletExtraArgs"] == [{"name": "node-ip", "value": "10.205.0.21"}]
    assert system.routes == {"10.244.2.0/24": "10.205.0.22", "10.244.0.0/24": CP}
    again = system.fresh()
    lab.apply("node", "node-1", lab_dir / "lab.json", again, layout)
    assert not [c for c in again.calls if c[0].endswith("kubeadm")] and again.changes == []


def test_apply_kubeadm_control_plane_inits_with_the_labs_ca_and_gives_every_node_its_cidr(
        lab_dir: Path, layout: lab.Layout) -> None:
    _, join_settings = kubeadm_lab(lab_dir)
    system = KubeadmSystem()
    system.kubernetes = layout.kubernetes
    lab.apply("control-plane", "cp", lab_dir / "lab.json", system, layout, ready_timeout=1)
    assert [c[1] for c in system.calls if c[0].endswith("kubeadm")] == ["init"]
    assert (layout.kubernetes / "pki" / "ca.crt").read_bytes() == (lab_dir / "pki" / "ca.crt").read_bytes()
    assert (layout.kubernetes / "pki" / "ca.key").stat().st_mode & 0o777 == 0o600
    docs = {d["kind"]: d for d in yaml.safe_load_all((layout.etc / "kubeadm.yaml").read_text())}
    assert docs["InitConfiguration"]["bootstrapTokens"] == [{"token": join_settings.token, "ttl": "0s"}]
    assert "podSubnet" not in docs["ClusterConfiguration"]["networking"]
    assert {k: json.loads(v)["spec"]["podCIDR"] for k, v in system.objects.items() if k.startswith("node/")} == {
        "node/node-1": "10.244.1.0/24", "node/node-2": "10.244.2.0/24", "node/cp": "10.244.0.0/24"}
    assert not any(k.startswith("clusterrole") for k in system.objects)  # kubeadm's RBAC is kubeadm's
    assert os.readlink(layout.root_kubeconfig) == str(layout.kubernetes / "admin.conf")
