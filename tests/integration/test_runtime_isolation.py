"""Isolation and limits, each checked from inside the container or in the cgroup, as a user would."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from pyruntime.linux.cgroups import manager
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.kit.busybox import build_rootfs

# a pure cgroup v2 host (the lab's node VM: make test-lab-v2), else this project's hybrid one with v1 controllers
V2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
HYBRID = " - cgroup2 " in Path("/proc/self/mountinfo").read_text()


def _remove_test_cgroups(*names: str) -> None:
    """What a test's cgroupsPath left in each hierarchy (the one of v2, every v1 one), deepest first."""
    hierarchies = [Path("/sys/fs/cgroup")] if V2 else [h for h in Path("/sys/fs/cgroup").iterdir() if h.is_dir()]
    for hierarchy in hierarchies:
        for name in names:
            if (hierarchy / name).is_dir():
                (hierarchy / name).rmdir()


def run(runtime, make_bundle, args, **edit):
    """Runs a container to completion; `edit` keys are dotted paths into the config, e.g. linux.sysctl."""
    bundle = make_bundle(args)
    config = json.loads((bundle / "config.json").read_text())
    for dotted, value in edit.items():
        node = config
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (bundle / "config.json").write_text(json.dumps(config))
    return runtime("run", "--bundle", str(bundle), "c1", check=False)


def test_namespaces_are_isolated(runtime, make_bundle):
    done = run(runtime, make_bundle, ["sh", "-c", "hostname; echo $$; ls /sys/class/net; ipcs -q | wc -l"],
               hostname="isolated")
    lines = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert lines[0] == "isolated"
    assert lines[1] == "1"
    assert lines[2] == "lo" and len(lines) == 4


def test_sysctl_applies_inside_the_namespace_only(runtime, make_bundle):
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        host = f.read()
    done = run(runtime, make_bundle, ["cat", "/proc/sys/net/ipv4/ip_forward"],
               linux__sysctl={"net.ipv4.ip_forward": "1" if host.strip() == "0" else "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout != host
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        assert f.read() == host


def test_memory_limit_oom_kills_and_the_exit_status_shows_it(runtime, make_bundle):
    done = run(runtime, make_bundle, ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
               linux__resources={"memory": {"limit": 16 << 20}, "devices": [{"allow": False, "access": "rwm"}]})
    assert done.returncode == 137, done.stderr


def test_pids_limit_stops_a_fork_bomb(runtime, make_bundle):
    done = run(runtime, make_bundle, ["sh", "-c", "for i in $(seq 20); do sleep 5 & done 2>&1; kill $(jobs -p)"],
               linux__resources={"pids": {"limit": 8}, "devices": [{"allow": False, "access": "rwm"}]})
    assert "can't fork" in done.stdout + done.stderr


def test_cpu_quota_and_cpuset_are_in_the_cgroup(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["cgroupsPath"] = "/pyruntime-test/cpu1"
    config["linux"]["resources"]["cpu"] = {"quota": 50000, "period": 100000, "cpus": "0", "shares": 512}
    config["linux"]["resources"]["memory"] = {"limit": 100 << 20}
    (bundle / "config.json").write_text(json.dumps(config))
    runtime("run", "-d", "--bundle", str(bundle), "c1")
    cg = manager("/pyruntime-test/cpu1", "c1", LinuxSyscalls())
    try:
        stats = cg.stats()
        assert stats["memory"]["usage"]["limit"] == 100 << 20
        files = (("cpu.max", "cpuset.cpus", "memory.max") if V2 else
                 ("cpu/cpu.cfs_quota_us", "cpuset/cpuset.cpus", "memory/memory.limit_in_bytes"))
        inside = runtime("exec", "c1", "sh", "-c", "cat " + " ".join(f"/sys/fs/cgroup/{f}" for f in files)
                         ).stdout.split()
        assert inside == (["50000", "100000"] if V2 else ["50000"]) + ["0", str(100 << 20)]
        runtime("delete", "--force", "c1")
        assert not cg.exists()
    finally:  # the parent is the caller's to remove, as with runc (a kubelet removes its pod cgroups)
        runtime("delete", "--force", "c1", check=False)
        _remove_test_cgroups("pyruntime-test")


def test_without_a_cgroup_namespace_the_container_sees_its_own_cgroup_not_the_hosts_tree(runtime, make_bundle):
    """As runc binds it (and as a CRI container on a v1 host runs, with no cgroup namespace): the container's
    own cgroup at /sys/fs/cgroup/<hierarchy>, so a process reads its own limit there, and no other
    container's cgroup (their names, their usage) is in sight."""
    own = "/sys/fs/cgroup" if V2 else "/sys/fs/cgroup/memory"
    limit = "memory.max" if V2 else "memory.limit_in_bytes"
    bundle = make_bundle(["sh", "-c", f"cat {own}/{limit}; ls {own}; mkdir {own}/sub 2>&1 || echo refused"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "cgroup"]
    config["linux"]["cgroupsPath"] = "/pyruntime-test/own1"
    config["linux"]["resources"]["memory"] = {"limit": 96 << 20}
    (bundle / "config.json").write_text(json.dumps(config))
    try:
        out = runtime("run", "--bundle", str(bundle), "own1").stdout.split()
        assert out[0] == str(96 << 20), "the container's own limit, not the host root's"
        assert "pyruntime-test" not in out and limit in out
        assert out[-1] == "refused" and "Read-only" in " ".join(out), "bound read-only, as the spec's mount says"
    finally:
        runtime("delete", "--force", "own1", check=False)
        _remove_test_cgroups("pyruntime-test/own1", "pyruntime-test")


@pytest.mark.skipif(V2 or not HYBRID, reason="needs a hybrid host: v1 hierarchies and a cgroup2 mount")
@pytest.mark.parametrize("cgroupns", [False, True])
def test_a_hybrid_hosts_cgroup2_mount_is_not_in_the_container(runtime, make_bundle, cgroupns):
    """As runc lays out /sys/fs/cgroup on a hybrid host: the v1 hierarchies only. A cgroup2 mount in sight is
    how software in a container decides its limits are v2 files (Kubernetes' e2e IsPodOnCgroupv2Node runs
    `mount -t cgroup2`), and on a hybrid host the limits are in the v1 ones."""
    bundle = make_bundle(["sh", "-c", "mount -t cgroup2; echo end; ls /sys/fs/cgroup"])
    config = json.loads((bundle / "config.json").read_text())
    if not cgroupns:
        config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "cgroup"]
    elif not any(n["type"] == "cgroup" for n in config["linux"]["namespaces"]):
        config["linux"]["namespaces"].append({"type": "cgroup"})
    (bundle / "config.json").write_text(json.dumps(config))
    try:
        out = runtime("run", "--bundle", str(bundle), "hy1").stdout.split("end\n")
        assert out[0] == "", "no cgroup2 mount in the container"
        assert "memory" in out[1].split() and "unified" not in out[1].split()
    finally:
        runtime("delete", "--force", "hy1", check=False)


def test_capabilities_and_no_new_privs(runtime, make_bundle):
    done = run(runtime, make_bundle, ["grep", "-E", "^(CapEff|CapBnd|CapPrm|NoNewPrivs)", "/proc/self/status"],
               process__capabilities={"bounding": ["CAP_KILL", "CAP_CHOWN"], "effective": ["CAP_KILL", "CAP_CHOWN"],
                                      "permitted": ["CAP_KILL", "CAP_CHOWN"]})
    fields = dict(line.split(":\t") for line in done.stdout.splitlines())
    assert fields["CapEff"] == fields["CapBnd"] == fields["CapPrm"] == f"{(1 << 5) | 1:016x}"
    assert fields["NoNewPrivs"] == "1"


def test_seccomp_rule_blocks_a_syscall_with_the_configured_errno(runtime, make_bundle):
    done = run(runtime, make_bundle, ["sh", "-c", "mkdir /tmp/x; echo status=$?"],
               root={"path": json.loads((make_bundle(["true"]) / "config.json").read_text())["root"]["path"],
                     "readonly": False},
               mounts=[{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                       {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}],
               linux__seccomp={"defaultAction": "SCMP_ACT_ALLOW",
                               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                                             "errnoRet": 13}]})
    assert "Permission denied" in done.stdout + done.stderr
    assert "status=1" in done.stdout


def test_readonly_root_masked_and_readonly_paths_hold(runtime, make_bundle):
    masked_file = next(p for p in ("/proc/keys", "/proc/timer_list", "/proc/kcore") if os.path.exists(p))
    done = run(runtime, make_bundle, ["sh", "-c", f"touch /x; echo masked=$(wc -c < {masked_file}); "
                                      "echo firmware=$(ls /sys/firmware | wc -l); echo 1 > /proc/sys/kernel/panic"])
    assert "touch: /x: Read-only file system" in done.stderr
    assert "masked=0" in done.stdout
    assert "firmware=0" in done.stdout
    assert "/proc/sys/kernel/panic: Read-only file system" in done.stderr


def test_user_namespace_maps_ids(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sh", "-c", "cat /proc/self/uid_map /proc/self/gid_map; id -u; stat -c %u /bin/busybox"])
    config = json.loads((bundle / "config.json").read_text())
    # the mapped root is a stranger on the host: its rootfs must be reachable by others
    shared = Path(tempfile.mkdtemp(prefix="pyruntime-userns-"))
    try:
        shared.chmod(0o755)
        build_rootfs(shared / "rootfs")
        config["root"]["path"] = str(shared / "rootfs")
        config["linux"]["namespaces"] = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "user")]
        config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        config["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        config["mounts"] = [m for m in config["mounts"] if m["destination"] not in ("/sys", "/sys/fs/cgroup")]
        (bundle / "config.json").write_text(json.dumps(config))
        done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    finally:
        shutil.rmtree(shared)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "100000", "65536", "0", "100000", "65536", "0", "65534"]


def test_hooks_run_in_order_with_the_state_on_stdin(runtime, make_bundle, tmp_path):
    log = tmp_path / "hooks"
    log.mkdir()

    def hook(kind, path="/bin/sh", target=str(log / "log")):
        return [{"path": path, "args": ["sh", "-c", f"read s; echo {kind} >> {target}; echo \"$s\" > {target}.{kind}"]}]
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"].append({"destination": "/hooks", "type": "bind", "source": str(log), "options": ["rbind"]})
    config["hooks"] = {"prestart": hook("prestart"), "createRuntime": hook("createRuntime"),
                       "createContainer": hook("createContainer"),
                       "startContainer": hook("startContainer", target="/hooks/log"),
                       "poststart": hook("poststart"), "poststop": hook("poststop")}
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert (log / "log").read_text().split() == ["prestart", "createRuntime", "createContainer", "startContainer",
                                                 "poststart", "poststop"]
    state = json.loads((log / "log.createRuntime").read_text())
    assert state["id"] == "c1" and state["bundle"] == str(bundle) and state["pid"] > 1
    assert json.loads((log / "log.poststop").read_text())["status"] == "stopped"


def test_failing_hook_fails_create_and_leaves_nothing(runtime, make_bundle):
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    config["hooks"] = {"createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", "echo boom >&2; exit 4"]}]}
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("create", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1
    assert "createRuntime hook /bin/sh: exit status 4: boom" in done.stderr
    assert not (runtime.root / "c1").exists()


def test_joining_an_existing_network_namespace_by_path(runtime, make_bundle):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "sandbox")
    sandbox_pid = runtime.state("sandbox")["pid"]
    bundle = make_bundle(["sleep", "100"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["namespaces"] = [{"type": t} for t in ("pid", "mount", "ipc", "uts")] + [
        {"type": "network", "path": f"/proc/{sandbox_pid}/ns/net"}]
    (bundle / "config.json").write_text(json.dumps(config))
    runtime("run", "-d", "--bundle", str(bundle), "app")
    app_pid = runtime.state("app")["pid"]
    assert os.readlink(f"/proc/{app_pid}/ns/net") == os.readlink(f"/proc/{sandbox_pid}/ns/net")
    assert os.readlink(f"/proc/{app_pid}/ns/pid") != os.readlink(f"/proc/{sandbox_pid}/ns/pid")
    runtime("delete", "--force", "app")
    runtime("delete", "--force", "sandbox")


def test_user_groups_umask_and_rlimits(runtime, make_bundle):
    done = run(runtime, make_bundle, ["sh", "-c", "id -u; id -g; id -G; umask; ulimit -n; ulimit -Hn"],
               process__user={"uid": 1000, "gid": 1001, "additionalGids": [5, 6], "umask": 0o27},
               process__rlimits=[{"type": "RLIMIT_NOFILE", "soft": 321, "hard": 654}])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "1001", "1001", "5", "6", "0027", "321", "654"]


def test_device_allow_list_is_enforced(runtime, make_bundle):
    caps = ["CAP_MKNOD", "CAP_DAC_OVERRIDE"]
    done = run(runtime, make_bundle, ["sh", "-c", "mknod /dev/mem2 c 1 1 && head -c1 /dev/mem2; "
                                      "head -c1 /dev/zero | wc -c; ls /dev"],
               process__capabilities=dict.fromkeys(("bounding", "effective", "permitted"), caps))
    assert "Operation not permitted" in done.stderr
    lines = done.stdout.split()
    assert lines[0] == "1"
    for dev in ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "mqueue", "fd", "stdin"):
        assert dev in lines


def test_terminal_master_goes_to_the_console_socket(runtime, make_bundle, tmp_path):
    import socket
    import threading
    sock_path = tmp_path / "console.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)
    received: dict = {}

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 1)
            received["name"], received["fd"] = msg.decode(), fds[0]
    t = threading.Thread(target=accept)
    t.start()
    bundle = make_bundle(["sh", "-c", "tty; stty size"])
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = True
    config["process"]["consoleSize"] = {"height": 30, "width": 100}
    (bundle / "config.json").write_text(json.dumps(config))
    try:
        runtime("create", "--bundle", str(bundle), "--console-socket", str(sock_path), "c1")
        t.join(10)
        runtime("start", "c1")
        out = b""
        while b"100" not in out:
            try:
                chunk = os.read(received["fd"], 1024)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        server.close()
        if "fd" in received:
            os.close(received["fd"])
        runtime("delete", "--force", "c1", check=False)
    assert received["name"].startswith("/dev/pts/")
    assert b"/dev/pts/0" in out and b"30 100" in out


def test_foreground_run_with_a_terminal_relays_it(runtime, make_bundle):
    import select
    import subprocess
    bundle = make_bundle(["sh", "-c", "tty; read x; echo got $x; exit 3"])
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = True
    (bundle / "config.json").write_text(json.dumps(config))
    master, slave = os.openpty()
    proc = subprocess.Popen([runtime.binary, "--root", str(runtime.root), "run", "--bundle", str(bundle), "c1"],
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while b"/dev/pts/0" not in out:
            assert select.select([master], [], [], 20)[0], out
            out += os.read(master, 1024)
        os.write(master, b"hello\r")
        while b"got hello" not in out:
            assert select.select([master], [], [], 20)[0], out
            out += os.read(master, 1024)
        assert proc.wait(timeout=20) == 3
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def test_seccomp_notify_fd_reaches_the_agent_at_listener_path(runtime, make_bundle, tmp_path):
    import socket
    listener = tmp_path / "agent.sock"
    bundle = make_bundle(["sh", "-c", "mkdir /dev/shm/x; echo status=$?"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": str(listener),
                                  "listenerMetadata": "agent-meta",
                                  "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]}
    (bundle / "config.json").write_text(json.dumps(config))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(listener))
        server.listen(1)
        runtime("create", "--bundle", str(bundle), "c1")
        conn, _ = server.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    message = json.loads(data)
    assert message["metadata"] == "agent-meta" and message["state"]["id"] == "c1"
    assert message["pid"] == runtime.state("c1")["pid"] and len(fds) == 1
    os.close(fds[0])  # the agent goes away: the notified syscall now fails instead of hanging
    runtime("start", "c1")
    for _ in range(100):
        if runtime.state("c1")["status"] == "stopped":
            break
        time.sleep(0.05)
    runtime("delete", "c1")


def test_an_exec_with_notify_rules_hands_its_own_fd_to_the_agent(runtime, make_bundle, tmp_path):
    """exec loads the container's filter in the new process, whose notify fd reaches the agent too, with the
    container's state and the process's pid (runc's setns init does the same)."""
    import socket
    import threading
    listener = tmp_path / "agent.sock"
    bundle = make_bundle(["sleep", "100"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": str(listener),
                                  "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]}
    (bundle / "config.json").write_text(json.dumps(config))
    messages: list[dict] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(listener))
        server.listen(2)

        def agent() -> None:  # takes each fd and goes away from it: notified syscalls then fail (ENOSYS)
            for _ in range(2):
                conn, _ = server.accept()
                with conn:
                    data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
                messages.append(json.loads(data))
                for fd in fds:
                    os.close(fd)
        thread = threading.Thread(target=agent, daemon=True)
        thread.start()
        try:
            runtime("run", "-d", "--bundle", str(bundle), "c1")
            init_pid = runtime.state("c1")["pid"]
            done = runtime("exec", "c1", "sh", "-c", "mkdir /dev/shm/x; echo status=$?")
            thread.join(10)
        finally:
            runtime("delete", "-f", "c1", check=False)
    assert "status=1" in done.stdout, done.stdout + done.stderr  # the agent went away: ENOSYS
    assert len(messages) == 2 and messages[0]["pid"] == init_pid
    assert messages[1]["pid"] not in (0, init_pid)  # the exec'd process's own
    assert messages[1]["state"]["status"] == "running" and messages[1]["state"]["pid"] == init_pid


def test_oom_score_adj_is_set_and_never_lowered_below_the_runtimes(runtime, make_bundle):
    with open("/proc/self/oom_score_adj") as f:
        ours = int(f.read())
    done = run(runtime, make_bundle, ["cat", "/proc/self/oom_score_adj"], process__oomScoreAdj=max(ours, 0) + 100)
    assert done.stdout.strip() == str(max(ours, 0) + 100), done.stderr
    done = run(runtime, make_bundle, ["cat", "/proc/self/oom_score_adj"], process__oomScoreAdj=-1000)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == ours  # clamped to the runtime's own score, as containerd's restrict_oom_score_adj


def test_domainname_is_set_in_the_uts_namespace(runtime, make_bundle):
    done = run(runtime, make_bundle, ["cat", "/proc/sys/kernel/domainname"], domainname="example.test")
    assert done.stdout.strip() == "example.test", done.stderr
