"""The defences the best runtimes have, each shown by the attack failing (research notes, section E)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pynode_os import mountinfo
from tests.kit.busybox import build_rootfs


@pytest.fixture
def own_rootfs(tmp_path) -> Path:
    """A rootfs a test may plant links in, so the shared one stays clean."""
    return build_rootfs(tmp_path / "evil-rootfs")


def _bundle(make_bundle, rootfs: Path, args, **edits) -> Path:
    bundle = make_bundle(args)
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["path"] = str(rootfs)
    for key, value in edits.items():
        config[key] = value
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def test_container_cannot_reach_the_runtime_through_proc_exe(runtime, make_bundle):
    """CVE-2019-5736: before start, pid 1 is still the runtime's interpreter; it must stay unreachable."""
    runtime("create", "--bundle", str(make_bundle(["sleep", "100"])), "c1")
    init = runtime.state("c1")["pid"]
    assert Path(f"/proc/{init}/exe").resolve().name.startswith("python")
    done = runtime("exec", "c1", "sh", "-c", "readlink /proc/1/exe; echo rc=$?; cat /proc/1/exe > /dev/null; "
                   "echo rc=$?; echo x >> /proc/1/exe; echo rc=$?; readlink /proc/1/fd/0; echo rc=$?", check=False)
    assert done.stdout.count("rc=1") == 4, done.stdout + done.stderr
    runtime("delete", "--force", "c1")


def test_no_host_fd_leaks_into_the_container(runtime, make_bundle):
    """CVE-2024-21626: only stdio is open in the workload, even when the caller leaks fds."""
    leaky = os.open("/", os.O_RDONLY)  # inherited by the runtime, as a careless caller would leak it
    try:
        bundle = make_bundle(["ls", "/proc/self/fd"])
        done = subprocess.run([runtime.binary, "--root", str(runtime.root), "run", "--bundle", str(bundle), "c1"],
                              capture_output=True, text=True, pass_fds=(leaky,), timeout=30)
    finally:
        os.close(leaky)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["0", "1", "2", "3"]  # 3 is ls's own directory fd


@pytest.mark.parametrize("fd", range(3, 21))
def test_cwd_through_a_leaked_fd_is_refused(runtime, make_bundle, fd):
    bundle = make_bundle(["pwd"])
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["cwd"] = f"/proc/self/fd/{fd}"
    (bundle / "config.json").write_text(json.dumps(config))
    leaky = os.open("/", os.O_RDONLY)
    try:
        done = subprocess.run([runtime.binary, "--root", str(runtime.root), "run", "--bundle", str(bundle), "c1"],
                              capture_output=True, text=True, pass_fds=(leaky,), timeout=30)
    finally:
        os.close(leaky)
    assert done.returncode != 0
    assert "process.cwd" in done.stderr
    assert not (runtime.root / "c1").exists()


@pytest.mark.parametrize("link", ["/", "../../../../..", "/tmp/../.."])
def test_mount_destination_symlink_cannot_escape_the_rootfs(runtime, make_bundle, own_rootfs, tmp_path, link):
    """CVE-2021-30465's class: /escape -> outside; a mount on /escape/target lands inside the rootfs."""
    (own_rootfs / "escape").symlink_to(link)
    host_target = Path("/") / f"pyruntime-escape-{os.getpid()}"
    bundle = _bundle(make_bundle, own_rootfs, ["sh", "-c", "ls -d /escape/*; mount | grep -c pyruntime-escape"])
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"].append({"destination": f"/escape/{host_target.name}", "type": "tmpfs", "source": "tmpfs"})
    config["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert not host_target.exists()
    assert (own_rootfs / host_target.name).is_dir()
    assert not any(host_target.name in m.mount_point for m in mountinfo.read())


def test_bind_mount_onto_a_symlinked_file_stays_inside(runtime, make_bundle, own_rootfs, tmp_path):
    (own_rootfs / "etc" / "resolv.conf").symlink_to("/../../../../etc/hostname-outside")
    src = tmp_path / "resolv"
    src.write_text("nameserver 192.0.2.1\n")
    bundle = _bundle(make_bundle, own_rootfs, ["cat", "/etc/resolv.conf"])
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"].append({"destination": "/etc/resolv.conf", "type": "bind", "source": str(src),
                             "options": ["rbind", "ro"]})
    config["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "nameserver 192.0.2.1\n"
    assert not Path("/etc/hostname-outside").exists()


def test_masked_path_that_is_a_symlink_is_refused(runtime, make_bundle, own_rootfs):
    """CVE-2025-31133's class: a masked path swapped for a symlink is refused, not followed."""
    (own_rootfs / "etc" / "secret").symlink_to("/etc/passwd")
    bundle = _bundle(make_bundle, own_rootfs, ["cat", "/etc/passwd"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["maskedPaths"].append("/etc/secret")
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 1
    assert "masked path /etc/secret is a symlink" in done.stderr
    assert not (runtime.root / "c1").exists()


def test_masking_uses_the_real_null_device_not_the_images(runtime, make_bundle, own_rootfs):
    """With the image's own /dev (no tmpfs), /dev/null planted as a symlink cannot redirect a mask."""
    (own_rootfs / "dev" / "null").symlink_to("/etc/passwd")
    bundle = _bundle(make_bundle, own_rootfs, ["sh", "-c", "wc -c < /proc/keys; cat /etc/passwd | head -1"])
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"] = [m for m in config["mounts"] if not m["destination"].startswith("/dev")]
    config["linux"]["maskedPaths"] = ["/proc/keys"]
    config["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    done = runtime("run", "--bundle", str(bundle), "c1", check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0].strip() == "0"
    assert lines[1].startswith("root:x:0:0")
