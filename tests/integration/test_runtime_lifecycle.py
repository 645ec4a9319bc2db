"""The runc-compatible life cycle, checked as a user of runc would check it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from pynode_os.proc import process_start_time


def test_run_reports_exit_status_and_output(runtime, make_bundle):
    done = runtime("run", "--bundle", str(make_bundle(["sh", "-c", "echo hello; exit 3"])), "c1", check=False)
    assert done.returncode == 3
    assert done.stdout == "hello\n"
    assert runtime("list", "--quiet").stdout.strip() == ""


def test_run_reports_signal_death_as_128_plus_signal(runtime, make_bundle):
    run = subprocess.Popen([runtime.binary, "--root", str(runtime.root), "run", "--bundle",
                            str(make_bundle(["sleep", "100"])), "c1"])
    for _ in range(200):
        if (runtime.root / "c1").exists() and runtime("state", "c1", check=False).returncode == 0 \
                and runtime.state("c1")["status"] == "running":
            break
        time.sleep(0.02)
    runtime("kill", "c1", "9")
    assert run.wait(timeout=20) == 128 + signal.SIGKILL
    assert not (runtime.root / "c1").exists()


def test_create_start_state_kill_delete(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "100"])
    pid_file = tmp_path / "pid"
    runtime("create", "--bundle", str(bundle), "--pid-file", str(pid_file), "c1")
    state = runtime.state("c1")
    assert state["status"] == "created"
    assert state["pid"] == int(pid_file.read_text())
    assert state["bundle"] == str(bundle)
    runtime("start", "c1")
    assert runtime.state("c1")["status"] == "running"
    assert runtime("start", "c1", check=False).returncode != 0
    assert "not stopped" in runtime("delete", "c1", check=False).stderr
    runtime("kill", "c1", "KILL")
    for _ in range(100):
        if runtime.state("c1")["status"] == "stopped":
            break
        time.sleep(0.05)
    assert runtime.state("c1")["status"] == "stopped"
    assert "not running" in runtime("kill", "c1", "TERM", check=False).stderr
    runtime("delete", "c1")
    assert "does not exist" in runtime("state", "c1", check=False).stderr


def test_delete_force_kills_a_running_container(runtime, make_bundle):
    runtime("run", "--detach", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    pid = runtime.state("c1")["pid"]
    runtime("delete", "--force", "c1")
    assert process_start_time(pid) is None
    assert runtime("list", "--format", "json").stdout.strip() == "[]"


def test_delete_of_created_container_needs_no_force(runtime, make_bundle):
    runtime("create", "--bundle", str(make_bundle(["true"])), "c1")
    runtime("delete", "c1")
    assert runtime("list", "-q").stdout.strip() == ""


def test_duplicate_id_is_refused_and_the_first_survives(runtime, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    runtime("create", "--bundle", str(bundle), "c1")
    done = runtime("create", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode != 0 and "already exists" in done.stderr
    assert runtime.state("c1")["status"] == "created"
    runtime("delete", "--force", "c1")


def test_pause_resume(runtime, make_bundle):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    runtime("pause", "c1")
    assert runtime.state("c1")["status"] == "paused"
    assert "it is paused" in runtime("exec", "c1", "true", check=False).stderr
    assert "not supported" in runtime("exec", "--ignore-paused", "c1", "true", check=False).stderr
    runtime("resume", "c1")
    assert runtime.state("c1")["status"] == "running"
    runtime("delete", "--force", "c1")


def test_exec_joins_every_namespace_and_the_cgroup(runtime, make_bundle):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    init = runtime.state("c1")["pid"]
    done = runtime("exec", "c1", "sh", "-c", "for f in /proc/self/ns/*; do readlink $f; done; cat /proc/self/cgroup")
    host_view = sorted(os.readlink(f"/proc/{init}/ns/{n}") for n in
                       ("cgroup", "ipc", "mnt", "net", "pid", "uts"))
    lines = done.stdout.split()
    for ns in host_view:
        assert ns in lines
    with open(f"/proc/{init}/cgroup") as f:
        init_cgroup = [line for line in f.read().splitlines() if ":memory:" in line or line.startswith("0::")]
    # inside the cgroup namespace, its root: the memory hierarchy's on v1, the one hierarchy's on v2
    own = "0::/" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else ":memory:/"
    assert any(line.endswith(own) for line in lines)
    assert init_cgroup and not any(line.endswith(own) for line in init_cgroup), "the host sees its real path"
    assert runtime("exec", "c1", "sh", "-c", "exit 5", check=False).returncode == 5
    ps = json.loads(runtime("ps", "--format", "json", "c1").stdout)
    assert ps == [init]
    runtime("delete", "--force", "c1")


def test_exec_with_an_oom_score_adj(runtime, make_bundle, tmp_path):
    """The exec'd process gets its oomScoreAdj (as containerd's CRI sets it on every exec), in a container with
    a pid namespace of its own, whose /proc shows no /proc/self to a process not yet in that namespace."""
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    with open("/proc/self/oom_score_adj") as f:
        ours = int(f.read())
    proc = {"args": ["cat", "/proc/self/oom_score_adj"], "cwd": "/", "env": ["PATH=/bin"],
            "user": {"uid": 0, "gid": 0}, "oomScoreAdj": max(ours, 0) + 100}
    (tmp_path / "p.json").write_text(json.dumps(proc))
    done = runtime("exec", "--process", str(tmp_path / "p.json"), "c1")
    assert done.stdout.split() == [str(max(ours, 0) + 100)]
    runtime("delete", "--force", "c1")


def test_exec_with_process_json(runtime, make_bundle, tmp_path):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    proc = {"args": ["sh", "-c", "id -u; pwd; echo $FOO"], "cwd": "/tmp", "env": ["FOO=bar", "PATH=/bin"],
            "user": {"uid": 65534, "gid": 65534}}
    (tmp_path / "p.json").write_text(json.dumps(proc))
    done = runtime("exec", "--process", str(tmp_path / "p.json"), "c1")
    assert done.stdout.split() == ["65534", "/tmp", "bar"]
    runtime("delete", "--force", "c1")


def test_events_stats_and_update(runtime, make_bundle):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    runtime("update", "--memory", str(64 << 20), "--pids-limit", "50", "c1")
    stats = json.loads(runtime("events", "--stats", "c1").stdout)
    assert stats["type"] == "stats" and stats["id"] == "c1"
    assert stats["data"]["memory"]["usage"]["limit"] == 64 << 20
    assert stats["data"]["pids"]["limit"] == 50
    runtime("delete", "--force", "c1")


def test_spec_and_features(runtime, tmp_path):
    runtime("spec", "--bundle", str(tmp_path), cwd=tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["ociVersion"].startswith("1.") and config["process"]["args"] == ["sh"]
    assert runtime("spec", "--bundle", str(tmp_path), check=False).returncode != 0
    features = json.loads(runtime("features").stdout)
    assert "pid" in features["linux"]["namespaces"]
    assert features["linux"]["cgroup"]["v1"] or features["linux"]["cgroup"]["v2"]
    assert "createRuntime" in features["hooks"]


def test_unknown_flag_and_command_fail_clearly(runtime):
    done = runtime("create", "--bogus", "c1", check=False)
    assert done.returncode != 0 and "--bogus" in done.stderr
    done = runtime("create", "--no-pivot", "c1", check=False)
    assert done.returncode != 0 and "--no-pivot: not supported: pyruntime always uses pivot_root" in done.stderr
    done = runtime("exec", "--apparmor", "x", "c1", "true", check=False)
    assert done.returncode != 0 and "AppArmor profiles are not supported" in done.stderr
    done = runtime("frobnicate", check=False)
    assert done.returncode != 0 and "frobnicate" in done.stderr


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("ociVersion"), "ociVersion: required"),
        (lambda c: c["process"].__setitem__("cwd", "relative"), "process.cwd: must be an absolute path"),
        (lambda c: c["process"]["user"].__setitem__("uid", "root"), "process.user.uid: must be an integer"),
        (lambda c: c["linux"]["namespaces"].append({"type": "pid"}), "duplicate namespace 'pid'"),
        (lambda c: c["linux"]["namespaces"].append({"type": "bogus"}), 'unknown namespace type "bogus"'),
        (lambda c: c["linux"].__setitem__("resources", {"memory": {"limit": "lots"}}), "linux.resources.memory.limit"),
        (lambda c: c["root"].__setitem__("path", "/nonexistent/rootfs"), "root.path: rootfs /nonexistent/rootfs"),
        (
            lambda c: c["linux"]["namespaces"].__setitem__(1, {"type": "network", "path": "/nonexistent/netns"}),
            "/nonexistent/netns",
        ),
        (
            lambda c: c["linux"]["namespaces"].__setitem__(1, {"type": "network", "path": "/proc/self/ns/ipc"}),
            "is not a network namespace",
        ),
        (lambda c: c["process"].__setitem__("args", ["/no/such/program"]), "/no/such/program"),
        (
            lambda c: c["linux"].__setitem__("sysctl", {"kernel.panic": "1"}),
            'linux.sysctl["kernel.panic"]: not a namespaced sysctl',
        ),
    ],
)
def test_bad_config_fails_with_a_message_naming_the_field_and_leaves_nothing(runtime, make_bundle, edit, message):
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    edit(config)
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("create", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1
    assert message in done.stderr
    assert not (runtime.root / "c1").exists()


def test_malformed_json_and_missing_bundle(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["true"])
    (bundle / "config.json").write_text("{not json")
    done = runtime("create", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1 and "invalid JSON" in done.stderr and "config.json" in done.stderr
    done = runtime("create", "--bundle", str(tmp_path / "nothing"), "c2", check=False)
    assert done.returncode == 1 and "no such file" in done.stderr
    assert "invalid container id" in runtime("create", "--bundle", str(bundle), "../x", check=False).stderr


def test_update_from_a_resources_file_and_events_stream(runtime, make_bundle, tmp_path):
    runtime("run", "-d", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    (tmp_path / "r.json").write_text(json.dumps({"memory": {"limit": 48 << 20}, "cpu": {"quota": 20000,
                                                                                        "period": 100000}}))
    runtime("update", "--resources", str(tmp_path / "r.json"), "c1")
    events = subprocess.Popen([runtime.binary, "--root", str(runtime.root), "events", "--interval", "0.2s", "c1"],
                              stdout=subprocess.PIPE, text=True)
    stdout = events.stdout
    assert stdout is not None
    try:
        first = json.loads(stdout.readline())
    finally:
        events.kill()
        events.wait()
        stdout.close()
    assert first["type"] == "stats" and first["data"]["memory"]["usage"]["limit"] == 48 << 20
    bad = runtime("update", "--memory", "lots", "c1", check=False)
    assert bad.returncode == 1 and "--memory: 'lots' is not a whole number" in bad.stderr
    runtime("delete", "--force", "c1")


def test_a_create_killed_midway_is_reported_stopped_and_delete_removes_everything(runtime, make_bundle, tmp_path):
    import psutil
    marker = tmp_path / "hook-started"
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    config["hooks"] = {"createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", f"touch {marker}; exec sleep 60"]}]}
    (bundle / "config.json").write_text(json.dumps(config))
    create = subprocess.Popen([runtime.binary, "--root", str(runtime.root), "create", "--bundle", str(bundle), "c1"])
    for _ in range(200):
        if marker.exists():
            break
        time.sleep(0.02)
    assert runtime.state("c1")["status"] == "creating"
    assert "not stopped" in runtime("delete", "c1", check=False).stderr
    create.kill()
    create.wait()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline()[:2] == ["sleep", "60"]:
                proc.kill()
                proc.wait()
        except psutil.Error:
            pass  # other tests' reaped-late zombies
    for _ in range(100):
        if runtime.state("c1")["status"] == "stopped":
            break
        time.sleep(0.05)
    assert runtime.state("c1")["status"] == "stopped"
    runtime("delete", "c1")
    assert runtime("list", "-q").stdout.strip() == ""
