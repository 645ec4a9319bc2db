"""Behaviour that users and tools of runc rely on, found by runc's own integration suite
(`make conformance-runc`): each test here is what a user would check by hand."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyruntime.linux import cgroups
from pyruntime.linux.seccomp import compiler, loader
from pyruntime.linux.seccomp.profile import Seccomp
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.integration.test_seccomp import BUSYBOX, BUSYBOX_START
from tests.kit.busybox import build_rootfs
from tests.kit.child import run_in_child


def _config(bundle: Path) -> dict:
    return json.loads((bundle / "config.json").read_text())


def _save(bundle: Path, config: dict) -> None:
    (bundle / "config.json").write_text(json.dumps(config))


def _run_on_pty(runtime, bundle: Path, cid: str, timeout: float = 20) -> tuple[int, bytes]:
    """`pyruntime run` in the foreground on a terminal of its own, as a user at a shell runs it."""
    master, slave = os.openpty()
    proc = subprocess.Popen([runtime.binary, "--root", str(runtime.root), "run", "--bundle", str(bundle), cid],
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while select.select([master], [], [], timeout)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every holder of the slave side is gone
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=timeout), out
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def test_rootfs_whose_proc_is_a_symlink_is_refused(runtime, make_bundle, tmp_path, rootfs):
    """A /proc that the image made a symlink would put procfs where the image points (CVE-2019-19921)."""
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "proc").rmdir()
    (own / "bad-proc").mkdir()
    (own / "proc").symlink_to("/bad-proc")
    bundle = make_bundle(["true"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False, timeout=30)
    assert done.returncode == 1
    assert "must be mounted on ordinary directory" in done.stderr
    assert not list((own / "bad-proc").iterdir())


@pytest.mark.parametrize("occupied", ["frozen", "not empty"])
def test_create_into_a_frozen_or_occupied_cgroup_is_refused_and_leaves_it(runtime, make_bundle, occupied):
    """A shared cgroup would be killed and removed with the container; a frozen one hangs its init."""
    path = f"/pynode-test-used-{os.getpid()}"
    bundle = make_bundle(["sleep", "100"])
    config = _config(bundle)
    config["linux"]["cgroupsPath"] = path
    _save(bundle, config)
    cg = cgroups.manager(path, "x", LinuxSyscalls())
    cg.create()
    holder = None
    try:
        if occupied == "frozen":
            cg.freeze()
        else:
            runtime("run", "-d", "--bundle", str(bundle), "first")
            holder = runtime.state("first")["pid"]
        done = runtime("create", "--bundle", str(bundle), "second", check=False, timeout=30)
        assert done.returncode == 1
        word = "unexpectedly frozen" if occupied == "frozen" else "is not empty"
        assert f"container's cgroup {word}" in done.stderr
        assert cg.exists()
        if holder:
            os.kill(holder, 0)  # the first container was left alone
            assert runtime.state("first")["status"] == "running"
    finally:
        runtime("delete", "-f", "first", check=False)
        if cg.exists():
            cg.thaw()
            cg.destroy()


@pytest.mark.parametrize("uid", [0, 1000])
def test_terminal_belongs_to_the_process_user_and_keeps_newlines(runtime, make_bundle, uid):
    """Output through a container's terminal arrives byte for byte (no CRLF), and a non-root process owns
    its terminal (group tty), as with runc."""
    bundle = make_bundle(["sh", "-c", "stat -c %u:%g $(tty); printf 'a\\nb\\n'"])
    config = _config(bundle)
    config["process"]["terminal"] = True
    config["process"]["user"] = {"uid": uid, "gid": 100 if uid else 0}
    _save(bundle, config)
    code, out = _run_on_pty(runtime, bundle, "c1")
    assert code == 0, out
    # the runtime puts its own terminal in raw mode, so any \r would be the container's terminal's
    assert out == f"{uid}:5\na\nb\n".encode()


def test_read_only_dev_is_made_after_its_devices(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "grep '^tmpfs /dev ' /proc/mounts; test -c /dev/null && test -d /dev/pts"])
    config = _config(bundle)
    for m in config["mounts"]:
        if m["destination"] == "/dev":
            m["options"].append("ro")
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert " ro," in done.stdout


@pytest.mark.parametrize(("options", "mode"), [([], "710"), (["mode=1500"], "1500")])
def test_tmpfs_over_a_directory_keeps_its_mode_unless_given(runtime, make_bundle, tmp_path, rootfs, options, mode):
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "tmpfs").mkdir(mode=0o710)
    os.chmod(own / "tmpfs", 0o710)
    bundle = make_bundle(["stat", "-c", "%a", "/tmpfs", "/fresh"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["mounts"] += [{"destination": "/tmpfs", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", *options]},
                         {"destination": "/fresh", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}]
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [mode, "1777"]
    assert oct(os.stat(own / "tmpfs").st_mode & 0o7777) == "0o710"


@pytest.mark.parametrize(("uid", "env", "home"), [
    (0, ["HOME="], "/root"), (0, ["HOME=/override", "HOME="], "/root"), (0, [], "/root"),
    (0, ["HOME=/override"], "/override"), (4242, [], "/")])
def test_empty_or_absent_home_comes_from_passwd(runtime, make_bundle, uid, env, home):
    bundle = make_bundle(["env"])
    config = _config(bundle)
    config["process"]["env"] = ["PATH=/bin:/usr/bin", *env]
    config["process"]["user"] = {"uid": uid, "gid": 0}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == [f"HOME={home}", "PATH=/bin:/usr/bin"]


def test_a_user_may_start_in_a_cwd_only_root_can_enter(runtime, make_bundle, tmp_path, rootfs):
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "rootonly").mkdir(mode=0o700)
    os.chmod(own / "rootonly", 0o700)
    bundle = make_bundle(["sh", "-c", "id -u; pwd"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["process"]["user"] = {"uid": 1000, "gid": 1000}
    config["process"]["cwd"] = "/rootonly"
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "/rootonly"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_cpu_affinity_of_the_caller_is_not_inherited(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    last = (os.cpu_count() or 1) - 1
    pinned = {"preexec_fn": lambda: os.sched_setaffinity(0, {0})}
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1", **pinned)
        pid = runtime.state("c1")["pid"]
        assert os.sched_getaffinity(pid) == set(range(last + 1))
        done = runtime("exec", "c1", "grep", "Cpus_allowed_list", "/proc/self/status", **pinned)
        assert done.stdout.split()[-1] == f"0-{last}"
    finally:
        runtime("delete", "-f", "c1", check=False)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_exec_cpu_affinity_initial_then_final(runtime, make_bundle, tmp_path):
    """process.execCPUAffinity (process.json's, else config.json's): `initial` while the process joins (runc's
    debug line says the mask), `final` as the process runs; the init keeps every CPU (not for it)."""
    bundle = make_bundle(["sleep", "100"])
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["execCPUAffinity"] = {"initial": "0", "final": "1"}
    _save(bundle, config)
    process_json = tmp_path / "process.json"
    process_json.write_text(json.dumps({"args": ["grep", "Cpus_allowed_list", "/proc/self/status"], "cwd": "/",
                                        "execCPUAffinity": {"initial": "1", "final": "0-1"}}))
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        assert os.sched_getaffinity(runtime.state("c1")["pid"]) == set(range(os.cpu_count() or 1))
        done = runtime("--debug", "exec", "c1", "grep", "Cpus_allowed_list", "/proc/self/status")
        assert "]: affinity: 0x1" in done.stderr and "nsexec" in done.stderr
        assert done.stdout.split()[-1] == "1"
        done = runtime("--debug", "exec", "--process", str(process_json), "c1")
        assert "]: affinity: 0x2" in done.stderr and done.stdout.split()[-1] == "0-1"
        process_json.write_text(json.dumps({"args": ["true"], "cwd": "/", "execCPUAffinity": {"final": "0-x"}}))
        bad = runtime("exec", "--process", str(process_json), "c1", check=False)
        assert bad.returncode != 0 and "execCPUAffinity.final: must be a list like '0-3,7'" in bad.stderr
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_debug_reports_the_set_up_stages_to_the_log_in_its_format(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "100"])
    text, as_json = tmp_path / "text.log", tmp_path / "json.log"
    try:
        done = runtime("--log", str(text), "--debug", "run", "-d", "--bundle", str(bundle), "c1")
        assert "level=debug" not in done.stderr
        assert 'level=debug msg="nsexec container setup"' in text.read_text()
        assert "init: closing the pipe to signal completion" in text.read_text()
        runtime("--log", str(as_json), "--log-format", "json", "--debug", "exec", "c1", "true")
        lines = [json.loads(line) for line in as_json.read_text().splitlines()]
        assert {"level": "debug", "msg": "setns_init: about to exec"} in [
            {k: v for k, v in line.items() if k != "time"} for line in lines]
        assert "level=debug" in runtime("--debug", "exec", "c1", "true").stderr
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_exec_failures_exit_255_and_the_process_status_passes_through(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        assert runtime("exec", "c1", "sh", "-c", "exit 42", check=False).returncode == 42
        assert runtime("exec", "c1", "no-such-binary", check=False).returncode == 255
        assert runtime("exec", "no-such-container", "true", check=False).returncode == 255
        # runc's --cap: never inheritable (so not ambient either without inheritable ones in the spec)
        status = runtime("exec", "--cap", "CAP_SYS_ADMIN", "c1", "cat", "/proc/self/status").stdout
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert int(fields["CapEff"], 16) & 1 << 21 and int(fields["CapInh"], 16) == 0
        runtime("pause", "c1")
        done = runtime("exec", "c1", "true", check=False)
        assert done.returncode == 255 and "cannot exec in a paused container" in done.stderr
        runtime("resume", "c1")
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_ps_list_and_events_speak_runc(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        pid = runtime.state("c1")["pid"]
        table = runtime("ps", "c1").stdout.splitlines()
        assert table[0].split() == ["UID", "PID", "PPID", "C", "STIME", "TTY", "TIME", "CMD"]
        assert [row.split()[1] for row in table[1:]] == [str(pid)]
        assert runtime("ps", "c1", "-e", "-x").stdout.split()[:4] == ["PID", "TTY", "STAT", "TIME"]
        assert runtime("list", "--format", "json").stdout.startswith('[{"ociVersion":"')
        assert runtime("events", "--stats", "c1").stdout.startswith('{"type":"stats","id":"c1",')
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_version_and_help_have_runcs_layout(runtime):
    version = runtime("-v").stdout.splitlines()
    assert version[0].startswith("runc version 0.1.0 (pyruntime")
    assert version[1].startswith("commit: ") and version[2] == "spec: 1.2.1"
    assert runtime("--help").stdout.splitlines()[:2] == [
        "NAME:", "   pyruntime - a Python runc - Open Container Initiative runtime"]
    assert "runc checkpoint" in runtime("checkpoint", "-h").stdout.splitlines()[1]
    done = runtime("foo", "-h", check=False)
    assert done.returncode == 1 and "No help topic for 'foo'" in done.stderr


def test_spec_adds_a_cgroup_namespace_only_on_a_cgroup_v2_host(runtime, tmp_path):
    runtime("spec", "--bundle", str(tmp_path))
    kinds = [ns["type"] for ns in _config(tmp_path)["linux"]["namespaces"]]
    assert ("cgroup" in kinds) == (cgroups.detect(LinuxSyscalls()) == "v2")


def _cgroup_file(state_pid: int, controller: str, name: str) -> str:
    for line in Path(f"/proc/{state_pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path(f"/sys/fs/cgroup/{controllers}{path}/{name}").read_text().strip()
    return Path(f"/sys/fs/cgroup{line.split(':', 2)[2]}/{name}").read_text().strip()  # v2: the last line


def test_update_takes_runcs_units_and_flag_names(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    v2 = cgroups.detect(LinuxSyscalls()) == "v2"
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        pid = runtime.state("c1")["pid"]
        runtime("update", "c1", "--memory", "50M", "--cpu-share", "200", "--cpu-period", "100000",
                "--cpu-quota", "50000")
        limit = _cgroup_file(pid, "memory", "memory.max" if v2 else "memory.limit_in_bytes")
        assert limit == str(50 * 1024 * 1024)
        if not v2:
            assert _cgroup_file(pid, "cpu", "cpu.shares") == "200"
        burst = "cpu.max.burst" if v2 else "cpu.cfs_burst_us"
        try:
            _cgroup_file(pid, "cpu", burst)
        except FileNotFoundError:
            pytest.skip(f"the kernel has no CFS burst ({burst}); the rest of the update was checked")
        runtime("update", "c1", "--cpu-burst", "20000")
        assert _cgroup_file(pid, "cpu", burst) == "20000"
    finally:
        runtime("delete", "-f", "c1", check=False)


@contextlib.contextmanager
def _running_with(runtime, make_bundle, resources: dict, controller: str, needed: str) -> Iterator[int]:
    """A detached `sleep` container c1 with linux.resources `resources`; yields its pid, or skips when
    the kernel lacks the cgroup file `needed`."""
    bundle = make_bundle(["sleep", "100"])
    config = _config(bundle)
    config["linux"]["resources"] = resources
    _save(bundle, config)
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        pid = runtime.state("c1")["pid"]
        try:
            _cgroup_file(pid, controller, needed)
        except FileNotFoundError:
            pytest.skip(f"kernel without {needed}")
        yield pid
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_update_of_cpu_idle_does_not_write_the_shares_an_idle_group_refuses(runtime, make_bundle):
    """runc's "update cgroup cpu.idle": a container run with cpu shares goes idle, back and idle again."""
    with _running_with(runtime, make_bundle, {"cpu": {"shares": 100}}, "cpu", "cpu.idle") as pid:
        for idle in ("1", "0", "1"):
            runtime("update", "c1", "--cpu-idle", idle)
            assert _cgroup_file(pid, "cpu", "cpu.idle") == idle
        runtime("update", "c1", "--cpu-period", "10000")  # another limit leaves the group idle
        assert _cgroup_file(pid, "cpu", "cpu.idle") == "1"


def test_update_of_memory_to_unlimited_lifts_the_swap_limit_too(runtime, make_bundle):
    """runc's "update cgroup v1/v2 common limits": --memory -1 after a memory+swap limit."""
    v2 = cgroups.detect(LinuxSyscalls()) == "v2"
    swap_file = "memory.swap.max" if v2 else "memory.memsw.limit_in_bytes"
    with _running_with(runtime, make_bundle, {"memory": {"limit": 33554432}}, "memory", swap_file) as pid:
        runtime("update", "c1", "--memory-swap", "96468992")
        runtime("update", "c1", "--memory", "-1")
        unlimited = "max" if v2 else "9223372036854771712"  # v1: LONG_MAX, page-aligned
        assert _cgroup_file(pid, "memory", "memory.max" if v2 else "memory.limit_in_bytes") == unlimited
        assert _cgroup_file(pid, "memory", swap_file) == unlimited


def test_an_idmapped_bind_mount_shows_its_files_through_its_own_mappings(runtime, make_bundle, tmp_path):
    """mounts[].uidMappings (runc's idmap.bats): on-disk owner k shows as the host id k maps to."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "root-owned").write_text("x")
    (data / "owned-by-1").write_text("y")
    os.chown(data / "owned-by-1", 1, 2)
    bundle = make_bundle(["sh", "-c", "stat -c '%n %u %g' /data/root-owned /data/owned-by-1; touch /data/new"])
    config = _config(bundle)
    ids = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    config["mounts"].append({"destination": "/data", "type": "bind", "source": str(data),
                             "options": ["rbind", "ro"], "uidMappings": ids, "gidMappings": ids})
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.stdout.split("\n")[:2] == ["/data/root-owned 100000 100000", "/data/owned-by-1 100001 100002"], \
        done.stderr
    assert "Read-only file system" in done.stderr  # the remount for "ro" reached the idmapped mount
    assert (data / "root-owned").stat().st_uid == 0  # nothing on disk changed


def test_an_idmapped_bind_mount_into_a_container_with_its_own_user_namespace(runtime, make_bundle, tmp_path):
    """What a kubelet asks for a pod with hostUsers: false: a volume owned by root on the host is the
    container's root's (with the mount's own mappings, or the container's for a bare `idmap`), and what the
    container writes there belongs to root on disk."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "root-owned").write_text("x")
    bundle = make_bundle(["sh", "-c", "stat -c '%n %u %g' /a/root-owned /b/root-owned /; "
                                      "touch /a/new && echo wrote"])
    config = _config(bundle)
    ids = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    config["linux"]["namespaces"].append({"type": "user"})
    config["linux"]["uidMappings"] = config["linux"]["gidMappings"] = ids
    shared = tmp_path / "shared"  # the rootfs's own directory must be open to the mapped root; above it, not
    shared.mkdir(mode=0o755)
    config["root"]["path"] = str(build_rootfs(shared / "rootfs"))
    for target in ("a", "b"):  # the mapped root may not make them in a rootfs the host's root owns
        (shared / "rootfs" / target).mkdir()
    config["mounts"] += [
        {"destination": "/a", "type": "bind", "source": str(data), "options": ["rbind"], "uidMappings": ids,
         "gidMappings": ids},
        {"destination": "/b", "type": "bind", "source": str(data), "options": ["rbind", "idmap"]},
    ]
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.stdout.split("\n")[:4] == ["/a/root-owned 0 0", "/b/root-owned 0 0",
                                           "/ 65534 65534", "wrote"], done.stderr
    assert (data / "new").stat().st_uid == 0 and (data / "new").stat().st_gid == 0


def test_kill_reaches_every_process_of_a_container_in_the_host_pid_namespace(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    config = _config(bundle)
    config["linux"]["namespaces"] = [ns for ns in config["linux"]["namespaces"] if ns["type"] != "pid"]
    config["linux"]["cgroupsPath"] = f"/pynode-test-hostpid-{os.getpid()}"
    _save(bundle, config)
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        init = runtime.state("c1")["pid"]
        runtime("exec", "-d", "--pid-file", str(bundle / "exec.pid"), "c1", "sleep", "100")
        other = int((bundle / "exec.pid").read_text())
        os.kill(init, 9)  # the init gone: runc still kills the rest
        for _ in range(100):
            if runtime.state("c1")["status"] == "stopped":
                break
        runtime("kill", "c1", "KILL")
        for _ in range(100):
            try:
                if "Z" in Path(f"/proc/{other}/stat").read_text().rsplit(")", 1)[1].split()[:1]:
                    break  # dead; a zombie until its reaper (not us) gets to it
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"exec'd process {other} survived kill KILL")
    finally:
        runtime("delete", "-f", "c1", check=False)


V1_RT = "/sys/fs/cgroup/cpu/cpu.rt_runtime_us"


@pytest.mark.skipif(cgroups.detect(LinuxSyscalls()) != "v1" or not os.path.exists(V1_RT),
                    reason="needs cgroup v1 with realtime group scheduling")
def test_v1_cpuset_parent_made_by_mkdir_and_rt_period_below_the_runtime():
    """A pod's parent made with a bare mkdir has an empty cpuset; a lower rt period must follow its runtime."""
    from pyruntime.linux.cgroups.resources import Cpu, Resources
    parent = Path(f"/sys/fs/cgroup/cpuset/pynode-test-bare-{os.getpid()}")
    parent.mkdir()
    cg = cgroups.manager(f"/{parent.name}/ctr", "ctr", LinuxSyscalls())
    try:
        cg.create()
        assert (parent / "cpuset.cpus").read_text().strip()
        child = subprocess.Popen(["sleep", "100"], preexec_fn=lambda: cg.add(os.getpid()))
        try:
            assert str(child.pid) in (parent / "ctr" / "cgroup.procs").read_text().split()
        finally:
            child.kill()
            child.wait()
        (Path("/sys/fs/cgroup/cpu") / parent.name / "cpu.rt_runtime_us").write_text("600000")
        cg.set(Resources(cpu=Cpu(realtime_period=1000000, realtime_runtime=500000)))
        cg.set(Resources(cpu=Cpu(realtime_period=400000, realtime_runtime=200000)))
        rt = Path("/sys/fs/cgroup/cpu") / parent.name / "ctr"
        assert (rt / "cpu.rt_period_us").read_text().strip() == "400000"
        assert (rt / "cpu.rt_runtime_us").read_text().strip() == "200000"
    finally:
        cg.destroy()
        for base in Path("/sys/fs/cgroup").iterdir():
            if (base / parent.name).is_dir():
                (base / parent.name).rmdir()


def test_masked_directories_share_one_read_only_tmpfs(runtime, make_bundle, tmp_path, rootfs):
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    for d in ("m1", "m2", "m3"):
        (own / d).mkdir()
    bundle = make_bundle(["sh", "-c", "stat -c %d /m1 /m2 /m3; touch /m2/x || echo refused"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["linux"]["maskedPaths"] = ["/m1", "/m2", "/m3"]
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    devices = done.stdout.split()[:3]
    assert len(set(devices)) == 1 and done.stdout.split()[3] == "refused"


def test_hook_errors_name_the_hook_and_start_container_hooks_get_the_process_env(runtime, make_bundle, busybox):
    bundle = make_bundle(["true"])
    config = _config(bundle)
    config["hooks"] = {"prestart": [{"path": busybox, "args": ["busybox", "true"]},
                                    {"path": busybox, "args": ["busybox", "false"]}]}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1 and "error running prestart hook #1:" in done.stderr
    config["process"]["env"] = ["PATH=/bin:/usr/bin", "ONE=two"]
    config["hooks"] = {"startContainer": [{"path": "/bin/sh", "args": ["sh", "-c", '[ "$ONE" = two ]']}]}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c2", check=False)
    assert done.returncode == 0, done.stderr


def test_syscalls_newer_than_the_seccomp_profile_fail_with_enosys():
    """libc falls back (clone3 -> clone) only on ENOSYS; a syscall the profile does not name but that
    is older than its newest one gets the default action."""
    profile = Seccomp.from_spec({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": [*BUSYBOX_START, "write"], "action": "SCMP_ACT_ALLOW"}]})
    libc = ctypes.CDLL(None, use_errno=True)
    numbers = [1000, *(compiler.libseccomp().seccomp_syscall_resolve_name(n) for n in (b"clone3", b"getpid"))]

    def probe() -> None:
        loader.load(profile)
        for nr in numbers:
            libc.syscall(nr, 0, 0)
            os.write(1, f"{ctypes.get_errno()} ".encode())

    code, out = run_in_child(probe, BUSYBOX, "true")
    assert code == 0, out
    assert out.split() == [str(errno.ENOSYS), str(errno.ENOSYS), str(errno.EPERM)]


def test_a_created_containers_init_holds_no_runtime_fd_but_the_exec_fifo(runtime, make_bundle):
    """Whatever the init holds before `start` the workload could reach through /proc/1/fd (runc's leak check)."""
    bundle = make_bundle(["true"])
    try:
        runtime("create", "--bundle", str(bundle), "c1")
        pid = runtime.state("c1")["pid"]
        held = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert [target for fd, target in held.items() if fd > 2] == [str(runtime.root / "c1" / "exec.fifo")]
        runtime("start", "c1")
        assert not (runtime.root / "c1" / "exec.fifo").exists()
    finally:
        runtime("delete", "-f", "c1", check=False)


@pytest.mark.parametrize("cap_dac_override", [False, True])
def test_a_file_only_its_owner_may_execute_runs_for_a_user_with_cap_dac_override(runtime, make_bundle, tmp_path,
                                                                                 rootfs, cap_dac_override):
    """runc's start_hello case: the program is looked up with the effective ids and capabilities, as execve
    will check it, not with access(2)'s real ones."""
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "owner").mkdir()
    subprocess.run(["cp", str(own / "bin" / "busybox"), str(own / "owner" / "echo")], check=True)
    os.chmod(own / "owner" / "echo", 0o700)  # root's alone
    bundle = make_bundle(["/owner/echo", "hello"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["process"]["user"] = {"uid": 1000, "gid": 100}
    if cap_dac_override:
        for kind in ("bounding", "effective", "inheritable", "ambient", "permitted"):
            config["process"]["capabilities"].setdefault(kind, []).append("CAP_DAC_OVERRIDE")
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    if cap_dac_override:
        assert (done.returncode, done.stdout) == (0, "hello\n"), done.stderr
    else:
        assert done.returncode != 0 and "/owner/echo" in done.stderr


def test_a_failing_execve_reads_as_runcs_one_line(runtime, make_bundle, tmp_path, rootfs):
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "run.sh").write_text("#!/mmnnttbb foo bar\nsh\n")
    os.chmod(own / "run.sh", 0o755)
    bundle = make_bundle(["/run.sh"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode != 0
    assert done.stderr.splitlines() == ["exec /run.sh: no such file or directory"]


def test_create_time_hooks_run_in_the_bundle_and_create_container_hooks_in_the_rootfs(
        runtime, make_bundle, tmp_path, rootfs):
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    bundle = make_bundle(["true"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["hooks"] = {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "pwd > prestart.cwd"]}],
                       "createContainer": [{"path": "/bin/sh", "args": ["sh", "-c", "pwd > ./container.cwd"]}]}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert (bundle / "prestart.cwd").read_text().strip() == str(bundle)
    assert (own / "container.cwd").read_text().strip() == str(own)


def test_device_deny_rules_hold_for_a_device_the_container_has(runtime, make_bundle):
    """linux.devices makes the node; linux.resources.devices alone decides access (runc's dev.bats), and
    an access string with runc's ignored "a" ("rwa") is taken."""
    bundle = make_bundle(["sleep", "100"])
    config = _config(bundle)
    config["linux"].setdefault("resources", {})["devices"] = [
        {"allow": False, "access": "rwm"}, {"allow": False, "type": "c", "major": 1, "minor": 11, "access": "rwa"}]
    config["linux"]["devices"] = [{"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11}]
    _save(bundle, config)
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        for _ in range(2):  # update re-applies the rules
            done = runtime("exec", "c1", "sh", "-c", "exec 3>/dev/kmsg", check=False)
            assert done.returncode != 0 and "Operation not permitted" in done.stderr
            runtime("update", "c1", "--pids-limit", "42")
        assert runtime("exec", "c1", "sh", "-c", "exec 3>/dev/null").returncode == 0
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_recursive_mount_attributes_reach_every_mount_below(runtime, make_bundle, tmp_path):
    """`rro` makes a submount read-only too, where `ro` on an rbind does not; `rnoatime` likewise."""
    volume = tmp_path / "volume"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(volume)], check=True)
    try:
        (volume / "sub").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "none", str(volume / "sub")], check=True)
        bundle = make_bundle(["sh", "-c", "touch /ro/sub/x; touch /rro/sub/x; grep ' /rro/sub ' /proc/mounts"])
        config = _config(bundle)
        config["mounts"] += [
            {"destination": "/ro", "type": "bind", "source": str(volume), "options": ["rbind", "ro"]},
            {"destination": "/rro", "type": "bind", "source": str(volume), "options": ["rbind", "rro", "rnoatime"]}]
        _save(bundle, config)
        done = runtime("run", "--bundle", str(bundle), "c1", check=False)
        assert done.stderr.count("Read-only file system") == 1 and "/rro/sub/x" in done.stderr, done.stderr
        assert done.stdout.split()[3].split(",")[:2] == ["ro", "noatime"]
    finally:
        subprocess.run(["umount", "-R", str(volume)], check=True)


def _sched(pid: int) -> tuple[int, int]:
    """(policy, nice) of a process, from /proc/PID/stat (fields 41 and 19)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[38]), int(fields[16])


def test_scheduler_io_priority_and_personality_reach_init_and_exec(runtime, make_bundle):
    """process.scheduler and process.ioPriority for init and, from config.json, for exec'd processes (a
    process.json of its own overrides them); linux.personality for both."""
    bundle = make_bundle(["sleep", "100"])
    config = _config(bundle)
    config["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 19}
    config["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_BE", "priority": 4}
    config["linux"]["personality"] = {"domain": "LINUX32"}
    _save(bundle, config)
    sched_batch, best_effort_4 = 3, (2 << 13) | 4
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        runtime("run", "-d", "--bundle", str(bundle), "c1")
        pid = runtime.state("c1")["pid"]
        assert _sched(pid) == (sched_batch, 19)
        assert libc.syscall(252, 1, pid) == best_effort_4  # ioprio_get(IOPRIO_WHO_PROCESS, pid)
        done = runtime("exec", "c1", "sh", "-c", "uname -m; cat /proc/self/stat")
        machine, stat = done.stdout.splitlines()
        assert machine == "i686"
        fields = stat.rsplit(")", 1)[1].split()
        assert (int(fields[38]), int(fields[16])) == (sched_batch, 19)
        own = bundle / "process.json"
        own.write_text(json.dumps({**config["process"], "args": ["sh", "-c", "cat /proc/self/stat"],
                                   "scheduler": {"policy": "SCHED_OTHER"}}))
        fields = runtime("exec", "--process", str(own), "c1").stdout.rsplit(")", 1)[1].split()
        assert (int(fields[38]), int(fields[16])) == (0, 0)
    finally:
        runtime("delete", "-f", "c1", check=False)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["process"].__setitem__("scheduler", {"policy": "SCHED_BATCH", "priority": 3}),
     "process.scheduler.priority: can only be set for SCHED_FIFO or SCHED_RR"),
    (lambda c: c["process"].__setitem__("scheduler", {"policy": "SCHED_NOPE"}),
     "process.scheduler.policy: unknown scheduling policy"),
    (lambda c: c["process"].__setitem__("ioPriority", {"class": "IOPRIO_CLASS_BE", "priority": 8}),
     "process.ioPriority.priority"),
    (lambda c: c["linux"].__setitem__("personality", {"domain": "LINUX64"}),
     "linux.personality.domain: unknown personality domain"),
    (lambda c: (c["process"].__setitem__("scheduler", {"policy": "SCHED_DEADLINE", "runtime": 42000,
                                                       "deadline": 1000000, "period": 1000000}),
                c["linux"].setdefault("resources", {}).__setitem__("cpu", {"cpus": "0"})),
     "process scheduler can't be used together with AllowedCPUs"),
])
def test_bad_scheduling_settings_are_refused_naming_the_field(runtime, make_bundle, edit, message):
    if "AllowedCPUs" in message and (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs")
    bundle = make_bundle(["true"])
    config = _config(bundle)
    edit(config)
    _save(bundle, config)
    try:
        done = runtime("run", "--bundle", str(bundle), "c1", check=False)
        assert done.returncode == 1 and message in done.stderr, done.stderr
    finally:
        runtime("delete", "-f", "c1", check=False)


def test_seccomp_flags_default_to_spec_allow_and_start_container_hooks_run_under_the_filter(runtime, make_bundle):
    """runc's choice of flags, which --debug reports: none named means SPEC_ALLOW where the host has it, an
    empty list means none. A startContainer hook runs under the container's filter (killed by it here)."""
    bundle = make_bundle(["sh", "-c", "mkdir /tmp/x"])
    config = _config(bundle)
    config["process"]["noNewPrivileges"] = True
    config["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                  "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    _save(bundle, config)
    default = 4 if "SECCOMP_FILTER_FLAG_SPEC_ALLOW" in compiler.supported_flags() else 0
    for flags, expected in ((None, default), ([], 0), (["SECCOMP_FILTER_FLAG_LOG"], 2)):
        if flags is not None:
            config["linux"]["seccomp"]["flags"] = flags
        _save(bundle, config)
        done = runtime("--debug", "run", "--bundle", str(bundle), "c1", check=False)
        assert done.returncode != 0 and "Operation not permitted" in done.stderr + done.stdout
        assert f'"seccomp filter flags: {expected}"' in done.stderr, (flags, done.stderr[-2000:])
        runtime("delete", "-f", "c1", check=False)

    config["process"]["args"] = ["true"]
    config["linux"]["seccomp"]["syscalls"][0]["action"] = "SCMP_ACT_KILL"
    config["hooks"] = {"startContainer": [{"path": "/bin/sh", "args": ["sh", "-c", "mkdir /tmp/y"]}]}
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c2", check=False)
    runtime("delete", "-f", "c2", check=False)
    assert done.returncode != 0
    assert "error running startContainer hook #0" in done.stderr and "signal: bad system call" in done.stderr


def test_tmpcopyup_fills_the_tmpfs_with_what_it_hides(runtime, make_bundle, tmp_path, rootfs):
    """runc's tmpcopyup: the directory's entries are copied into the tmpfs mounted over it (modes kept), which
    stays read-only when asked; the image's directory itself is untouched."""
    own = tmp_path / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(own)], check=True)
    (own / "dir1" / "dir2").mkdir(parents=True)
    os.chmod(own / "dir1" / "dir2", 0o777)
    (own / "dir1" / "file").write_text("from the image\n")
    bundle = make_bundle(["sh", "-c", "ls -ld /dir1/dir2; cat /dir1/file; touch /dir1/new && echo wrote"])
    config = _config(bundle)
    config["root"] = {"path": str(own)}
    config["mounts"].append({"source": "tmpfs", "destination": "/dir1", "type": "tmpfs", "options": ["tmpcopyup"]})
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("drwxrwxrwx") and "from the image" in done.stdout and "wrote" in done.stdout
    assert not (own / "dir1" / "new").exists()
    config["mounts"][-1]["options"] = ["tmpcopyup", "ro"]
    _save(bundle, config)
    done = runtime("run", "--bundle", str(bundle), "c2", check=False)
    assert "from the image" in done.stdout and "wrote" not in done.stdout and "Read-only" in done.stderr
