"""Device rules on cgroup v2, against the kernel: the eBPF program the v2 driver attaches must answer as
the v1 devices cgroup answers for the same rules, and must stop a root container with CAP_MKNOD from
reading the host's disk through a node it makes.

This project's machine is hybrid: cgroup device programs work on its cgroup2 mount (/sys/fs/cgroup/unified),
and a process is checked by both its v1 devices cgroup and the programs of its cgroup2 cgroup. The
differential test puts each probe in one restricted cgroup and an allow-all one of the other kind (it needs
both kinds: a pure v2 host has no v1 devices cgroup to compare with). The attack test runs the runtime in a
mount namespace where /sys/fs/cgroup is that cgroup2 mount, so the runtime sees, and drives, a pure cgroup
v2 host: the container's only device restriction is then the program. On a pure v2 host (the lab's node VM:
make test-lab-v2) the runtime runs as it is, on the host's own /sys/fs/cgroup. The "host disk" is a loop
device over a file with a known secret, because this VM refuses even its own root a read of its real disk; a
loop device is a block device like any disk, and readable by root.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynode_os.cgroups import parse_mountinfo
from pyruntime.linux.cgroups.resources import DEFAULT_ALLOWED_DEVICES, DeviceRule, Resources
from pyruntime.linux.cgroups.v1 import V1Manager
from pyruntime.linux.cgroups.v2 import V2Manager
from pyruntime.linux.syscalls import BPF_CGROUP_DEVICE, LinuxSyscalls
from tests.kit.runtime import PYRUNTIME, Runtime, bundle_config, write_bundle


def _mounts() -> tuple[str, str]:
    with open("/proc/self/mountinfo") as f:
        v1, v2 = parse_mountinfo(f.read())
    devices = next((h.mountpoint for h in v1 if "devices" in h.controllers), "")
    return devices, (v2.mountpoint if v2 is not None else "")


V1_DEVICES, CGROUP2 = _mounts()
PURE_V2 = CGROUP2 == "/sys/fs/cgroup"
pytestmark = pytest.mark.skipif(not CGROUP2, reason="needs a cgroup2 mount")

# (type, major, minor, what to try): mknod always, open for read and for write where harmless; the loop
# device the test sets up is added to them
PROBES = [("c", 1, 3, "rw"), ("c", 1, 5, "rw"), ("c", 1, 7, "rw"), ("c", 1, 9, "r"), ("c", 5, 2, "rw"),
          ("c", 10, 200, "rw"), ("c", 136, 0, ""), ("c", 10, 229, "rw"), ("b", 8, 0, "rw")]
SECRET = b"host disk secret\n"

PROBE = r"""
import errno, json, os, stat, sys
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
where, probes = sys.argv[1], json.loads(sys.argv[2])
out = {}
for i, (t, ma, mi, modes) in enumerate(probes):
    fresh = f"{where}/m{i}-{os.getpid()}"
    kind = stat.S_IFCHR if t == "c" else stat.S_IFBLK
    out[f"{t} {ma}:{mi} m"] = attempt(lambda: os.mknod(fresh, kind | 0o600, os.makedev(ma, mi)))
    if os.path.lexists(fresh):
        os.unlink(fresh)
    for mode in modes:
        flags = (os.O_RDONLY if mode == "r" else os.O_WRONLY) | os.O_NONBLOCK | os.O_NOCTTY
        out[f"{t} {ma}:{mi} {mode}"] = attempt(lambda: os.close(os.open(f"{where}/n{i}", flags)))
print(json.dumps(out))
"""

RULE_LISTS = [
    Resources().with_device_policy().devices,  # what create applies without rules of the spec's
    (DeviceRule(True),),
    (DeviceRule(True), DeviceRule(False, "b", 8, 0, "r"), DeviceRule(False, "c", 1, 5, "w"),
     DeviceRule(False, "c", 10, None, "m"), DeviceRule(False, "b", 7, None, "w")),
    (DeviceRule(False), DeviceRule(True, "c", 1, None, "r"), DeviceRule(True, "c", 1, 3, "w"),
     DeviceRule(True, "b", None, None, "m")),
    (DeviceRule(False), DeviceRule(True, "c", None, None, "rwm"), DeviceRule(False, "c", None, None, "w")),
    (DeviceRule(True, "b", 8, 0, "rw"), DeviceRule(True, "c", 10, 229, "m"), DeviceRule(True, "b", 7, None, "r")),
    (DeviceRule(False), DeviceRule(True, "c", 1, 3, "rwm"), DeviceRule(False, "c", 1, 3, "w"),
     *DEFAULT_ALLOWED_DEVICES),
]


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(major, minor) of a loop device over a file that starts with SECRET."""
    image = tmp_path / "disk.img"
    image.write_bytes(SECRET.ljust(64 << 10, b"\0"))
    device = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
                            check=True).stdout.strip()
    try:
        rdev = os.stat(device).st_rdev
        yield os.major(rdev), os.minor(rdev)
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)


def _probe(tmp_path: Path, probes: list, join: list[str]) -> dict[str, str]:
    """The probe's answers from a process that first writes itself into each cgroup.procs of `join`."""
    def enter() -> None:
        for procs in join:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), json.dumps(probes)], preexec_fn=enter,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def probe_nodes(tmp_path: Path, loop_device) -> tuple[Path, list]:
    probes = [*PROBES, ("b", *loop_device, "rw")]
    for i, (t, ma, mi, _) in enumerate(probes):
        os.mknod(tmp_path / f"n{i}", (stat.S_IFCHR if t == "c" else stat.S_IFBLK) | 0o600, os.makedev(ma, mi))
    return tmp_path, probes


@pytest.mark.skipif(not V1_DEVICES, reason="compares with a v1 devices cgroup, which a pure v2 host has not")
@pytest.mark.parametrize("rules", RULE_LISTS)
def test_program_answers_as_the_v1_devices_cgroup(probe_nodes, rules):
    name = f"devdiff-{uuid.uuid4().hex[:10]}"
    parts = ("pyruntime-test", name)
    v1 = V1Manager({"devices": V1_DEVICES}, parts, (("pyruntime-test",),))
    open_v1 = V1Manager({"devices": V1_DEVICES}, ("pyruntime-test", name + "-all"), (("pyruntime-test",),))
    v2 = V2Manager(CGROUP2, CGROUP2, parts, (("pyruntime-test",),), LinuxSyscalls())
    try:
        for mgr in (v1, open_v1, v2):
            mgr.create()
        v1.set(Resources(devices=rules))
        v2.set(Resources(devices=rules))
        where, probes = probe_nodes
        by_v1 = _probe(where, probes, [os.path.join(v1.dirs["devices"], "cgroup.procs")])
        by_program = _probe(where, probes, [os.path.join(open_v1.dirs["devices"], "cgroup.procs"),
                                            os.path.join(v2.path, "cgroup.procs")])
    finally:
        for mgr in (v2, v1, open_v1):
            mgr.destroy()
    assert by_program == by_v1


CRI_CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]


@pytest.fixture
def v2_runtime(tmp_path: Path):
    """pyruntime as it is on a pure v2 host, else run in a mount namespace of its own where /sys/fs/cgroup is
    the cgroup2 mount."""
    if PURE_V2:
        rt = Runtime(tmp_path / "state")
        yield rt
        rt.cleanup()
        return
    wrapper = tmp_path / "pyruntime-on-cgroup2"
    wrapper.write_text("#!/bin/sh\nexec unshare -m --propagation private sh -c "
                       f"'mount --bind {CGROUP2} /sys/fs/cgroup && exec \"$0\" \"$@\"' {PYRUNTIME} \"$@\"\n")
    wrapper.chmod(0o755)
    rt = Runtime(tmp_path / "state", str(wrapper))
    yield rt
    rt.cleanup()


def _device_programs(cgroup: str) -> list[int]:
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return LinuxSyscalls().bpf_prog_query(fd, BPF_CGROUP_DEVICE)
    finally:
        os.close(fd)


def test_root_pod_with_mknod_cannot_read_the_host_disk(v2_runtime, rootfs, tmp_path, loop_device):
    major, minor = loop_device
    config = bundle_config(rootfs, ["sleep", "1000"])
    config["process"]["capabilities"] = dict.fromkeys(("bounding", "effective", "permitted"), CRI_CAPABILITIES)
    config["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}  # as containerd's CRI gives
    bundle = write_bundle(tmp_path / "bundle", config)
    cid = f"devv2-{uuid.uuid4().hex[:8]}"
    v2_runtime("run", "-d", "--bundle", str(bundle), cid)
    pid = v2_runtime.state(cid)["pid"]
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    assert not [line for line in lines if cid in line and not line.startswith("0::")], "v1 was driven, not v2"
    [cgroup] = [CGROUP2 + line[3:] for line in lines if line.startswith("0::") and line.endswith(cid)]
    attack = (f"mknod /dev/d b {major} {minor} && echo made; head -c {len(SECRET)} /dev/d; "
              "echo x > /dev/null && echo null-ok; head -c 4 /dev/zero | wc -c")
    done = v2_runtime("exec", cid, "sh", "-c", attack, check=False)
    assert "made" in done.stdout  # mknod of any node is allowed, as runc allows it
    assert "/dev/d: Operation not permitted" in done.stderr, done.stdout + done.stderr
    assert done.stdout.split() == ["made", "null-ok", "4"]
    [first] = _device_programs(cgroup)

    update = tmp_path / "update.json"
    update.write_text(json.dumps({"devices": [{"allow": False, "access": "rwm"},
                                              {"allow": True, "type": "b", "major": major, "minor": minor,
                                               "access": "r"}]}))
    v2_runtime("update", "--resources", str(update), cid)
    [second] = _device_programs(cgroup)
    assert second != first  # replaced, not added to
    done = v2_runtime("exec", cid, "sh", "-c", f"head -c {len(SECRET)} /dev/d; echo x > /dev/null && echo ok")
    assert done.stdout == SECRET.decode() + "ok\n", done.stderr
    v2_runtime("delete", "--force", cid)


def test_a_program_the_kernel_refuses_fails_the_call():
    """A parent holding a device program attached without BPF_F_ALLOW_MULTI makes the kernel refuse any
    program below it: the container's rules then fail, rather than leave its devices unrestricted."""
    from pyruntime.linux.cgroups import CgroupError
    from pyruntime.linux.cgroups.devicefilter import LICENSE, compile_rules
    from pyruntime.linux.syscalls import BPF_PROG_TYPE_CGROUP_DEVICE
    kernel = LinuxSyscalls()
    parts = ("pyruntime-test", f"devparent-{uuid.uuid4().hex[:10]}")
    parent = V2Manager(CGROUP2, CGROUP2, parts, (("pyruntime-test",),), kernel)
    child = V2Manager(CGROUP2, CGROUP2, (*parts, "ctr"), (("pyruntime-test",),), kernel)
    try:
        parent.create()
        child.create()
        fd = os.open(parent.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            prog = kernel.bpf_prog_load(BPF_PROG_TYPE_CGROUP_DEVICE, compile_rules((DeviceRule(True),)), LICENSE, "t")
            try:
                kernel.bpf_prog_attach(fd, prog, BPF_CGROUP_DEVICE, 0)
            finally:
                os.close(prog)
        finally:
            os.close(fd)
        with pytest.raises(CgroupError, match=r"^linux.resources.devices: bpf\(BPF_PROG_ATTACH.*ctr: "
                                              r"Operation not permitted$"):
            child.set(Resources(devices=(DeviceRule(False),)))
        assert _device_programs(child.path) == []
    finally:
        child.destroy()
        parent.destroy()


def test_kernel_refusals_name_the_call_and_say_why(tmp_path):
    from pyruntime.linux.cgroups.devicefilter import EXIT, LICENSE, insn
    from pyruntime.linux.syscalls import BPF_PROG_TYPE_CGROUP_DEVICE, SyscallError
    kernel = LinuxSyscalls()
    with pytest.raises(SyscallError, match=r"bpf\(BPF_PROG_LOAD, type 15, 1 instructions\): Permission denied: "
                                           r"0: \(95\) exit / R0 !read_ok$"):
        kernel.bpf_prog_load(BPF_PROG_TYPE_CGROUP_DEVICE, insn(EXIT), LICENSE, "t")  # exits with R0 unset
    (tmp_path / "file").write_text("")
    fd = os.open(tmp_path / "file", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(SyscallError, match=rf"bpf\(BPF_PROG_QUERY, type 6\) of {tmp_path}/file: "):
            kernel.bpf_prog_query(fd, BPF_CGROUP_DEVICE)
    finally:
        os.close(fd)
