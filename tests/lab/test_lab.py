"""`make test-lab`: a real `vagrant up` of one node VM of the lab (vagrant/Vagrantfile) under QEMU software
emulation, joined to a control plane on this host, a deployment on it, and nothing left afterwards.

The package's fixture (conftest.py) walks the lab as a user would (labkit.brought_up: the host checked, the
box, prepare, the network, the control plane and the registry on the host), then `vagrant up node-1
--no-provision` (the boot) and `vagrant up node-1` again, which provisions it, each timed. Times go to the
terminal summary.
"""
from __future__ import annotations

import json
import time

import pytest

from pynode_cluster import hosts
from tests.kit.cluster_admin import http
from tests.kit.cri_images import HTTPD
from tests.lab.conftest import NODE, NODE_IP
from tests.lab.labkit import TIMES, Lab, node_ready

pytestmark = [pytest.mark.timeout(3000),  # the first test's setup holds the whole bring-up
              # the registry's Popen (hosts.Daemons) is dropped while it runs: a daemon, stopped by pid
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def test_provisioned(lab: Lab):
    """The upload reached /opt/pynode-lab and provision.sh ran as ROLE NAME."""
    assert "pynode" in lab.ssh(NODE, "ls /opt/pynode-lab/wheelhouse")
    assert lab.ssh(NODE, "systemctl is-system-running || true").strip() in ("running", "degraded")


def test_node_ready_and_deployment(lab: Lab):
    started = time.monotonic()
    node_ready(lab, NODE, 300)
    TIMES["node Ready after vagrant up"] = time.monotonic() - started
    cidr = lab.kubectl("get", "node", NODE, "-o", "jsonpath={.spec.podCIDR}").stdout
    assert cidr, f"{NODE} has no pod CIDR"
    lab.route(cidr, NODE_IP)

    hosts.wait_for("the default ServiceAccount",
                   lambda: lab.kubectl("get", "serviceaccount", "default", check=False).returncode == 0, 120)
    started = time.monotonic()
    lab.kubectl("create", "deployment", "web", f"--image={HTTPD}", "--port=80")

    def running() -> dict | None:
        pods = json.loads(lab.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
        ready = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return ready[0] if ready else None

    pod = hosts.wait_for("the web pod Running", running, 600, interval=2)
    assert pod["spec"]["nodeName"] == NODE
    answer = hosts.wait_for("the pod's answer", lambda: http(f"http://{pod['status']['podIP']}/"), 120)
    assert "It works!" in answer
    TIMES["deployment to an answering pod"] = time.monotonic() - started


def test_provision_again_changes_nothing(lab: Lab):
    """A second `vagrant provision` leaves every service running as it was (same main pids)."""
    # less the ones that come and go with a login or a D-Bus call (vagrant ssh's user manager, hostnamed)
    snapshot = ("systemctl list-units --type=service --state=running --no-legend --plain | cut -d' ' -f1 | "
                "grep -vE '^(user@|systemd-(hostnamed|localed|timedated))' | xargs systemctl show -p Id,MainPID")
    before = lab.ssh(NODE, snapshot)
    lab.timed("vagrant provision again", "provision", NODE)
    assert lab.ssh(NODE, snapshot) == before
    assert lab.kubectl("get", "node", NODE, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
                       ).stdout == "True"
