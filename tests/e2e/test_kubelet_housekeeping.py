"""pykubelet's housekeeping on a real node (containerd 1.6 through CRI): image garbage collection removes an
unused image and keeps the one a running pod uses (and the runtime's pause image), with thresholds forced
so low that the node always wants space (high 1 %, low 0 %: it reports FreeDiskSpaceFailed, since the disk
holds more than images); container log rotation keeps a chatty container's log files within
containerLogMaxFiles, compresses the older ones, and loses no line at a rotation (read from the files:
`kubectl logs` is not served yet).

Both images are pulled before the kubelet starts, so both are as old as the kubelet's first look at them
and the first collection (imageMinimumGCAge after the start) may take either."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from pynode_cluster.node import SANDBOX_IMAGE
from tests.kit.kubelet_node import BUSYBOX, HTTPD, apply, delete, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-housekeeping"
NODE_IP = "10.201.0.35"
MAX_FILES = 3  # the live file, the newest rotated one, one compressed
KUBELET_CONFIG = {"containerLogMaxSize": "1Ki", "containerLogMaxFiles": MAX_FILES, "containerLogMonitorInterval": "3s",
                  "imageGCHighThresholdPercent": 1, "imageGCLowThresholdPercent": 0, "imageMinimumGCAge": "20s"}
STOPPABLE = "trap 'exit 0' TERM; "  # sh as PID 1 ignores SIGTERM unless it traps it
LINE = re.compile(r"^\S+ stdout [FP] line (\d+) ")


@pytest.fixture(scope="module", autouse=True)
def images(runtime):
    """Both images in the runtime before the kubelet (a module fixture set up after this one) starts."""
    for image in (BUSYBOX, HTTPD):
        runtime.pull_image(image)


def pod_spec(name: str, command: str) -> dict:
    return kit_pod_spec(NODE, name, {"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", STOPPABLE + command]})


def running(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def present(runtime, image: str) -> bool:
    return runtime.image_status(image).image.ByteSize() > 0


def test_image_gc_removes_an_unused_image_and_keeps_the_one_in_use(control_plane, kubelet, runtime, kubepods,
                                                                   tmp_path):
    apply(control_plane, tmp_path, pod_spec("in-use", "sleep 3600 & wait"))
    try:
        wait_pod(control_plane, "in-use", "Running", running)
        has_pause_image = present(runtime, SANDBOX_IMAGE)  # containerd's; pyruntime-cri's pause is built in
        wait_for("the unused image removed", lambda: not present(runtime, HTTPD), timeout=90)
        assert present(runtime, BUSYBOX), "the image of a running pod was removed"
        assert present(runtime, SANDBOX_IMAGE) == has_pause_image, "the pause image was removed"
        events = wait_for("a FreeDiskSpaceFailed event", lambda: [
            e for e in json.loads(control_plane.kubectl("get", "events", "-n", "default", "--field-selector",
                                                        "reason=FreeDiskSpaceFailed", "-o", "json").stdout)["items"]
            if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == NODE], timeout=30)
        assert events[0]["type"] == "Warning" and "Attempted to free" in events[0]["message"]
        assert running(wait_pod(control_plane, "in-use", "still Running", running))
    finally:
        delete(control_plane, "in-use")


def numbers(text: str) -> list[int]:
    return [int(m.group(1)) for m in map(LINE.match, text.splitlines()) if m]


def test_chatty_container_log_is_rotated_and_bounded(control_plane, kubelet, kubepods, tmp_path):
    # ~100 lines of ~110 bytes a second: past 1 KiB at every pass
    apply(control_plane, tmp_path, pod_spec("chatty", 'i=0; while true; do echo "line $i $(printf %100s)"; '
                                            'i=$((i+1)); sleep 0.01; done & wait'))
    try:
        pod = wait_pod(control_plane, "chatty", "Running", running)
        logs = kubelet.pods_dir / f"default_chatty_{pod['metadata']['uid']}" / "main"
        seen: set[str] = set()

        def rotated_and_compressed() -> bool:
            names = {p.name for p in logs.iterdir()}
            finished = {n for n in names if not n.endswith(".tmp")}
            assert len(finished) <= MAX_FILES, sorted(names)
            seen.update(finished)
            return any(n.endswith(".gz") for n in seen) and sum(n.startswith("0.log.") for n in seen) >= 3

        wait_for("rotations and a compressed file", rotated_and_compressed, timeout=60, interval=0.3)

        def contiguous() -> list[int] | None:
            """Lines of the newest rotated file and of the live one, read while no rotation happened."""
            before = sorted(p.name for p in logs.iterdir())
            newest = max((n for n in before if re.fullmatch(r"0\.log\.\d{8}-\d{6}", n)), default=None)
            if newest is None:
                return None
            lines = numbers((logs / newest).read_text()) + numbers((logs / "0.log").read_text())
            return lines if sorted(p.name for p in logs.iterdir()) == before else None

        lines = wait_for("the newest two files read between rotations", contiguous, timeout=30, interval=0.2)
        assert lines == list(range(lines[0], lines[0] + len(lines))), "a line was lost or reordered at rotation"

        def compressed() -> list[int] | None:
            """The lines of the compressed file (None if a rotation removed it as it was read)."""
            try:
                name = next(p.name for p in logs.iterdir() if p.name.endswith(".gz"))
                return numbers(gzip.decompress((logs / name).read_bytes()).decode())
            except (StopIteration, FileNotFoundError):
                return None

        older = wait_for("a compressed file read", compressed, timeout=30, interval=0.2)
        assert older == list(range(older[0], older[0] + len(older))) and older[-1] < lines[-1]
    finally:
        delete(control_plane, "chatty")
