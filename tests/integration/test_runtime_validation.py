"""Validation before anything is made, and the cgroupsPath forms real clients hand the runtime.

An invalid spec must fail `create` before the id is claimed, the cgroup made or a process forked:
each case below names its own cgroupsPath, and after the failure neither the state directory nor that
cgroup exists in any hierarchy (the leak check around every root test sees any process left).
"""
from __future__ import annotations

import json
import os
import posixpath
import subprocess
import uuid

import pytest

CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_dirs(relative: str) -> list[str]:
    """Where a cgroup path (as /proc/PID/cgroup shows it) lives in every mounted hierarchy."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ")[0].split()[4] for line in f if " - cgroup" in line]
    return [os.path.join(m, relative.lstrip("/")) for m in mounts]


def own_cgroup(controller: str = "memory") -> str:
    """This process's cgroup in the hierarchy of `controller` (the unified one on a cgroup v2 host)."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if controller in controllers.split(","):
            return path
    return next(path for _, controllers, path in lines if controllers == "")


def memory_mount() -> str:
    v1 = os.path.join(CGROUP_ROOT, "memory")
    return v1 if os.path.isdir(v1) else CGROUP_ROOT


def write_config(bundle, edit) -> None:
    config = json.loads((bundle / "config.json").read_text())
    edit(config)
    (bundle / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["linux"].__setitem__("sysctl", {"net.ipv4.ip_forward": "1"}) or
     c["linux"]["namespaces"].__setitem__(1, {"type": "network", "path": "/proc/self/ns/net"}),
     'linux.sysctl["net.ipv4.ip_forward"]: linux.namespaces[1].path /proc/self/ns/net is the runtime\'s own network '
     "namespace"),
    (lambda c: c["linux"].__setitem__("sysctl", {"kernel.panic": "1"}),
     'linux.sysctl["kernel.panic"]: not a namespaced'),
    (lambda c: c["linux"]["namespaces"].__setitem__(2, {"type": "ipc", "path": "/proc/self/ns/net"}),
     "linux.namespaces[2].path: /proc/self/ns/net is not an ipc namespace (its type is network)"),
    (lambda c: c["linux"].__setitem__("uidMappings", [{"containerID": 0, "hostID": 1000, "size": 1}]),
     "linux.uidMappings: mappings need a user namespace"),
    (lambda c: c["mounts"].append({"destination": "/x", "type": "bind", "options": ["rbind"]}),
     "mounts[7].source: required for a bind mount"),
    (lambda c: c["linux"].__setitem__("devices", [{"type": "c", "path": "/dev/a", "major": 1, "minor": 3},
                                                  {"type": "c", "path": "/dev/a", "major": 1, "minor": 5}]),
     "linux.devices[1].path: /dev/a is already linux.devices[0]"),
    (lambda c: c["linux"].__setitem__("resources", {"memory": {"limit": 64 << 20, "swap": 32 << 20}}),
     "linux.resources.memory.swap: 33554432 is below memory limit 67108864"),
])
def test_an_invalid_spec_leaves_nothing_behind(runtime, make_bundle, edit, message):
    cgroup = f"/pyruntime-validate-{uuid.uuid4().hex[:12]}"
    bundle = make_bundle(["true"])
    write_config(bundle, lambda c: (c["linux"].__setitem__("cgroupsPath", cgroup), edit(c)))
    done = runtime("create", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr
    assert not (runtime.root / "c1").exists()
    assert not [d for d in cgroup_dirs(cgroup) if os.path.exists(d)]


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_cri_slice_prefix_name_cgroups_path_is_a_directory_name(runtime, make_bundle, form):
    """containerd's CRI gives `test.slice:cri-containerd:ID` for a pod under a .slice parent, whatever the
    runtime's cgroup driver; as runc's fs driver, a relative one lands under the runtime's own cgroup, and as
    its fs2 driver, under that cgroup's parent on a cgroup v2 host (the runtime's own cgroup has processes: a
    systemd service's refuses a domain child the container's)."""
    name = f"test.slice:cri-containerd:{uuid.uuid4().hex[:12]}"
    cgroups_path = name if form == "relative" else "/" + name
    base = posixpath.dirname(own_cgroup()) if memory_mount() == CGROUP_ROOT else own_cgroup()
    expected = (base.rstrip("/") + "/" + name) if form == "relative" else "/" + name
    bundle = make_bundle(["sleep", "100"])
    write_config(bundle, lambda c: c["linux"].__setitem__("cgroupsPath", cgroups_path))
    runtime("run", "-d", "--bundle", str(bundle), "c1")
    try:
        init = runtime.state("c1")["pid"]
        with open(f"/proc/{init}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        memory = [path for _, controllers, path in lines if "memory" in controllers.split(",") or controllers == ""]
        assert expected in memory, lines
        directory = os.path.join(memory_mount(), expected.lstrip("/"))
        assert os.path.isdir(directory)
        with open(os.path.join(directory, "cgroup.procs")) as f:
            assert str(init) in f.read().split()
    finally:
        runtime("delete", "--force", "c1")
    assert not os.path.exists(directory)


def test_a_sysctl_applies_in_a_network_namespace_joined_by_path(runtime, make_bundle):
    """A bind-mounted namespace (as `ip netns` and CNI runtimes make them) is recognised by its type,
    and a sysctl goes into it because it is not the runtime's own."""
    name = f"pyv-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        bundle = make_bundle(["cat", "/proc/sys/net/ipv4/ip_forward"])
        write_config(bundle, lambda c: (
            c["linux"]["namespaces"].__setitem__(1, {"type": "network", "path": f"/run/netns/{name}"}),
            c["linux"].__setitem__("sysctl", {"net.ipv4.ip_forward": "1"})))
        done = runtime("run", "--bundle", str(bundle), "c1", check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1"
        inside = subprocess.run(["ip", "netns", "exec", name, "cat", "/proc/sys/net/ipv4/ip_forward"],
                                capture_output=True, text=True, check=True)
        assert inside.stdout.strip() == "1"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
