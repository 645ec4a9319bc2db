"""`make run`: the main job, end to end on one machine with nothing but Debian's busybox-static.

It builds the busybox test image as a real OCI image, imports it into pyruntime's image store, makes
an overlay rootfs from it and runs a container with the `pyruntime` command, printing what it ran.
Standalone: no registry, no API server.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from pyruntime.images.store import ImageStore
from tests.kit.busybox import build_busybox_image
from tests.kit.runtime import PYRUNTIME, bundle_config

IMAGE = "localhost/pynode/busybox:latest"
SCRIPT = ("echo \"hello from $(hostname), pid $$ in its own namespaces\"; echo 'processes:'; ps -o pid,user,comm; "
          "echo 'network:'; ip -o link | cut -d' ' -f2; echo 'memory limit:' "
          "$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="pynode-demo-") as tmp:
        work = Path(tmp)
        image = build_busybox_image(work / "layout", work / "build")
        archive = work / "busybox.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(image.layout, arcname=".")
        store = ImageStore(work / "images")
        store.import_archive(archive, name=IMAGE)
        print(f"imported {IMAGE} ({image.manifest_digest})")
        rootfs = store.prepare_rootfs(IMAGE, "demo")
        try:
            config = bundle_config(rootfs, ["sh", "-c", SCRIPT], hostname="pynode-demo")
            config["linux"]["resources"]["memory"] = {"limit": 64 << 20}
            bundle = work / "bundle"
            bundle.mkdir()
            (bundle / "config.json").write_text(json.dumps(config, indent=1))
            cmd = [PYRUNTIME, "--root", str(work / "state"), "run", "--bundle", str(bundle), "demo"]
            print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
            code = subprocess.run(cmd).returncode
            print(f"container exited with status {code}")
        finally:
            store.release_rootfs("demo")
    return code


if __name__ == "__main__":
    sys.exit(main())
