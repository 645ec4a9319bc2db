"""pykubelet as kubeadm starts the stock kubelet: the KubeletConfiguration kubeadm writes to
/var/lib/kubelet/config.yaml (tests/unit/data/kubelet, with this machine's paths in it) and the flags of
kubeadm's systemd drop-in (kubeadm-flags.env: --container-runtime-endpoint, --node-ip, --node-labels,
--register-with-taints, --pod-infra-container-image), against a stock API server. The health check kubeadm
waits on answers on 127.0.0.1:10248, the Node carries the flags' labels and taints, its allocatable is less
systemReserved, and a Default-dnsPolicy pod's resolver is resolvConf's. On each CRI runtime of
tests/e2e/conftest.py. And the stock kubeadm's own printed KubeletConfiguration (the peer kubeadm) is the
hand-written one of tests/unit/data and is taken whole."""
from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from pykubelet import config
from pykubelet.api import quantity
from pynode_cluster.components import peer
from tests.kit.kubelet_node import BUSYBOX, Kubelet, apply, delete, get_pod, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-kubeadm"
NODE_IP = "10.201.0.43"
UNIT_DATA = Path(__file__).parents[1] / "unit" / "data" / "kubelet"
KUBEADM_CONFIG = UNIT_DATA / "kubeadm-var-lib-kubelet-config.yaml"
RESOLV_CONF = "nameserver 192.0.2.53\nsearch kubeadm.example\noptions ndots:2\n"
SYSTEM_RESERVED = {"cpu": "500m", "memory": "256Mi"}
LABELS = {"kubelet.kubernetes.io/pool": "e2e", "example.com/rack": "r1"}
TAINTS = [{"key": "example.com/dedicated", "value": "infra", "effect": "NoSchedule"},
          {"key": "example.com/e2e", "effect": "PreferNoSchedule"}]
KUBEADM_FLAGS = ["--node-labels=" + ",".join(f"{k}={v}" for k, v in LABELS.items()),
                 "--register-with-taints=" + ",".join(f"{t['key']}={t['value']}:{t['effect']}" if "value" in t
                                                      else f"{t['key']}:{t['effect']}" for t in TAINTS),
                 "--pod-infra-container-image=registry.k8s.io/pause:3.10"]


def kubeadm_config(cp, work: Path, runtime: str) -> dict:
    """kubeadm's file, its host paths made this test's: the CA is the control plane's, resolvConf a file of
    the test's, no static pods (/etc/kubernetes/manifests is the machine's); the endpoint comes by flag, as
    kubeadm-flags.env gives it; and systemReserved, which kubeadm leaves out. Its cgroupDriver (systemd) is
    kept where the runtime says which driver it uses (pyruntime-cri's RuntimeConfig: cgroupfs here, which
    the kubelet follows, as the stock one); containerd 1.6 has no RuntimeConfig, so there it is cgroupfs, as
    the runtime's here."""
    config = yaml.safe_load(KUBEADM_CONFIG.read_text())
    resolv = work / "resolv.conf"
    resolv.write_text(RESOLV_CONF)
    config["authentication"]["x509"]["clientCAFile"] = str(cp.ca.pair.cert)
    for name in ("apiVersion", "kind", "staticPodPath", "containerRuntimeEndpoint"):
        del config[name]
    assert config["cgroupDriver"] == "systemd"
    driver = {} if runtime == "pyruntime-cri" else {"cgroupDriver": "cgroupfs"}
    return config | {"resolvConf": str(resolv), "systemReserved": SYSTEM_RESERVED} | driver


@pytest.fixture(scope="module")
def kubelet(control_plane, cri, tmp_path_factory):
    """As tests/e2e/conftest.py's, with kubeadm's file and flags."""
    work = tmp_path_factory.mktemp("pykubelet")
    k = Kubelet.for_node(work, NODE, NODE_IP, cri.url, control_plane.node_kubeconfig(NODE),
                         kubeadm_config(control_plane, work, cri.name), *KUBEADM_FLAGS, f"--cert-dir={work / 'pki'}")
    k.start()
    wait_for("the node to register", lambda: not k.running() or control_plane.kubectl(
        "get", "node", NODE, check=False).returncode == 0)
    assert k.running(), k.log_tail()
    yield k
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
    k.stop()


def node(cp) -> dict:
    return json.loads(cp.kubectl("get", "node", NODE, "-o", "json").stdout)


def test_healthz_answers_ok_on_kubeadms_port(kubelet):
    def healthz() -> str | None:
        try:
            with urllib.request.urlopen("http://127.0.0.1:10248/healthz", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return None
    assert wait_for("healthz", healthz, timeout=30) == "ok"


def test_kubeadms_file_has_nothing_left_unimplemented(kubelet):
    assert "taken but not implemented by pykubelet" not in kubelet.log_tail(1_000_000)
    assert "--pod-infra-container-image registry.k8s.io/pause:3.10: ignored" in kubelet.log_tail(1_000_000)


def test_node_has_the_flags_labels_and_taints(control_plane, kubelet):
    n = node(control_plane)
    assert {k: n["metadata"]["labels"].get(k) for k in LABELS} == LABELS
    assert n["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    flags = [t for t in n["spec"]["taints"] if not t["key"].startswith("node.kubernetes.io/")]  # not-ready: Node's
    assert [(t["key"], t.get("value", ""), t["effect"]) for t in flags] == [
        (t["key"], t.get("value", ""), t["effect"]) for t in TAINTS]


def test_allocatable_is_less_system_reserved(control_plane, kubelet):
    status = wait_for("the node's status", lambda: node(control_plane).get("status", {}).get("allocatable"))
    capacity = node(control_plane)["status"]["capacity"]
    assert status["cpu"] == quantity.milli_decimal_si(quantity.milli_value(quantity.parse(capacity["cpu"])) - 500)
    memory = quantity.value(quantity.parse(capacity["memory"]))
    eviction = 100 << 20  # the default evictionHard memory.available: kubeadm's file leaves it out
    assert status["memory"] == quantity.binary_si(memory - (256 << 20) - eviction)


def test_a_default_dns_pod_has_resolv_confs_resolver(control_plane, kubelet, runtime, kubepods, tmp_path):
    tolerate = [{"key": t["key"], "operator": "Exists"} for t in TAINTS]
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "dns-default", {
        "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"]}, dnsPolicy="Default", tolerations=tolerate))
    try:
        pod = wait_pod(control_plane, "dns-default", "Running", lambda p: p["status"].get("phase") == "Running")
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        out, err, code = runtime.exec_sync(cid, ["cat", "/etc/resolv.conf"], 10)
        assert code == 0, err
        lines = [line for line in out.decode().splitlines() if line.strip()]
        assert sorted(lines) == sorted(RESOLV_CONF.splitlines()), out
    finally:
        delete(control_plane, "dns-default")
        wait_for("dns-default gone", lambda: not get_pod(control_plane, "dns-default"))


def kubeadm_printed_kubelet_configuration() -> dict:
    """The KubeletConfiguration document of the stock kubeadm's `config print init-defaults` (offline: it
    reads nothing of the machine but whether systemd-resolved runs)."""
    printed = subprocess.run([peer("kubeadm"), "config", "print", "init-defaults", "--component-configs",
                              "KubeletConfiguration"], capture_output=True, text=True, timeout=60, check=True).stdout
    docs = [d for d in yaml.safe_load_all(printed) if d and d.get("kind") == "KubeletConfiguration"]
    assert len(docs) == 1, printed
    return docs[0]


def test_kubeadms_printed_kubelet_configuration_is_taken_as_the_hand_written_file(tmp_path):
    """tests/unit/data/kubelet/kubeadm-print-init-defaults.yaml was written from kubeadm's source: it is what
    kubeadm prints, but for resolvConf, which kubeadm adds where systemd-resolved is active. pykubelet's loader
    takes kubeadm's own document whole, no field refused or left unimplemented (the start-up warning), to the
    same settings as the hand-written file; and with its CA path made this test's, build starts from it."""
    printed = kubeadm_printed_kubelet_configuration()
    machine = {"resolvConf": "/run/systemd/resolve/resolv.conf"}  # systemd-resolved active: kubeadm's Mutate
    hand = yaml.safe_load((UNIT_DATA / "kubeadm-print-init-defaults.yaml").read_text())
    assert {k: v for k, v in printed.items() if machine.get(k) != v} == hand
    path = tmp_path / "kubeadm-printed.yaml"
    path.write_text(yaml.safe_dump(printed))
    values = config.load_file(path)
    assert "not_implemented" not in values
    expected = config.load_file(UNIT_DATA / "kubeadm-print-init-defaults.yaml")
    if "resolvConf" in printed:
        expected["resolv_conf"] = Path(printed["resolvConf"])
    assert values == expected
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    printed["authentication"]["x509"]["clientCAFile"] = str(ca)
    path.write_text(yaml.safe_dump(printed))
    s = config.build({**dict.fromkeys(config.FLAGS), "hostname_override": NODE}, path)
    assert s.client_ca_file == ca and s.not_implemented == [] and s.cgroup_driver == "systemd"
