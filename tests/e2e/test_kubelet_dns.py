"""Pods' resolv.conf as pykubelet forms it for each dnsPolicy, end to end (stock kube-apiserver, containerd 1.6 and
pyruntime-cri), read inside the pod's container: ClusterFirst gets the cluster DNS, the search path
NS.svc.cluster.local svc.cluster.local cluster.local before the host's, ndots:5, the pod's dnsConfig merged over
it; Default gets the host's resolv.conf; None only its dnsConfig; a hostNetwork pod keeps the cluster DNS with
ClusterFirstWithHostNet and falls back to the host's with ClusterFirst; more nameservers or search domains than
the resolver takes are cut, with the kubelet's DNSConfigForming warnings. The host file is the kubelet's default
resolvConf, /etc/resolv.conf."""
from __future__ import annotations

import json
from pathlib import Path

from pykubelet.pods.dns import parse_resolv_conf
from tests.kit.kubelet_node import BUSYBOX, apply, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-dns"
NODE_IP = "10.201.0.37"
CLUSTER_DNS = "10.96.0.10"
KUBELET_CONFIG = {"clusterDNS": [CLUSTER_DNS], "clusterDomain": "cluster.local"}
CLUSTER_SEARCH = ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"]
IDLE = "trap 'exit 0' TERM; while true; do sleep 0.2; done"


def host():
    return parse_resolv_conf(Path("/etc/resolv.conf").read_text())  # the kit's kubelets keep the default resolvConf


def resolv_conf(control_plane, runtime, tmp_path, name: str, **spec) -> dict[str, list[str]]:
    """The resolv.conf of a busybox pod with `spec`, as its container reads it: nameserver, search and options,
    each in its order."""
    apply(control_plane, tmp_path, kit_pod_spec(NODE, name, {"name": "c", "image": BUSYBOX,
                                                             "command": ["sh", "-c", IDLE]}, **spec))
    pod = wait_pod(control_plane, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")
    container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    out, err, code = runtime.exec_sync(container, ["cat", "/etc/resolv.conf"], 10)
    assert code == 0, err
    found: dict[str, list[str]] = {"nameserver": [], "search": [], "options": []}
    for line in out.decode().splitlines():
        fields = line.split()
        if fields and fields[0] in found:
            found[fields[0]] += fields[1:]
    return found


def test_cluster_first_with_the_pods_dns_config(control_plane, runtime, pods, tmp_path):
    pods.append("cluster-first")
    got = resolv_conf(control_plane, runtime, tmp_path, "cluster-first", dnsConfig={
        "nameservers": ["10.0.0.11"], "searches": ["my.domain"],
        "options": [{"name": "ndots", "value": "3"}, {"name": "edns0"}]})
    assert got["nameserver"] == [CLUSTER_DNS, "10.0.0.11"]
    assert got["search"] == [*CLUSTER_SEARCH, *[s for s in host().searches if s not in CLUSTER_SEARCH], "my.domain"]
    assert sorted(got["options"]) == ["edns0", "ndots:3"]


def test_default_is_the_hosts(control_plane, runtime, pods, tmp_path):
    pods.append("default")
    got = resolv_conf(control_plane, runtime, tmp_path, "default", dnsPolicy="Default")
    expected = host()
    assert got["nameserver"] == list(expected.nameservers)[:3] and got["search"] == list(expected.searches)
    assert sorted(got["options"]) == sorted(expected.options)


def test_none_is_only_the_dns_config(control_plane, runtime, pods, tmp_path):
    pods.append("none")
    got = resolv_conf(control_plane, runtime, tmp_path, "none", dnsPolicy="None", dnsConfig={
        "nameservers": ["203.0.113.1"], "searches": ["a.example"], "options": [{"name": "timeout", "value": "1"}]})
    assert got == {"nameserver": ["203.0.113.1"], "search": ["a.example"], "options": ["timeout:1"]}


def test_host_network_pods(control_plane, runtime, pods, tmp_path):
    """ClusterFirstWithHostNet keeps the cluster DNS on the host's network; ClusterFirst falls back to the host's."""
    pods += ["with-host-net", "host-net"]
    with_host_net = resolv_conf(control_plane, runtime, tmp_path, "with-host-net", hostNetwork=True,
                                dnsPolicy="ClusterFirstWithHostNet")
    assert with_host_net["nameserver"] == [CLUSTER_DNS] and with_host_net["search"][:3] == CLUSTER_SEARCH
    assert with_host_net["options"] == ["ndots:5"]
    host_net = resolv_conf(control_plane, runtime, tmp_path, "host-net", hostNetwork=True)
    assert host_net["nameserver"] == list(host().nameservers)[:3]


def test_the_limits_cut_and_warn(control_plane, runtime, pods, tmp_path):
    """Four nameservers and 35 search domains (each list within what the API server takes in dnsConfig): the
    first three and the first 32 reach the resolv.conf, and the pod has a DNSConfigForming warning for each."""
    pods.append("limits")
    searches = [f"d{i}.example" for i in range(32)]
    got = resolv_conf(control_plane, runtime, tmp_path, "limits", dnsConfig={
        "nameservers": ["10.0.0.2", "10.0.0.3", "10.0.0.4"], "searches": searches})
    assert got["nameserver"] == [CLUSTER_DNS, "10.0.0.2", "10.0.0.3"]
    merged = [*CLUSTER_SEARCH, *[s for s in host().searches if s not in CLUSTER_SEARCH], *searches]
    assert got["search"] == merged[:32]

    def warnings() -> set[str]:
        events = json.loads(control_plane.kubectl("get", "events", "--field-selector",
                                                  "involvedObject.name=limits,reason=DNSConfigForming", "-o",
                                                  "json").stdout)["items"]
        found = {e["message"] for e in events if e["type"] == "Warning"}
        return found if len(found) == 2 else set()
    messages = wait_for("both DNSConfigForming warnings", warnings, timeout=30)
    assert ("Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line "
            f"is: {CLUSTER_DNS} 10.0.0.2 10.0.0.3") in messages, messages
    assert ("Search Line limits were exceeded, some search paths have been omitted, the applied search line is: "
            + " ".join(merged[:32])) in messages, messages
