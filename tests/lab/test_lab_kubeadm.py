"""`make test-lab-kubeadm`: the lab kubeadm makes (`LAB_KUBEADM=1 vagrant up`), in VMs under QEMU software
emulation: the control-plane VM by `kubeadm init`, its control plane pykubelet's static pods on pyruntime-cri
(cgroup v2, systemd, the systemd cgroup driver); a node VM by `kubeadm join` with the lab's token; a deployment
on the node answering, and nothing left afterwards. Not part of CI (two VMs, 18 minutes here); `make
test-lab` runs one node VM there.
"""
from __future__ import annotations

import json
import time

import pytest

from pynode_cluster import hosts
from tests.kit.cluster_admin import http
from tests.kit.cri_images import HTTPD
from tests.lab.labkit import SUBNET, TIMES, Lab, brought_up, node_ready

NODES = [("node-1", f"{SUBNET}.21")]
pytestmark = [pytest.mark.timeout(5400),  # the first test's setup holds the whole bring-up
              pytest.mark.filterwarnings("ignore::ResourceWarning")]  # the registry, a daemon stopped by pid


@pytest.fixture(scope="module")
def lab_vms(tmp_path_factory):
    with brought_up(tmp_path_factory.mktemp("lab"), NODES, "vm", kubeadm=True) as lab_:
        lab_.timed("vagrant up cp (kubeadm init)", "up", "cp", timeout=3600)
        lab_.timed("vagrant up node-1 (kubeadm join)", "up", "node-1", timeout=3600)
        yield lab_


def test_kubeadm_made_both_nodes(lab_vms: Lab):
    """cp is kubeadm's control plane, node-1 joined; both run pykubelet on pyruntime-cri with systemd's
    cgroup driver, and are Ready on their lab.json pod CIDRs."""
    started = time.monotonic()
    for name in ("cp", "node-1"):
        node_ready(lab_vms, name, 600)
    TIMES["both nodes Ready after vagrant up"] = time.monotonic() - started
    items = json.loads(lab_vms.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    nodes = {n["metadata"]["name"]: n for n in items}
    assert "node-role.kubernetes.io/control-plane" in nodes["cp"]["metadata"]["labels"]
    for node in nodes.values():
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.0+pykubelet"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("pyruntime://")
    assert {name: n["spec"].get("podCIDR") for name, n in nodes.items()} == {
        "cp": "10.244.0.0/24", "node-1": "10.244.1.0/24"}
    flags = lab_vms.ssh("cp", "sudo cat /var/lib/kubelet/config.yaml")
    assert "cgroupDriver: systemd" in flags
    for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        pod = json.loads(lab_vms.kubectl("get", "pod", "-n", "kube-system", f"{component}-cp", "-o", "json").stdout)
        assert "kubernetes.io/config.mirror" in pod["metadata"]["annotations"]
        assert pod["status"]["phase"] == "Running"


def test_a_deployment_on_the_joined_node_answers(lab_vms: Lab):
    hosts.wait_for("the default ServiceAccount", lambda: lab_vms.kubectl(
        "get", "serviceaccount", "default", check=False).returncode == 0, 120)
    lab_vms.route("10.244.1.0/24", NODES[0][1])
    started = time.monotonic()
    lab_vms.kubectl("create", "deployment", "web", f"--image={HTTPD}", "--port=80")
    lab_vms.kubectl("rollout", "status", "deployment/web", "--timeout=600s", timeout=620)
    pod = json.loads(lab_vms.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"][0]
    assert pod["spec"]["nodeName"] == "node-1"  # cp keeps kubeadm's control-plane taint
    answer = hosts.wait_for("the pod's answer", lambda: http(f"http://{pod['status']['podIP']}/"), 120)
    assert "It works!" in answer
    TIMES["deployment to an answering pod"] = time.monotonic() - started
