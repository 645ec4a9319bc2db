"""Container log rotation: keeps every container's log files under containerLogMaxSize x
containerLogMaxFiles, as the kubelet's container log manager does, so a chatty container cannot fill the
node's disk.

The runtime writes each container's output to its log file (CRI LogPath, under podLogsDir) and never
rotates it itself. Every containerLogMonitorInterval, for each running container whose log has reached
containerLogMaxSize: leftovers of an interrupted pass go (`*.tmp`, a rotated file whose `.gz` exists),
the oldest rotated files go until at most containerLogMaxFiles - 2 remain, the remaining rotated files
are gzip-compressed (through a `.tmp` file, renamed when complete), then the live file is renamed to
`N.log.YYYYMMDD-HHMMSS` (UTC) and the runtime is told to open a new one (CRI ReopenContainerLog). So a
container has at most containerLogMaxFiles files: the live one, the newest rotated one uncompressed
(what `kubectl logs` reads back beyond the live file) and older ones compressed. If the runtime cannot
reopen, the rename is undone, so the runtime never writes into a file that was rotated away.
"""
from __future__ import annotations

import gzip
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.config import Settings

log = logging.getLogger(__name__)

TIMESTAMP = "%Y%m%d-%H%M%S"  # the kubelet's "20060102-150405"
GZ = ".gz"
TMP = ".tmp"


def plan(rotated: list[str], max_files: int) -> tuple[list[str], list[str]]:
    """Of the rotated files of one log (names `N.log.TIMESTAMP[.gz][.tmp]`, the live file excluded), which
    to remove and which to compress before the live file is rotated: (remove, compress)."""
    names = set(rotated)
    remove = [n for n in rotated if n.endswith(TMP) or (not n.endswith(GZ) and n + GZ in names)]
    kept = sorted((n for n in rotated if n not in remove), key=lambda n: n.removesuffix(GZ))
    excess = max(0, len(kept) - max(0, max_files - 2))
    remove += kept[:excess]
    compress = [n for n in kept[excess:] if not n.endswith(GZ)]
    return remove, compress


def compress(path: Path) -> None:
    """`path` to `path.gz`, through `path.gz.tmp`; the original goes once the archive is complete."""
    tmp = path.with_name(path.name + GZ + TMP)
    with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.rename(path.with_name(path.name + GZ))
    path.unlink()


class LogRotator:
    def __init__(self, runtime: cri.CRIRuntime, settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        self.runtime, self.settings, self.clock = runtime, settings, clock

    def rotate_all(self) -> int:
        """One pass over the running containers; returns how many logs it rotated."""
        rotated = 0
        running = api_pb2.ContainerFilter(state=api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING))
        for c in self.runtime.list_containers(running):
            try:
                status = self.runtime.container_status(c.id).status
            except cri.NotFound:
                continue  # gone meanwhile
            if not status.log_path:
                continue
            try:
                rotated += self.rotate(c.id, Path(status.log_path))
            except (OSError, cri.CRIError) as e:
                log.warning("container %s: log rotation of %s: %s", c.id[:12], status.log_path, e)
        return rotated

    def rotate(self, container_id: str, path: Path) -> bool:
        """Rotates the log `path` of the container if it reached the maximum size; True if it did."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            # removed behind the runtime's back: it would keep writing to the unlinked file
            self.runtime.reopen_container_log(container_id)
            return False
        if size < self.settings.container_log_max_size:
            return False
        prefix = path.name + "."
        remove, to_compress = plan([p.name for p in path.parent.iterdir() if p.name.startswith(prefix)],
                                   self.settings.container_log_max_files)
        for name in remove:
            (path.parent / name).unlink(missing_ok=True)
        for name in to_compress:
            compress(path.parent / name)
        target = path.with_name(prefix + time.strftime(TIMESTAMP, time.gmtime(self.clock())))
        if target.exists() or target.with_name(target.name + GZ).exists():
            return False  # rotated within this second already: the next pass does it
        os.rename(path, target)
        try:
            self.runtime.reopen_container_log(container_id)
        except cri.CRIError:
            os.rename(target, path)  # the runtime still writes to it
            raise
        log.debug("container %s: rotated %s to %s", container_id[:12], path, target.name)
        return True

    def run(self, stop: threading.Event) -> None:
        """Rotates every containerLogMonitorInterval until `stop`."""
        while not stop.wait(self.settings.container_log_monitor_interval):
            try:
                self.rotate_all()
            except cri.CRIError as e:
                log.warning("log rotation: %s", e)
