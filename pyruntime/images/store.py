"""The image store: one object over the parts containerd splits an image service into.

Layout under the root (the caller chooses it; `pyruntime image` defaults to /var/lib/pyruntime/images):
  blobs/sha256/<hex>        verified content (manifests, configs, layers)        -- content.py
  ingest/<hex>.partial      downloads in progress, kept for resume                -- content.py
  snapshots/<chain hex>/fs  one unpacked layer each, overlayfs lower format      -- snapshots.py
  containers/<id>/          a container's rootfs record, upper and work dirs     -- snapshots.py
  images.json               image records and the tag table                      -- metadata.py
  locks/                    flock files: metadata, GC, one per blob/snapshot/container

Pulls (pull.py) and imports (archive.py) install through one path; gc.py deletes what no record names.
Settings (root, registry hosts dir, snapshotter, platform, the syscall layer) are parameters: nothing here
reads the environment, so a CLI, a CRI server and a test can each run a store of their own. The constructor is
the one place of the package that picks the real kernel (when no `kernel` is given); every part below it is
handed the same object.
"""
from __future__ import annotations

import builtins
from collections.abc import Iterable
from pathlib import Path

from pynode_os.files import make_dirs
from pyruntime.images.content import ContentStore
from pyruntime.images.gc import GarbageCollector, PruneReport
from pyruntime.images.metadata import Image, ImageDB
from pyruntime.images.mount import IdMap, mount_all, unmount
from pyruntime.images.request import Credentials, Platform
from pyruntime.images.snapshots import ContainerMount, SnapshotStore
from pyruntime.linux.syscalls import LinuxSyscalls, Syscalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.images.pull import ProgressCallback, Puller


class ImageStore:
    def __init__(self, root: Path | str, *, hosts_dir: Path | None = None, platform: Platform | None = None,
                 snapshotter: str = "overlay", kernel: Syscalls | None = None) -> None:
        """`kernel`: the syscall layer snapshots are mounted and layers unpacked through (the real one by default)."""
        self.root = Path(root)
        self.kernel = kernel or LinuxSyscalls()
        # containerd's snapshotter root mode (CVE-2021-41103): layers and upper dirs hold setuid files and the
        # secrets of private images; narrowed when an older version left it wider
        make_dirs(self.root, 0o700, chmod=self.kernel.chmod)
        self.content = ContentStore(self.root)
        self.snapshots = SnapshotStore(self.root, self.kernel, snapshotter)
        self.db = ImageDB(self.root, self.content, self.snapshots)
        self.gc = GarbageCollector(self.root, self.db, self.content, self.snapshots)
        self.platform = platform or Platform()
        self.hosts_dir = hosts_dir
        self._puller: Puller | None = None

    @property
    def puller(self) -> Puller:
        """Made on first use: the registry client loads requests and TLS (bench.cri's memory), which a store
        that is only read (pyruntime-cri's, whose pulls run in a child process) never needs."""
        if self._puller is None:
            from pyruntime.images.pull import Puller
            self._puller = Puller(self.content, self.snapshots, self.db, self.gc, hosts_dir=self.hosts_dir,
                                  platform=self.platform, kernel=self.kernel)
        return self._puller

    # ---- images ---------------------------------------------------------------------------------------------

    def list(self) -> builtins.list[Image]:
        return self.db.list()

    def get(self, ref_or_id: str) -> Image:
        return self.db.get(ref_or_id)

    def pull(self, ref: str, *, auth: Credentials | None = None, progress: ProgressCallback | None = None,
             platform: Platform | None = None, progress_timeout: float | None = None) -> Image:
        """`progress_timeout`: seconds a blob may stand still (0: never; None: containerd's default)."""
        if progress_timeout is None:
            return self.puller.pull(ref, auth=auth, progress=progress, platform=platform)
        return self.puller.pull(ref, auth=auth, progress=progress, platform=platform,
                                progress_timeout=progress_timeout)

    def tag(self, ref_or_id: str, new_ref: str) -> None:
        self.db.tag(ref_or_id, new_ref)

    def remove(self, ref: str, *, force: bool = False) -> builtins.list[str]:
        """Untag; an image left with no name is deleted, and then whatever only it used. Returns deleted IDs."""
        def users(image_id: str) -> builtins.list[str]:
            return [m.container_id for m in self.snapshots.list_containers() if m.image_id == image_id]

        deleted = self.db.remove(ref, force=force, users=users)
        if deleted:
            self.gc.collect()
        return deleted

    def refcounts(self) -> dict[str, int]:
        """Users of each snapshot: images whose chain includes it plus containers running on it."""
        counts = {s.chain_id: 0 for s in self.snapshots.list()}
        with self.db.transaction(write=False) as db:
            for rec in db["images"].values():
                for c in rec["chain_ids"]:
                    counts[c] = counts.get(c, 0) + 1
            for mount in self.snapshots.list_containers():
                rec = db["images"].get(mount.image_id)
                for c in (rec["chain_ids"] if rec else []):
                    counts[c] = counts.get(c, 0) + 1
        return counts

    def prune(self, *, dangling_only: bool = False, keep: Iterable[str] = ()) -> PruneReport:
        return self.gc.prune(dangling_only=dangling_only, keep=keep)

    def collect(self) -> PruneReport:
        return self.gc.collect()

    def import_archive(self, path: Path | str, *, name: str | None = None,
                       progress: ProgressCallback | None = None) -> builtins.list[Image]:
        from pyruntime.images import archive
        return archive.import_archive(self.puller, path, name=name, progress=progress)

    def export(self, refs_or_ids: builtins.list[str], dest: Path | str) -> Path:
        from pyruntime.images import archive
        return archive.export(self.db, self.content, refs_or_ids, dest)

    # ---- container root filesystems -------------------------------------------------------------------------

    def prepare_mounts(self, ref_or_id: str, container_id: str, *, driver: str | None = None) -> ContainerMount:
        """A container's writable rootfs as the mounts to make, for a caller that mounts them where it wants."""
        with self.gc.shared():
            image_id, chain = self.db.chain(ref_or_id)
            return self.snapshots.prepare(container_id, image_id, chain, driver=driver)

    def prepare_rootfs(self, ref_or_id: str, container_id: str, idmap: IdMap | None = None) -> Path:
        """A writable rootfs for a container, mounted at the path returned: an overlay of the image's snapshots
        with its own upper directory, or a copy of them where overlayfs is refused. `idmap`: for a container
        in a pod's user namespace (mount.mount_all)."""
        record = self.prepare_mounts(ref_or_id, container_id)
        try:
            mount_all(record.mounts, record.rootfs, self.kernel, idmap)
        except OSError:
            self.snapshots.release(container_id)
            if record.driver != "overlay":
                raise
            record = self.prepare_mounts(ref_or_id, container_id, driver="copy")
            mount_all(record.mounts, record.rootfs, self.kernel, idmap)
        return Path(record.rootfs)

    def release_rootfs(self, container_id: str) -> bool:
        """Unmount a container's rootfs (where prepare_rootfs mounted it) and delete its writable layer."""
        with self.gc.shared():
            record = self.snapshots.container(container_id)
            if record is not None:
                unmount(record.rootfs, self.kernel)
            return self.snapshots.release(container_id)

    def rootfs_mounts(self) -> builtins.list[ContainerMount]:
        return self.snapshots.list_containers()
