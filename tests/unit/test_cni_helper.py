"""The resident CNI helper's protocol without root: malformed requests, version skew, stop.

Each test runs its own helper under a random socket name, in a socket directory of its own (mode 0700, so
without root too), with a log of its own; STATUS of pyhost-local needs neither root nor a netns, so it
stands for a plugin call.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from cni_plugins import helper, launch
from cni_plugins.install import TEMPLATE

REPO = Path(__file__).resolve().parents[2]
ACCEPTCON = "00010000"  # /proc/net/unix flags of a listening socket (bound but not listening: 00000000)


def listening(name: str) -> bool:
    path = launch.socket_path(name)
    return any(line.split()[-1] == path and line.split()[3] == ACCEPTCON
               for line in Path("/proc/net/unix").read_text().splitlines()[1:] if len(line.split()) > 7)


@pytest.fixture(autouse=True)
def helper_dir(monkeypatch: pytest.MonkeyPatch):
    """A socket directory of the test's own, short enough for a unix socket path (tmp_path may not be)."""
    directory = tempfile.mkdtemp(prefix="pyt-cni-", dir="/tmp")
    monkeypatch.setenv(launch.DIR_ENV, directory)
    yield directory
    shutil.rmtree(directory)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        time.sleep(0.02)


def helper_pid(name: str) -> int:
    conn = launch.connect(name)
    assert not isinstance(conn, str), conn
    conn[0].close()
    return conn[1]


@pytest.fixture
def running(tmp_path: Path):
    """A helper of this checkout's code on a fresh name; yields (name, log path)."""
    name = f"pyt-helper-{secrets.token_hex(4)}"
    log = tmp_path / "helper.log"
    env = {**os.environ, "PYCNI_HELPER_LOG": str(log)}
    proc = subprocess.Popen([sys.executable, "-c", f"from cni_plugins.helper import main; main({name!r})"],
                            env=env, cwd=REPO)
    try:
        wait_for(lambda: listening(name))
        yield name, log
    finally:
        try:
            helper.stop(name)
            proc.wait(timeout=10)
        finally:
            proc.kill()  # only if it did not stop: a test failure, not a leak
            proc.wait()


def raw_call(name: str, payload: bytes, half_close: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(15)
        s.connect(launch.socket_path(name))
        s.sendall(payload)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def status_request(tmp_path: Path) -> tuple[dict, bytes]:
    env = {"CNI_COMMAND": "STATUS"}
    conf = {"cniVersion": "1.1.0", "name": "pyt-net", "type": "pyhost-local",
            "ipam": {"type": "pyhost-local", "subnet": "10.222.70.0/24", "dataDir": str(tmp_path / "data")}}
    return env, json.dumps(conf).encode()


@pytest.mark.parametrize("payload,half_close,details", [
    (b"garbage\n", False, "header has 1 fields"),
    (b"1 2 x v\n", False, "not integers"),
    (b"1 -5 0 v\n", False, "out of range"),
    (b"8 0 0 v\nnoplugin", False, "unknown plugin 'noplugin'"),
    (b"10 3 0 v\npyloopbackabc", False, "environment entry without '='"),
    (b"\x00\x01\x02 no newline", True, "the peer closed the connection"),
    (b"x" * 5000, False, "no end of line in the first 4096 bytes"),
])
def test_malformed_request_gets_a_cni_error_and_the_helper_serves_on(running, tmp_path: Path, payload: bytes,
                                                                        half_close: bool, details: str) -> None:
    name, log = running
    reply = raw_call(name, payload, half_close)
    head, _, body = reply.partition(b"\n")
    rc, size = head.split()
    assert int(rc) == 1 and int(size) == len(body)
    error = json.loads(body)
    assert set(error) == {"cniVersion", "code", "msg", "details"}
    assert error["code"] == 6 and error["msg"] == "malformed request to the CNI helper"
    assert details in error["details"]
    logged = [line for line in log.read_text().splitlines() if "WARNING malformed request: " in line]
    assert len(logged) == 1 and details in logged[0]
    env, stdin = status_request(tmp_path)
    assert launch.call_helper(name, "pyhost-local", env, stdin) == (0, b"")


def test_helper_refuses_other_plugin_code_and_makes_way(running, tmp_path: Path) -> None:
    name, log = running
    old = helper_pid(name)
    env, stdin = status_request(tmp_path)
    payload = launch.encode_request("pyhost-local", env, stdin, "0000000000000000")
    assert raw_call(name, payload) == b"refused skew\n"
    wait_for(lambda: not helper.alive(old))
    assert not listening(name), "a refusing helper must give its name up for one of the new code"
    assert "plugin code changed" in log.read_text()


def test_changed_installed_code_is_not_served_by_the_old_helper(tmp_path: Path) -> None:
    """An upgrade in place: the launcher's next call is served in-process and starts a helper of the new code."""
    pkg = tmp_path / "pkg"
    for package in ("cni_plugins", "pynode_os"):
        shutil.copytree(REPO / package, pkg / package, ignore=shutil.ignore_patterns("__pycache__"))
    exe = tmp_path / "pyhost-local"
    exe.write_text(TEMPLATE.format(python=sys.executable, repo=str(pkg), site=sysconfig.get_paths()["purelib"],
                                   func="host_local"))
    exe.chmod(0o755)
    name = f"pyt-helper-{secrets.token_hex(4)}"
    log = tmp_path / "helper.log"
    env, stdin = status_request(tmp_path)
    env.update(PYCNI_HELPER_SOCKET=name, PYCNI_HELPER_LOG=str(log), PYCNI_HELPER_DIR=os.environ[launch.DIR_ENV],
               PATH=os.environ.get("PATH", ""))

    def call() -> None:
        proc = subprocess.run([str(exe)], input=stdin, env=env, capture_output=True, check=False)
        assert (proc.returncode, proc.stdout) == (0, b""), proc

    try:
        call()  # starts the helper
        wait_for(lambda: listening(name))
        first = helper_pid(name)
        call()
        assert helper.alive(first)
        module = pkg / "cni_plugins" / "ipam" / "host_local" / "plugin.py"
        module.write_text(module.read_text() + "\n# upgraded\n")
        call()
        wait_for(lambda: not helper.alive(first))
        wait_for(lambda: listening(name))
        second = helper_pid(name)
        assert second != first
        # the new helper writes its first line just after it listens
        wait_for(lambda: log.read_text().count("serving ") == 2)
        assert "plugin code changed" in log.read_text()
    finally:
        helper.stop(name)


def test_the_code_version_covers_the_os_floor_the_plugins_import(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("cni_plugins", "pynode_os"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.setattr(launch, "PACKAGE", str(tmp_path / "cni_plugins"))
    monkeypatch.setattr(launch, "FLOOR", str(tmp_path / "pynode_os"))
    before = launch.code_version()
    (tmp_path / "pynode_os" / "files.py").write_text("# upgraded\n")
    assert launch.code_version() != before


def test_stop_without_a_helper(tmp_path: Path) -> None:
    assert helper.stop(f"pyt-helper-{secrets.token_hex(4)}") is False


@pytest.mark.parametrize("kind", ["mode 0755", "symlink"])
def test_a_socket_directory_not_ours_to_trust_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          helper_dir: str, kind: str) -> None:
    """Anyone who could write there could squat the helper's socket: the launcher sends nothing into such a
    directory (its call runs in-process) and a helper does not listen in it."""
    if kind == "mode 0755":
        os.chmod(helper_dir, 0o755)
        directory = helper_dir
    else:
        directory = f"{helper_dir}/link"
        os.symlink(helper_dir, directory)  # itself 0700 and ours: only lstat sees it is not a directory
        monkeypatch.setenv(launch.DIR_ENV, directory)
    name = f"pyt-helper-{secrets.token_hex(4)}"
    log = tmp_path / "helper.log"
    proc = subprocess.run([sys.executable, "-c", f"from cni_plugins.helper import main; main({name!r})"],
                          env={**os.environ, "PYCNI_HELPER_LOG": str(log)}, cwd=REPO, timeout=30, check=False)
    assert proc.returncode == 0
    assert "not serving: " in log.read_text() and not listening(name)
    assert os.listdir(helper_dir) == (["link"] if kind == "symlink" else [])
    assert launch.connect(name) == launch.UNTRUSTED


class NoPeerPidfd:
    """A socket on a kernel before 6.5, which has no SO_PEERPIDFD."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def getsockopt(self, level: int, option: int, *size: int):
        if option == launch.SO_PEERPIDFD:
            raise OSError(errno.ENOPROTOOPT, os.strerror(errno.ENOPROTOOPT))
        return self.sock.getsockopt(level, option, *size)


def test_peer_check_without_peer_pidfd_refuses_a_process_started_after_the_accept() -> None:
    """Before Linux 6.5 the pid SO_PEERCRED gives is opened with pidfd_open: a process that started after
    the connection was accepted has taken the pid of a peer that exited."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        peer = NoPeerPidfd(ours)
        assert launch.peer_refusal(peer, time.clock_gettime(time.CLOCK_BOOTTIME)) == ""  # type: ignore[arg-type]  # duck-typed socket
        assert "the peer's pid was reused" in launch.peer_refusal(peer, 0.0)  # type: ignore[arg-type]  # duck-typed socket


def test_a_stopped_helper_leaves_neither_its_socket_nor_its_lock(running, helper_dir: str) -> None:
    """Each helper name (a test's, a bench's, a node's) left a .lock file in /run/pycni/helper for ever."""
    name, _log = running
    assert sorted(os.listdir(helper_dir)) == [os.path.basename(launch.socket_path(name)) + s for s in ("", ".lock")]
    helper.stop(name)
    assert os.listdir(helper_dir) == []


def test_a_lock_removed_under_a_claimant_elects_one_helper(helper_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exiting helper unlinks its lock file while it holds the flock, and a successor may make a new one and
    lock it at once: a claimant that opened the old file before and locks it after must see that it is no longer
    the name's lock, or two helpers would serve one name (and one's exit unlink the other's socket)."""
    name = f"pyt-helper-{secrets.token_hex(4)}"
    lock_path = launch.socket_path(name) + ".lock"
    real_flock = fcntl.flock
    successor: list[int] = []

    def flock_after_a_handover(fd: int, op: int) -> None:
        if not successor:  # between the claimant's open and its flock: the holder leaves, a successor comes
            os.unlink(lock_path)
            successor.append(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600))
            real_flock(successor[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_handover)
    try:
        assert helper.claim(name) is None  # the successor holds the name's lock
    finally:
        os.close(successor[0])
        os.unlink(lock_path)
    assert os.listdir(helper_dir) == []
