"""State directories get their modes from the code, never from the umask (issue 22, item 2): the helpers that
make them under umask 000 (which would leave them world-writable) and 077 (which would close a volume to its
container's user), and the narrowing of a directory an older version left wider."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cni_plugins.ipam.host_local.store import DiskAllocationStore
from pykubelet import dirs
from pykubelet.volumes import atomic
from pyruntime.linux.syscalls import LinuxSyscalls


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_kubelets_root_and_pods_dirs_are_0750_and_narrowed_at_start(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    with umask(0):
        dirs.set_up_root(root)
    assert (mode(root), mode(root / "pods")) == (0o750, 0o750)
    os.chmod(root, 0o755)
    os.chmod(root / "pods", 0o777)
    dirs.set_up_root(root)
    assert (mode(root), mode(root / "pods")) == (0o750, 0o750)


def test_a_volumes_nested_directories_stay_open_to_its_container_under_a_closed_umask(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    with umask(0o077):
        atomic.write(target, {"a/b/key": (b"v", 0o644)})
    data = target / atomic.DATA
    assert (mode(target), mode(data.resolve()), mode(data / "a"), mode(data / "a" / "b")) == (0o755,) * 4
    assert mode(data / "a" / "b" / "key") == 0o644


def test_the_ipam_store_is_not_world_writable_under_umask_000(tmp_path: Path) -> None:
    store = tmp_path / "networks" / "net1"
    with umask(0), DiskAllocationStore(store).locked():
        pass
    assert (mode(tmp_path / "networks"), mode(store)) == (0o755, 0o755)
    os.chmod(store, 0o777)  # an older version's
    with DiskAllocationStore(store).locked():
        pass
    assert mode(store) == 0o755


def test_the_runtimes_standalone_root_is_0711_whatever_the_umask_and_an_older_mode(tmp_path: Path) -> None:
    """pyruntime's --root (/run/pyruntime) holds every container's state.json and exec fifo: under umask 000
    and a root an older version left 0777, a host user could add or replace entries in it."""
    from pyruntime.cli.main import OwnConsole
    from pyruntime.container.store import ContainerStore
    root = tmp_path / "pyruntime"
    root.mkdir()
    os.chmod(root, 0o777)
    with umask(0):
        ContainerStore(str(root)).reserve("c1", LinuxSyscalls())
    assert (mode(root), mode(root / "c1")) == (0o711, 0o711)
    fresh = tmp_path / "fresh" / "pyruntime"
    with umask(0):
        console = OwnConsole(str(fresh), LinuxSyscalls())
    console.close()
    assert (mode(fresh.parent), mode(fresh)) == (0o711, 0o711)
