"""The lab tier (make test-lab: one node VM, test_lab.py, then the project's root tests run inside it on cgroup
v2, test_lab_v2.py) prints what it measured; the whole lab in VMs (make test-lab-full: three of them, not for
CI) and the lab kubeadm makes (make test-lab-kubeadm: two) are collected only when asked for.

The node VM is the package's: brought up once, for test_lab.py and then test_lab_v2.py, and destroyed after
the last of them.
"""
from __future__ import annotations

import os

import pytest

from tests.lab.labkit import SUBNET, brought_up

NODE, NODE_IP = "node-1", f"{SUBNET}.21"
collect_ignore = ([] if os.environ.get("PYNODE_TEST_LAB_FULL") == "1" else ["test_lab_full.py"]) + \
    ([] if os.environ.get("PYNODE_TEST_LAB_KUBEADM") == "1" else ["test_lab_kubeadm.py"])


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    """node-1 joined to a control plane on this host: `vagrant up node-1 --no-provision` (the boot) and
    `vagrant up node-1` again, which provisions it (the provisioners run at every `up`: what finishes an
    interrupted one), each timed."""
    with brought_up(tmp_path_factory.mktemp("lab"), [(NODE, NODE_IP)], "host", with_tests=True) as lab:
        lab.timed("vagrant up (boot)", "up", NODE, "--no-provision")
        lab.timed("vagrant up (provisioning)", "up", NODE)
        yield lab


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.lab.labkit import GUEST_RESULTS, TIMES
    if TIMES:
        terminalreporter.section("lab times")
        for step, seconds in TIMES.items():
            terminalreporter.line(f"{step}: {seconds:.0f} s")
    if GUEST_RESULTS:
        terminalreporter.section("the root tests in the node VM (cgroup v2, systemd)")
        for line in GUEST_RESULTS:
            terminalreporter.line(line)
