"""The resident helper and network namespaces: a caller is served only by the helper of its own netns,
and a helper does not outlive its node's netns (nor keep it, with its veths, alive).

The "nodes" here are namespaces the plugin is exec'd from (`ip netns exec NODE pybridge`), as a runtime in
its own netns or a nested node would exec it; each pod netns gets a veth whose host end is in its node.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cni_plugins import helper
from cni_plugins.launch import DEFAULT_DIR
from tests.integration.cni_helpers import CNIEnv, helper_listening, ns_exec
from tests.integration.test_cni_bridge import bridge_conf, links_in

pytestmark = pytest.mark.usefixtures("restore_forwarding")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def helpers_in(cni: CNIEnv, netns: str) -> list[int]:
    """Pids of this test's helpers whose netns is `netns`."""
    ino = os.stat(netns).st_ino
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if (
                f"main({cni.helper_name!r})" in " ".join(proc.cmdline())
                and os.stat(f"/proc/{proc.pid}/ns/net").st_ino == ino
            ):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue  # exited while we looked: not a helper of that netns any more
    return found


def stop_helper_in(cni: CNIEnv, netns: str) -> None:
    """Stops it from our mount namespace (a helper serves no other)."""
    code = f"from cni_plugins.helper import stop; stop({cni.helper_name!r})"
    proc = subprocess.run(["nsenter", f"--net={netns}", "--", sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=20, check=False)
    assert proc.returncode == 0, proc.stderr


def test_callers_in_two_namespaces_get_their_own_bridges(cni: CNIEnv) -> None:
    cni.use_helper = True
    conf = bridge_conf(cni, subnet="10.222.71.0/24")
    node_a, node_b = cni.netns(), cni.netns()
    pod_a1, pod_a2, pod_b = cni.netns(), cni.netns(), cni.netns()
    try:
        a1 = cni.run("pybridge", "ADD", conf, pod_a1, "a1", caller_netns=node_a)  # in-process; starts A's helper
        assert a1.ok, a1.raw
        wait_for(lambda: helper_listening(cni.helper_name, node_a), 10, "node A's helper")
        a2 = cni.run("pybridge", "ADD", conf, pod_a2, "a2", caller_netns=node_a)  # served by A's helper
        b = cni.run("pybridge", "ADD", conf, pod_b, "b1", caller_netns=node_b)
        assert a2.ok and b.ok, (a2.raw, b.raw)
        for node, result in ((node_a, a1), (node_a, a2), (node_b, b)):
            links = links_in(node)
            assert conf["bridge"] in links, f"no bridge in {node}"
            assert result.out["interfaces"][1]["name"] in links, f"the host veth of {result.out} is not in {node}"
            assert "10.222.71.1/24" in ns_exec(node, "ip", "-o", "-4", "addr", "show", conf["bridge"]).stdout
        assert not Path(f"/sys/class/net/{conf['bridge']}").exists(), "the bridge was made in the test's netns"
        assert len(helpers_in(cni, node_a)) == 1
    finally:
        for node in (node_a, node_b):
            stop_helper_in(cni, node)


def test_deleted_node_netns_frees_its_helper_and_veths(cni: CNIEnv) -> None:
    cni.use_helper = True
    conf = bridge_conf(cni, subnet="10.222.72.0/24")
    node, pod = cni.netns(), cni.netns()
    add = cni.run("pybridge", "ADD", conf, pod, "n1", caller_netns=node)
    assert add.ok, add.raw
    wait_for(lambda: helper_listening(cni.helper_name, node), 10, "the node's helper")
    [pid] = helpers_in(cni, node)
    try:
        subprocess.run(["ip", "netns", "del", os.path.basename(node)], check=True)
        cni.namespaces.remove(os.path.basename(node))
        wait_for(lambda: not helper.alive(pid), 10, "the helper of a deleted netns to exit")
        # the netns is freed once its last user went, and its host veth ends take their pod ends with them
        wait_for(lambda: "eth0" not in links_in(pod), 10, "the pod's veth to go with the node's netns")
    finally:
        if helper.alive(pid):
            os.kill(pid, 9)


# A root process in the node's netns with a mount namespace of its own: a hostNetwork root pod. It asks the
# helper to ADD with an IPAM store of its choosing, on every helper socket it can reach.
ATTACKER = """
import json, os, socket, sys
from cni_plugins import launch
name, store = sys.argv[1], sys.argv[2]
conf = {"cniVersion": "1.0.0", "name": "pyt-evil", "type": "pyhost-local",
        "ipam": {"type": "pyhost-local", "subnet": "10.222.99.0/24", "dataDir": store}}
env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "evil", "CNI_NETNS": "/proc/1/ns/net", "CNI_IFNAME": "eth0"}
request = launch.encode_request("pyhost-local", env, json.dumps(conf).encode(), launch.code_version())
directory = sys.argv[3]
addresses = [b"\\0" + name.encode()]
if os.path.isdir(directory):
    addresses += [f"{directory}/{f}" for f in os.listdir(directory) if f.startswith(name) and "lock" not in f]
for address in addresses:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        try:
            s.connect(address)
        except OSError as exc:
            print(json.dumps([repr(address), "unreachable", exc.strerror]), flush=True)
            continue
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        print(json.dumps([repr(address), "reached", reply.decode()]), flush=True)
"""
PRIVATE_RUN = ["unshare", "-m", "--propagation", "private",
               "sh", "-c", 'mount -t tmpfs pyt-run /run && exec "$@"', "sh"]
OWN_MOUNTS = ["unshare", "-m", "--propagation", "private"]  # the node's /run in view: a hostPath mount of it
REPO = Path(__file__).resolve().parents[2]


def start_host_helper(cni: CNIEnv, tmp_path: Path) -> None:
    """A helper of the test's netns (the node's), started as a runtime's first plugin call starts one."""
    cni.use_helper = True
    conf = {"cniVersion": "1.1.0", "name": "pyt-net", "type": "pyhost-local",
            "ipam": {"type": "pyhost-local", "subnet": "10.222.98.0/24", "dataDir": str(tmp_path / "data")}}
    assert cni.run("pyhost-local", "STATUS", conf).ok
    wait_for(lambda: cni.helper_log.exists() and "serving " in cni.helper_log.read_text(), 10, "the helper")


@pytest.mark.parametrize("mounts", [PRIVATE_RUN, OWN_MOUNTS], ids=["private-run", "host-run-mounted"])
def test_a_host_network_root_pod_cannot_get_the_helper_to_run_a_plugin(cni: CNIEnv, tmp_path: Path,
                                                                        mounts: list[str]) -> None:
    start_host_helper(cni, tmp_path)
    store = tmp_path / "pwned"
    proc = subprocess.run([*mounts, sys.executable, "-c", ATTACKER, cni.helper_name, str(store), DEFAULT_DIR],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    tries = [json.loads(line) for line in proc.stdout.splitlines()]
    assert not store.exists(), f"the helper ran the pod's ADD: {tries}"
    for address, outcome, detail in tries:
        assert outcome == "unreachable" or detail == "refused foreign\n", (address, detail)
    if mounts is OWN_MOUNTS:  # the path was in view: the helper refused the caller for its mount namespace
        assert any(outcome == "reached" for _, outcome, _ in tries), tries
        assert "refused a caller: " in cni.helper_log.read_text() and "ns/mnt" in cni.helper_log.read_text()


# Binds the helper's names of netns NETNS_INO (default its own) and listens there, as user LISTEN_AS when given
# (the socket file stays root's: SO_PEERCRED names who called listen()); prints what each caller sent.
SQUATTER = """
import json, os, socket, sys, time
name, directory, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
netns_ino = int(sys.argv[4]) if len(sys.argv) > 4 else os.stat('/proc/self/ns/net').st_ino
listen_as = int(sys.argv[5]) if len(sys.argv) > 5 else None
os.makedirs(directory, mode=0o700, exist_ok=True)
listeners = []
for address in (b"\\0" + name.encode(), f"{directory}/{name}.net-{netns_ino}"):
    s = socket.socket(socket.AF_UNIX)
    s.bind(address)
    s.settimeout(0.05)
    listeners.append(s)
if listen_as is not None:
    os.setgroups([])
    os.setresgid(listen_as, listen_as, listen_as)
    os.setresuid(listen_as, listen_as, listen_as)
for s in listeners:
    s.listen(8)
print("ready", flush=True)
received = []
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for s in listeners:
        try:
            conn, _ = s.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(2)
            try:
                received.append(conn.recv(65536).decode(errors="replace"))
            except TimeoutError:
                received.append("")
print(json.dumps(received), flush=True)
"""


def squatted_add(cni: CNIEnv, tmp_path: Path, prefix: list[str], *args: str) -> None:
    """An ADD while SQUATTER (run under `prefix`, with `args` after its first three) holds the helper's socket
    of our netns: the launcher sends the squatter nothing, serves the call in-process, and starts no helper
    beside a socket it did not verify."""
    cni.use_helper = True
    squatter = subprocess.Popen([*prefix, sys.executable, "-c", SQUATTER, cni.helper_name, DEFAULT_DIR, "8", *args],
                                stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        conf = {"cniVersion": "1.0.0", "name": "pyt-net", "type": "pyhost-local",
                "ipam": {"type": "pyhost-local", "subnet": "10.222.97.0/24", "dataDir": str(tmp_path / "data")}}
        add = cni.run("pyhost-local", "ADD", conf, netns="/proc/1/ns/net")
        assert add.ok and add.out["ips"][0]["address"] == "10.222.97.2/24", add.raw
        received, _ = squatter.communicate(timeout=30)
    finally:
        squatter.kill()
        squatter.wait()
    assert json.loads(received) in ([], [""]), "the launcher sent its request to the squatter"
    assert not helper_listening(cni.helper_name), "the launcher started a helper beside an untrusted socket"


def test_a_host_network_root_pod_cannot_squat_the_helper_socket(cni: CNIEnv, tmp_path: Path) -> None:
    """A pod with the node's /run in view binds the helper's name first: refused for its mount namespace."""
    squatted_add(cni, tmp_path, OWN_MOUNTS)


def test_the_launcher_refuses_a_listener_of_another_netns(cni: CNIEnv, tmp_path: Path) -> None:
    """A root process of another netns in our mount namespace binds the helper's socket of our netns (the
    file is root's in the root 0700 directory, the listener our interpreter): refused for its netns."""
    squatted_add(cni, tmp_path, ["nsenter", f"--net={cni.netns()}", "--"], str(os.stat("/proc/self/ns/net").st_ino))


def test_the_launcher_refuses_a_listener_of_another_user(cni: CNIEnv, tmp_path: Path) -> None:
    """The helper's socket file is root's, but the process listening on it runs as another user: refused for
    its uid (the file's owner alone does not make the listener ours)."""
    squatted_add(cni, tmp_path, [], str(os.stat("/proc/self/ns/net").st_ino), "65534")


def test_the_helper_refuses_a_caller_of_another_netns(cni: CNIEnv, tmp_path: Path) -> None:
    """The socket file of the node's helper is in view of a process in another netns of the same mount
    namespace: the helper checks the caller's netns and refuses it."""
    start_host_helper(cni, tmp_path)
    other = cni.netns()
    store = tmp_path / "pwned"
    proc = subprocess.run(["nsenter", f"--net={other}", "--", sys.executable, "-c", ATTACKER, cni.helper_name,
                           str(store), DEFAULT_DIR], capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    tries = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [t[1:] for t in tries if t[1] == "reached"] == [["reached", "refused foreign\n"]], tries
    assert not store.exists()
    assert "refused a caller: " in cni.helper_log.read_text() and "ns/net" in cni.helper_log.read_text()


def test_the_helper_refuses_a_caller_of_another_user(cni: CNIEnv, tmp_path: Path) -> None:
    """A process of another uid that can reach the socket anyway (CAP_DAC_OVERRIDE) is refused for its uid."""
    start_host_helper(cni, tmp_path)
    store = tmp_path / "pwned"
    caps = "+dac_override,+dac_read_search"
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps={caps}",
                           f"--ambient-caps={caps}", sys.executable, "-c", ATTACKER, cni.helper_name, str(store),
                           DEFAULT_DIR], capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    tries = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [t[1:] for t in tries if t[1] == "reached"] == [["reached", "refused foreign\n"]], tries
    assert not store.exists()
    assert "runs as uid 65534" in cni.helper_log.read_text()
