"""`make test-lab`, its second part: the runtime's and the CRI server's isolation and resource tests on a pure
cgroup v2 host with systemd as PID 1, which this project's machine is not (hybrid: v1 controllers, a cgroup2
mount with hugetlb only) and the hosts users have are.

The host is the node VM of test_lab.py (the package's fixture in conftest.py: booted once), a stock Debian 12
booting the unified hierarchy; the first test asserts that it is one. The second drives the node's own
pyruntime-cri with crictl, as a kubelet would, and reads the container's limits in its cgroup v2 files while a
root container with CAP_MKNOD fails to read the VM's disk through a node it makes. The third uploads the
checkout's tests/ and the static and dynamic busyboxes the root tests build their rootfs and images from,
installs pytest from the lab's offline wheelhouse into the node's venv and the packages the CRI tests' fixtures
run (the test registry, skopeo, gcc, containerd) from its offline Debian repository (both from prepare
--with-tests), and runs GUEST_SUITE there as root under the leak check, as `make test` runs it here: every test
must pass, and only the tests of GUEST_SKIPS, for the reason given there, may skip. The guest's counts and skips
go to the terminal summary.

The pykubelet and kube-proxy of the node are stopped first (their pods keep running), and so are systemd's
timers: the leak check walks the whole cgroup tree and the iptables rules, and a timer's service or a
kubelet's pod coming or going during a test would be named as that test's leak.
"""
from __future__ import annotations

import io
import json
import shlex
import tarfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

from pynode_cluster import lab as lab_config
from tests.kit.busybox import static_busybox
from tests.kit.cri_images import BUSYBOX, DYNAMIC_ROOT, dynamic_busybox
from tests.lab.conftest import NODE
from tests.lab.labkit import CHECKOUT, GUEST_RESULTS, TIMES, Lab

pytestmark = [pytest.mark.timeout(3000),  # the package's bring-up, when this module runs alone, and the suite
              pytest.mark.filterwarnings("ignore::ResourceWarning")]  # as test_lab.py's: the registry's Popen

GUEST_SUITE = (  # relative to the checkout: what runs the runtime on the host's cgroups, and the attacks on it
    "tests/integration/test_cgroups_v2_kernel.py",  # freezer, kill, events on the real v2 kernel
    "tests/integration/test_devices_v2.py",  # issue 22 item 1: the eBPF device program, a CAP_MKNOD root container
    "tests/integration/test_runtime_isolation.py",  # memory (OOM), pids, cpu, cpuset, devices, namespaces
    "tests/integration/test_runtime_lifecycle.py",  # pause/resume (freezer), exec into the cgroup, update, stats
    "tests/integration/test_runtime_security.py",  # the runtime's attack tests (/proc/self/exe, fds, symlinks)
    "tests/integration/test_runtime_validation.py",  # cgroupsPath forms, and a refused spec leaves no cgroup
    "tests/integration/test_runtime_api.py",
    "tests/integration/test_capabilities.py",
    "tests/integration/test_seccomp.py",
    "tests/integration/test_cri_stats.py",  # the CRI's CPU and memory stats, read from the v2 files
    "tests/integration/test_cri_ocispec_run.py",  # the CRI's OCI spec (resources, cgroup parent) run for real
    "tests/integration/test_cri_pause_confined.py",  # a ptrace-capable root container vs the shared-pid pause
    "tests/integration/test_state_modes.py",  # the CRI socket 0660, its state closed under umask 000 and 077
    "tests/integration/test_cni_helper.py",  # a hostNetwork root pod vs the resident CNI helper's socket
    "tests/integration/test_eviction_pids.py",  # pid pressure: the pod that forks, counted in its v2 cgroup
    "tests/integration/test_cni_bridge.py::test_vlan",  # the bridge's VLAN filtering, which this VM's kernel lacks
    "tests/integration/test_cri_crictl.py",  # the CRI through crictl: limits in the pod's cgroups, exec, logs
    "tests/integration/test_cri_registry_creds.py",  # the node's registry credentials reach no other registry
    "tests/integration/test_systemd_cgroup.py",  # issue 24 item 4: containers as transient scopes, the slices
    # pyruntime-cri with cgroup_driver systemd and containerd with SystemdCgroup: a pod's scopes, limits, and
    # pykubelet's slices (cgroupDriver systemd) holding them on each
    "tests/integration/test_cri_systemd.py",
    # issue 24 item 8: graceful node shutdown against the real logind, on pyruntime-cri and on containerd
    "tests/integration/test_node_shutdown.py",
)
GUEST_SKIPS = {  # test id (less its parameters) -> why it cannot run on a pure v2 host
    "tests/integration/test_devices_v2.py::test_program_answers_as_the_v1_devices_cgroup":
        "the differential test compares the program with the v1 devices cgroup, which a pure v2 host has not "
        "(it runs on the hybrid host in make test)",
    "tests/integration/test_systemd_cgroup.py::test_the_driver_is_refused_with_its_reason_where_it_cannot_work":
        "the refusal is for a host without systemd or cgroup v2; this one has both (it runs on the hybrid host)",
}
GUEST_DIR = "/root/pynode-suite"  # the checkout's tests/ and setup.cfg (pytest's config), .venv the node's venv
GUEST_VENV = "/opt/pynode/venv"  # provision.sh's
# at this venv's versions, which `prepare --with-tests` put into the wheelhouse (lab.py's TEST_DISTRIBUTIONS)
GUEST_TEST_DISTRIBUTIONS = ("pytest", "pytest-timeout")
GUEST_APT = "/var/lib/pynode-lab/apt-tests"  # apt's lists and cache for the test packages (provision.sh's way)
# debs/tests.txt's packages (lab.py's TEST_PACKAGES) from the lab's repository alone, no service started by
# their installation (docker-registry's would listen on :5000, containerd's would be a system containerd the
# tests' own ones would meet in /run/containerd), dpkg without fsync (an emulated disk)
INSTALL_TEST_PACKAGES = f"""
mkdir -p {GUEST_APT}/lists/partial {GUEST_APT}/cache/archives/partial {GUEST_APT}/sources.list.d
echo 'deb [trusted=yes] file:/opt/pynode-lab/debs ./' > {GUEST_APT}/sources.list
set -- -o Dir::Etc::SourceList={GUEST_APT}/sources.list -o Dir::Etc::SourceParts={GUEST_APT}/sources.list.d \
    -o Dir::State::Lists={GUEST_APT}/lists -o Dir::Cache={GUEST_APT}/cache -o APT::Get::List-Cleanup=false \
    -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-unsafe-io
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get "$@" -q update >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get "$@" -q -y --no-install-recommends \
    install $(cat /opt/pynode-lab/debs/tests.txt) >/dev/null
"""
SOCKET = f"unix://{lab_config.Layout().run}/{NODE}/cri.sock"  # the node's pyruntime-cri (pynode_cluster.node)
CRICTL = f"/opt/pynode-lab/bin/crictl --runtime-endpoint {SOCKET} --image-endpoint {SOCKET} --timeout 120s"


def root(lab: Lab, script: str, timeout: float = 300) -> str:
    return lab.ssh(NODE, f"sudo sh -euc {shlex.quote(script)}", timeout=timeout)


@pytest.fixture(scope="module")
def quiet_node(lab: Lab) -> Lab:
    root(lab, "systemctl stop pynode-pykubelet.service pynode-kube-proxy.service timers.target")
    return lab


def test_the_vm_is_pure_cgroup_v2_with_systemd_as_pid_1(quiet_node: Lab):
    fs, init, controllers = root(quiet_node, "stat -fc %T /sys/fs/cgroup; cat /proc/1/comm; "
                                             "cat /sys/fs/cgroup/cgroup.subtree_control").splitlines()
    assert (fs, init) == ("cgroup2fs", "systemd")
    assert {"cpu", "cpuset", "io", "memory", "pids"} <= set(controllers.split())
    assert "cgroup" not in root(quiet_node, "cut -d' ' -f3 /proc/mounts").split(), "a v1 hierarchy beside it"


def test_a_pod_through_pyruntime_cri_gets_its_limits_and_no_disk(quiet_node: Lab, tmp_path: Path):
    """crictl runp/create/start on the node's pyruntime-cri: the container's memory and CPU limits are in its
    cgroup v2 files, its pod's cgroup is the parent it was given, and root with CAP_MKNOD (the CRI's default
    capabilities) can make a node of the VM's disk but not read it."""
    lab = quiet_node
    pod = {"metadata": {"name": "v2-limits", "namespace": "lab-v2", "uid": "lab-v2-limits"},
           "log_directory": "/tmp/lab-v2-pod", "linux": {"cgroup_parent": "/lab-v2/podlimits"}}
    container = {"metadata": {"name": "limited"}, "image": {"image": BUSYBOX},
                 "command": ["sh", "-c", "exec sleep 3600"], "log_path": "limited.log",
                 "linux": {"resources": {"memory_limit_in_bytes": 64 << 20, "cpu_period": 100000,
                                         "cpu_quota": 50000, "cpu_shares": 512}}}
    root(lab, f"mkdir -p /tmp/lab-v2 && echo {shlex.quote(json.dumps(pod))} > /tmp/lab-v2/pod.json && "
              f"echo {shlex.quote(json.dumps(container))} > /tmp/lab-v2/container.json")
    started = time.monotonic()
    root(lab, f"{CRICTL} pull {BUSYBOX} >/dev/null", timeout=600)
    pod_id = root(lab, f"{CRICTL} runp /tmp/lab-v2/pod.json", timeout=600).strip()
    try:
        cid = root(lab, f"{CRICTL} create {pod_id} /tmp/lab-v2/container.json /tmp/lab-v2/pod.json",
                   timeout=600).strip()
        root(lab, f"{CRICTL} start {cid}", timeout=600)
        pid = json.loads(root(lab, f"{CRICTL} inspect {cid}"))["info"]["pid"]
        cgroup = root(lab, f"cat /proc/{pid}/cgroup").strip()
        assert cgroup.startswith("0::/lab-v2/podlimits/") and "\n" not in cgroup, cgroup
        where = "/sys/fs/cgroup" + cgroup[3:]
        memory, cpu, weight = root(lab, f"cat {where}/memory.max {where}/cpu.max {where}/cpu.weight").splitlines()
        assert (memory, cpu) == (str(64 << 20), "50000 100000")
        assert weight == str(1 + ((512 - 2) * 9999) // 262142)  # shares to weight as runc converts them
        disk = root(lab, "cat /sys/block/vda/dev").strip().replace(":", " ")
        attack = root(lab, f"{CRICTL} exec {cid} sh -c 'mknod /tmp/disk b {disk} && echo made; "
                           "head -c 16 /tmp/disk && echo read; head -c 4 /dev/zero | wc -c' 2>&1 || true",
                      timeout=600)
        assert "made" in attack and "Operation not permitted" in attack and "read" not in attack.split(), attack
        assert attack.split()[-1] == "4", attack
    finally:  # the pod's cgroup parent is the kubelet's to remove, here the test's
        root(lab, f"{CRICTL} stopp {pod_id} && {CRICTL} rmp {pod_id} && "
                  "rmdir /sys/fs/cgroup/lab-v2/podlimits /sys/fs/cgroup/lab-v2 && rm -r /tmp/lab-v2", timeout=600)
    TIMES["a pod through pyruntime-cri on the VM"] = time.monotonic() - started


def _suite_tarball() -> bytes:
    """The checkout's tests/ (no caches) and setup.cfg, the static busybox, and the dynamic one's extracted
    package (the CRI images' base: the VM has no package list to download it with), as a gzipped tar."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(CHECKOUT / "tests", "tests", filter=lambda i: None if "__pycache__" in i.name else i)
        tar.add(CHECKOUT / "setup.cfg", "setup.cfg")
        tar.add(static_busybox(), "busybox")
        dynamic_busybox()
        tar.add(DYNAMIC_ROOT, "busybox-dynamic")
    return out.getvalue()


def test_the_root_tests_pass_on_cgroup_v2(quiet_node: Lab, tmp_path: Path):
    lab = quiet_node
    started = time.monotonic()
    tarball = tmp_path / "suite.tar.gz"
    tarball.write_bytes(_suite_tarball())
    lab.vagrant("upload", str(tarball), "/tmp/pynode-suite.tar.gz", NODE, timeout=600)
    pins = " ".join(f"{d}=={metadata.version(d)}" for d in GUEST_TEST_DISTRIBUTIONS)
    root(lab, f"rm -rf {GUEST_DIR} && mkdir -p {GUEST_DIR} && tar -xzf /tmp/pynode-suite.tar.gz -C {GUEST_DIR} && "
              f"ln -s {GUEST_VENV} {GUEST_DIR}/.venv && "
              f"install -D -m 0755 {GUEST_DIR}/busybox /root/.cache/pynode/busybox-static/bin/busybox && "
              "install -D -m 0755 /opt/pynode-lab/bin/crictl /root/.cache/pynode/bin/crictl && "
              f"rm -rf /root/.cache/pynode/busybox-dynamic && mv {GUEST_DIR}/busybox-dynamic /root/.cache/pynode/ && "
              # the first `ip netns add` on a machine mounts /run/netns: the host's doing, not a test's leak
              "ip netns add pynode-lab-v2 && ip netns del pynode-lab-v2 && "
              f"{GUEST_VENV}/bin/pip install -q --disable-pip-version-check --no-index "
              f"--find-links /opt/pynode-lab/wheelhouse {pins}", timeout=900)
    TIMES["the suite uploaded and pytest installed in the VM"] = time.monotonic() - started
    started = time.monotonic()
    root(lab, INSTALL_TEST_PACKAGES, timeout=1200)
    TIMES["the CRI tests' packages installed in the VM"] = time.monotonic() - started
    started = time.monotonic()
    # its exit status too: a leak the session's check finds (tests/conftest.py) is in no test's result
    status = root(lab, f"cd {GUEST_DIR} && rc=0 && PYTHONDONTWRITEBYTECODE=1 .venv/bin/python -m pytest "
                       f"-p no:cacheprovider -ra --junitxml={GUEST_DIR}/results.xml {' '.join(GUEST_SUITE)} "
                       f">{GUEST_DIR}/pytest.log 2>&1 || rc=$? && echo $rc", timeout=2700).strip()
    TIMES["the root tests in the VM"] = time.monotonic() - started
    log = root(lab, f"cat {GUEST_DIR}/pytest.log")
    results = ET.fromstring(root(lab, f"cat {GUEST_DIR}/results.xml"))
    suite = results if results.tag == "testsuite" else results.find("testsuite")
    assert suite is not None, log[-5000:]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    skipped, unexpected = [], []
    for case in suite.iter("testcase"):
        skip = case.find("skipped")
        if skip is None:
            continue
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '').split('[')[0]}"
        skipped.append(f"{test}: {skip.get('message', '')}")
        if test not in GUEST_SKIPS:
            unexpected.append(skipped[-1])
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    GUEST_RESULTS.append(f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
                         f"{counts['skipped']} skipped of {counts['tests']} in {len(GUEST_SUITE)} files, "
                         f"{TIMES['the root tests in the VM']:.0f} s")
    GUEST_RESULTS.extend(f"skipped: {line}" for line in sorted(set(skipped)))
    assert counts["failures"] == counts["errors"] == 0, log[-20000:]
    assert status == "0", f"pytest in the VM exited {status}:\n{log[-5000:]}"
    assert counts["tests"] > counts["skipped"], log[-5000:]
    assert not unexpected, "skipped in the VM without a reason in GUEST_SKIPS:\n" + "\n".join(unexpected)
