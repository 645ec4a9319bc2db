"""Drives the `pyruntime` command the way a user or a shim does, for tests and benchmarks."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path

from pyruntime.oci.default import default_spec

REPO = Path(__file__).resolve().parents[2]
PYRUNTIME = str(REPO / ".venv" / "bin" / "pyruntime")


class Runtime:
    def __init__(self, root: Path, binary: str = PYRUNTIME) -> None:
        self.root, self.binary = Path(root), binary

    def __call__(self, *args: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Runs one command; output goes through files, not pipes, because a container started by
        `create` or `run -d` inherits them and would hold a pipe open long after the command exits."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            code = subprocess.run([self.binary, "--root", str(self.root), *args], stdout=out, stderr=err,
                                  timeout=timeout, **kw).returncode
            out.seek(0)
            err.seek(0)
            done = subprocess.CompletedProcess(args, code, out.read(), err.read())
        if check and done.returncode != 0:
            raise AssertionError(f"pyruntime {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def state(self, cid: str) -> dict:
        return json.loads(self("state", cid).stdout)

    def cleanup(self) -> None:
        """Force-deletes whatever a failed test left, so one failure doesn't leak into the next test."""
        if self.root.is_dir():
            for cid in os.listdir(self.root):
                self("delete", "--force", cid, check=False)


def bundle_config(rootfs: Path, args: list[str], **edits) -> dict:
    """runc's default config for a busybox rootfs, without a terminal, with `edits` merged in."""
    config = default_spec()
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["args"] = args
    for key, value in edits.items():
        config[key] = value
    return copy.deepcopy(config)


def write_bundle(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path
