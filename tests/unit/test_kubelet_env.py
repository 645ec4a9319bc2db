"""Env resolution as the kubelet's: envFrom before env, env overriding, $(VAR) expansion against what is
defined so far, configMap/secret keys with `optional`, downward API fields and resources with divisors,
and the messages a missing object or key gives (the CreateContainerConfigError the pod shows)."""
from __future__ import annotations

import pytest

from pykubelet.api.podmodel import Container, parse_pod
from pykubelet.config import Settings
from pykubelet.pods.env import EnvSource, container_env, field_value, resource_value, service_env, valid_name
from pykubelet.volumes.errors import ContainerConfigError
from tests.unit.test_kubelet_volumes import POD, RAW, FakeClient, cm, pod_with, sec

ALLOCATABLE = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "1000"}


def env_of(container: dict, objs: dict | None = None, warnings: list | None = None) -> dict:
    pod = pod_with(container)
    return container_env(pod, pod.spec.containers[0], FakeClient(objs), host_ips=["10.0.0.1"],
                         pod_ips=["10.1.0.5", "fd00::5"], allocatable=lambda: ALLOCATABLE,
                         warn=lambda reason, message: (warnings if warnings is not None else []).append(
                             (reason, message)))


def test_env_order_override_and_expansion():
    objs = {**cm("c", {"A": "from-cm", "B": "b"}), **sec("s", {"S": b"secret"})}
    container = {"name": "c", "envFrom": [{"configMapRef": {"name": "c"}}, {"secretRef": {"name": "s"},
                                                                            "prefix": "P_"}],
                 "env": [{"name": "A", "value": "own"},
                         {"name": "X", "value": "$(A)/$(B)/$(P_S)/$(LATER)/$$(A)"},
                         {"name": "LATER", "value": "late"},
                         {"name": "Y", "value": "$(LATER)"}]}
    env = env_of(container, objs)
    assert env == {"A": "own", "B": "b", "P_S": "secret", "X": "own/b/secret/$(LATER)/$(A)", "LATER": "late",
                   "Y": "late"}
    assert list(env)[:3] == ["A", "B", "P_S"]


def test_value_from_every_kind():
    objs = {**cm("c", {"k": "v"}), **sec("s", {"k": b"sv"})}
    env = env_of({"name": "c", "env": [
        {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "none", "key": "k", "optional": True}}},
        {"name": "OPTKEY", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "nokey", "optional": True}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['b']"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}]},
        objs)
    assert env == {"CM": "v", "SEC": "sv", "IP": "10.1.0.5", "IPS": "10.1.0.5,fd00::5", "HOST": "10.0.0.1",
                   "LABEL": "2", "MEM": "8192"}  # no limit of its own: the node's allocatable


@pytest.mark.parametrize("ref, message", [
    ({"configMapKeyRef": {"name": "gone", "key": "k"}}, 'configmap "gone" not found'),
    ({"secretKeyRef": {"name": "gone", "key": "k"}}, 'secret "gone" not found'),
    ({"configMapKeyRef": {"name": "c", "key": "nokey"}}, "couldn't find key nokey in ConfigMap ns/c"),
    ({"fieldRef": {"fieldPath": "spec.bogus"}}, "unsupported fieldPath: spec.bogus"),
])
def test_missing_objects_and_keys_name_them(ref, message):
    with pytest.raises(ContainerConfigError) as e:
        env_of({"name": "c", "env": [{"name": "X", "valueFrom": ref}]}, cm("c", {"k": "v"}))
    assert str(e.value) == message


def test_env_from_missing_and_optional_and_invalid_names():
    assert env_of({"name": "c", "envFrom": [{"configMapRef": {"name": "gone", "optional": True}}]}) == {}
    with pytest.raises(ContainerConfigError, match='secret "gone" not found'):
        env_of({"name": "c", "envFrom": [{"secretRef": {"name": "gone"}}]})
    warnings: list = []
    env = env_of({"name": "c", "envFrom": [{"configMapRef": {"name": "c"}, "prefix": "A="}]},
                 cm("c", {"k": "v"}), warnings)
    assert env == {} and warnings[0][0] == "InvalidEnvironmentVariableNames" and "A=k" in warnings[0][1]
    assert valid_name("1.relaxed-ok") and not valid_name("a=b") and not valid_name("") and not valid_name("tab\t")


def test_field_values():
    assert field_value(POD, "metadata.name") == "p" and field_value(POD, "metadata.uid") == "u-1"
    assert field_value(POD, "metadata.labels") == 'a="q\\"x"\nb="2"'
    assert field_value(POD, "metadata.annotations") == ""
    assert field_value(POD, "metadata.annotations['none']") == ""
    assert field_value(POD, "spec.nodeName") == "n1" and field_value(POD, "spec.serviceAccountName") == "sa"
    assert field_value(POD, "status.podIP") == "" and field_value(POD, "status.hostIPs", host_ips=["a", "b"]) == "a,b"
    with pytest.raises(ContainerConfigError, match="does not support subscript"):
        field_value(POD, "metadata.name['x']")


def test_resource_values_round_up_and_default_to_allocatable():
    pod = pod_with({"name": "c", "resources": {"requests": {"cpu": "250m", "memory": "100M"},
                                               "limits": {"cpu": "1500m"}}})
    c = pod.spec.containers[0]

    def value(resource: str, divisor: str | None = None, container: Container | None = c) -> str:
        ref = {"resource": resource, **({"divisor": divisor} if divisor else {})}
        return resource_value(pod, container, ref, lambda: ALLOCATABLE)

    assert value("limits.cpu") == "2"  # 1.5 cores, rounded up
    assert value("limits.cpu", "1m") == "1500"
    assert value("requests.cpu", "100m") == "3"
    assert value("requests.memory") == "100000000" and value("requests.memory", "1Mi") == "96"
    assert value("limits.memory", "1Gi") == "8"  # no limit: the node's allocatable
    assert value("requests.ephemeral-storage") == "0"
    assert resource_value(pod, None, {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"},
                          lambda: ALLOCATABLE) == "1500"
    with pytest.raises(ContainerConfigError, match=r"unsupported container resource : limits\.gpu"):
        value("limits.gpu")
    with pytest.raises(ContainerConfigError, match="container 'x' not found"):
        resource_value(pod, None, {"containerName": "x", "resource": "limits.cpu"}, lambda: ALLOCATABLE)


def svc(namespace: str, name: str, ip: str, *ports: dict) -> dict:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"clusterIP": ip, "ports": list(ports)}}


SERVICES = [svc("default", "kubernetes", "10.96.0.1", {"name": "https", "port": 443, "protocol": "TCP"}),
            svc("app", "my-db", "10.96.0.9", {"port": 5432}, {"name": "metrics-udp", "port": 9000, "protocol": "UDP"}),
            svc("app", "headless", "None", {"port": 80}), svc("app", "external", "", {"port": 80}),
            svc("other", "elsewhere", "10.96.0.7", {"port": 80}), svc("default", "web", "10.96.0.8", {"port": 80})]


def test_service_env_as_get_service_env_var_map():
    env = service_env(SERVICES, "app", True)
    assert env == {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
        "MY_DB_SERVICE_HOST": "10.96.0.9", "MY_DB_SERVICE_PORT": "5432", "MY_DB_SERVICE_PORT_METRICS_UDP": "9000",
        "MY_DB_PORT": "tcp://10.96.0.9:5432", "MY_DB_PORT_5432_TCP": "tcp://10.96.0.9:5432",
        "MY_DB_PORT_5432_TCP_PROTO": "tcp", "MY_DB_PORT_5432_TCP_PORT": "5432", "MY_DB_PORT_5432_TCP_ADDR": "10.96.0.9",
        "MY_DB_PORT_9000_UDP": "udp://10.96.0.9:9000", "MY_DB_PORT_9000_UDP_PROTO": "udp",
        "MY_DB_PORT_9000_UDP_PORT": "9000", "MY_DB_PORT_9000_UDP_ADDR": "10.96.0.9"}
    # enableServiceLinks false: the master service only; in default, its other services are links too
    assert set(service_env(SERVICES, "app", False)) == {k for k in env if k.startswith("KUBERNETES_")}
    assert "WEB_SERVICE_HOST" in service_env(SERVICES, "default", True)
    assert service_env([svc("x", "v6", "fd00::1", {"port": 80})], "x", True)["V6_PORT"] == "tcp://[fd00::1]:80"


def test_explicit_env_wins_over_service_env_and_can_reference_it():
    services = service_env(SERVICES, "app", True)
    db = {"name": "DB", "value": "$(MY_DB_SERVICE_HOST):$(MY_DB_SERVICE_PORT)"}
    pod = pod_with({"name": "c", "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "mine"}, db]})
    env = container_env(pod, pod.spec.containers[0], FakeClient(None), host_ips=[], pod_ips=[],
                        allocatable=lambda: ALLOCATABLE, services=services)
    assert env["KUBERNETES_SERVICE_HOST"] == "mine" and env["DB"] == "10.96.0.9:5432"
    assert env["KUBERNETES_SERVICE_PORT"] == "443" and list(env)[:2] == ["KUBERNETES_SERVICE_HOST", "DB"]


def test_env_source_resolves_with_the_nodes_ips_and_services():
    """What the pod sync asks: the node's IP as status.hostIP, and a hostNetwork pod's IPs are the node's."""
    source = EnvSource(FakeClient(None), Settings(node_ip="10.0.0.1"), lambda: ALLOCATABLE, services=lambda: SERVICES)
    c = {"name": "c", "image": "i", "env": [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f"status.{n}"}}}
                                            for n in ("hostIP", "podIP")]}
    app = parse_pod({**RAW, "metadata": {**RAW["metadata"], "namespace": "app"},
                     "spec": {**RAW["spec"], "containers": [c]}})
    env = source.resolve(app, app.spec.containers[0], pod_ips=["10.1.0.5"], warn=lambda reason, message: None)
    assert (env["hostIP"], env["podIP"], env["MY_DB_SERVICE_HOST"]) == ("10.0.0.1", "10.1.0.5", "10.96.0.9")
    host = parse_pod({**app.raw, "spec": {**app.raw["spec"], "hostNetwork": True}})
    assert source.resolve(host, host.spec.containers[0], pod_ips=[],
                          warn=lambda reason, message: None)["podIP"] == "10.0.0.1"


def test_env_source_refuses_an_env_without_the_services_until_they_are_listed():
    unlisted = EnvSource(FakeClient(None), Settings(), lambda: ALLOCATABLE, services=lambda: None)
    with pytest.raises(ContainerConfigError, match="services have not yet been read at least once"):
        unlisted.resolve(POD, POD.spec.containers[0], pod_ips=[], warn=lambda reason, message: None)
    # a static pod does not wait: it may be the API server itself (kubeadm's control plane)
    static = parse_pod({**POD.raw, "metadata": {**POD.raw["metadata"],
                                                "annotations": {"kubernetes.io/config.source": "file"}}})
    assert "MY_DB_SERVICE_HOST" not in unlisted.resolve(static, static.spec.containers[0], pod_ips=[],
                                                        warn=lambda reason, message: None)
    standalone = EnvSource(FakeClient(None), Settings(), lambda: ALLOCATABLE)  # no API server: no services
    one = pod_with({"name": "c", "env": [{"name": "A", "value": "1"}]})
    assert standalone.resolve(one, one.spec.containers[0], pod_ips=[], warn=lambda reason, message: None) == {"A": "1"}


def test_configmap_keys_that_are_no_shell_names_reach_the_env():
    """The upstream ConfigMap specs' keys and prefixes ("should be consumable via environment variable", "via
    the environment", "as environment variable names with various prefixes"): 1.37 takes any printable name
    without '=', so none is skipped and no warning is given."""
    objs = cm("c", {"data-1": "value-1", "data-2": "value-2"})
    warnings: list = []
    env = env_of({"name": "c", "env": [{"name": "CONFIG_DATA_1",
                                        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "data-1"}}}],
                  "envFrom": [{"configMapRef": {"name": "c"}}] + [{"configMapRef": {"name": "c"}, "prefix": p}
                                                                    for p in ("p-", "1-", "$_-", "ABC_", "#@!")]},
                 objs, warnings)
    assert env["CONFIG_DATA_1"] == "value-1" and not warnings
    for prefix in ("", "p-", "1-", "$_-", "ABC_", "#@!"):
        assert (env[f"{prefix}data-1"], env[f"{prefix}data-2"]) == ("value-1", "value-2")
