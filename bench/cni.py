"""ADD and DEL latency of pybridge+pyhost-local against the reference bridge+host-local, side by side.

Each side runs CYCLES ADD/DEL cycles of the same config (isGateway, a /24 from host-local) into one
network namespace, exec'd as a CNI runtime would exec it; ours is measured with its resident helper warm
(the first call starts it; a warm-up cycle is not counted). Prints the medians and our/reference ratios.
Needs root and the reference plugins built by `make peers`.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cni_plugins import helper
from cni_plugins.install import install

CYCLES = 50
PEERS_CNI = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "cni"


def _conf(bridge_type: str, ipam_type: str, bridge: str, data_dir: Path) -> bytes:
    return json.dumps({
        "cniVersion": "1.1.0", "name": f"pyt-bench-{bridge_type}", "type": bridge_type, "bridge": bridge,
        "isGateway": True,
        "ipam": {"type": ipam_type, "subnet": "10.222.200.0/24", "dataDir": str(data_dir)},
    }).encode()


def _call(exe: Path, command: str, stdin: bytes, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(exe)], input=stdin, env={**env, "CNI_COMMAND": command},
                          stdout=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{exe.name} {command} failed: {proc.stdout.decode(errors='replace')}")
    return elapsed


def measure(exe: Path, stdin: bytes, env: dict[str, str], cycles: int) -> tuple[list[float], list[float]]:
    adds, dels = [], []
    _call(exe, "ADD", stdin, env)
    _call(exe, "DEL", stdin, env)
    for _ in range(cycles):
        adds.append(_call(exe, "ADD", stdin, env))
        dels.append(_call(exe, "DEL", stdin, env))
    return adds, dels


def main(cycles: int = CYCLES) -> int:
    if os.geteuid() != 0 or not (PEERS_CNI / "bridge").exists():
        print("bench.cni: needs root and the reference plugins (make peers)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="pyt-bench-"))
    netns = f"pyt-bench-{secrets.token_hex(3)}"
    bridge = f"pyt-br-{secrets.token_hex(3)}"
    helper_name = f"pyt-bench-helper-{secrets.token_hex(3)}"
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        bin_dir = tmp / "bin"
        install(bin_dir)
        for name in ("bridge", "host-local"):
            os.symlink(PEERS_CNI / name, bin_dir / name)
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "CNI_CONTAINERID": "bench",
               "CNI_NETNS": f"/run/netns/{netns}", "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir),
               "PYCNI_HELPER_SOCKET": helper_name, "PYCNI_HELPER_LOG": str(tmp / "helper.log")}
        ref = measure(bin_dir / "bridge", _conf("bridge", "host-local", bridge, tmp / "data"), env, cycles)
        ours = measure(bin_dir / "pybridge", _conf("pybridge", "pyhost-local", bridge, tmp / "data"), env, cycles)
    finally:
        helper.stop(helper_name)
        subprocess.run(["ip", "netns", "del", netns], check=False)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forwarding)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CNI bridge+host-local, {cycles} ADD/DEL cycles (median ms)")
    print(f"{'':6}{'reference':>12}{'ours':>10}{'ratio':>8}")
    for label, r, o in (("ADD", ref[0], ours[0]), ("DEL", ref[1], ours[1])):
        rm, om = statistics.median(r) * 1000, statistics.median(o) * 1000
        print(f"{label:6}{rm:12.1f}{om:10.1f}{om / rm:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
