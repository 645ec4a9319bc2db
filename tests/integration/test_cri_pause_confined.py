"""The built-in pause of a pod sharing its pid namespace, attacked from the pod it holds (issue 22, item 7).

The pause is pid 1 of the pod's containers. A container given CAP_SYS_PTRACE (a capability the kubelet
lets any pod add) sees it through /proc/1: were it the launcher's root child with every capability, in the
host's mount namespace, /proc/1/root would be the host's `/` and /proc/1/fd the host's files. It must be
what containerd's pause container is under runc: no capabilities, no new privileges, not dumpable (so root
in the pod is refused /proc/1/root, /proc/1/fd and ptrace), user 65535, an empty read-only root of its
own, and in the pod's cgroup, not the daemon's.
"""
from __future__ import annotations

import os
from pathlib import Path

from pynode_os.proc import process_start_time
from pyruntime.cri.jobs import PauseJob
from pyruntime.cri.launcher import Launcher
from pyruntime.cri.model import Layout
from pyruntime.cri.pause import release_pause
from pyruntime.linux.syscalls import LinuxSyscalls
from pyruntime.settings import Settings
from tests.kit import cri_server as kit
from tests.kit.kubelet_node import wait_for

cri_server = kit.cri_server  # the module's daemon

KERNEL = LinuxSyscalls()
SLEEPER = ["sh", "-c", "exec sleep 3600"]
SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _status(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def test_a_ptrace_capable_root_container_reaches_nothing_of_the_host_through_the_pause(cri_server) -> None:
    c = cri_server
    hostname = Path("/etc/hostname").read_text().strip()
    with c.pod("confined", hostname="confined-pod") as pod:
        cid = c.start_container(pod, "attacker", command=SLEEPER, linux={"security_context": {
            "capabilities": {"add_capabilities": ["SYS_PTRACE"]}}})

        def sh(cmd: str) -> tuple[str, str]:
            r = c.crictl("exec", "-s", cid, "sh", "-c", cmd, check=False)
            return r.stdout, r.stderr

        out, _ = sh("id -u; grep CapEff /proc/self/status; cat /proc/1/comm")
        uid, _, eff, comm = out.split()
        assert (uid, comm) == ("0", "pyruntime-pause") and int(eff, 16) >> 19 & 1, \
            "the attacker is root with CAP_SYS_PTRACE, and pid 1 is the pause"
        # the host's root, cwd and files through /proc/1: CAP_SYS_PTRACE in the host's user namespace passes
        # the kernel's check, as it would for containerd's pause, and finds an empty root and no fds
        for cmd in ("ls -a /proc/1/root/ /proc/1/cwd/ /proc/1/fd/",
                    "readlink /proc/1/root; readlink /proc/1/cwd",
                    "cat /proc/1/root/etc/hostname", "ls /proc/1/root/proc/ /proc/1/root/etc/"):
            out, err = sh(f"{{ {cmd}; }} 2>/dev/null; echo rc=$?")
            assert set(out.split()) <= {".", "..", "/", "/proc/1/root/:", "/proc/1/cwd/:", "/proc/1/fd/:",
                                        "rc=0", "rc=1"}, (cmd, out, err)
            assert hostname not in out + err
        # the pause's memory and environment, and its paths to a container without CAP_SYS_PTRACE: refused
        plain = c.start_container(pod, "plain", command=SLEEPER)
        for cmd in ("cat /proc/1/environ", "cat /proc/1/maps", "ls /proc/1/root/", "readlink -v /proc/1/cwd",
                    "readlink -v /proc/1/exe", "readlink -v /proc/1/root"):
            r = c.crictl("exec", "-s", plain, "sh", "-c", f"{cmd}; echo rc=$?", check=False)
            assert r.stdout.startswith("rc=1\n") and "Permission denied" in r.stdout, (cmd, r.stdout, r.stderr)
        # what the pause is
        status = _status(sh("cat /proc/1/status")[0])
        assert {k: status[k] for k in SETS} == dict.fromkeys(SETS, "0000000000000000")
        assert status["NoNewPrivs"] == "1"
        assert status["Uid"].split() == ["65535"] * 4 and status["Gid"].split() == ["65535"] * 4
        assert status["Groups"] == ""
        assert status["Seccomp"] == "2"
        # seen from the host
        pause = int(c.json("inspectp", pod.id)["info"]["pid"])
        assert os.readlink(f"/proc/{pause}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        assert os.listdir(f"/proc/{pause}/root/") == [] and os.readlink(f"/proc/{pause}/cwd") == "/"
        assert os.listdir(f"/proc/{pause}/fd") == []
        parent = pod.config["linux"]["cgroup_parent"]
        cgroups = [line.split(":", 2)[2] for line in Path(f"/proc/{pause}/cgroup").read_text().splitlines()]
        assert cgroups and all(path.startswith(parent + "/") for path in cgroups if path != "/"), cgroups
        # still the pod's pid 1: it reaps what a container orphans
        sh("sleep 0.1 &")
        states = "for f in /proc/[0-9]*/stat; do cut -d' ' -f3 $f; done"
        wait_for("the orphan reaped", lambda: "Z" not in sh(states)[0].split(), timeout=10, interval=0.2)

def test_a_pause_without_a_cgroup_parent_is_in_a_cgroup_of_its_own(tmp_path, runtime) -> None:
    """No parent (crictl without one, as containerd's /k8s.io/<id>): not the daemon's cgroup, and gone
    with the pause."""
    layout = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
    launcher = Launcher.spawn(Settings(root=str(runtime.root)), layout)
    try:
        ns_dir = layout.ns_dir("nopar")
        info = launcher.run_pause(PauseJob("nopar", ns_dir, share_pid=True))
        try:
            assert info.cgroup == "/pyruntime/nopar"
            own = Path(f"/proc/{launcher.pid}/cgroup").read_text().splitlines()
            pause = Path(f"/proc/{info.pid}/cgroup").read_text().splitlines()
            assert any(line.endswith(":/pyruntime/nopar") for line in pause), pause
            assert not set(own) & {line for line in pause if not line.endswith(":/")}
        finally:
            release_pause(info, ns_dir, KERNEL)
        assert process_start_time(info.pid) is None
    finally:
        launcher.close()


def test_the_pause_of_a_pod_with_a_user_namespace_is_confined_too(tmp_path, runtime) -> None:
    """hostUsers: false with a shared pid namespace: the pause is pid 1 in the pod's user namespace, as the
    pod's 65535 (host id 265535), with nothing of the host's filesystem."""
    layout = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
    launcher = Launcher.spawn(Settings(root=str(runtime.root)), layout)
    ids = [[0, 200000, 65536]]
    try:
        ns_dir = layout.ns_dir("userns")
        info = launcher.run_pause(PauseJob("userns", ns_dir, share_pid=True, uid_map=ids, gid_map=ids))
        try:
            status = _status(Path(f"/proc/{info.pid}/status").read_text())
            assert status["Uid"].split() == ["265535"] * 4 and status["Gid"].split() == ["265535"] * 4
            assert {k: status[k] for k in SETS} == dict.fromkeys(SETS, "0000000000000000")
            assert status["NoNewPrivs"] == "1" and status["NSpid"].split()[1:] == ["1"]
            assert os.listdir(f"/proc/{info.pid}/root/") == []
            assert os.stat(f"/proc/{info.pid}/ns/user").st_ino == os.stat(info.namespaces["user"]).st_ino
        finally:
            release_pause(info, ns_dir, KERNEL)
        assert process_start_time(info.pid) is None
    finally:
        launcher.close()
