"""crictl (cri-tools v1.37.0) drives pyruntime-cri through a pod's whole life, as an operator or a kubelet would.

Each test makes its pods through `cri_server.pod()`, which stops and removes them (and must succeed at it),
so the per-test leak check also proves that StopPodSandbox/RemovePodSandbox leave nothing: no pin, no IP, no
cgroup, no process. crictl's own behaviour is the contract (its exit codes, what it prints), checked against
its source (cmd/crictl) where it matters.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.kit import cri_server as kit
from tests.kit.cri_server import HTTPD, HTTPD_INDEX, cgroup_file, remove_cgroup
from tests.kit.kubelet_node import wait_for

cri_server = kit.cri_server  # the module's daemon

SLEEPER = ["sh", "-c", "echo started; exec sleep 3600"]


def test_life_cycle(cri_server) -> None:
    c = cri_server
    c.crictl("pull", kit.BUSYBOX)  # pulled by the kit already: a pull of what is there
    assert c.node.proc is not None
    assert "charset_normalizer" not in Path(f"/proc/{c.node.proc.pid}/maps").read_text(), \
        "pulls run in a child of the launcher: the daemon never loads the registry client (requests)"
    images = c.json("images", "-o", "json")["images"]
    assert any(kit.BUSYBOX in i["repoTags"] for i in images)
    with c.pod("life", labels={"suite": "crie2e"}) as pod:
        pods = c.json("pods", "-o", "json")["items"]
        assert [p["state"] for p in pods if p["id"] == pod.id] == ["SANDBOX_READY"]
        assert [p["id"] for p in c.json("pods", "--label", "suite=crie2e", "--state", "ready", "-o", "json")["items"]] \
            == [pod.id]
        assert c.json("pods", "--label", "suite=other", "-o", "json")["items"] == []
        cid = c.start_container(pod, "main", command=SLEEPER, labels={"role": "main"})
        created = c.start_container(pod, "other", command=SLEEPER)
        ps = c.json("ps", "-o", "json")["containers"]
        assert [x["state"] for x in ps if x["id"] == cid] == ["CONTAINER_RUNNING"]
        assert [x["id"] for x in c.json("ps", "--label", "role=main", "-o", "json")["containers"]] == [cid]
        assert [x["id"] for x in c.json("ps", "--pod", pod.id, "--name", "other", "-o", "json")["containers"]] \
            == [created]
        c.crictl("stop", "--timeout", "0", created)
        assert [x["id"] for x in c.json("ps", "--state", "exited", "-o", "json")["containers"]] == [created]
        c.crictl("rm", created)
        status = c.json("inspect", cid)
        assert status["status"]["state"] == "CONTAINER_RUNNING"
        assert status["status"]["metadata"]["name"] == "main"
        assert status["info"]["sandboxID"] == pod.id
        wait_for("the container's first line",
                 lambda: "started" in c.crictl("logs", cid).stdout, timeout=20, interval=0.1)
        inspectp = c.json("inspectp", pod.id)
        assert inspectp["status"]["state"] == "SANDBOX_READY"
        assert inspectp["status"]["network"]["ip"].startswith("10.236.")
        c.crictl("stop", "--timeout", "1", cid)
        status = c.json("inspect", cid)["status"]
        assert status["state"] == "CONTAINER_EXITED"
        c.crictl("rm", cid)
        assert c.json("ps", "-a", "-o", "json")["containers"] == []


def exited(c, cid: str) -> dict:
    return wait_for(f"container {cid} to exit",
                    lambda: (s := c.json("inspect", cid)["status"])["state"] == "CONTAINER_EXITED" and s,
                    timeout=20, interval=0.1)


def test_exit_code_and_reason(cri_server) -> None:
    c = cri_server
    with c.pod("exits") as pod:
        done = c.start_container(pod, "done", command=["sh", "-c", "exit 0"])
        status = exited(c, done)
        assert (status["exitCode"], status["reason"]) == (0, "Completed")
        failed = c.start_container(pod, "failed", command=["sh", "-c", "exit 3"])
        status = exited(c, failed)
        assert (status["exitCode"], status["reason"]) == (3, "Error")
        killed = c.start_container(pod, "killed", command=SLEEPER)
        c.crictl("stop", "--timeout", "0", killed)
        status = c.json("inspect", killed)["status"]
        assert (status["state"], status["exitCode"], status["reason"]) == ("CONTAINER_EXITED", 137, "Error")
        c.crictl("stop", killed)  # stopping what has exited is a success
        hog = c.start_container(pod, "hog", command=["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
                                linux={"resources": {"memory_limit_in_bytes": 32 << 20}})
        status = exited(c, hog)
        assert (status["exitCode"], status["reason"]) == (137, "OOMKilled")
        for cid in (done, failed, killed, hog):
            c.crictl("rm", cid)
        c.crictl("stop", done)  # stopping what is gone is a success (crictl rm asks ContainerStatus first)


def test_logs_follow_format_and_reopen(cri_server) -> None:
    c = cri_server
    ticker = ["sh", "-c", "i=0; while true; do echo line$i; i=$((i+1)); sleep 0.1; done"]
    with c.pod("logs") as pod:
        cid = c.start_container(pod, "ticker", command=ticker)
        log_path = Path(c.json("inspect", cid)["status"]["logPath"])
        assert str(log_path).startswith(pod.config["log_directory"])
        with subprocess.Popen(c.argv("logs", "-f", cid), stdout=subprocess.PIPE, text=True) as follow:
            assert follow.stdout is not None
            try:
                seen = [follow.stdout.readline().strip() for _ in range(15)]  # lines written after it started too
            finally:
                follow.kill()
        assert seen == [f"line{i}" for i in range(15)]
        first = log_path.read_text().splitlines()[0]
        stamp, stream, tag, text = first.split(" ", 3)
        assert (stream, tag, text) == ("stdout", "F", "line0")
        assert stamp.endswith("Z") and "T" in stamp and len(stamp.split(".")[1]) == 10  # 9 digits + Z
        rotated = log_path.with_name(log_path.name + ".1")
        os.rename(log_path, rotated)
        c.crictl("logs", "--reopen", cid)
        wait_for("the new log file",
                 lambda: log_path.exists() and log_path.read_text().count("\n") >= 3, timeout=20, interval=0.1)
        new_first = log_path.read_text().splitlines()[0].split(" ", 3)[3]
        old_last = rotated.read_text().splitlines()[-1].split(" ", 3)[3]
        assert int(new_first[4:]) > int(old_last[4:])
        out = c.crictl("logs", "--tail", "2", cid).stdout.split()
        assert len(out) == 2 and all(x.startswith("line") for x in out)
        c.crictl("stop", "--timeout", "0", cid)
        rotated.unlink()


def run_in_pty(argv: list[str], send: bytes, expect: bytes, timeout: float = 20) -> bytes:
    """Runs argv with a pty as its stdio (crictl -t wants a terminal), types `send`, reads until `expect`;
    then kills it. Returns what it printed."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = b""
    try:
        time.sleep(0.5)
        os.write(master, send)
        deadline = time.monotonic() + timeout
        import select
        while expect not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 4096)
                except OSError:
                    break
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)


def test_exec(cri_server) -> None:
    c = cri_server
    with c.pod("exec") as pod:
        cid = c.start_container(pod, "main", command=SLEEPER)
        assert c.crictl("exec", cid, "echo", "hello").stdout == "hello\n"
        # crictl -s prints stdout, then stderr, each with fmt.Println (cmd/crictl/exec.go)
        assert c.crictl("exec", "-s", cid, "echo", "sync").stdout == "sync\n\n\n"
        # crictl's contract (cmd/crictl/exec.go, cri-client's ExecSync): a command ending non-zero is an error,
        # -s or not ("command '...' exited with N: STDERR" / "command terminated with exit code N"): exit 1
        synced = c.crictl("exec", "-s", cid, "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
        assert synced.returncode == 1 and "exited with 3: err" in synced.stderr, synced.stderr
        streamed = c.crictl("exec", cid, "sh", "-c", "exit 4", check=False)
        assert streamed.returncode == 1 and "exit code 4" in streamed.stderr, streamed.stderr
        assert c.crictl("exec", "-i", cid, "cat", input="from stdin\n").stdout == "from stdin\n"
        assert c.crictl("exec", "-i", cid, "wc", "-c", input="x" * 100000).stdout.strip() == "100000"
        ws = ("exec", "--transport", "websocket")
        assert c.crictl(*ws, "-i", cid, "cat", input="over websocket\n").stdout == "over websocket\n"
        streamed = c.crictl(*ws, cid, "sh", "-c", "exit 5", check=False)
        assert streamed.returncode == 1 and "exit code 5" in streamed.stderr, streamed.stderr
        out = run_in_pty(c.argv(*ws, "-it", cid, "sh"), b"echo $((7*7))w; exit\r", b"49w")
        assert b"49w" in out, out
        missing = c.crictl("exec", cid, "no-such-binary", check=False)
        assert missing.returncode != 0
        out = run_in_pty(c.argv("exec", "-it", cid, "sh"), b"tty; echo $((6*7))x; exit\r", b"42x")
        assert b"/dev/pts/" in out and b"42x" in out, out
        c.crictl("stop", "--timeout", "0", cid)
        stopped = c.crictl("exec", cid, "echo", "never", check=False, timeout=30)
        assert stopped.returncode != 0 and "not running" in stopped.stderr, stopped.stderr
        stopped = c.crictl("exec", "-s", cid, "echo", "never", check=False, timeout=30)
        assert stopped.returncode != 0 and "not running" in stopped.stderr, stopped.stderr


def test_attach(cri_server) -> None:
    c = cri_server
    with c.pod("attach") as pod:
        cid = c.start_container(pod, "shell", command=["sh"], stdin=True, tty=True)
        out = run_in_pty(c.argv("attach", "-it", cid), b"echo $((5*5))y\r", b"25y")
        assert b"25y" in out, out
        out = run_in_pty(c.argv("attach", "--transport", "websocket", "-it", cid), b"echo $((4*4))v\r", b"16v")
        assert b"16v" in out, out
        assert c.json("inspect", cid)["status"]["state"] == "CONTAINER_RUNNING"  # a detach leaves it running
        c.crictl("stop", "--timeout", "0", cid)


def http_get(port: int, host: str = "127.0.0.1") -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as r:
        return r.read().decode()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
def test_port_forward(cri_server, transport) -> None:
    c = cri_server
    with c.pod(f"pf-{transport}") as pod:
        c.start_container(pod, "web", image=HTTPD)
        wait_for("httpd listening", lambda: listening(c, pod_container(c, pod.id)), timeout=20, interval=0.1)
        port = free_port()
        forward = subprocess.Popen(c.argv("port-forward", "--transport", transport, pod.id, f"{port}:80"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def fetch():
                try:
                    return http_get(port)
                except OSError:
                    return None
            body = wait_for("the forwarded port", fetch, timeout=20, interval=0.1)
            assert HTTPD_INDEX in body
            assert HTTPD_INDEX in http_get(port)  # a second connection over the same session
        finally:
            forward.kill()
            forward.communicate()


def listening(c, cid: str) -> bool:
    return HTTPD_INDEX in c.crictl("exec", "-s", cid, "wget", "-q", "-O", "-", "http://127.0.0.1/", check=False).stdout


def pod_container(c, pod_id: str) -> str:
    return c.json("ps", "-p", pod_id, "-o", "json")["containers"][0]["id"]


def test_pod_ip_answers_from_host_and_from_another_pod(cri_server) -> None:
    c = cri_server
    with c.pod("server") as server, c.pod("client") as client:
        web = c.start_container(server, "web", image=HTTPD)
        ip = server.ip()
        wait_for("httpd listening", lambda: listening(c, web), timeout=20, interval=0.1)
        assert HTTPD_INDEX in http_get(80, ip)
        probe = c.start_container(client, "probe", command=SLEEPER)
        assert client.ip() != ip
        out = c.crictl("exec", "-s", probe, "sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 80")
        assert HTTPD_INDEX in out.stdout
        ipam = Path(c.work / "ipam")
        assert any(ip in p.name for p in ipam.rglob("*"))
    assert not any(ip in p.name for p in ipam.rglob("*")), "the pod's address is still in the host-local store"


def test_stats_update(cri_server) -> None:
    c = cri_server
    with c.pod("stats") as pod:
        cid = c.start_container(pod, "main", command=SLEEPER)
        stats = c.json("stats", "-o", "json", "--id", cid)["stats"]
        assert [s["attributes"]["id"] for s in stats] == [cid]
        assert int(stats[0]["memory"]["workingSetBytes"]["value"]) > 0
        podstats = c.json("statsp", "-o", "json", "--id", pod.id)["stats"]
        assert [s["attributes"]["id"] for s in podstats] == [pod.id]
        c.crictl("update", "--memory", str(96 << 20), cid)
        parent = pod.config["linux"]["cgroup_parent"]
        limit = cgroup_file(parent, cid, "memory/memory.limit_in_bytes", "memory.max")
        assert int(limit.read_text()) == 96 << 20
        assert int(c.json("inspect", cid)["status"]["resources"]["linux"]["memoryLimitInBytes"]) == 96 << 20
        c.crictl("stop", "--timeout", "0", cid)
        c.crictl("rm", cid)
        ns_dir = json.loads(c.crictl("inspectp", pod.id).stdout)["info"]["namespaces"]["net"]
    assert not Path(ns_dir).exists()
    assert not cgroup_file(parent, cid, "memory/memory.limit_in_bytes", "memory.max").parent.exists()


def test_pod_settings(cri_server) -> None:
    c = cri_server
    dns = {"servers": ["10.236.0.53"], "searches": ["crie2e.svc.local"], "options": ["ndots:3"]}
    with c.pod("settings", hostname="crie2e-host", dns_config=dns,
               linux={"sysctls": {"net.ipv4.ip_unprivileged_port_start": "77"}}) as pod:
        cid = c.start_container(pod, "main", command=SLEEPER)
        sh = lambda cmd: c.crictl("exec", "-s", cid, "sh", "-c", cmd).stdout  # noqa: E731
        assert sh("cat /etc/resolv.conf").strip().splitlines() == [
            "nameserver 10.236.0.53", "search crie2e.svc.local", "options ndots:3"]
        assert sh("hostname").strip() == "crie2e-host"
        assert sh("cat /proc/sys/net/ipv4/ip_unprivileged_port_start").strip() == "77"
    host_value = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text().strip()
    assert host_value != "77"


def test_host_network_pod(cri_server) -> None:
    c = cri_server
    host = {"security_context": {"namespace_options": {"network": 2}}}
    with c.pod("hostnet", linux=host) as pod:
        cid = c.start_container(pod, "main", command=SLEEPER)
        assert c.crictl("exec", "-s", cid, "hostname").stdout.strip() == os.uname().nodename
        links = c.crictl("exec", "-s", cid, "ls", "/sys/class/net").stdout.split()
        assert set(links) == set(os.listdir("/sys/class/net"))


def test_a_pod_without_a_shared_pid_namespace_has_no_pause_process(cri_server) -> None:
    """As the kubelet asks for most pods (pid CONTAINER): the pins alone hold the pod's namespaces; the pod
    is ready, has its hostname, network and network figures, and stopping it releases all of it."""
    c = cri_server
    own_pid = {"security_context": {"namespace_options": {"pid": 1}}}
    with c.pod("nopause", hostname="nopause-host", linux=own_pid) as pod:
        info = c.json("inspectp", pod.id)["info"]
        assert info["pid"] == 0 and set(info["namespaces"]) == {"net", "ipc", "uts"}
        assert c.json("inspectp", pod.id)["status"]["state"] == "SANDBOX_READY"
        cid = c.start_container(pod, "main", command=SLEEPER)
        sh = lambda cmd: c.crictl("exec", "-s", cid, "sh", "-c", cmd).stdout.strip()  # noqa: E731
        assert sh("hostname") == "nopause-host"
        assert sh("ip -o -4 addr show eth0").split()[3].split("/")[0] == pod.ip()
        assert sh("cat /proc/1/comm") == "sleep"  # the container's own command is pid 1 of its pid namespace
        sh("echo x | nc -u -w 1 $(ip route | awk '/^default/ {print $3}') 9; true")  # a datagram out of eth0
        network = c.json("statsp", "-o", "json", "--id", pod.id)["stats"][0]["linux"]["network"]
        assert network["defaultInterface"]["name"] == "eth0"
        assert int(network["defaultInterface"]["txBytes"]["value"]) > 0
        ip, pins = pod.ip(), info["namespaces"]
        ipam = Path(c.work / "ipam")
        assert any(ip in p.name for p in ipam.rglob("*"))
    assert not any(Path(p).exists() for p in pins.values())
    assert not any(ip in p.name for p in ipam.rglob("*")), "the pod's address is still in the host-local store"


def test_a_pod_with_a_user_namespace_of_its_own(cri_server) -> None:
    """hostUsers: false as the kubelet asks for it: the pod's root is host id 200000, yet owns the image's
    files (its rootfs is idmapped, no layer chowned), and what it writes belongs to 200000 on the host; a
    volume the stock kubelet idmaps with the pod's mappings is the pod's root's, and what is written there
    belongs to the host's root on disk."""
    c = cri_server
    ids = [{"container_id": 0, "host_id": 200000, "length": 65536}]
    userns = {"security_context": {"namespace_options": {"pid": 1, "userns_options": {"uids": ids, "gids": ids}}}}
    with c.pod("userns", linux=userns) as pod:
        info = c.json("inspectp", pod.id)["info"]
        assert set(info["namespaces"]) == {"user", "net", "ipc", "uts"}
        volume = c.work / "volumes" / "userns"  # below 0700 directories, as a kubelet's pods directory
        volume.mkdir(parents=True)
        (volume / "data").write_text("from the host\n")
        assert c.work.stat().st_mode & 0o777 == 0o700
        idmapped = c.work / "volumes" / "idmapped"
        idmapped.mkdir(mode=0o755)
        cid = c.start_container(pod, "main", command=SLEEPER,
                                mounts=[{"container_path": "/data", "host_path": str(volume), "readonly": True},
                                        {"container_path": "/vol", "host_path": str(idmapped),
                                         "uidMappings": ids, "gidMappings": ids}])
        sh = lambda cmd: c.crictl("exec", "-s", cid, "sh", "-c", cmd).stdout.split()  # noqa: E731
        assert sh("cat /proc/self/uid_map /proc/self/gid_map") == ["0", "200000", "65536"] * 2
        assert sh("cat /data/data") == ["from", "the", "host"]
        assert sh("id -u; stat -c '%u %g' /bin/busybox /etc") == ["0", "0", "0", "0", "0"]
        sh("echo x > /written; mkdir /var/made; echo y > /vol/out")
        assert sh("stat -c '%u %g' /vol /vol/out /data") == ["0", "0", "0", "0", "65534", "65534"]
        assert (idmapped / "out").stat().st_uid == 0 and (idmapped / "out").read_text() == "y\n"
        assert sh("ip -o -4 addr show eth0")[3].split("/")[0] == pod.ip()
        init = int(c.json("inspect", cid)["info"]["pid"])
        for name in ("written", "var/made"):
            st = os.stat(f"/proc/{init}/root/{name}")
            assert (st.st_uid, st.st_gid) == (200000, 200000), name
        layers = list((c.work / "root" / "images").glob("**/snapshots/*/fs/bin/busybox"))
        assert layers and all(p.stat().st_uid == 0 for p in layers), "an image file changed owner on disk"
        # the host's root is nobody in there: a file only it may write stays unwritable
        assert "Permission denied" in c.crictl("exec", cid, "sh", "-c", "echo x > /etc/hostname",
                                                 check=False).stderr


def test_process_titles(cri_server) -> None:
    c = cri_server
    with c.pod("titles") as pod:
        cid = c.start_container(pod, "main", command=SLEEPER)
        info = c.json("inspect", cid)["info"]
        pause = c.json("inspectp", pod.id)["info"]["pid"]
        supervisor = info["supervisorPid"]
        assert Path(f"/proc/{supervisor}/comm").read_text().strip() == "pyruntime-super"
        assert Path(f"/proc/{pause}/comm").read_text().strip() == "pyruntime-pause"
        assert Path(f"/proc/{supervisor}/cmdline").read_bytes().split(b"\0")[:2] == [
            b"pyruntime-supervisor", cid.encode()]
        assert Path(f"/proc/{pause}/cmdline").read_bytes().split(b"\0")[:2] == [
            b"pyruntime-pause", pod.id.encode()]
        assert c.node.proc is not None
        launchers = [p for t in Path(f"/proc/{c.node.proc.pid}/task").iterdir()
                     for p in (t / "children").read_text().split()]
        assert [Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0] for p in launchers] == \
            [b"pyruntime-launcher"], "its only child, named (not python -c with the settings)"
        c.crictl("stop", "--timeout", "0", cid)


# ---- bad requests -------------------------------------------------------------------------------------------

def test_bad_requests(cri_server) -> None:
    c = cri_server
    config = c.write("ctr-orphan", c.container_config("orphan", command=SLEEPER))
    pod_config = c.write("pod-none", c.pod_config("none"))
    missing = c.crictl("create", "f" * 64, str(config), str(pod_config), check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr, missing.stderr
    with c.pod("dup") as pod:
        before = c.json("pods", "-o", "json")["items"]
        dup = c.crictl("runp", str(pod.config_path), check=False)
        assert dup.returncode != 0 and "AlreadyExists" in dup.stderr, dup.stderr
        assert c.json("pods", "-o", "json")["items"] == before  # nothing half made
        bad_image = c.write("ctr-bad-image", c.container_config("nope", image="registry.k8s.io/no/such:1",
                                                                command=SLEEPER))
        gone = c.crictl("create", pod.id, str(bad_image), str(pod.config_path), check=False)
        assert gone.returncode != 0 and "registry.k8s.io/no/such:1" in gone.stderr, gone.stderr
        assert "NotFound" in gone.stderr, gone.stderr
        invalid = c.write("ctr-invalid", c.container_config(
            "invalid", command=SLEEPER, linux={"resources": {"cpu_shares": -5, "memory_limit_in_bytes": -1}}))
        bad = c.crictl("create", pod.id, str(invalid), str(pod.config_path), check=False)
        assert bad.returncode != 0 and "InvalidArgument" in bad.stderr, bad.stderr
        assert "memory_limit_in_bytes" in bad.stderr or "cpu_shares" in bad.stderr, bad.stderr
        assert c.json("ps", "-a", "-o", "json")["containers"] == []
        c.crictl("stopp", pod.id)
        c.crictl("stopp", pod.id)
    for call in (("stop", "a" * 64), ("stopp", "b" * 64)):
        c.crictl(*call)  # what is gone: a success
    # crictl rm and rmp ask ContainerStatus / PodSandboxStatus first (cmd/crictl), whose NotFound they report
    for call in (("rm", "a" * 64), ("rmp", "b" * 64)):
        gone = c.crictl(*call, check=False)
        assert gone.returncode == 1 and "NotFound" in gone.stderr, gone.stderr


def test_stop_timeout_exec_timeout_and_names(cri_server) -> None:
    c = cri_server
    with c.pod("timeouts") as pod:
        # it outlives SIGTERM, and says "late" once it has slept 8 s past it: a kill at the 2 s timeout comes first
        stubborn = c.start_container(pod, "stubborn", command=[
            "sh", "-c", "trap 'echo term; t=1' TERM; echo ready; n=0; while true; do sleep 0.1; "
                        "[ -n \"$t\" ] && n=$((n+1)); [ $n = 80 ] && echo late; done"])
        wait_for("the trap", lambda: "ready" in c.crictl("logs", stubborn).stdout, timeout=20, interval=0.1)
        began = time.monotonic()
        c.crictl("stop", "--timeout", "2", stubborn)
        took = time.monotonic() - began
        status = c.json("inspect", stubborn)["status"]
        assert (status["exitCode"], status["reason"]) == (137, "Error") and took > 1.5, (status, took)
        said = c.crictl("logs", stubborn).stdout.split()
        assert "term" in said and "late" not in said, said
        c.crictl("rm", stubborn)
        # the name is free again once removed; taken while its container exists
        first = c.start_container(pod, "stubborn", command=SLEEPER)
        dup = c.crictl("create", pod.id, str(c.write("dup", c.container_config("stubborn", command=SLEEPER))),
                       str(pod.config_path), check=False)
        assert dup.returncode == 1 and "AlreadyExists" in dup.stderr, dup.stderr
        timed = c.crictl("exec", "-s", "--timeout", "1", first, "sh", "-c", "sleep 30; touch /tmp/finished",
                         check=False)
        assert timed.returncode == 1 and "DeadlineExceeded" in timed.stderr, timed.stderr
        # answered at its deadline, not once the command had run its course
        assert c.crictl("exec", "-s", first, "ls", "/tmp/finished", check=False).returncode != 0
        assert c.crictl("exec", "-s", first, "echo", "alive").stdout.startswith("alive")


def test_rmp_force_of_a_running_pod_and_unknown_handler(cri_server) -> None:
    c = cri_server
    config = c.pod_config("forced")
    path = c.write("pod-forced", config)
    pod_id = c.crictl("runp", str(path)).stdout.strip()
    try:
        cid = c.crictl("create", pod_id, str(c.write("ctr-forced", c.container_config("main", command=SLEEPER))),
                       str(path)).stdout.strip()
        c.crictl("start", cid)
        c.crictl("rmp", "--force", pod_id)
        assert c.json("pods", "-o", "json")["items"] == []
        assert c.json("ps", "-a", "-o", "json")["containers"] == []
    finally:
        c.remove_all_pods()
        remove_cgroup(config["linux"]["cgroup_parent"])
    bad = c.crictl("runp", "--runtime", "no-such-handler", str(path), check=False)
    assert bad.returncode == 1 and "no-such-handler" in bad.stderr, bad.stderr
    assert c.json("pods", "-o", "json")["items"] == []
