"""What containerd's runc shim relies on from its runtime binary, found by running pyruntime under it.

The shim reads a failed command's reason from `--log` (a sandbox's runtime gets a read-only /dev/null as
stdout and stderr), expects exit status 1 for a runtime error, and runs `exec --detach` without being a
subreaper, so the runtime must report the exec'd process's own error, not what waiting for it said.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess


def test_a_failed_create_with_unwritable_stdio_logs_its_error_and_exits_1(runtime, tmp_path):
    log = tmp_path / "runtime.log"
    with open("/dev/null", "rb") as read_only:
        done = subprocess.run([runtime.binary, "--root", str(runtime.root), "--log", str(log), "--log-format",
                               "json", "create", "--bundle", str(tmp_path / "missing"), "c1"],
                              stdout=read_only, stderr=read_only, timeout=60)
    assert done.returncode == 1
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error"
    assert str(tmp_path / "missing") in entry["msg"]


def test_a_detached_exec_that_fails_reports_the_process_error(runtime, make_bundle):
    runtime("run", "--detach", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    not_executable = runtime("exec", "--detach", "c1", "/etc/passwd", check=False)
    assert not_executable.returncode == 255  # runc's exec: its own failures are 255
    assert "/etc/passwd" in not_executable.stderr and "No child processes" not in not_executable.stderr
    bad_cwd = runtime("exec", "--detach", "--cwd", "/nowhere", "c1", "true", check=False)
    assert bad_cwd.returncode == 255
    assert "/nowhere" in bad_cwd.stderr
    runtime("delete", "--force", "c1")


def test_exec_under_a_seccomp_profile_needs_nothing_from_the_container(runtime, make_bundle):
    """libseccomp is the host's: it must be loaded before exec joins the container's mount namespace."""
    bundle = make_bundle(["sleep", "100"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                  "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    (bundle / "config.json").write_text(json.dumps(config))
    runtime("run", "--detach", "--bundle", str(bundle), "c1")
    denied = runtime("exec", "c1", "mkdir", "/tmp/x", check=False)
    assert denied.returncode == 1
    assert "Operation not permitted" in denied.stderr
    runtime("delete", "--force", "c1")


def test_exec_with_a_terminal_needs_nothing_from_the_container(runtime, make_bundle, tmp_path):
    """The console code is the runtime's: it must be loaded before exec joins the container."""
    sock_path = tmp_path / "console.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)
    runtime("run", "--detach", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    master = -1
    try:
        pid_file = tmp_path / "exec.pid"
        execd = runtime("exec", "--detach", "--tty", "--console-socket", str(sock_path), "--pid-file",
                        str(pid_file), "c1", "tty", check=False)
        assert execd.returncode == 0, execd.stderr
        conn, _ = server.accept()
        with conn:
            _msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 1)
        master = fds[0]
        out = b""
        while b"/dev/pts/" not in out:
            chunk = os.read(master, 1024)
            if not chunk:
                break
            out += chunk
        assert b"/dev/pts/" in out
        # this test process is the nearest subreaper of a detached exec, as a shim is: it reaps it, or the
        # container's init could not finish exiting
        os.waitpid(int(pid_file.read_text()), 0)
    finally:
        server.close()
        if master >= 0:
            os.close(master)
        runtime("delete", "--force", "c1", check=False)
