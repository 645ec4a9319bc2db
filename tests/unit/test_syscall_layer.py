"""The syscall layer is the only way to the kernel, and it is handed in, never picked up.

A module that made a raw call (os.mknod, os.chown, a ctypes libc call) or built its own LinuxSyscalls
would run for real in the unit tests that hand it a FakeSyscalls, touching the host without anyone
noticing; these checks fail instead. They read the source (AST), so they cover code paths no test runs.
"""
from __future__ import annotations

import ast
import errno
import importlib
import os
import pkgutil
from pathlib import Path

import pytest

import pyruntime
from pyruntime.linux import resolve, syscalls
from pyruntime.linux.syscalls import FakeSyscalls, LinuxSyscalls, SyscallError

PACKAGE = Path(pyruntime.__file__).parent
# os functions that change ownership, identity, modes, device nodes, links or namespaces: only through Syscalls
RAW_OS_CALLS = {"mknod", "chown", "lchown", "fchown", "chmod", "lchmod", "fchmod", "symlink", "statvfs",
                "setns", "unshare", "setresuid", "setresgid", "setgroups", "setuid", "setgid", "seteuid", "setegid",
                "setreuid", "setregid"}
# bindings themselves: the syscall layer with its libc handle, and libseccomp's binding (a library
# that builds a BPF program; its one kernel call is seccomp(2) loading it)
BINDINGS = {"linux/syscalls.py", "linux/_libc.py", "linux/seccomp/compiler.py", "linux/seccomp/loader.py"}
# entry points, the only places that choose the real kernel: the CLI, the container life cycle's
# public calls, the CRI server's main and fork server, and the image store's constructor
EDGES = {"linux/syscalls.py", "cli/main.py", "container/create.py", "container/exec.py", "container/control.py",
         "cri/launcher.py", "cri/main.py", "images/store.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def _raw_calls(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in RAW_OS_CALLS:
                found.append(f"os.{node.attr} (line {node.lineno})")
            if node.value.id == "libc":
                found.append(f"libc.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name} (line {node.lineno})" for a in node.names if a.name == "ctypes"]
        elif isinstance(node, ast.ImportFrom) and (
                node.module in ("ctypes", "pyruntime.linux._libc")
                or (node.module == "os" and any(a.name in RAW_OS_CALLS for a in node.names))):
            found.append(f"from {node.module} import ... (line {node.lineno})")
    return found


def test_no_module_makes_raw_kernel_calls_outside_the_syscall_layer():
    offenders = {name: calls for name, tree in _modules() if name not in BINDINGS and (calls := _raw_calls(tree))}
    assert offenders == {}, "call these through the Syscalls object the module is handed"


def test_only_entry_points_choose_the_real_kernel():
    offenders = [name for name, tree in _modules() if name not in EDGES
                 and any((isinstance(n, ast.Name) and n.id == "LinuxSyscalls") or
                         (isinstance(n, ast.alias) and n.name == "LinuxSyscalls") for n in ast.walk(tree))]
    assert offenders == [], "take a `kernel: Syscalls` parameter instead of making a LinuxSyscalls"


def test_no_module_holds_a_syscall_object_to_fall_back_on():
    """A module-level instance (the old `syscalls.SYS`) is what tests used to monkeypatch, and what code
    that forgot its parameter silently used for real."""
    for info in pkgutil.walk_packages(pyruntime.__path__, "pyruntime."):
        if info.name.startswith("pyruntime.cli"):
            continue  # the CLI modules run their command on import of __main__ only, but stay out of it
        module = importlib.import_module(info.name)
        held = [k for k, v in vars(module).items() if isinstance(v, (LinuxSyscalls, FakeSyscalls))]
        assert held == [], f"{info.name} holds {held}"


def test_the_checks_catch_a_forgetful_module():
    tree = ast.parse("import os\nfrom pyruntime.linux._libc import libc\n"
                     "def make(name):\n    os.mknod(name)\n    libc.mount(None)\n")
    assert _raw_calls(tree) == ["from pyruntime.linux._libc import ... (line 2)", "os.mknod (line 4)",
                                "libc.mount (line 5)"]


def test_fake_records_changes_and_makes_lookups(tmp_path):
    fake = FakeSyscalls()
    fake.mknod(str(tmp_path / "null"), 0o20666, os.makedev(1, 3))
    fake.symlink("/proc/self/fd", str(tmp_path / "fd"))
    fake.chown(str(tmp_path), 0, 0)
    assert os.listdir(tmp_path) == []
    assert [c[0] for c in fake.calls] == ["mknod", "symlink", "chown"]
    assert fake.statvfs_flags(str(tmp_path)) == os.statvfs(tmp_path).f_flag
    overridden = {n for n in vars(FakeSyscalls) if not n.startswith("_")} - {"PASS_THROUGH", "named"}
    assert overridden == {n for n in vars(syscalls.Syscalls) if not n.startswith("_")}


def test_errors_name_the_call_and_the_path(tmp_path):
    kernel = LinuxSyscalls()
    (tmp_path / "taken").write_text("")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SyscallError, match=rf"symlink\(-> /x\) taken \(in {tmp_path}\): File exists") as e:
            kernel.symlink("/x", "taken", dir_fd=dfd)
    finally:
        os.close(dfd)
    assert e.value.errno == errno.EEXIST and isinstance(e.value.__cause__, FileExistsError)
    with pytest.raises(SyscallError, match=f"statfs {tmp_path}/missing: No such file"):
        kernel.statfs_type(str(tmp_path / "missing"))
    assert kernel.statfs_type("/proc") == 0x9FA0  # PROC_SUPER_MAGIC


class _NoOpenat2(FakeSyscalls):
    """A kernel older than openat2 (5.6)."""

    def openat2(self, dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
        raise SyscallError(errno.ENOSYS, f"openat2 {path}: Function not implemented")


def test_resolve_without_openat2_refuses_every_symlink_and_dotdot(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hosts").write_text("x")
    (tmp_path / "link").symlink_to("etc")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for kernel in (LinuxSyscalls(), _NoOpenat2()):
            os.close(resolve.open_in_root(kernel, root, "/etc/hosts", os.O_RDONLY))
        fd = resolve.open_in_root(LinuxSyscalls(), root, "/link/hosts", os.O_RDONLY)
        os.close(fd)
        with pytest.raises(SyscallError) as e:
            resolve.open_in_root(_NoOpenat2(), root, "/link/hosts", os.O_RDONLY)
        assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
        with pytest.raises(SyscallError, match=r"'\.\.' is refused"):
            resolve.open_in_root(_NoOpenat2(), root, "etc/../etc/hosts", os.O_RDONLY)
    finally:
        os.close(root)


def test_resolve_clamps_absolute_symlinks_to_the_root(tmp_path):
    (tmp_path / "escape").symlink_to("/")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = resolve.open_in_root(LinuxSyscalls(), root, "/escape/../..", syscalls.O_PATH)
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path)
        finally:
            os.close(fd)
    finally:
        os.close(root)
