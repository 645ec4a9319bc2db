"""Image garbage collection: keeps the image filesystem below the node's disk thresholds, as the kubelet's
image GC manager does, so a node full of old images does not go DiskPressure and start evicting pods.

Every `PERIOD` seconds the image filesystem's usage (its mountpoint from CRI ImageFsInfo, capacity and
free space from statvfs, the way the kubelet reads it through cadvisor) is compared with
imageGCHighThresholdPercent; at or above it, unused images are removed, least recently used first, until
usage would be at imageGCLowThresholdPercent. An image is in use while any container (running or exited:
`kubectl logs --previous` and a restart need it) was made from it; the runtime's pinned images and its
sandbox (pause) image are never removed; an image seen for less than imageMinimumGCAge is left alone (it
was likely pulled for a pod about to start). "Last used" is tracked by this process, as the kubelet's: the
time of the last pass that saw a container using it, so after a restart every image starts as just seen.
When not enough can be freed, or a call fails, the Node gets a Warning event (FreeDiskSpaceFailed,
ImageGCFailed), as from the kubelet. imageGCHighThresholdPercent 100 turns it off.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pykubelet import runtime as cri
from pykubelet.config import Settings
from pykubelet.events import WARNING, EventRecorder

log = logging.getLogger(__name__)

PERIOD = 300.0  # the kubelet's ImageGCPeriod


@dataclass
class ImageRecord:
    """What this process knows of one image: when it first saw it and when last in use (0: never)."""
    id: str
    size: int
    first_detected: float
    last_used: float = 0.0
    in_use: bool = False
    pinned: bool = False


def amount_to_free(capacity: int, available: int, high: int, low: int) -> int:
    """Bytes to free so that usage goes down to `low` percent, when it is at or above `high` percent
    (else 0); the kubelet's arithmetic, in whole percents."""
    if capacity <= 0 or high >= 100:
        return 0
    usage = 100 - available * 100 // capacity
    if usage < high:
        return 0
    return max(0, capacity * (100 - low) // 100 - available)


def select(images: list[ImageRecord], amount: int, now: float, min_age: float) -> list[ImageRecord]:
    """The images to remove to free `amount` bytes: unused, unpinned, seen at least `min_age` seconds ago,
    least recently used first (then first seen first); all of them if they do not add up to `amount`."""
    candidates = sorted((i for i in images if not i.in_use and not i.pinned and now - i.first_detected >= min_age),
                        key=lambda i: (i.last_used, i.first_detected))
    chosen: list[ImageRecord] = []
    freed = 0
    for image in candidates:
        if freed >= amount:
            break
        chosen.append(image)
        freed += image.size
    return chosen


def node_ref(node: str) -> dict:
    """The involvedObject of an event about the node (the kubelet uses the name as its uid)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}


class ImageGC:
    def __init__(self, runtime: cri.CRIRuntime, settings: Settings, events: EventRecorder | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.runtime, self.settings, self.events, self.clock = runtime, settings, events, clock
        self.records: dict[str, ImageRecord] = {}
        self._sandbox_image: str | None = None

    def _warn(self, reason: str, message: str) -> None:
        log.warning("image GC: %s", message)
        if self.events is not None:
            self.events.event(node_ref(self.settings.node_name), WARNING, reason, message)

    def sandbox_image(self) -> str:
        """The runtime's pause image as it names it in its verbose status (containerd: config.sandboxImage;
        "" if it does not say), read once."""
        if self._sandbox_image is None:
            try:
                config = json.loads(self.runtime.status(verbose=True).info.get("config", "{}"))
            except (cri.CRIError, ValueError):
                config = {}
            self._sandbox_image = config.get("sandboxImage", "") if isinstance(config, dict) else ""
        return self._sandbox_image

    def detect(self) -> list[ImageRecord]:
        """Lists the runtime's images and containers: records new images, marks those in use (a container's
        image or one it mounts as an image volume) as used now, forgets images that are gone."""
        now = self.clock()
        used: set[str] = set()
        for c in self.runtime.list_containers():
            used.update(x for x in (c.image_ref, c.image.image) if x)
            try:  # and the images it mounts as image volumes, which only its status names
                mounts = self.runtime.container_status(c.id).status.mounts
            except cri.CRIError:  # removed meanwhile
                continue
            used.update(x for m in mounts for x in (m.image.image, m.image.image_ref) if x)
        sandbox = self.sandbox_image()
        seen: dict[str, ImageRecord] = {}
        for image in self.runtime.list_images():
            record = self.records.get(image.id) or ImageRecord(image.id, image.size, now)
            record.size = image.size
            record.in_use = bool(used & {image.id, *image.repo_tags, *image.repo_digests})
            record.pinned = image.pinned or sandbox in image.repo_tags
            if record.in_use:
                record.last_used = now
            seen[image.id] = record
        self.records = seen
        return list(seen.values())

    def usage(self) -> tuple[int, int]:
        """(capacity, available) in bytes of the image filesystem."""
        filesystems = self.runtime.image_fs_info().image_filesystems
        if not filesystems or not filesystems[0].fs_id.mountpoint:
            raise OSError("CRI ImageFsInfo names no image filesystem")
        st = os.statvfs(filesystems[0].fs_id.mountpoint)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def collect(self) -> list[str]:
        """One pass; returns the ids of the images it removed."""
        images = self.detect()
        capacity, available = self.usage()
        high, low = self.settings.image_gc_high_threshold_percent, self.settings.image_gc_low_threshold_percent
        amount = amount_to_free(capacity, available, high, low)
        if amount <= 0:
            return []
        log.info("image GC: image filesystem at %d%% (threshold %d%%): freeing %d bytes",
                 100 - available * 100 // capacity, high, amount)
        removed: list[str] = []
        freed = 0
        for image in select(images, amount, self.clock(), self.settings.image_minimum_gc_age):
            try:
                self.runtime.remove_image(image.id)
            except cri.NotFound:
                pass
            except cri.CRIError as e:
                self._warn("ImageGCFailed", f"failed to remove image {image.id}: {e}")
                continue
            log.info("image GC: removed image %s (%d bytes)", image.id, image.size)
            self.records.pop(image.id, None)
            removed.append(image.id)
            freed += image.size
        if freed < amount:
            self._warn("FreeDiskSpaceFailed", f"Failed to garbage collect required amount of images. Attempted to "
                       f"free {amount} bytes, but only found {freed} bytes eligible to free.")
        return removed

    def run(self, stop: threading.Event) -> None:
        """Records the images at once, collects first when they are imageMinimumGCAge old (the earliest
        anything can go), then every PERIOD seconds, until `stop`."""
        if self.settings.image_gc_high_threshold_percent >= 100:
            log.info("image GC: off (imageGCHighThresholdPercent 100)")
            return
        delay = min(PERIOD, self.settings.image_minimum_gc_age)
        try:
            self.detect()
        except cri.CRIError as e:
            log.warning("image GC: %s", e)
        while not stop.wait(delay):
            try:
                self.collect()
            except (cri.CRIError, OSError) as e:
                self._warn("ImageGCFailed", f"image garbage collection failed: {e}")
            delay = PERIOD
