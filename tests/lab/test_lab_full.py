"""`make test-lab-full`: the whole lab of vagrant/Vagrantfile in VMs under QEMU software emulation, brought up
by `vagrant up --no-parallel` as `make lab-up` does: the control-plane VM and two node VMs, then the issue's
cross-node check (a deployment of 4 replicas spreads over both nodes; a pod on node-1 reaches a pod on node-2
by IP and through a Service), and nothing left afterwards. Not part of CI: it takes three VMs' memory (about
7.5 GiB) and a quarter of an hour here; `make test-lab` runs one node VM there.
"""
from __future__ import annotations

import json
import time

import pytest

from pynode_cluster import hosts, lab
from tests.kit.cluster_admin import answers_from
from tests.kit.cri_images import HTTPD
from tests.lab.labkit import LAB_DIR, SUBNET, TIMES, Lab, brought_up, node_ready

NODES = [("node-1", f"{SUBNET}.21"), ("node-2", f"{SUBNET}.22")]
pytestmark = [pytest.mark.timeout(5400),  # the first test's setup holds the whole bring-up
              pytest.mark.filterwarnings("ignore::ResourceWarning")]  # the registry, a daemon stopped by pid


@pytest.fixture(scope="module")
def lab_vms(tmp_path_factory):
    with brought_up(tmp_path_factory.mktemp("lab"), NODES, "vm") as lab_:
        lab_.timed("vagrant up --no-parallel (cp, node-1, node-2)", "up", "--no-parallel", timeout=3600)
        yield lab_


def test_both_nodes_ready_with_their_lab_json_cidrs(lab_vms: Lab):
    started = time.monotonic()
    for name, _ip in NODES:
        node_ready(lab_vms, name, 300)
    TIMES["both nodes Ready after vagrant up"] = time.monotonic() - started
    nodes = json.loads(lab_vms.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    config = lab.Lab.load(LAB_DIR / "lab.json")
    assert {n["metadata"]["name"]: n["spec"].get("podCIDR") for n in nodes} == \
        {n.name: n.pod_cidr for n in config.nodes}


def test_replicas_spread_and_pods_reach_each_other_across_nodes(lab_vms: Lab):
    kubectl = lab_vms.kubectl
    hosts.wait_for("the default ServiceAccount",
                   lambda: kubectl("get", "serviceaccount", "default", check=False).returncode == 0, 120)
    started = time.monotonic()
    kubectl("create", "deployment", "web", f"--image={HTTPD}", "--replicas=4")
    kubectl("rollout", "status", "deployment/web", "--timeout=600s", timeout=620)
    TIMES["4 replicas available"] = time.monotonic() - started
    pods = json.loads(kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {"node-1", "node-2"}, "the 4 replicas spread over both nodes"
    kubectl("expose", "deployment", "web", "--port=80")
    service_ip = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)["spec"]["clusterIP"]
    on_2 = [p["status"]["podIP"] for p in pods if p["spec"]["nodeName"] == "node-2"]
    node_2_cidr = lab.Lab.load(LAB_DIR / "lab.json").node("node-2").pod_cidr
    assert all(ip.startswith(node_2_cidr.rsplit(".", 1)[0] + ".") for ip in on_2), (on_2, node_2_cidr)
    started = time.monotonic()
    answers = answers_from(kubectl, "node-1", [*on_2, service_ip], timeout=300)
    TIMES["a pod on node-1 asked node-2's pods and the Service"] = time.monotonic() - started
    for target in [*on_2, service_ip]:
        assert f"ok {target}\n" in answers, answers
