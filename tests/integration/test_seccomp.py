"""Filters loaded by loader.load() in a forked child act on the busybox it then execs."""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from pyruntime.linux.seccomp import compiler, loader
from pyruntime.linux.seccomp.profile import Seccomp
from tests.kit.busybox import static_busybox
from tests.kit.child import run_in_child

BUSYBOX = str(static_busybox())
# What static busybox needs to start and exit (strace of `busybox true`).
BUSYBOX_START = ["execve", "brk", "arch_prctl", "set_tid_address", "set_robust_list", "rseq", "prlimit64",
                 "readlink", "getrandom", "mprotect", "prctl", "getuid", "exit_group"]


def load(spec: dict, warnings: list[str] | None = None) -> Callable[[], int | None]:
    config = Seccomp.from_spec(spec)
    return lambda: loader.load(config, warn=None if warnings is None else warnings.append)


def test_errno_rule_denies_mkdir(tmp_path: Path) -> None:
    target = tmp_path / "x"
    code, out = run_in_child(
        load({"defaultAction": "SCMP_ACT_ALLOW",
              "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}),
        BUSYBOX, "mkdir", str(target))
    assert code == 1 and "Operation not permitted" in out
    assert not target.exists()


def test_default_errno_is_eperm_and_errno_ret_is_returned(tmp_path: Path) -> None:
    _, out = run_in_child(
        load({"defaultAction": "SCMP_ACT_ALLOW",
              "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"},
                           {"names": ["rmdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 28}]}),
        BUSYBOX, "sh", "-c", f"mkdir {tmp_path}/a; mkdir -p {tmp_path}/b 2>/dev/null; rmdir {tmp_path}")
    assert "Operation not permitted" in out and "No space left on device" in out
    assert list(tmp_path.iterdir()) == []


def test_allow_list_with_errno_default(tmp_path: Path) -> None:
    """Everything but what busybox echo needs fails, so the allowed program still runs and others fail."""
    allowed = [*BUSYBOX_START, "write"]
    spec = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [{"names": allowed, "action": "SCMP_ACT_ALLOW"}]}
    code, out = run_in_child(load(spec), BUSYBOX, "echo", "hello")
    assert (code, out) == (0, "hello\n")
    code, out = run_in_child(load(spec), BUSYBOX, "mkdir", str(tmp_path / "x"))
    assert code == 1 and "Function not implemented" in out


def test_argument_conditions(tmp_path: Path) -> None:
    """kill(pid, 0) probes pass while kill(pid, SIGTERM) is denied; MASKED_EQ denies a chmod to a private mode."""
    spec = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["kill"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 1, "value": 15, "op": "SCMP_CMP_EQ"}]},
        {"names": ["chmod"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
         "args": [{"index": 1, "value": 0o077, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["fchmodat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
         "args": [{"index": 2, "value": 0o077, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
    ]}
    (tmp_path / "f").touch()
    _, out = run_in_child(load(spec), BUSYBOX, "sh", "-c",
                             f"kill -0 $$ && echo alive; kill -TERM $$; echo survived; "
                             f"chmod 0755 {tmp_path}/f && echo public; chmod 0700 {tmp_path}/f")
    assert "alive" in out and "survived" in out and "Operation not permitted" in out
    assert "public" in out and "Permission denied" in out
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o755


def test_same_argument_twice_is_an_or(tmp_path: Path) -> None:
    """Docker's profile lists one value per rule entry for the same argument; runc adds them as separate rules."""
    spec = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["kill"], "action": "SCMP_ACT_ERRNO", "args": [
            {"index": 1, "value": 15, "op": "SCMP_CMP_EQ"}, {"index": 1, "value": 10, "op": "SCMP_CMP_EQ"}]}]}
    _, out = run_in_child(load(spec), BUSYBOX, "sh", "-c", "kill -TERM $$; kill -USR1 $$; echo survived")
    assert out.count("Operation not permitted") == 2 and "survived" in out


def test_unknown_syscalls_are_skipped_with_a_warning() -> None:
    warnings: list[str] = []
    config = Seccomp.from_spec({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["no_such_syscall", "mkdir"], "action": "SCMP_ACT_ERRNO"}]})

    def setup() -> None:
        loader.load(config, warn=warnings.append)
        os.write(1, json.dumps(warnings).encode() + b"\n")

    code, out = run_in_child(setup, BUSYBOX, "true")
    assert code == 0 and json.loads(out.splitlines()[0]) == ["seccomp: unknown syscall 'no_such_syscall' ignored"]


def test_rule_with_the_default_action_is_skipped() -> None:
    code, out = run_in_child(load({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"},
        {"names": BUSYBOX_START, "action": "SCMP_ACT_ALLOW"}]}), BUSYBOX, "true")
    assert (code, out) == (0, "")


def test_kill_process_and_log_flag() -> None:
    code, _ = run_in_child(load({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"],
                                 "syscalls": [{"names": ["uname"], "action": "SCMP_ACT_KILL_PROCESS"}]}),
                           BUSYBOX, "uname")
    assert code == -31  # SIGSYS


def test_no_new_privs_is_left_alone() -> None:
    code, out = run_in_child(load({"defaultAction": "SCMP_ACT_ALLOW"}), BUSYBOX, "grep", "NoNewPrivs",
                             "/proc/self/status")
    assert code == 0 and out.split() == ["NoNewPrivs:", "0"]


def test_unsupported_flag_is_a_clear_error() -> None:
    if "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV" in compiler.features()["supportedFlags"]:
        pytest.skip("libseccomp here supports WAIT_KILLABLE_RECV")
    code, out = run_in_child(load({"defaultAction": "SCMP_ACT_ALLOW",
                                   "flags": ["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"]}), BUSYBOX, "true")
    assert code == 127 and "seccomp_attr_set(SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV): not supported" in out


def test_notify_fd_reaches_the_listener(tmp_path: Path) -> None:
    """The agent gets the state and the notify fd; once it closes the fd, notified syscalls fail with ENOSYS."""
    listener = tmp_path / "agent.sock"
    config = Seccomp.from_spec({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": str(listener),
                                "listenerMetadata": "meta",
                                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]})
    state = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 0, "bundle": "/b"}

    def setup() -> None:
        fd = loader.load(config)
        assert fd is not None
        loader.send_listener_fd(config, fd, pid=os.getpid(), state=state)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(listener))
        server.listen(1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.dup2(w, 1)
                os.dup2(w, 2)
                setup()
                os.execv(BUSYBOX, [BUSYBOX, "mkdir", str(tmp_path / "x")])
            finally:
                os._exit(127)
        os.close(w)
        conn, _ = server.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
            assert conn.recv(1) == b""
        assert len(fds) == 1
        os.close(fds[0])
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1 and "Function not implemented" in out
    message = json.loads(data)
    assert message == {"ociVersion": "1.2.0", "fds": ["seccompFd"], "pid": pid, "metadata": "meta", "state": state}
    assert not (tmp_path / "x").exists()


def test_notify_rule_with_only_unknown_names_gives_no_fd(tmp_path: Path) -> None:
    config = Seccomp.from_spec({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": str(tmp_path / "agent.sock"),
                                "syscalls": [{"names": ["no_such_syscall"], "action": "SCMP_ACT_NOTIFY"}]})

    def setup() -> None:
        os.write(1, repr(loader.load(config)).encode())
        os._exit(0)

    assert run_in_child(setup, BUSYBOX, "true") == (0, "None")
