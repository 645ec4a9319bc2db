"""`make run` (the installed package's `pynode run`) starts a real node in the background (pyruntime-cri,
pykubelet in standalone mode, the package's static pod static-web.yaml serving HTTP), prints the pod's IP and
its answer, and a second `make run` changes nothing; `make stop` (`pynode stop`) removes all of it (the per-test
leak check sees every process, link, cgroup, mount and iptables rule), and is idempotent too. It needs none of
the Go-built peers of the tests: they are hidden from it."""
from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

from pynode_cluster import standalone

REPO = Path(__file__).resolve().parents[2]


def make(target: str, peers: Path) -> str:
    done = subprocess.run(["make", "-s", target, f"PEERS_BIN={peers}"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"make {target} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_make_run_is_a_node_and_make_stop_leaves_nothing(tmp_path: Path):
    no_peers = tmp_path / "no-peers"
    no_peers.mkdir()
    assert not standalone.VAR.exists() and not standalone.RUN.exists(), \
        "a node of `make run` is already up: `make stop` first"
    try:
        first = make("run", no_peers)
        ip = re.search(r"^pod IP: (\S+)$", first, re.M)
        assert ip, first
        assert f"GET http://{ip.group(1)}/ -> hello from {standalone.POD}" in first
        assert "pynode stop" in first and "importing the busybox image" in first
        with urllib.request.urlopen(f"http://{ip.group(1)}/", timeout=5) as answer:
            assert answer.read().decode().startswith(f"hello from {standalone.POD}")
        container = re.search(r"container (\w+)$", first, re.M)
        assert container, first

        second = make("run", no_peers)
        assert "the node is already running" in second
        assert "importing" not in second and "starting" not in second
        assert f"pod IP: {ip.group(1)}" in second and f"container {container.group(1)}" in second
    finally:
        stopped = make("stop", no_peers)
    assert "the node is stopped and removed" in stopped
    assert not standalone.VAR.exists() and not standalone.RUN.exists()
    assert not Path(f"/sys/class/net/{standalone.NODE.bridge}").exists()
    assert make("stop", no_peers).strip() == "no node is running: nothing to stop"
