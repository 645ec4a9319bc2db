"""`make cluster` and `make cluster-down`: a stock control plane and N pynode nodes on this machine, each a network
namespace on a bridge of the cluster's own (hosts.py), and every trace of them removed again.

Everything the cluster makes is recorded before it is made, in STATE/cluster.json and the daemons' pid files,
so `down` undoes a half-made cluster as well as a whole one, and removes only what the cluster made: its
daemons by pid, its namespaces, links and routes by name, the mounts under its own directories, the cgroups
under its nodes' cgroup roots, the kernel knobs the stock kubelet sets (put back as they were). The iptables
rules of kube-proxy and of the CNI plugins live in the nodes' namespaces and go with them.

A second `up` while a cluster runs says so and changes nothing; an `up` that fails removes what it made.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from pykubelet.pods.termination import cgroup_hierarchies
from pynode_cluster import components, coredns, hosts, kubeadm_node, pki
from pynode_cluster.kubeadm_node import KubeadmNode
from pynode_cluster.node import KUBELETS, RUNTIMES, Node
from pynode_os.files import atomic_write

STATE = Path(os.environ.get("PYNODE_CLUSTER_DIR", "/var/lib/pynode/cluster"))
RUN = Path(os.environ.get("PYNODE_CLUSTER_RUN", "/run/pynode/cluster"))
LOCK = Path("/tmp/pynode-cluster.lock")
BRIDGE = "pync0"
NET = "10.203.0"  # the hosts' subnet: the host's side of the bridge .1, the control plane .10, node i .20+i
HOST_IP, CP_IP = f"{NET}.1", f"{NET}.10"
CP_NETNS = "pync-cp"
MNTNS = RUN / "mnt"  # the kubeadm nodes' mount namespaces (kubeadm_node.py), a private mount of its own
APISERVER_PORT = 6443
# The kubelets' resolvConf: the DNS of dnsPolicy Default pods, CoreDNS's among them, whose Corefile forwards
# there what is not the cluster's. The control plane's address, where nothing listens on port 53: a name outside
# the cluster fails at once and no query leaves the machine. (A host's own resolv.conf may name 127.0.0.53,
# which inside a pod is the pod itself: CoreDNS's loop plugin would stop it.)
RESOLV_CONF = STATE / "resolv.conf"
ETCD_PORTS = (2379, 2380)
CONTAINER_LOGS = Path("/var/log/containers")  # the stock kubelet's symlinks: a path it hard-codes
CONTAINERD_RUN = Path("/run/containerd")  # containerd 1.6's shims put their sockets here whatever the config says
# what the stock kubelet sets on the host (protectKernelDefaults is off), put back by `down`
KERNEL_KNOBS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                "kernel/keys/root_maxbytes")


class ClusterError(RuntimeError):
    """The cluster could not be brought up or down; the message says which step and where its log is."""


@dataclass
class NodeRecord:
    name: str
    address: str
    netns: str
    kubelet: str
    runtime: str
    pod_cidr: str = ""

    def node(self) -> Node:
        return Node(self.name, self.address, STATE / "nodes" / self.name, RUN / self.name, self.kubelet,
                    self.runtime, cluster_dns=components.DNS_IP, resolv_conf=RESOLV_CONF)

    def kubeadm_node(self) -> KubeadmNode:
        return KubeadmNode(self.node(), self.netns, MNTNS / self.name)


@dataclass
class Record:
    """What the cluster made (or is about to make): written before each step."""
    nodes: list[NodeRecord] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    bridge: str = ""
    routes: list[str] = field(default_factory=list)
    knobs: dict[str, str] = field(default_factory=dict)
    containerd_run_existed: bool = True
    container_logs_existed: bool = True
    registry: str = ""
    kubeadm: bool = False  # the nodes are kubeadm's (kubeadm_node.py), the control plane their static pods
    created: list[str] = field(default_factory=list)  # host paths the cluster made, removed by `down`

    def save(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        (STATE / "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls) -> Record | None:
        try:
            data = json.loads((STATE / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        data["nodes"] = [NodeRecord(**n) for n in data.get("nodes", [])]
        return cls(**data)


def daemons() -> hosts.Daemons:
    return hosts.Daemons(STATE / "pids")


def admin_kubeconfig() -> Path:
    return STATE / "admin.kubeconfig"


def kubectl(*args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess:
    argv = [components.peer("kubectl"), "--kubeconfig", str(kubeconfig or STATE / "super-admin.kubeconfig"), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def logs() -> dict[str, str]:
    """Each component's log file."""
    out = {}
    for name in daemons().names():
        with contextlib.suppress(OSError, ValueError, KeyError):
            out[name] = json.loads((STATE / "pids" / f"{name}.json").read_text())["log"]
    for log in (STATE / "logs").glob("*/*.log"):  # the units of the kubeadm nodes' inits
        out[f"{log.parent.name}-{log.stem}"] = str(log)
    return out


def describe() -> str:
    lines = [f"kubeconfig: {admin_kubeconfig()}",
             f"  kubectl: {components.peer('kubectl')} --kubeconfig {admin_kubeconfig()} get nodes", "logs:"]
    lines += [f"  {name}: {path}" for name, path in sorted(logs().items())]
    return "\n".join(lines)


def running() -> bool:
    d = daemons()
    return any(d.process(name) for name in d.names())


# ---- up ----------------------------------------------------------------------------------------------------

# starts an image registry for the pods (daemon "registry" in the netns, at the address), its files under the
# first path, writes the certs.d mirror config into the second, logs to the third; returns its host:port
Images = Callable[[hosts.Daemons, str, str, Path, Path, Path], str]


def up(nodes: int = 1, kubelet: str = "pykubelet", runtime: str = "pyruntime-cri", images: Images | None = None,
       out=sys.stdout, kubeadm: bool = False) -> int:
    """`images`: a registry for the pods' images (tests/kit/cluster_registry.start in a checkout); without
    it, images come from the registries their names say. `kubeadm`: the cluster made by kubeadm init and join
    (kubeadm_node.py), its control plane node-1's static pods; `kubelet` and `runtime` may then name a pair per
    node (node_pairs)."""
    if not 1 <= nodes <= 9:
        raise ClusterError(f"NODES={nodes}: from 1 to 9 nodes")
    pairs = node_pairs(nodes, kubelet, runtime, kubeadm)
    with _locked():
        if Record.load() is None and (taken := routes_into(_host_routes())):
            print("the cluster's networks are routed elsewhere on this host (another lab or cluster?): "
                  + "; ".join(taken) + ". Nothing was made.", file=out)
            return 1
        if Record.load() is not None:
            if running():
                print(f"a cluster is already running (state in {STATE}); `make cluster-down` removes it",
                      file=out)
                print(describe(), file=out)
                return 0
            print(f"{STATE} holds what is left of a cluster whose daemons are gone: `make cluster-down` first",
                  file=out)
            return 1
        started = time.monotonic()
        try:
            if kubeadm:
                _up_kubeadm(pairs, images, out)
            else:
                _up(nodes, kubelet, runtime, images, out)
        except BaseException as e:
            # the logs go with the cluster: keep their ends in the message
            tails = "".join(f"\n--- {name} (last lines)\n{daemons().log(name, 1500)}" for name in daemons().names())
            _down()
            with contextlib.suppress(OSError):
                print(f"cluster start-up failed: {e}{tails}\nremoved what it had made", file=out)
            if isinstance(e, Exception):
                return 1
            raise
        print(f"cluster up in {time.monotonic() - started:.1f} s: {nodes} node(s), {kubelet} on {runtime}"
              + (", by kubeadm" if kubeadm else ""), file=out)
        print(describe(), file=out)
        return 0


def node_pairs(nodes: int, kubelet: str, runtime: str, kubeadm: bool) -> list[tuple[str, str]]:
    """Each node's kubelet and runtime: one pair for all, or (kubeadm clusters) a comma-separated list of
    each, a kubelet and a runtime per node, so that the stock pair joins a cluster of ours or the other way
    round."""
    kubelets, runtimes = kubelet.split(","), runtime.split(",")
    if kubeadm and (len(kubelets) > 1 or len(runtimes) > 1):
        if len(kubelets) != nodes or len(runtimes) != nodes:
            raise ClusterError(f"KUBELET={kubelet} RUNTIME={runtime}: a list names the pair of each of the "
                               f"{nodes} nodes")
    elif len(kubelets) > 1 or len(runtimes) > 1:
        raise ClusterError(f"KUBELET={kubelet} RUNTIME={runtime}: a pair per node is for KUBEADM=1 clusters")
    else:
        kubelets, runtimes = kubelets * nodes, runtimes * nodes
    for k, r in zip(kubelets, runtimes, strict=True):
        if k not in KUBELETS or r not in RUNTIMES:
            raise ClusterError(f"KUBELET={kubelet} RUNTIME={runtime}: a kubelet is one of {', '.join(KUBELETS)}, "
                               f"a runtime one of {', '.join(RUNTIMES)}")
    return list(zip(kubelets, runtimes, strict=True))


def networks() -> dict[str, str]:
    """What the cluster routes on the host, by what it is for."""
    return {f"{NET}.0/24": "the hosts' subnet", components.CLUSTER_CIDR: "the pods' CIDRs",
            components.SERVICE_CIDR: "the Services' CIDR"}


def routes_into(routes: list[dict]) -> list[str]:
    """The host's routes (`ip -j route` objects) into the cluster's networks, each with what it collides with:
    `up` would fail halfway on `ip route add` ("File exists"), or the host would send the cluster's traffic
    elsewhere. A default route overlaps everything and is the host's own way out: not counted."""
    taken = []
    for route in routes:
        if route.get("dst", "default") == "default":
            continue
        dst = ipaddress.ip_network(route["dst"], strict=False)
        for cidr, purpose in networks().items():
            if dst.version == 4 and dst.overlaps(ipaddress.ip_network(cidr)):
                via = f" via {route['gateway']}" if "gateway" in route else ""
                taken.append(f"{route['dst']}{via} dev {route.get('dev', '?')} overlaps {cidr}, {purpose}")
    return taken


def _host_routes() -> list[dict]:
    return json.loads(hosts.ip("-j", "route", "show", "table", "main").stdout or "[]")


def _hosts(pairs: list[tuple[str, str]], kubeadm: bool = False) -> Record:
    """The record of a new cluster, and its hosts: the bridge, the control plane's netns, the nodes'."""
    record = Record(containerd_run_existed=CONTAINERD_RUN.exists(), container_logs_existed=CONTAINER_LOGS.is_dir(),
                    kubeadm=kubeadm)
    record.nodes = [NodeRecord(f"node-{i}", f"{NET}.{20 + i}", f"pync-n{i}", kubelet, runtime)
                    for i, (kubelet, runtime) in enumerate(pairs, 1)]
    record.knobs = {k: (Path("/proc/sys") / k).read_text() for k in KERNEL_KNOBS if (Path("/proc/sys") / k).exists()}
    record.bridge = BRIDGE
    record.netns = [CP_NETNS] + [n.netns for n in record.nodes]
    record.save()
    RUN.mkdir(parents=True, exist_ok=True)
    (STATE / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write(RESOLV_CONF, f"nameserver {CP_IP}\n".encode(), mode=0o644)

    hosts.make_bridge(BRIDGE, f"{HOST_IP}/24")
    hosts.make_host(CP_NETNS, BRIDGE, f"{CP_IP}/24")
    for n in record.nodes:
        hosts.make_host(n.netns, BRIDGE, f"{n.address}/24")
        hosts.sysctl(n.netns, "net.ipv4.ip_forward", "1")
    return record


def _registry(record: Record, images: Images | None, hosts_dir: Path, out) -> None:
    hosts_dir.mkdir(parents=True, exist_ok=True)
    if images is not None:
        print(f"image registry in {CP_NETNS}", file=out)
        record.registry = images(daemons(), CP_NETNS, CP_IP, STATE / "registry", hosts_dir,
                                 STATE / "logs" / "registry.log")
        record.save()


def _up(count: int, kubelet: str, runtime: str, images: Images | None, out) -> None:
    record = _hosts([(kubelet, runtime)] * count)
    log_dir = STATE / "logs"

    # certificates and kubeconfigs, as kubeadm names its users
    pki_dir = STATE / "pki"
    server = f"https://{CP_IP}:{APISERVER_PORT}"
    ca = pki.control_plane(pki_dir, CP_IP)
    for stem, (user, groups) in pki.CONTROL_PLANE_USERS.items():
        pki.user_kubeconfig(ca, STATE / f"{stem}.kubeconfig", server, user, groups)
    proxy = STATE / "kube-proxy.kubeconfig"
    front_proxy = pki.front_proxy(pki_dir / "front-proxy").dir
    ca.ensure(pki.metrics_server_serving(CP_IP))
    metrics_kubeconfig = pki.user_kubeconfig(ca, STATE / "metrics-server.kubeconfig", server,
                                             components.METRICS_SERVER_USER)
    argvs = components.control_plane_argvs(address=CP_IP, port=APISERVER_PORT, pki=pki_dir, etcd_dir=STATE / "etcd",
                                           etcd_ports=ETCD_PORTS, kubeconfigs=STATE, front_proxy=front_proxy)

    d = daemons()
    hosts_dir = STATE / "certs.d"
    _registry(record, images, hosts_dir, out)

    print("control plane: etcd, kube-apiserver", file=out)
    for name in ("etcd", "kube-apiserver"):
        d.start(name, argvs[name], log_dir / f"{name}.log", CP_NETNS)
    admin = pki_dir / "super-admin"
    hosts.wait_for("kube-apiserver /readyz",
                   lambda: components.apiserver_ready(server, pki_dir / "ca.crt", admin), 120,
                   failed=lambda: d.exited("etcd", "kube-apiserver"))
    kubectl("apply", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": components.KUBEADM_RBAC}))
    for name in ("kube-controller-manager", "kube-scheduler"):
        d.start(name, argvs[name], log_dir / f"{name}.log", CP_NETNS)
    # metrics-server beside them, for `kubectl top`: the aggregator reaches it in the control plane's netns
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "List",
        "items": components.metrics_server_objects(CP_IP, ca.pair.cert.read_bytes())}))
    d.start("metrics-server", components.metrics_server_argv(kubeconfig=metrics_kubeconfig, address=CP_IP,
                                                             pki=pki_dir),
            log_dir / "metrics-server.log", CP_NETNS)

    for n in record.nodes:
        print(f"{n.name} ({n.address}): {runtime}, {kubelet}", file=out)
        node = n.node()
        for hierarchy in cgroup_hierarchies():  # the stock kubelet wants its cgroup root to exist
            (hierarchy / node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        ca.ensure(pki.kubelet_serving(n.name, n.address))
        client = pki.kubelet_client(n.name)
        kubeconfig = pki.user_kubeconfig(ca, STATE / f"{client.name}.kubeconfig", server, client.common_name,
                                         client.groups)
        # its plugins start the CNI helper of the node's netns (warm plugins, no import per call): `down` stops it
        d.start(f"{n.name}-{runtime}", node.runtime_argv(hosts_dir), log_dir / f"{n.name}-{runtime}.log", n.netns)
        hosts.wait_for(f"{runtime} on {node.sock}", node.sock.exists, 60,
                       failed=lambda n=n: d.exited(f"{n.name}-{runtime}"))
        d.start(f"{n.name}-{kubelet}", node.kubelet_argv(kubeconfig, pki_dir), log_dir / f"{n.name}-{kubelet}.log",
                n.netns)
    _pod_network(record, lambda n: d.start(
        f"{n.name}-kube-proxy", components.kube_proxy_argv(kubeconfig=proxy, node=n.name),
        log_dir / f"{n.name}-kube-proxy.log", n.netns))
    # the ServiceAccount admission plugin refuses pods until the controller manager made `default`
    hosts.wait_for("the default ServiceAccount", lambda: kubectl("get", "serviceaccount", "default",
                                                                 check=False).returncode == 0, 60)
    # metrics.k8s.io answers once metrics-server does; `kubectl top` has figures after its second scrape
    hosts.wait_for("the metrics.k8s.io APIService Available", lambda: kubectl(
        "get", "apiservice", "v1beta1.metrics.k8s.io", "-o",
        'jsonpath={.status.conditions[?(@.type=="Available")].status}', check=False).stdout == "True", 90,
        failed=lambda: d.exited("metrics-server"))
    print(f"cluster DNS: CoreDNS {coredns.VERSION} at {components.DNS_IP}", file=out)
    _deploy_dns()


def _node_daemons(record: Record, n: NodeRecord) -> list[str]:
    """The daemons a node's failure shows in."""
    if record.kubeadm:
        return [f"{n.name}-init"]
    return [f"{n.name}-{n.runtime}", f"{n.name}-{n.kubelet}", "kube-controller-manager"]


def _pod_network(record: Record, kube_proxy: Callable[[NodeRecord], object] | None = None) -> None:
    """What a CNI add-on does once the controller manager gave each node its pod CIDR: the node's network
    config, routes between the nodes (and from the host and the control plane's netns) to each pod CIDR; with
    `kube_proxy`, the node's kube-proxy started then. Returns when every node is Ready."""
    d = daemons()
    for n in record.nodes:
        n.pod_cidr = hosts.wait_for(
            f"{n.name} registered with a pod CIDR",
            lambda n=n: kubectl("get", "node", n.name, "-o", "jsonpath={.spec.podCIDR}", check=False).stdout, 90,
            failed=lambda n=n: d.exited(*_node_daemons(record, n)))
        record.routes.append(f"{n.pod_cidr} via {n.address}")
        record.save()
        hosts.ip("route", "add", n.pod_cidr, "via", n.address)
        # the API server calls webhooks, conversion webhooks and aggregated API servers at their pods' IPs
        # (--enable-aggregator-routing), as a kubeadm control plane, itself a node, reaches the pod network
        hosts.ip("route", "add", n.pod_cidr, "via", n.address, netns=CP_NETNS)
        n.node().write_network(n.pod_cidr)
        if kube_proxy is not None:
            kube_proxy(n)
    for n in record.nodes:  # pods reach the pods of other nodes through their node
        for other in record.nodes:
            if other is not n:
                hosts.ip("route", "add", other.pod_cidr, "via", other.address, netns=n.netns)
    record.routes.append(f"{components.SERVICE_CIDR} via {record.nodes[0].address}")
    record.save()
    hosts.ip("route", "add", components.SERVICE_CIDR, "via", record.nodes[0].address)
    for n in record.nodes:
        hosts.wait_for(f"{n.name} Ready", lambda n=n: kubectl(
            "get", "node", n.name, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            check=False).stdout == "True", 90,
            failed=lambda n=n: d.exited(*_node_daemons(record, n), *([] if record.kubeadm else
                                                                     [f"{n.name}-kube-proxy"])))


def _up_kubeadm(pairs: list[tuple[str, str]], images: Images | None, out) -> None:
    """kubeadm init on node-1, kubeadm join of the others (kubeadm_node.py), the pod network as for `_up`."""
    record = _hosts(pairs, kubeadm=True)
    log_dir = STATE / "logs"
    record.created = [str(p) for p in _missing([*kubeadm_node.PRIVATE_DIRS, *kubeadm_node.HOST_PATHS])]
    record.save()
    for path in map(Path, record.created):
        if kubeadm_node.HOST_PATHS.get(str(path)) == "file":
            path.touch()
        else:
            path.mkdir()
    hosts_dir = STATE / "certs.d"
    _registry(record, images, hosts_dir, out)
    MNTNS.mkdir(parents=True, exist_ok=True)  # a private mount, where mount namespaces may be bound
    subprocess.run(["mount", "--bind", str(MNTNS), str(MNTNS)], check=True)
    subprocess.run(["mount", "--make-private", str(MNTNS)], check=True)
    d = daemons()
    kns = [n.kubeadm_node() for n in record.nodes]
    etc_hosts = STATE / "hosts"
    atomic_write(etc_hosts, ("127.0.0.1\tlocalhost\n" + "".join(f"{n.address}\t{n.name}\n" for n in record.nodes))
                 .encode(), mode=0o644)
    for n, kn in zip(record.nodes, kns, strict=True):
        print(f"{n.name} ({n.address}): node init, {n.runtime}, {n.kubelet}", file=out)
        for hierarchy in cgroup_hierarchies():
            (hierarchy / kn.node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        kn.make_mount_namespace(etc_hosts)
        kn.write_bin()
        d.start(f"{n.name}-init", kn.init_argv(hosts_dir, log_dir / n.name), log_dir / f"{n.name}-init.log")
        hosts.wait_for(f"{n.runtime} on {kn.node.sock}", kn.node.sock.exists, 60,
                       failed=lambda n=n: d.exited(f"{n.name}-init"))
    first = kns[0]
    kubeadm_log = log_dir / "kubeadm.log"
    config = first.node.dir / "kubeadm.yaml"
    config.write_text(first.init_config(RESOLV_CONF))
    print(f"kubeadm init on {first.node.name}", file=out)
    _kubeadm(first, kubeadm_log, "init", "--config", str(config))
    for conf in ("admin.conf", "super-admin.conf"):
        shutil.copyfile(first.private("/etc/kubernetes") / conf, STATE / conf.replace(".conf", ".kubeconfig"))
    join = _kubeadm(first, kubeadm_log, "token", "create", "--print-join-command").stdout
    for kn in kns[1:]:
        print(f"kubeadm join of {kn.node.name}", file=out)
        config = kn.node.dir / "kubeadm.yaml"
        config.write_text(kn.join_config(join))
        _kubeadm(kn, kubeadm_log, "join", "--config", str(config))
    _pod_network(record)
    hosts.wait_for("the default ServiceAccount", lambda: kubectl("get", "serviceaccount", "default",
                                                                 check=False).returncode == 0, 60)
    print(f"cluster DNS: kubeadm's CoreDNS at {components.DNS_IP}", file=out)
    _wait_dns()


def _kubeadm(kn: KubeadmNode, log: Path, *args: str) -> subprocess.CompletedProcess:
    result = kn.kubeadm(*args, log=log)
    if result.returncode != 0:
        raise ClusterError(f"kubeadm {args[0]} on {kn.node.name} exited {result.returncode} (log: {log}): "
                           f"{(result.stdout + result.stderr)[-3000:]}")
    return result


def _missing(paths) -> list[Path]:
    """Of `paths`, those the host lacks, each after its own missing parents."""
    missing: list[Path] = []
    for path in map(Path, paths):
        for p in reversed([path, *path.parents]):
            if not p.exists() and p not in missing:
                missing.append(p)
    return missing


def _deploy_dns() -> None:
    """kubeadm's CoreDNS add-on, available before `up` returns: a cluster's pods find Services by name from the
    first. If it does not come up, the error says what its pods say."""
    items = coredns.manifests(components.DNS_IP, components.CLUSTER_DOMAIN)
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    _wait_dns()


def _wait_dns() -> None:
    """CoreDNS's Deployment (ours or kubeadm's add-on) rolled out; else what its pods say."""
    ns = ["-n", coredns.NAMESPACE]
    rollout = kubectl("rollout", "status", f"deployment/{coredns.NAME}", *ns, "--timeout=120s", check=False,
                      timeout=150)
    if rollout.returncode != 0:
        selector = ",".join(f"{k}={v}" for k, v in coredns.LABELS.items())
        pods = kubectl("get", "pods", *ns, "-l", selector, "-o", "wide", check=False).stdout
        statuses = kubectl("get", "pods", *ns, "-l", selector, "-o", "jsonpath={.items[*].status}",
                           check=False).stdout
        logs = kubectl("logs", *ns, "-l", selector, "--tail", "20", check=False)
        raise ClusterError(f"CoreDNS did not become available: {rollout.stderr.strip()}\n{pods}\n{statuses}\n"
                           f"{logs.stdout}{logs.stderr}")


# ---- down --------------------------------------------------------------------------------------------------

def down(out=sys.stdout) -> int:
    with _locked():
        if Record.load() is None and not STATE.exists() and not RUN.exists():
            print("no cluster to remove", file=out)
            return 0
        started = time.monotonic()
        problems = _down()
        for problem in problems:
            print(f"cluster-down: {problem}", file=out)
        print(f"cluster removed in {time.monotonic() - started:.1f} s" if not problems else
              "cluster-down left the above behind", file=out)
        return 1 if problems else 0


def _down() -> list[str]:
    """Undoes everything in the record, in the reverse order of `up`; returns what could not be removed."""
    record = Record.load() or Record()
    d = daemons()
    problems: list[str] = []
    if record.kubeadm:
        problems += _reset(record)
    for n in record.nodes:  # the kubelets first: nothing recreates the pods removed next
        d.stop(f"{n.name}-{n.kubelet}", grace=15)
        d.stop(f"{n.name}-kube-proxy")
    for n in record.nodes:
        node = n.node()
        name = f"{n.name}-init" if record.kubeadm else f"{n.name}-{n.runtime}"
        if d.process(name) is not None:
            problems += _remove_pods(node)
        children = _descendants(d.process(name))
        d.stop(name, grace=30)
        _kill(children)
        _kill([p for p in psutil.process_iter() if str(node.sock) in " ".join(_cmdline(p))])  # containerd's shims
        problems += _remove_cgroups(node.cgroup_root)
        # it would go with the netns, within a second or two: gone now, as everything else. It answers only a
        # caller of its own mount namespace: a kubeadm node's
        stop = [sys.executable, "-m", "cni_plugins", "helper-stop"]
        subprocess.run(n.kubeadm_node().enter(stop) if record.kubeadm else ["ip", "netns", "exec", n.netns, *stop],
                       capture_output=True, timeout=30)
    for name in ("metrics-server", "kube-scheduler", "kube-controller-manager"):
        d.stop(name)
    d.stop("kube-apiserver", grace=15)
    for name in d.names():  # etcd, the registry, and whatever a failed start left
        d.stop(name)
    problems += _unmount_under(STATE, RUN)
    for netns in reversed(record.netns):
        hosts.remove_host(netns)
    if record.bridge:
        hosts.ip("link", "del", record.bridge, check=False)  # its routes go with it
    for knob, value in record.knobs.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / knob).write_text(value)
    _remove_container_logs(record.container_logs_existed)
    for created in map(Path, reversed(record.created)):  # each after what it holds: the deepest first
        with contextlib.suppress(FileNotFoundError):
            if created.is_dir() and not created.is_symlink():
                try:
                    created.rmdir()
                except OSError as e:
                    problems.append(f"{created}, made by the cluster, could not be removed: {e.strerror}")
            else:
                created.unlink()
    if not record.containerd_run_existed:
        shutil.rmtree(CONTAINERD_RUN, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)
    for path in (STATE, RUN):
        if path.exists():
            problems.append(f"{path} could not be removed")
    return problems


def _reset(record: Record) -> list[str]:
    """`kubeadm reset` on each node whose init runs, the workers first (the control plane's API server answers
    their resets): the kubelet stopped, every pod removed through the CRI, kubeadm's files gone."""
    d = daemons()
    problems = []
    for n in reversed(record.nodes):
        if d.process(f"{n.name}-init") is None:
            continue
        kn = n.kubeadm_node()
        try:
            result = kn.kubeadm("reset", "--force", "--cri-socket", kn.node.endpoint, log=STATE / "logs" /
                                "kubeadm.log", timeout=180)
        except subprocess.TimeoutExpired:
            problems.append(f"kubeadm reset on {n.name} did not end within 180 s")
            continue
        if result.returncode != 0:
            problems.append(f"kubeadm reset on {n.name} exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return problems


def _remove_pods(node: Node) -> list[str]:
    """Every pod through the CRI, as a drained node's kubelet does (containers, sandboxes, their networks)."""
    from pykubelet.runtime import CRIRuntime
    client = CRIRuntime(node.endpoint, timeout=60)
    try:
        for sandbox in client.list_pod_sandbox():
            client.stop_pod_sandbox(sandbox.id)
            client.remove_pod_sandbox(sandbox.id)
        return []
    except Exception as e:  # the runtime is stopped next either way; what it leaves is removed below
        return [f"removing the pods of {node.name} through {node.endpoint}: {e}"]
    finally:
        client.close()


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _descendants(proc: psutil.Process | None) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True) if proc is not None else []
    except psutil.Error:
        return []


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for p in procs:
        hosts.ended(p, 10)


def _remove_cgroups(root: str) -> list[str]:
    """The node's cgroup root in every hierarchy; a process still in it is a container of this node (the
    cgroup root is the node's own), killed."""
    return [p for h in cgroup_hierarchies() for p in hosts.remove_cgroup_tree(h / root.lstrip("/"), kill=True)]


def _unmount_under(*dirs: Path) -> list[str]:
    from pynode_os import mountinfo
    prefixes = tuple(f"{p}/" for p in dirs)
    for m in sorted(mountinfo.read(), key=lambda m: len(m.mount_point), reverse=True):
        if m.mount_point.startswith(prefixes) or m.mount_point in map(str, dirs):
            subprocess.run(["umount", "-l", m.mount_point], capture_output=True)
    left = [m.mount_point for m in mountinfo.read() if m.mount_point.startswith(prefixes)]
    return [f"mounts left: {', '.join(left)}"] if left else []


def _remove_container_logs(existed: bool) -> None:
    """The stock kubelet's /var/log/containers links into this cluster's pod logs."""
    if not CONTAINER_LOGS.is_dir():
        return
    for link in CONTAINER_LOGS.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(f"{STATE}/"):
                link.unlink()
    if not existed:
        with contextlib.suppress(OSError):
            CONTAINER_LOGS.rmdir()
