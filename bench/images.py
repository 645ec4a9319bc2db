"""Pull + unpack of a ~100 MB multi-layer image from a local registry: pyruntime against skopeo + umoci.

The image (4 gzip layers, ~100 MB compressed, a mix of many small text files and a few large binary ones) is
built once by the test-image kit and pushed to Debian's docker-registry on 127.0.0.1. Each round times, one
after the other so machine noise hits both alike:
  ours:      `pyruntime image pull` (a fresh process, as a user runs it) into an empty store: download, verify,
             unpack every layer into its overlay snapshot
  reference: `skopeo copy docker://... oci:DIR` then `umoci unpack --image DIR BUNDLE`, into empty directories
Prints medians and our/reference ratio. Needs root (umoci unpack and our ownership-preserving unpack).
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.integration.registry_server import Registry
from tests.kit.images import add_image, d, f, tar_entries, write_index

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python")
OURS = "import sys; from pyruntime.cli.image import main; sys.exit(main(sys.argv[1:]))"
LAYERS_MB = (45, 35, 25, 15)


def build_image(layout: Path) -> None:
    rng = random.Random(7)
    words = [rng.randbytes(6).hex() for _ in range(2000)]
    layers = []
    for i, mb in enumerate(LAYERS_MB):
        entries = [d(f"l{i}"), d(f"l{i}/text"), d(f"l{i}/bin")]
        text_budget = (mb << 20) // 4
        n = 0
        while text_budget > 0:
            body = " ".join(rng.choices(words, k=rng.randint(50, 800))).encode()
            entries.append(f(f"l{i}/text/f{n}.txt", body))
            text_budget -= len(body)
            n += 1
        for j in range(4):
            entries.append(f(f"l{i}/bin/blob{j}", rng.randbytes((mb << 20) * 3 // 16), 0o755))
        layers.append((tar_entries(entries), "gzip"))
    desc, _ = add_image(layout, layers)
    write_index(layout, [desc])


def _timed(cmds: list[list[str]]) -> float:
    start = time.perf_counter()
    for cmd in cmds:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.images")
    parser.add_argument("-n", "--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    for tool in ("skopeo", "umoci", "docker-registry"):
        if not shutil.which(tool):
            print(f"bench.images: {tool} not installed, skipped")
            return 0
    with tempfile.TemporaryDirectory(prefix="pynode-bench-images-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        build_image(tmp / "layout")
        size = sum(p.stat().st_size for p in (tmp / "layout/blobs").rglob("*") if p.is_file())
        reg = Registry(tmp / "reg").start()
        try:
            reg.push(tmp / "layout", "bench/big:latest")
            ref = f"{reg.host}/bench/big:latest"
            print(f"image: {len(LAYERS_MB)} layers, {size / 1e6:.0f} MB compressed, built and pushed in "
                  f"{time.perf_counter() - t0:.1f}s; {args.rounds} rounds")
            ours, theirs = [], []
            for r in range(args.rounds):
                store = tmp / f"store{r}"
                ours.append(_timed([[PYTHON, "-c", OURS, "--root", str(store), "pull", "-q", ref]]))
                shutil.rmtree(store)
                oci, bundle = tmp / f"oci{r}", tmp / f"bundle{r}"
                theirs.append(_timed([["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}",
                                       f"oci:{oci}:latest"],
                                      ["umoci", "unpack", "--image", f"{oci}:latest", str(bundle)]]))
                shutil.rmtree(oci)
                shutil.rmtree(bundle)
        finally:
            reg.stop()
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"{'':28}{'median':>10}{'min':>10}{'max':>10}")
    print(f"{'pyruntime image pull':28}{mo:>9.2f}s{min(ours):>9.2f}s{max(ours):>9.2f}s")
    print(f"{'skopeo copy + umoci unpack':28}{mt:>9.2f}s{min(theirs):>9.2f}s{max(theirs):>9.2f}s")
    print(f"ratio ours/reference: {mo / mt:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
