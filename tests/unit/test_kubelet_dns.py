"""A pod's DNS as the kubelet forms it (pykubelet/pods/dns.py), table by table against the stock kubelet's own
cases (pkg/kubelet/network/dns/dns_test.go of v1.37.2): the host's resolv.conf parsed, the search path and
nameserver limits with their warnings, the pod's dnsConfig options merged, and each dnsPolicy with and without a
cluster DNS and a host file. Where Go compares options as sets (its maps have no order), so do these."""
from __future__ import annotations

from pathlib import Path

import pytest

from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.pods.dns import (
    MISSING_CLUSTER_DNS,
    DNSError,
    PodDNS,
    fit_nameservers,
    fit_searches,
    merge_options,
    parse_resolv_conf,
    pod_dns,
    read_resolv_conf,
)

HOST_NAMESERVER, HOST_DOMAIN = "8.8.8.8", "host.domain"


def pod(namespace: str = "testNS", **spec) -> Pod:
    return parse_pod({"metadata": {"name": "test_pod", "namespace": namespace, "uid": "u1"},
                      "spec": {"containers": [{"name": "c", "image": "i"}], **spec}})


@pytest.mark.parametrize("text, nameservers, searches, options", [
    ("", [], [], []),
    (" ", [], [], []),
    ("\n", [], [], []),
    ("\t\n\t", [], [], []),
    ("#comment\n", [], [], []),
    (" #comment\n", [], [], []),
    ("#comment\n#comment", [], [], []),
    ("#comment\nnameserver 1.2.3.4\nsearch", ["1.2.3.4"], [], []),
    ("nameserver 1.2.3.4", ["1.2.3.4"], [], []),
    (" nameserver 1.2.3.4", ["1.2.3.4"], [], []),
    ("\tnameserver 1.2.3.4", ["1.2.3.4"], [], []),
    ("nameserver\t1.2.3.4", ["1.2.3.4"], [], []),
    ("nameserver \t 1.2.3.4", ["1.2.3.4"], [], []),
    ("nameserver 1.2.3.4\nnameserver 5.6.7.8", ["1.2.3.4", "5.6.7.8"], [], []),
    ("nameserver 1.2.3.4 #comment", ["1.2.3.4"], [], []),
    ("search ", [], [], []),
    ("search .", [], [], []),
    ("search . foo", [], ["foo"], []),
    ("search foo .", [], ["foo"], []),
    ("search foo .  bar", [], ["foo", "bar"], []),
    ("search foo", [], ["foo"], []),
    ("search foo bar", [], ["foo", "bar"], []),
    ("search foo. bar", [], ["foo", "bar"], []),
    ("search foo bar bat\n", [], ["foo", "bar", "bat"], []),
    ("search foo\nsearch bar", [], ["bar"], []),
    ("nameserver 1.2.3.4\nsearch foo bar", ["1.2.3.4"], ["foo", "bar"], []),
    ("nameserver 1.2.3.4\nsearch foo\nnameserver 5.6.7.8\nsearch bar", ["1.2.3.4", "5.6.7.8"], ["bar"], []),
    ("#comment\nnameserver 1.2.3.4\n#comment\nsearch foo\ncomment", ["1.2.3.4"], ["foo"], []),
    ("options ", [], [], []),
    ("options ndots:5 attempts:2", [], [], ["ndots:5", "attempts:2"]),
    ("options ndots:1 ndots:5 attempts:2", [], [], ["ndots:5", "attempts:2"]),
    ("options ndots:1 edns0 attempts:2 single-request-reopen", [], [],
     ["edns0", "attempts:2", "single-request-reopen", "ndots:1"]),
    ("options ndots:1\noptions ndots:5 attempts:3", [], [], ["ndots:5", "attempts:3"]),
    ("options ndots:1 timeout:3 timeout:1 attempts:3\noptions ndots:5", [], [], ["ndots:5", "timeout:1", "attempts:3"]),
    ("options ndots:1 attempts:3\noptions ndots:1 attempts:3 ndots:5", [], [], ["ndots:5", "attempts:3"]),
    ("nameserver 1.2.3.4\nsearch foo\nnameserver 5.6.7.8\nsearch bar\noptions ndots:5 attempts:4",
     ["1.2.3.4", "5.6.7.8"], ["bar"], ["ndots:5", "attempts:4"]),
])
def test_parse_resolv_conf(text, nameservers, searches, options):
    conf = parse_resolv_conf(text)
    assert list(conf.nameservers) == nameservers and list(conf.searches) == searches
    assert set(conf.options) == set(options) and len(conf.options) == len(options)


@pytest.mark.parametrize("text", ["#comment\nnameserver", "#comment\nnameserver\nsearch"])
def test_a_nameserver_line_without_an_address_is_an_error(text):
    with pytest.raises(DNSError, match="line 2: nameserver list is empty"):
        parse_resolv_conf(text)


SEARCH_2048 = ["A" * 128] + ["A" * 127] * 15  # 2048 characters joined by spaces
NUMBERED = ["testNS.svc.TEST", "svc.TEST", "TEST"] + [str(i) for i in range(4, 33)]
CUT = "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: "


@pytest.mark.parametrize("searches, kept, warned", [
    (["testNS.svc.TEST", "svc.TEST", "TEST"], ["testNS.svc.TEST", "svc.TEST", "TEST"], False),
    (["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "BBB"], ["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "BBB"],
     False),
    (["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "B" * 256, "BBB"],
     ["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "BBB"], True),
    (SEARCH_2048, SEARCH_2048, False),
    ([*SEARCH_2048, "B"], SEARCH_2048, True),
    (["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "BBB", "CCC", "DDD"],
     ["testNS.svc.TEST", "svc.TEST", "TEST", "AAA", "BBB", "CCC", "DDD"], False),
    (NUMBERED, NUMBERED, False),
    ([*NUMBERED, "33"], NUMBERED, True),
])
def test_search_path_limits(searches, kept, warned):
    fitted, message = fit_searches(searches)
    assert fitted == kept
    assert message == (CUT + " ".join(kept) if warned else None)


@pytest.mark.parametrize("servers, kept, warned", [
    (["127.0.0.1"], ["127.0.0.1"], False),
    (["127.0.0.1", "10.0.0.10", "8.8.8.8"], ["127.0.0.1", "10.0.0.10", "8.8.8.8"], False),
    (["127.0.0.1", "10.0.0.10", "8.8.8.8", "1.2.3.4"], ["127.0.0.1", "10.0.0.10", "8.8.8.8"], True),
])
def test_nameserver_limits(servers, kept, warned):
    fitted, message = fit_nameservers(servers)
    assert fitted == kept and (message is not None) == warned
    if warned:
        assert message == ("Nameserver limits were exceeded, some nameservers have been omitted, the applied "
                           "nameserver line is: 127.0.0.1 10.0.0.10 8.8.8.8")


@pytest.mark.parametrize("existing, pod_options, merged", [
    (["ndots:5", "debug"], [], ["ndots:5", "debug"]),
    (["ndots:5", "debug"], [("single-request", None), ("attempts", "3")],
     ["ndots:5", "debug", "single-request", "attempts:3"]),
    (["ndots:5", "debug"], [("ndots", "3"), ("debug", None), ("single-request", None), ("attempts", "3")],
     ["ndots:3", "debug", "single-request", "attempts:3"]),
    (["ndots:5"], [("edns0", "")], ["ndots:5", "edns0"]),  # an empty value is the name alone
])
def test_merge_options(existing, pod_options, merged):
    assert set(merge_options(existing, pod_options)) == set(merged)


CLUSTER_NS = "203.0.113.1"


@pytest.mark.parametrize("policy, host_network, cluster_dns, cluster", [
    ("ClusterFirst", False, True, True),
    ("ClusterFirstWithHostNet", True, True, True),
    ("ClusterFirstWithHostNet", False, True, True),
    ("Default", False, False, False),
    ("Default", True, False, False),
    ("ClusterFirst", True, True, False),  # a hostNetwork pod falls back to Default
    ("None", False, False, False),
])
def test_each_policy_takes_the_cluster_dns_or_not(policy, host_network, cluster_dns, cluster):
    got = pod_dns(pod(dnsPolicy=policy, hostNetwork=host_network), cluster_dns=[CLUSTER_NS] if cluster_dns else [],
                  cluster_domain="TEST", host=f"nameserver {HOST_NAMESERVER}\n")
    want = [CLUSTER_NS] if cluster else [] if policy == "None" else [HOST_NAMESERVER]
    assert list(got.servers) == want


def test_get_pod_dns_without_a_host_file():
    """resolvConf "": host-DNS pods get the node's loopback and no search path (the stock TestGetPodDNS)."""
    def dns(policy: str, host_network: bool) -> PodDNS:
        return pod_dns(pod(namespace="", dnsPolicy=policy, hostNetwork=host_network), cluster_dns=[CLUSTER_NS],
                       cluster_domain="kubernetes.io", host=None)
    for got in (dns("ClusterFirstWithHostNet", True), dns("ClusterFirst", False)):
        assert list(got.servers) == [CLUSTER_NS] and got.searches[0] == ".svc.kubernetes.io"
        assert list(got.options) == ["ndots:5"]
    for got in (dns("ClusterFirst", True), dns("Default", True)):
        assert list(got.servers) == ["127.0.0.1"] and list(got.searches) == ["."] and not got.options
    six = pod_dns(pod(dnsPolicy="Default"), cluster_dns=[], cluster_domain="", host=None, node_ips=["fd00::2"])
    assert list(six.servers) == ["::1"]


def test_get_pod_dns_with_a_host_file():
    """The cluster's search path before the host's, the host's nameservers replaced by the cluster DNS."""
    host = "nameserver 10.0.0.1\nnameserver 10.0.0.2\nsearch a.example b.example\noptions timeout:1\n"
    got = pod_dns(pod(), cluster_dns=[CLUSTER_NS], cluster_domain="kubernetes.io", host=host)
    assert list(got.servers) == [CLUSTER_NS] and list(got.options) == ["ndots:5"]
    assert list(got.searches) == ["testNS.svc.kubernetes.io", "svc.kubernetes.io", "kubernetes.io", "a.example",
                                  "b.example"]
    default = pod_dns(pod(dnsPolicy="Default"), cluster_dns=[CLUSTER_NS], cluster_domain="kubernetes.io", host=host)
    assert default == PodDNS(("10.0.0.1", "10.0.0.2"), ("a.example", "b.example"), ("timeout:1",))
    no_domain = pod_dns(pod(), cluster_dns=[CLUSTER_NS], cluster_domain="", host=host)
    assert list(no_domain.searches) == ["a.example", "b.example"]


DNS_CONFIG = {"nameservers": ["10.0.0.11"], "searches": ["my.domain"],
              "options": [{"name": "ndots", "value": "3"}, {"name": "debug"}]}
CLUSTER_SEARCH = ["testNS.svc.kubernetes.io", "svc.kubernetes.io", "kubernetes.io"]


@pytest.mark.parametrize("policy, host_network, dns_config, servers, searches, options", [
    ("None", False, None, [], [], []),
    ("None", False, {"nameservers": ["203.0.113.1"], "searches": ["my.domain", "second.domain"],
                     "options": [{"name": "ndots", "value": "3"}, {"name": "debug"}]},
     ["203.0.113.1"], ["my.domain", "second.domain"], ["ndots:3", "debug"]),
    ("ClusterFirst", False, DNS_CONFIG, ["10.0.0.10", "10.0.0.11"], [*CLUSTER_SEARCH, HOST_DOMAIN, "my.domain"],
     ["ndots:3", "debug"]),
    ("ClusterFirstWithHostNet", True, DNS_CONFIG, ["10.0.0.10", "10.0.0.11"],
     [*CLUSTER_SEARCH, HOST_DOMAIN, "my.domain"], ["ndots:3", "debug"]),
    ("Default", False, DNS_CONFIG, [HOST_NAMESERVER, "10.0.0.11"], [HOST_DOMAIN, "my.domain"], ["ndots:3", "debug"]),
])
def test_get_pod_dns_custom(policy, host_network, dns_config, servers, searches, options):
    """The pod's dnsConfig merged over every policy's base (the stock TestGetPodDNSCustom)."""
    spec = {"dnsPolicy": policy, "hostNetwork": host_network} | ({"dnsConfig": dns_config} if dns_config else {})
    got = pod_dns(pod(**spec), cluster_dns=["10.0.0.10"], cluster_domain="kubernetes.io",
                  host=f"nameserver {HOST_NAMESERVER}\nsearch {HOST_DOMAIN}\n")
    assert list(got.servers) == servers and list(got.searches) == searches
    assert set(got.options) == set(options) and len(got.options) == len(options)
    assert not got.pod_events and not got.node_events


def test_no_cluster_dns_falls_back_to_default_with_a_warning_on_the_pod_and_the_node():
    got = pod_dns(pod(), cluster_dns=[], cluster_domain="cluster.local", host=f"nameserver {HOST_NAMESERVER}\n")
    assert list(got.servers) == [HOST_NAMESERVER] and not got.searches
    assert got.node_events == (("MissingClusterDNS", MISSING_CLUSTER_DNS),)
    assert got.pod_events == (("MissingClusterDNS", f'pod: "test_pod_testNS(u1)". {MISSING_CLUSTER_DNS}'),)


def test_the_limits_hold_over_the_merged_config_and_warn_on_the_pod():
    dns_config = {"nameservers": ["10.0.0.2", "10.0.0.3", "10.0.0.4"], "searches": [f"d{i}.example" for i in range(40)]}
    got = pod_dns(pod(dnsConfig=dns_config), cluster_dns=["10.0.0.10"], cluster_domain="cluster.local", host="")
    assert list(got.servers) == ["10.0.0.10", "10.0.0.2", "10.0.0.3"]
    assert len(got.searches) == 32 and got.searches[:4] == ("testNS.svc.cluster.local", "svc.cluster.local",
                                                            "cluster.local", "d0.example")
    assert [reason for reason, _ in got.pod_events] == ["DNSConfigForming", "DNSConfigForming"]
    assert got.pod_events[1][1] == CUT + " ".join(got.searches)


def test_the_host_file_is_read_whole_or_refused(tmp_path: Path):
    assert read_resolv_conf(None) is None
    (tmp_path / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    assert read_resolv_conf(tmp_path / "resolv.conf") == "nameserver 10.0.0.1\n"
    with pytest.raises(DNSError, match=r"could not open resolv conf file .*missing"):
        read_resolv_conf(tmp_path / "missing")
    (tmp_path / "big").write_bytes(b"#" * ((10 << 20) + 1))
    with pytest.raises(DNSError, match="longer than"):
        read_resolv_conf(tmp_path / "big")


class Events:
    """The recorder's sending side: what the sync records, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (kind, type, reason) of each

    def event(self, ref: dict, type_: str, reason: str, _message: str) -> None:
        self.seen.append((ref["kind"], type_, reason))


def test_the_sync_gives_the_sandbox_the_pods_dns_read_from_the_host_file(tmp_path: Path):
    """The sandbox's DNSConfig from the host file as it is when the sandbox is made; a file that cannot be read
    makes no sandbox, and says why in the pod's waiting reason and a FailedCreatePodSandBox event."""
    from pykubelet.config import Settings
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer
    from tests.kit.fake_cri import FakeCRI

    host = tmp_path / "resolv.conf"
    host.write_text("nameserver 10.0.0.1\nsearch corp.example\n")
    rt, events = FakeCRI(), Events()
    rt.add_image("sha256:i", "i")
    syncer = PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs", cluster_dns=["10.96.0.10"],
                                    cluster_domain="cluster.local", resolv_conf=host),
                       events=events)  # type: ignore[arg-type]  # a fake of the recorder
    p = pod(dnsConfig={"options": [{"name": "ndots", "value": "2"}]})
    syncer.sync(p, observe(rt, "u1"))
    (config,) = [args[0] for rpc, *args in rt.calls if rpc == "RunPodSandbox"]
    assert list(config.dns_config.servers) == ["10.96.0.10"] and list(config.dns_config.options) == ["ndots:2"]
    assert list(config.dns_config.searches) == ["testNS.svc.cluster.local", "svc.cluster.local", "cluster.local",
                                                "corp.example"]
    assert not [e for e in events.seen if e[1] == "Warning"]

    host.unlink()
    events.seen.clear()
    other = parse_pod({"metadata": {"name": "other", "namespace": "testNS", "uid": "u2"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}})
    result = syncer.sync(other, observe(rt, "u2"))
    assert [rpc for rpc, *_ in rt.calls].count("RunPodSandbox") == 1
    assert result.waiting["c"][0] == "ContainerCreating" and str(host) in result.waiting["c"][1]
    assert events.seen == [("Pod", "Warning", "FailedCreatePodSandBox")]


def test_the_sync_warns_on_the_pod_and_the_node_without_a_cluster_dns(tmp_path: Path):
    from pykubelet.config import Settings
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer
    from tests.kit.fake_cri import FakeCRI

    rt, events = FakeCRI(), Events()
    rt.add_image("sha256:i", "i:1")
    syncer = PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs", node_ip="10.0.0.5",
                                    resolv_conf=None),
                       events=events)  # type: ignore[arg-type]  # a fake of the recorder
    syncer.sync(parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u3"},
                           "spec": {"containers": [{"name": "c", "image": "i:1"}]}}), observe(rt, "u3"))
    (config,) = [args[0] for rpc, *args in rt.calls if rpc == "RunPodSandbox"]
    assert list(config.dns_config.servers) == ["127.0.0.1"] and list(config.dns_config.searches) == ["."]
    assert [e for e in events.seen if e[1] == "Warning"] == [("Pod", "Warning", "MissingClusterDNS"),
                                                             ("Node", "Warning", "MissingClusterDNS")]
