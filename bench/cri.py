"""pyruntime-cri against containerd 1.6 (runc, reference CNI plugins v1.10.0), the same pod workload side by side.

What a kubelet waits for on every pod is RunPodSandbox, CreateContainer+StartContainer and, when the pod goes,
the teardown (stop + remove of the container, then StopPodSandbox + RemovePodSandbox); what a node pays for
every pod it runs is the memory of the per-pod processes (our supervisor and pause; containerd's shim and
pause). Both daemons run at once, each with its own root, socket and CNI network (different bridge and
subnet), and the workload alternates between them pod by pod, so machine noise hits both alike.

The RPCs are timed twice, in separate rounds: directly over gRPC (the stubs in proto/, one channel per
daemon kept open, as a kubelet does) and through crictl, one exec per call (what the issue's reference
figures were measured with; crictl's own start-up, ~15-25 ms per exec, is in those). Memory is read while the
N pods of the gRPC round run: the daemon's RSS and PSS (ours: the daemon plus its launcher, the fork
server every pod process comes from), and per pod the PSS (/proc/PID/smaps_rollup) of the container's
parent (our supervisor; containerd-shim-runc-v2) plus the pod's pause process. The pods are what a kubelet asks
for without shareProcessNamespace (a pid namespace per container), for which pyruntime-cri runs no pause
process (its pinned namespaces hold the pod) and containerd still runs one.

It takes the integration lock (it makes bridges, netns, cgroups, mounts) and leaves the host as found, with
the cleanup of the critest harness, whose endpoints and test registry it reuses. Needs root, containerd and
crictl (`make peers`).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.runtime import pct
from pynode_cluster.node import SANDBOX_IMAGE
from tests.conformance import critest

PODS = 20
IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
NETWORKS = {"containerd": ("pyt-bench-ctd0", "10.235.0.0/16"), "pyruntime-cri": ("pyt-bench-py0", "10.236.0.0/16")}
OPS = ("runp", "create+start", "teardown")


def _network(cls: type[critest.Endpoint], types: tuple[str, str, str]) -> type[critest.Endpoint]:
    """The critest endpoint, on a bridge and subnet of its own so both daemons can run at once."""

    class Bench(cls):  # type: ignore[misc,valid-type]  # a subclass of a class passed in, which mypy cannot type
        def cni_setup(self) -> None:
            super().cni_setup()
            bridge, subnet = NETWORKS[self.name]
            conf = critest.conflist(*types, self.work / "ipam")
            conf["plugins"][0]["bridge"] = bridge
            conf["plugins"][0]["ipam"]["ranges"] = [[{"subnet": subnet}]]
            (self.cni_conf / "10-critest.conflist").write_text(json.dumps(conf))

    Bench.__name__ = cls.__name__
    return Bench


ENDPOINTS = (_network(critest.Containerd, ("bridge", "host-local", "portmap")),
             _network(critest.PyruntimeCri, ("pybridge", "pyhost-local", "pyportmap")))


def pod_config(n: int, tag: str, logs: Path) -> dict:
    """A pod as the kubelet asks for one without shareProcessNamespace: a pid namespace per container."""
    return {"metadata": {"name": f"bench-{tag}-{n}", "namespace": "bench", "uid": f"bench-{tag}-{n}", "attempt": 0},
            "log_directory": str(logs / f"{tag}-{n}"),
            "linux": {"security_context": {"namespace_options": {"pid": 1}}}}


def container_config(n: int, seccomp: bool = False) -> dict:
    """`seccomp`: the RuntimeDefault profile (0 in the proto's enum), as a pod of the "restricted" Pod
    Security Standard or a kubelet with seccompDefault asks for every container."""
    security: dict = {"namespace_options": {"pid": 1}, **({"seccomp": {"profile_type": 0}} if seccomp else {})}
    return {"metadata": {"name": f"sleep-{n}"}, "image": {"image": IMAGE}, "command": ["sleep", "3600"],
            "log_path": "sleep.log", "linux": {"security_context": security}}


class Grpc:
    """One daemon over a kept-open gRPC channel (as the kubelet talks to it)."""

    def __init__(self, url: str) -> None:
        import grpc

        from proto import api_pb2, api_pb2_grpc
        self.pb = api_pb2
        self.channel = grpc.insecure_channel(url)
        self.rt = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.img = api_pb2_grpc.ImageServiceStub(self.channel)

    def _msg(self, cls: str, data: dict):
        from google.protobuf import json_format
        return json_format.ParseDict(data, getattr(self.pb, cls)())

    def pull(self, image: str) -> None:
        self.img.PullImage(self.pb.PullImageRequest(image=self.pb.ImageSpec(image=image)), timeout=120)

    def runp(self, pod: dict) -> str:
        return self.rt.RunPodSandbox(self.pb.RunPodSandboxRequest(config=self._msg("PodSandboxConfig", pod)),
                                     timeout=60).pod_sandbox_id

    def create_start(self, pod_id: str, pod: dict, ctr: dict) -> str:
        cid = self.rt.CreateContainer(self.pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=self._msg("ContainerConfig", ctr),
            sandbox_config=self._msg("PodSandboxConfig", pod)), timeout=60).container_id
        self.rt.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=60)
        return cid

    def teardown(self, pod_id: str, cid: str) -> None:
        self.rt.StopContainer(self.pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
        self.rt.RemoveContainer(self.pb.RemoveContainerRequest(container_id=cid), timeout=60)
        self.rt.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self.rt.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)

    def pids(self, pod_id: str, cid: str) -> tuple[int, int]:
        """(pause pid, container init pid) from the verbose status both daemons give."""
        pod = json.loads(self.rt.PodSandboxStatus(self.pb.PodSandboxStatusRequest(
            pod_sandbox_id=pod_id, verbose=True), timeout=10).info["info"])
        ctr = json.loads(self.rt.ContainerStatus(self.pb.ContainerStatusRequest(
            container_id=cid, verbose=True), timeout=10).info["info"])
        return int(pod["pid"]), int(ctr["pid"])

    def close(self) -> None:
        self.channel.close()


class Crictl:
    """The same calls, one crictl exec each; pod and container configs as files."""

    def __init__(self, url: str, work: Path) -> None:
        self.base = [str(critest.CRICTL), "--runtime-endpoint", url, "--image-endpoint", url, "--timeout", "60s"]
        self.work = work

    def _run(self, *args: str) -> str:
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"crictl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def _file(self, name: str, data: dict) -> str:
        path = self.work / name
        path.write_text(json.dumps(data))
        return str(path)

    def runp(self, pod: dict) -> str:
        return self._run("runp", self._file(f"pod-{pod['metadata']['name']}.json", pod))

    def create_start(self, pod_id: str, pod: dict, ctr: dict) -> str:
        pod_file = str(self.work / f"pod-{pod['metadata']['name']}.json")
        cid = self._run("create", "--no-pull", pod_id, self._file(f"ctr-{pod['metadata']['name']}.json", ctr),
                        pod_file)
        self._run("start", cid)
        return cid

    def teardown(self, pod_id: str, cid: str) -> None:
        self._run("stop", "--timeout", "0", cid)
        self._run("rm", cid)
        self._run("stopp", pod_id)
        self._run("rmp", pod_id)


@contextlib.contextmanager
def integration_lock(bench: str) -> Iterator[None]:
    """The integration lock, or the one this process inherited already locked (flock(1) keeps its descriptor
    open in the command it runs; a second open description of the file would wait for it forever)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(critest.LOCK):
                fcntl.flock(int(fd), fcntl.LOCK_EX)  # ours already: returns at once
                yield
                return
    with open(critest.LOCK, "a") as f:
        started = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"{bench}: integration lock held after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        yield


def _timed(samples: list[float], call: Callable, *args):
    start = time.perf_counter()
    result = call(*args)
    samples.append(time.perf_counter() - start)
    return result


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB of one process, from /proc/PID/smaps_rollup; pid 0 (a pod without a pause) is none."""
    if pid == 0:
        return 0, 0
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return fields["Rss"], fields["Pss"]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
            for c in (t / "children").read_text().split()]


def daemon_memory(name: str, pid: int) -> dict[str, int]:
    """RSS/PSS of the daemon; ours also with its launcher (the daemon's only child, its fork server)."""
    rss, pss = memory_kib(pid)
    out = {"rss": rss, "pss": pss}
    if name == "pyruntime-cri":
        launcher = [memory_kib(p) for p in children(pid)]
        out |= {"launcher_rss": sum(m[0] for m in launcher), "launcher_pss": sum(m[1] for m in launcher)}
    return out


def pod_memory(client: Grpc, pods: list[tuple[str, str]]) -> dict[str, float]:
    """Mean over the pods of PSS (and RSS) of the container's parent (supervisor / shim) and the pause."""
    per: dict[str, list[int]] = {"pss": [], "rss": [], "parent_pss": [], "pause_pss": []}
    for pod_id, cid in pods:
        pause, init = client.pids(pod_id, cid)
        keeper = parent(init)
        (krss, kpss), (prss, ppss) = memory_kib(keeper), memory_kib(pause)
        per["pss"].append(kpss + ppss)
        per["rss"].append(krss + prss)
        per["parent_pss"].append(kpss)
        per["pause_pss"].append(ppss)
    return {k: statistics.mean(v) for k, v in per.items()}


def run_round(clients: dict, pods: int, logs: Path, tag: str, measure: Callable | None = None,
              seccomp: bool = False) -> dict:
    """`pods` pods on every daemon, alternating; then (measure) memory; then every teardown."""
    times: dict[str, dict[str, list[float]]] = {name: {op: [] for op in OPS} for name in clients}
    made: dict[str, list[tuple[str, str]]] = {name: [] for name in clients}
    try:
        for n in range(pods):
            for name, client in clients.items():
                pod, ctr = pod_config(n, f"{tag}-{name}", logs), container_config(n, seccomp)
                pod_id = _timed(times[name]["runp"], client.runp, pod)
                made[name].append((pod_id, ""))
                cid = _timed(times[name]["create+start"], client.create_start, pod_id, pod, ctr)
                made[name][-1] = (pod_id, cid)
        memory = measure(made) if measure else {}
        for n in range(pods):
            for name, client in clients.items():
                pod_id, cid = made[name][n]
                _timed(times[name]["teardown"], client.teardown, pod_id, cid)
                made[name][n] = ("", "")
    finally:
        for name, client in clients.items():  # what a failed round left: best effort, the cleanup follows
            for pod_id, cid in made[name]:
                if pod_id and cid:
                    try:
                        client.teardown(pod_id, cid)
                    except Exception:
                        pass
    return {"times": times, "memory": memory}


def _pid(endpoint: critest.Endpoint) -> int:
    assert endpoint.proc is not None  # started
    return endpoint.proc.pid


def report(results: dict, pods: int) -> str:
    lines = [f"{pods} pods per daemon; times in ms (median / p90); ratio: pyruntime-cri median / containerd's",
             "", "| via | op | containerd median | p90 | pyruntime-cri median | p90 | ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for via, result in results.items():
        if via == "memory":
            continue
        t = result["times"]
        for op in OPS:
            c, p = (sorted(x * 1000 for x in t[n][op]) for n in ("containerd", "pyruntime-cri"))
            cm, pm = statistics.median(c), statistics.median(p)
            lines.append(f"| {via} | {op} | {cm:.1f} | {pct(c, 0.9):.1f} | {pm:.1f} | {pct(p, 0.9):.1f} "
                         f"| {pm / cm:.2f} |")
    mem = results["memory"]
    d, pod = mem["daemon"], mem["pod"]
    mib = 1024
    lines += ["", f"memory with {pods} pods running (MiB)", "",
              "| | containerd | pyruntime-cri |", "|---|---:|---:|",
              f"| daemon RSS | {d['containerd']['rss'] / mib:.1f} | {d['pyruntime-cri']['rss'] / mib:.1f} "
              f"(+ launcher {d['pyruntime-cri']['launcher_rss'] / mib:.1f}) |",
              f"| daemon PSS | {d['containerd']['pss'] / mib:.1f} | {d['pyruntime-cri']['pss'] / mib:.1f} "
              f"(+ launcher {d['pyruntime-cri']['launcher_pss'] / mib:.1f}) |",
              f"| per pod PSS (shim / supervisor + pause) | {pod['containerd']['pss'] / mib:.2f} | "
              f"{pod['pyruntime-cri']['pss'] / mib:.2f} |",
              f"| of which shim / supervisor | {pod['containerd']['parent_pss'] / mib:.2f} | "
              f"{pod['pyruntime-cri']['parent_pss'] / mib:.2f} |",
              f"| of which pause | {pod['containerd']['pause_pss'] / mib:.2f} | "
              f"{pod['pyruntime-cri']['pause_pss'] / mib:.2f} |",
              f"| per pod RSS (sum, shared pages counted in each) | {pod['containerd']['rss'] / mib:.2f} | "
              f"{pod['pyruntime-cri']['rss'] / mib:.2f} |"]
    return "\n".join(lines) + "\n"


def bench(pods: int, vias: list[str], out: Path | None, seccomp: bool = False) -> int:
    # this checkout's pyruntime-cri (and its pyruntime), as `make` runs with the venv's launchers
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    ctypes.CDLL(None, use_errno=True).prctl(critest.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="pynode-bench-cri-registry-", dir="/var/tmp") as tmp, \
            critest.critest_registry(Path(tmp)) as mirror, integration_lock("bench.cri"):
        before = critest.HostState.take()
        work = Path(tempfile.mkdtemp(prefix="pynode-bench-cri-", dir="/var/tmp"))
        run_dir_existed = critest.CONTAINERD_RUN.exists()
        endpoints = {}
        clients: dict[str, Grpc] = {}
        try:
            for cls in ENDPOINTS:
                (work / cls.name).mkdir()
                endpoints[cls.name] = ep = cls(work / cls.name, mirror.hosts_dir)
                ep.start()
                clients[cls.name] = Grpc(ep.url)
                clients[cls.name].pull(IMAGE)
                clients[cls.name].pull(SANDBOX_IMAGE)
            logs = work / "logs"

            def measure(made: dict) -> dict:
                time.sleep(1)  # let the pods settle (shims and supervisors finish their start-up allocations)
                return {"daemon": {n: daemon_memory(n, _pid(ep)) for n, ep in endpoints.items()},
                        "pod": {n: pod_memory(clients[n], made[n]) for n in endpoints}}

            print("bench.cri: daemons up, images pulled", file=sys.stderr)
            # a warm-up pod each, not counted (first-use costs: image snapshot mounts, CNI plugin caches)
            run_round(clients, 1, logs, "warmup", seccomp=seccomp)
            if "grpc" in vias:
                results["grpc"] = run_round(clients, pods, logs, "grpc", measure, seccomp)
                results["memory"] = results["grpc"]["memory"]
            if "crictl" in vias:
                cli = {n: Crictl(ep.url, work) for n, ep in endpoints.items()}
                results["crictl"] = run_round(cli, pods, logs, "crictl",
                                              None if "memory" in results else measure, seccomp)
                results.setdefault("memory", results["crictl"]["memory"])
        finally:
            for client in clients.values():
                client.close()
            for ep in endpoints.values():
                ep.stop()
            if not run_dir_existed:
                critest.shutil.rmtree(critest.CONTAINERD_RUN, ignore_errors=True)
            leaks = critest.cleanup(before, work, {mirror.registry_pid})
    text = report(results, pods)
    print(text)
    if leaks:
        print(f"bench.cri: left behind (could not remove): {leaks}", file=sys.stderr)
    if out:
        out.write_text(json.dumps(results, indent=1))
    return 1 if leaks else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--pods", type=int, default=PODS, help=f"pods per daemon and round (default {PODS})")
    p.add_argument("--via", action="append", choices=("grpc", "crictl"), help="default: both")
    p.add_argument("--json", type=Path, help="also write the raw samples here")
    p.add_argument("--seccomp", action="store_true", help="containers with the RuntimeDefault seccomp profile")
    args = p.parse_args(argv or [])
    if os.geteuid() != 0:
        print("bench.cri: needs root", file=sys.stderr)
        return 1
    for needed in (critest.CRICTL, critest.REFERENCE_CNI / "bridge"):
        if not needed.exists():
            print(f"bench.cri: {needed} is missing: run `make peers`", file=sys.stderr)
            return 1
    return bench(args.pods, args.via or ["grpc", "crictl"], args.json, args.seccomp)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
