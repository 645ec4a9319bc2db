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
# bindings themselves: the syscall layer, and libseccomp's binding (a library that builds a BPF program; its
# one kernel call is seccomp(2) loading it)
BINDINGS = {"linux/syscalls.py", "linux/seccomp/compiler.py", "linux/seccomp/loader.py"}
# the OS floor's raw calls: the libc handle, and mount(2), umount2(2) and statfs(2), which only the syscall
# layer makes for the runtime (pynode_os/__init__.py)
FLOOR_RAW = {"pynode_os.libc", "pynode_os.mounts"}
# entry points, the only places that choose the real kernel: the CLI, the container life cycle's
# public calls, the CRI server's main and fork server, and the image store's constructor
EDGES = {"linux/syscalls.py", "cli/main.py", "container/create.py", "container/exec.py", "container/control.py",
         "cri/forkserver.py", "cri/main.py", "images/store.py"}


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
            found += [f"import {a.name} (line {node.lineno})" for a in node.names
                      if a.name == "ctypes" or a.name in FLOOR_RAW]
        elif isinstance(node, ast.ImportFrom) and (
                node.module == "ctypes" or node.module in FLOOR_RAW
                or (node.module == "pynode_os" and any(f"pynode_os.{a.name}" in FLOOR_RAW for a in node.names))
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
    tree = ast.parse("import os\nfrom pynode_os.libc import libc\nfrom pynode_os import mounts, files\n"
                     "import pynode_os.mounts\n"
                     "def make(name):\n    os.mknod(name)\n    libc.mount(None)\n")
    assert _raw_calls(tree) == ["from pynode_os.libc import ... (line 2)", "from pynode_os import ... (line 3)",
                                "import pynode_os.mounts (line 4)", "os.mknod (line 6)", "libc.mount (line 7)"]


# Forks, signals, and the making and removal of directory entries are made directly, not through Syscalls:
# what the code does next depends on their real effect (a child that runs, a process that is gone, a directory
# that is a lock, a cgroup or a mount point), which a recording fake could not give, and unit tests point the
# runtime at tmp_path. They are allowed only in the functions listed, each with why it reaches nothing but the
# runtime's own processes and files, or what a spec or a request names: a new one fails
# test_direct_calls_are_made_only_where_listed until its function is listed here, with its reason. The floor
# under pyruntime (pynode_os, its functions run by the runtime as its own) is held to the same list.
FLOOR = PACKAGE.parent / "pynode_os"
DIRECT_CALLS = {*(f"os.{name}" for name in ("fork", "forkpty", "kill", "killpg", "pidfd_open", "mkdir", "makedirs",
                                            "unlink", "remove", "rmdir", "removedirs")),
                "shutil.rmtree", "signal.pidfd_send_signal"}
PATH_METHODS = {"mkdir", "unlink", "rmdir"}  # pathlib's: called on anything but os and a Syscalls object

FORK = "the child runs the runtime's own code next"
CHILD = "a child of this process, not yet reaped, so its pid names no other process"
INIT = ("the container's init, under the container's lock, once status_of found its pid with the start time "
        "the state recorded (runc's kill)")
IN_ROOT = "inside the container's root, relative to a directory fd that openat2(RESOLVE_IN_ROOT) resolved there"
CGROUPFS = "the cgroup filesystem's interface (a directory is a cgroup), under the hierarchy the manager was given"
CRI_RECORDS = "the CRI daemon's own directories under its --root and --state (cri/layout.py)"
SNAPSHOTS = "the snapshotter's own tree under the image store's root, under the snapshot's lock"
CONTENT = "the content store's own tree under the image store's root, under the blob's lock"
UNPACK = ("inside the snapshot being unpacked, relative to a directory fd opened without following links: what "
          "the layer's tar asks for, its whiteouts included")
DIRECT_ALLOWED: dict[str, tuple[str, str]] = {  # "file function": (calls, why)
    "cli/main.py OwnConsole.close": ("os.unlink", "the console socket this command made"),
    "container/control.py start": ("os.kill os.unlink",
                                   f"the exec fifo, whose removal marks the container started; {INIT}"),
    "container/control.py kill": ("os.kill", INIT),
    "container/control.py delete": ("os.kill", INIT),
    "container/control.py wait_gone": ("os.pidfd_open", "only watches a process the caller named by pid and start"),
    "container/create.py fork_in_cgroup": ("os.fork", f"stage 1, where clone3 into the cgroup is refused; {FORK}"),
    "container/create.py _kill_and_reap": ("os.kill", CHILD),
    "container/create.py wait_exit": ("os.kill", "forwards a foreground runtime's signals to the container's "
                                                 "init, its child as the subreaper (runc's)"),
    "container/exec.py _stage1": ("os.fork", f"stage 2, in the container's namespaces; {FORK}"),
    "container/exec.py _exec": ("os.fork os.kill", f"stage 1, forked plainly to set its CPU affinity before it "
                                                   f"enters the cgroup, killed if the exec fails: {CHILD}; {FORK}"),
    "container/init.py stage1": ("os.fork", f"stage 2, the container's init in its new pid namespace; {FORK}"),
    "container/paths.py mkdir_all": ("os.mkdir", f"a mount point the spec names, {IN_ROOT}"),
    "container/paths.py make_target": ("os.mkdir", f"a mount point the spec names, {IN_ROOT}"),
    "container/rootfs.py copy_tree": ("os.mkdir", "a copied directory, into a tmpfs of the container's by fd"),
    "container/rootfs.py _subdir": ("os.mkdir", "in a tmpfs the container's set-up has just mounted, by fd"),
    "container/rootfs.py create_device": ("os.unlink", f"the entry a spec's device replaces, {IN_ROOT}"),
    "container/store.py ContainerStore.reserve": ("os.mkdir", "the container's state directory under --root: the mkdir "
                                                     "claims the id"),
    "container/store.py ContainerStore.remove": ("os.rmdir os.unlink shutil.rmtree",
                                        "the container's state directory under --root, at its delete"),
    "cri/attach.py AttachServer.close": ("os.unlink", "the attach socket this supervisor made"),
    "cri/containers.py Containers._create": ("os.makedirs", f"the container's bundle, rootfs and image volume "
                                                            f"mount points and log directory; {CRI_RECORDS}"),
    "cri/containers.py Containers._dismantle": ("shutil.rmtree", f"once its rootfs is unmounted; {CRI_RECORDS}"),
    "cri/crilog.py CriLogWriter._open": ("os.makedirs", "the log directory the kubelet named, as containerd "
                                                        "makes it"),
    "cri/events.py SupervisorWatcher.watch": ("os.pidfd_open", "only watches a supervisor, whose start time is "
                                                               "checked once the pidfd pins it"),
    "cri/launcher.py ExecHandle.kill": ("signal.pidfd_send_signal", "through the exec'd process's pidfd, which "
                                                                   "names no other process"),
    "cri/forkserver.py _Server._fork": ("os.fork", f"one child per request (a supervisor, a pause, an exec); {FORK}"),
    "cri/forkserver.py _Server._fork_puller": ("os.fork", f"the puller, at start (again once it died); {FORK}"),
    "cri/forkserver.py _puller": ("os.fork", f"one child per image pull; {FORK}"),
    "cri/forkserver.py _start_exec": ("os.kill os.makedirs os.pidfd_open shutil.rmtree",
                                    "the process Runtime.exec has just started and not yet handed over (its "
                                    "pidfd for the supervisor), and a directory of its own for its console socket"),
    "cri/main.py claim_socket": ("os.unlink", "the --listen socket, only when no daemon answers on it"),
    "cri/main.py _serve": ("os.unlink", "the daemon's own --listen socket, as it stops"),
    "cri/network.py Network._cache_write": ("os.makedirs", f"the CNI result cache; {CRI_RECORDS}"),
    "cri/network.py _remove": ("os.remove", f"a CNI result cache file; {CRI_RECORDS}"),
    "cri/ocispec.py _cri_mounts": ("os.makedirs", "a missing hostPath a mount names, made as containerd makes it "
                                                  "(hostPath DirectoryOrCreate relies on it)"),
    "cri/pause.py pin": ("os.makedirs", f"the directory of the pod's namespace pins; {CRI_RECORDS}"),
    "cri/pause.py unpin": ("os.rmdir os.unlink", f"the pins once unmounted, and their directory; {CRI_RECORDS}"),
    "cri/pause.py become_pause": ("os.kill", f"the pod's pid 1 when the pause's set-up fails: {CHILD}"),
    "cri/pause.py _pod_init": ("os.fork", f"the pod's pid 1 in its new pid namespace; {FORK}"),
    "cri/pause.py _user_namespace_pod": ("os.kill", "the pod's pid 1 when the set-up fails: its parent, this "
                                                    "process's child, is not yet reaped, so the pid names no other"),
    "cri/pause.py release_pause": ("os.unlink", f"the pause's pid file; {CRI_RECORDS}"),
    "cri/pause.py _kill_if_same": ("os.pidfd_open signal.pidfd_send_signal",
                                   "the pause, through a pidfd taken before its start time is checked"),
    "cri/pause_image.py Pauses.run_pause": ("os.makedirs", f"the pause container's bundle; {CRI_RECORDS}"),
    "cri/pause_image.py Pauses._release": ("shutil.rmtree", f"the pause container's bundle and supervisor "
                                                            f"directory once it is deleted; {CRI_RECORDS}"),
    "cri/sandbox.py Sandboxes._dismantle": ("shutil.rmtree", f"the pod's directories once its pause is released; "
                                                             f"{CRI_RECORDS}"),
    "cri/store.py RecordStore.save_sandbox": ("os.makedirs", CRI_RECORDS),
    "cri/store.py RecordStore.save_container": ("os.makedirs", CRI_RECORDS),
    "cri/supervisor.py _Supervisor._start": ("os.makedirs", f"the supervisor's own directory; {CRI_RECORDS}"),
    "cri/supervisor.py _Supervisor._serve": ("os.unlink", "an attach socket left by an earlier supervisor of this "
                                                          "container id, in the supervisor's own directory"),
    "cri/supervisor.py _Supervisor._create": ("os.fork", f"Runtime.create in a child that exits once done; {FORK}"),
    "cri/supervisor.py _Supervisor._create_with_terminal": ("os.unlink", "the console socket in the supervisor's "
                                                                         "own directory"),
    "images/content.py _Locks.hold": ("os.unlink", "a lock file, removed while held once what it guards is gone"),
    "images/content.py ContentStore.__init__": ("Path.mkdir", CONTENT),
    "images/content.py ContentStore.delete": ("Path.unlink", CONTENT),
    "images/content.py ContentStore.writer": ("Path.unlink", CONTENT),
    "images/content.py ContentStore.clean_ingest": ("Path.unlink", CONTENT),
    "images/gc.py GarbageCollector._clean_locks": ("Path.unlink", "lock files of what is gone, under the "
                                                                  "exclusive GC lock"),
    "images/mount.py _mount_idmapped": ("os.makedirs os.mkdir", "the staging directory beside the rootfs, and a "
                                                                "mount point in it per lower layer"),
    "images/mount.py _drop_staging": ("os.rmdir", "those staging mount points once detached"),
    "images/snapshots.py SnapshotStore.__init__": ("Path.mkdir", SNAPSHOTS),
    "images/snapshots.py SnapshotStore.create": ("Path.mkdir shutil.rmtree", SNAPSHOTS),
    "images/snapshots.py SnapshotStore.remove": ("shutil.rmtree", SNAPSHOTS),
    "images/snapshots.py SnapshotStore.clean_temporary": ("shutil.rmtree", SNAPSHOTS),
    "images/snapshots.py SnapshotStore.prepare": ("Path.mkdir shutil.rmtree", SNAPSHOTS),
    "images/snapshots.py SnapshotStore.release": ("Path.unlink shutil.rmtree", SNAPSHOTS),
    "images/unpack.py _Applier._create_parents": ("os.mkdir", UNPACK),
    "images/unpack.py _Applier._remove": ("os.unlink shutil.rmtree", UNPACK),
    "images/unpack.py _Applier._dir": ("os.mkdir", UNPACK),
    "images/unpack.py copy_snapshot_into": ("Path.mkdir", f"the copy snapshotter's private copy; {SNAPSHOTS}"),
    "images/unpack.py _rm": ("Path.unlink shutil.rmtree", f"the copy snapshotter's private copy; {SNAPSHOTS}"),
    "linux/cgroups/base.py makedirs": ("os.makedirs", CGROUPFS),
    "linux/cgroups/base.py rmdir_tree": ("os.rmdir", CGROUPFS),
    "linux/cgroups/base.py rmdir_if_empty": ("os.rmdir", CGROUPFS),
    "linux/cgroups/base.py signal_pids": ("os.kill", "the processes of a container's cgroup (its cgroup.procs, "
                                                     "frozen meanwhile where it can be), as runc's kill --all"),
    "linux/cgroups/v1.py V1Manager.create": ("os.mkdir", CGROUPFS),
    "linux/cgroups/v2.py V2Manager.create": ("os.mkdir", CGROUPFS),
    "linux/userns.py fork_mapped": ("os.fork", f"a child that unshares a user namespace and runs `then` in it; "
                                               f"{FORK}"),
    "pynode_os/files.py atomic_file._discard": ("os.unlink", "the temporary file of a write that failed"),
    "pynode_os/files.py _make_missing": ("os.mkdir", "make_dirs' levels, each given its mode through the chmod its "
                                                     "caller hands (the runtime's Syscalls.chmod)"),
}


def _name_of(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _direct_calls(tree: ast.Module) -> dict[str, set[str]]:
    """The DIRECT_CALLS and pathlib calls in each def, keyed by its qualified name (a lambda's count as its
    def's); importing one by name counts too, as that import, which no entry of DIRECT_ALLOWED lists."""
    found: dict[str, set[str]] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            call = None
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
                call = f"{child.value.id}.{child.attr}" if f"{child.value.id}.{child.attr}" in DIRECT_CALLS else None
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr in PATH_METHODS and _name_of(child.func.value) not in ("os", "kernel")):
                call = f"Path.{child.func.attr}"
            if isinstance(child, ast.ImportFrom):
                named = [a.name for a in child.names if f"{child.module}.{a.name}" in DIRECT_CALLS]
                call = f"from {child.module} import {', '.join(named)}" if named else None
            if call:
                found.setdefault(scope or "<module>", set()).add(call)
            visit(child, scope)

    visit(tree, "")
    return found


def test_direct_calls_are_made_only_where_listed():
    floor = [(f"pynode_os/{p.relative_to(FLOOR)}", ast.parse(p.read_text(), str(p)))
             for p in sorted(FLOOR.rglob("*.py"))]
    found = {f"{name} {function}": calls for name, tree in _modules() + floor if name not in BINDINGS
             for function, calls in _direct_calls(tree).items()}
    allowed = {key: set(calls.split()) for key, (calls, _why) in DIRECT_ALLOWED.items()}
    unlisted = {key: sorted(calls - allowed.get(key, set())) for key, calls in found.items()
                if calls - allowed.get(key, set())}
    assert unlisted == {}, "route these through Syscalls, or list the function in DIRECT_ALLOWED with why it is safe"
    stale = {key: sorted(calls - found.get(key, set())) for key, calls in allowed.items()
             if calls - found.get(key, set())}
    assert stale == {}, "DIRECT_ALLOWED names calls these functions no longer make: drop them from it"


def test_the_direct_call_check_sees_every_form():
    tree = ast.parse("import os, shutil, signal\nfrom os import kill\n"
                     "class Reaper:\n    def reap(self, pid, path):\n        os.kill(pid, 9)\n"
                     "        signal.pidfd_send_signal(pid, 9)\n        path.parent.unlink()\n"
                     "        self.kernel.unlink(path)\n        os.unlink(path)\n"
                     "def tidy(path):\n    later = lambda: shutil.rmtree(path)\n    Path(path).mkdir()\n")
    assert _direct_calls(tree) == {
        "<module>": {"from os import kill"},
        "Reaper.reap": {"os.kill", "signal.pidfd_send_signal", "Path.unlink", "os.unlink"},
        "tidy": {"shutil.rmtree", "Path.mkdir"}}


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
