"""pykubelet's settings: flags over the KubeletConfiguration file over defaults, as the kubelet merges
them, and an unknown or invalid setting stops start-up naming it."""
from __future__ import annotations

import json
import re
import ssl
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pykubelet import config, durations
from pykubelet.main import main

NO_FLAGS = dict.fromkeys(config.FLAGS)


def write(tmp_path, doc: dict, name: str = "kubelet.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps({"apiVersion": config.API_VERSION, "kind": config.KIND, **doc}))
    return path


def build(tmp_path=None, doc: dict | None = None, **flags):
    return config.build({**NO_FLAGS, "hostname_override": "node-a", **flags},
                        write(tmp_path, doc) if doc is not None else None)


def test_defaults_are_the_kubelets():
    s = build()
    assert (s.port, s.max_pods, s.node_status_update_frequency, s.node_status_report_frequency,
            s.node_lease_duration_seconds, s.root_dir.as_posix()) == (10250, 110, 10.0, 300.0, 40, "/var/lib/kubelet")
    assert s.kubeconfig is None and s.node_name == "node-a"


def test_file_over_defaults_and_flags_over_file(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    s = build(tmp_path, {"maxPods": 20, "port": 11250, "nodeStatusUpdateFrequency": "1m30s",
                         "authentication": {"x509": {"clientCAFile": str(ca)}, "anonymous": {"enabled": False}},
                         "clusterDNS": ["10.96.0.10"], "containerLogMaxSize": "5Mi"},
              max_pods=30)
    assert s.max_pods == 30 and s.port == 11250 and s.node_status_update_frequency == 90.0
    assert s.client_ca_file == ca and s.cluster_dns == ["10.96.0.10"]
    assert s.container_log_max_size == 5 * 1024 * 1024


def test_yaml_file(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text(f"apiVersion: {config.API_VERSION}\nkind: {config.KIND}\nstaticPodPath: /etc/kubernetes/manifests\n"
                    "failSwapOn: false\n")
    s = config.build({**NO_FLAGS, "hostname_override": "n"}, path)
    assert str(s.static_pod_path) == "/etc/kubernetes/manifests"


@pytest.mark.parametrize(("doc", "flags", "message"), [
    ({"maxPod": 3}, {}, "unknown field maxPod"),
    ({"authentication": {"x509": {"clientCaFile": "x"}}}, {}, "unknown field authentication.x509.clientCaFile"),
    ({"port": 70000}, {}, "port: expected an integer in [1, 65535], got 70000"),
    ({"nodeStatusUpdateFrequency": "10 seconds"}, {}, "nodeStatusUpdateFrequency: expected a duration"),
    ({"cgroupDriver": "docker"}, {}, "cgroupDriver: expected one of cgroupfs, systemd"),
    ({}, {"max_pods": 0}, "--max-pods: expected an integer in [1, ...], got 0"),
    ({}, {"node_ip": "169.254.0.1"}, "--node-ip: expected a routable address"),
    ({}, {"node_ip": "0.0.0.0"}, "--node-ip: expected a routable address"),
    ({}, {"node_ip": "node-a"}, "--node-ip: expected an IP address"),
    ({}, {"container_runtime_endpoint": "tcp://1.2.3.4:5"}, "--container-runtime-endpoint: expected a unix socket"),
    ({}, {"hostname_override": "Not_A_Name"}, "node name 'not_a_name' is not a DNS-1123 subdomain"),
    ({}, {"tls_cert_file": "/etc/hostname"}, "--tls-cert-file and --tls-private-key-file go together"),
    ({}, {"kubeconfig": "/nonexistent/kubeconfig"}, "--kubeconfig /nonexistent/kubeconfig: no such file"),
])
def test_bad_settings_are_named(tmp_path, doc, flags, message):
    with pytest.raises(config.ConfigError) as e:
        build(tmp_path, doc, **flags)
    assert message in str(e.value)


def test_wrong_kind_is_refused(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(config.ConfigError, match="kind/apiVersion must be KubeletConfiguration"):
        config.build(NO_FLAGS, path)


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("5m", 300), ("1h2m3s", 3723), ("100ms", 0.1), ("0", 0)])
def test_go_durations(text, seconds):
    assert durations.duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("seconds", "text"), [(1.5, "1.5s"), (0.3502, "350.2ms"), (90, "1m30s"), (120, "2m0s"),
                                               (2e-6, "2µs")])
def test_durations_printed_as_go_prints_them(seconds, text):
    assert durations.go_duration(seconds) == text


def test_version_is_printed_as_kubeadm_parses_it():
    """kubeadm's preflight (KubeletVersion, SystemVerification) runs `kubelet --version` and wants this line."""
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"Kubernetes v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)([-\w.+]*)?\n", result.output)


def test_command_line_stops_naming_the_setting(tmp_path):
    result = CliRunner().invoke(main, ["--config", str(write(tmp_path, {"maxPods": 3, "bogus": 1})),
                                       "--hostname-override", "n"])
    assert result.exit_code == 2
    assert "unknown field bogus" in result.output


class RuntimeConfigs:
    """A runtime's answers to RuntimeConfig, one per call (an exception is raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)

    def runtime_config(self):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_cgroup_driver_is_the_runtimes_as_the_kubelets_getCgroupDriverFromCRI(monkeypatch):
    """kubeadm writes cgroupDriver: systemd; the kubelet follows the runtime, and the config only where the
    runtime has no RuntimeConfig (containerd 1.6)."""
    import grpc

    from proto import api_pb2
    from pykubelet import main as kubelet_main
    from pykubelet import runtime as cri

    monkeypatch.setattr(kubelet_main, "booted", lambda: True)
    stop = threading.Event()
    cgroupfs = api_pb2.RuntimeConfigResponse(linux=api_pb2.LinuxRuntimeConfiguration(cgroup_driver=api_pb2.CGROUPFS))
    systemd = api_pb2.RuntimeConfigResponse(linux=api_pb2.LinuxRuntimeConfiguration(cgroup_driver=api_pb2.SYSTEMD))
    assert kubelet_main.cgroup_driver(RuntimeConfigs(cgroupfs), "systemd", stop) == "cgroupfs"
    assert kubelet_main.cgroup_driver(RuntimeConfigs(systemd), "cgroupfs", stop) == "systemd"
    assert kubelet_main.cgroup_driver(RuntimeConfigs(api_pb2.RuntimeConfigResponse()), "cgroupfs", stop) == "cgroupfs"
    unimplemented = cri.Unimplemented("RuntimeConfig", grpc.StatusCode.UNIMPLEMENTED, "unknown method")
    assert kubelet_main.cgroup_driver(RuntimeConfigs(unimplemented), "systemd", stop) == "systemd"
    starting = cri.CRIError("RuntimeConfig", grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert kubelet_main.cgroup_driver(RuntimeConfigs(starting, cgroupfs), "systemd", stop, wait=0) == "cgroupfs"
    with pytest.raises(cri.CRIError, match="connection refused"):
        kubelet_main.cgroup_driver(RuntimeConfigs(starting, starting, starting), "systemd", stop, wait=0)
    monkeypatch.setattr(kubelet_main, "booted", lambda: False)
    with pytest.raises(SystemExit, match="cgroupDriver: systemd: systemd is not running on this host"):
        kubelet_main.cgroup_driver(RuntimeConfigs(systemd), "cgroupfs", stop)


DATA = Path(__file__).parent / "data" / "kubelet"


def paths(doc: dict, prefix: str = "") -> set[str]:
    """The field paths of a document, objects gone into (the maps of a field are its value)."""
    out = set()
    for key, value in doc.items():
        name = prefix + key
        if isinstance(value, dict) and name not in config.FILE_FIELDS:
            out |= paths(value, name + ".")
        elif key not in ("apiVersion", "kind"):
            out.add(name)
    return out


def test_every_v1beta1_field_is_taken():
    """The test file gives every field of v1beta1 (1.37): each is in the table and taken, the ones not
    implemented named for the start-up warning, in the file's order."""
    path = DATA / "every-field.yaml"
    assert paths(yaml.safe_load(path.read_text())) == set(config.FILE_FIELDS)
    values = config.load_file(path)
    s = config.Settings(**values)
    assert s.not_implemented == [name for name, f in config.FILE_FIELDS.items() if not f.implemented]
    assert "cpuManagerPolicy" in s.not_implemented and "shutdownGracePeriod" not in s.not_implemented
    assert s.rotate_certificates and s.server_tls_bootstrap
    assert (s.resolv_conf, s.healthz_port, s.healthz_bind_address) == (
        Path("/run/systemd/resolve/resolv.conf"), 10248, "127.0.0.1")
    assert s.tls_min_version == ssl.TLSVersion.TLSv1_2
    assert s.tls_cipher_suites == ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"]
    assert s.feature_gates == {"KubeletCrashLoopBackOffMax": True, "ContainerCheckpoint": False, "NodeSwap": True}
    assert s.system_reserved == {"cpu": 500, "memory": 512 << 20, "ephemeral-storage": 1 << 30, "pid": 1000}
    assert s.kube_reserved == {"cpu": 1000, "memory": 256 << 20}
    assert (s.shutdown_grace_period, s.shutdown_grace_period_critical_pods) == (30.0, 10.0)
    assert s.shutdown_grace_period_by_pod_priority == [{"priority": 100000, "shutdownGracePeriodSeconds": 10}]
    assert s.register_with_taints == [{"key": "example.com/dedicated", "value": "infra", "effect": "NoSchedule"}]
    assert s.verbosity == 2 and s.node_status_report_frequency == 120.0


KUBEADM = {  # what kubeadm's files set, over the kubelet's defaults (their "0s" durations are the defaults)
    "client_ca_file": Path("/etc/kubernetes/pki/ca.crt"), "anonymous_auth": False, "webhook_authentication": True,
    "authorization_mode": "Webhook", "cgroup_driver": "systemd", "cluster_dns": ["10.96.0.10"],
    "cluster_domain": "cluster.local", "healthz_bind_address": "127.0.0.1", "healthz_port": 10248,
    "static_pod_path": Path("/etc/kubernetes/manifests"), "sync_frequency": 60.0, "runtime_request_timeout": 120.0,
    "node_status_update_frequency": 10.0, "node_status_report_frequency": 300.0,
    "authentication_webhook_cache_ttl": 120.0, "authorization_webhook_cache_authorized_ttl": 300.0,
    "streaming_connection_idle_timeout": 4 * 3600.0, "eviction_pressure_transition_period": 300.0,
    "shutdown_grace_period": 0.0, "verbosity": 0, "rotate_certificates": True, "not_implemented": [],
}


@pytest.mark.parametrize(("name", "expected"), [
    ("kubeadm-print-init-defaults.yaml", {"container_runtime_endpoint": "unix:///run/containerd/containerd.sock",
                                          "resolv_conf": Path("/etc/resolv.conf")}),
    ("kubeadm-var-lib-kubelet-config.yaml", {
        "container_runtime_endpoint": "unix:///var/run/containerd/containerd.sock",
        "resolv_conf": Path("/run/systemd/resolve/resolv.conf")}),
])
def test_kubeadms_files_are_taken(tmp_path, name, expected):
    s = config.Settings(**config.load_file(DATA / name))
    assert {k: getattr(s, k) for k in {**KUBEADM, **expected}} == {**KUBEADM, **expected}
    # and whole, with the files it names there
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    path = tmp_path / "config.yaml"
    path.write_text((DATA / name).read_text().replace("/etc/kubernetes/pki/ca.crt", str(ca)))
    assert config.build({**NO_FLAGS, "hostname_override": "n"}, path).client_ca_file == ca


@pytest.mark.parametrize(("doc", "message"), [
    ({"evictionHard": {"memory.available": "lots"}}, "evictionHard.memory.available: expected"),
    ({"systemReserved": {"cpu": "fast"}}, "systemReserved.cpu: expected a cpu quantity"),
    ({"kubeReserved": {"gpu": "1"}}, "kubeReserved.gpu: expected one of cpu, memory, ephemeral-storage, pid"),
    ({"registerWithTaints": [{"key": "a", "effect": "Sometimes"}]}, "registerWithTaints[0].effect: expected one of"),
    ({"featureGates": {"NoSuchGate": True}}, "featureGates: expected a known feature gate: unrecognized feature "
                                             "gate: NoSuchGate"),
    ({"featureGates": {"NodeSwap": "yes"}}, "featureGates: expected true or false for feature gate NodeSwap"),
    ({"featureGates": {"NodeSwap": False}}, "featureGates: expected true for feature gate NodeSwap: cannot set "
                                            "feature gate NodeSwap to false, feature is locked to true"),
    # locked by a spec that writes LockToDefault before PreRelease
    ({"featureGates": {"SeparateCacheWatchRPC": True}}, "featureGates: expected false for feature gate "
     "SeparateCacheWatchRPC: cannot set feature gate SeparateCacheWatchRPC to true, feature is locked to false"),
    ({"readOnlyPort": 10255}, "readOnlyPort: expected 0: this node serves no unauthenticated port, got 10255"),
    ({"cgroupsPerQOS": False}, "cgroupsPerQOS: expected true: pods' cgroups are always under kubepods"),
    ({"tlsMinVersion": "TLS1.2"}, "tlsMinVersion: expected one of VersionTLS10, VersionTLS11, VersionTLS12"),
    ({"tlsCipherSuites": ["TLS_NO_SUCH_SUITE"]}, "tlsCipherSuites: expected cipher suites as Go's crypto/tls names"),
    ({"healthzPort": "10248"}, "healthzPort: expected an integer in [0, 65535], got '10248'"),
    ({"logging": "json"}, "logging: expected an object, got 'json'"),
    ({"logging": {"format": "xml"}}, "logging.format: expected one of text, json"),
    ({"logging": {"colour": True}}, "unknown field logging.colour"),
    ({"shutdownGracePeriodByPodPriority": [{"priority": 1, "seconds": 3}]},
     "shutdownGracePeriodByPodPriority[0].seconds: expected a field of priority, shutdownGracePeriodSeconds"),
    ({"shutdownGracePeriod": 30}, "shutdownGracePeriod: expected a duration"),
    ({"shutdownGracePeriod": "10s", "shutdownGracePeriodCriticalPods": "20s"},
     "shutdownGracePeriodCriticalPods: expected at most shutdownGracePeriod (10s), got 20s"),
    ({"shutdownGracePeriod": "500ms"}, "shutdownGracePeriod: expected zero or at least 1s, as the kubelet, got 0.5s"),
    ({"shutdownGracePeriod": "30s", "shutdownGracePeriodByPodPriority": [{"priority": 0,
                                                                          "shutdownGracePeriodSeconds": 30}]},
     "shutdownGracePeriodByPodPriority: expected either it or shutdownGracePeriod"),
    ({"staticPodURLHeader": {"X": "a"}}, "staticPodURLHeader.X: expected a list"),
    ({"reservedMemory": [{"numaNode": 0, "limits": {"memory": "lots"}}]},
     "reservedMemory[0].limits.memory: expected a quantity"),
    ({"enforceNodeAllocatable": ["none", "pods"]}, "enforceNodeAllocatable: expected \"none\" alone"),
    ({"resolvConf": 3}, "resolvConf: expected a string, got 3"),
])
def test_bad_values_are_refused_with_their_field_path(tmp_path, doc, message):
    with pytest.raises(config.ConfigError) as e:
        build(tmp_path, doc)
    assert message in str(e.value)


def test_zero_values_are_the_defaults_and_pointer_zeros_are_values(tmp_path):
    """As Go reads a file: "0s" of a duration is the field left out (kubeadm writes it so), and so is "" of a
    string; a pointer's zero (healthzPort 0, resolvConf "") is a value."""
    s = build(tmp_path, {"runtimeRequestTimeout": "0s", "containerRuntimeEndpoint": "", "staticPodPath": "",
                         "healthzPort": 0, "resolvConf": "", "nodeStatusUpdateFrequency": "20s"})
    assert s.runtime_request_timeout == 120.0 and s.container_runtime_endpoint.endswith("containerd.sock")
    assert s.static_pod_path is None and s.healthz_port == 0 and s.resolv_conf is None
    assert s.node_status_report_frequency == 20.0  # left out, it follows the update period as the kubelet's
    assert s.not_implemented == []


@pytest.mark.parametrize(("flags", "expected"), [
    ({"node_labels": "kubelet.kubernetes.io/pool=,node.kubernetes.io/exclude-from-external-load-balancers=x,"
                     "example.com/rack=r1,topology.kubernetes.io/zone=z1"},
     {"node_labels": {"kubelet.kubernetes.io/pool": "", "example.com/rack": "r1",
                      "node.kubernetes.io/exclude-from-external-load-balancers": "x",
                      "topology.kubernetes.io/zone": "z1"}}),
    ({"register_with_taints": "node-role.kubernetes.io/control-plane:NoSchedule,example.com/gpu=yes:NoExecute"},
     {"register_with_taints": [{"key": "node-role.kubernetes.io/control-plane", "value": "", "effect": "NoSchedule"},
                               {"key": "example.com/gpu", "value": "yes", "effect": "NoExecute"}]}),
])
def test_kubeadms_flags(flags, expected):
    s = build(**flags)
    assert {k: getattr(s, k) for k in expected} == expected


@pytest.mark.parametrize(("flags", "message"), [
    ({"node_labels": "kubernetes.io/role=master"}, "--node-labels: expected labels in the 'kubernetes.io' namespace"),
    ({"node_labels": "node-role.kubernetes.io/worker="}, "labels node-role.kubernetes.io/worker"),
    ({"node_labels": "example.k8s.io/x=1"}, "unknown 'kubernetes.io' or 'k8s.io' labels example.k8s.io/x"),
    ({"node_labels": "novalue"}, "--node-labels: expected key=value pairs"),
    ({"node_labels": "a=b c"}, "--node-labels: expected a label value"),
    ({"register_with_taints": "a=b"}, "--register-with-taints: expected taints as key=value:Effect"),
    ({"register_with_taints": "a=b:Never"}, "--register-with-taints: expected one of NoSchedule"),
])
def test_kubeadms_flags_refused(flags, message):
    with pytest.raises(config.ConfigError) as e:
        build(**flags)
    assert message in str(e.value)


def test_pod_infra_container_image_is_accepted(tmp_path):
    result = CliRunner().invoke(main, ["--config", str(write(tmp_path, {"readOnlyPort": 1})),
                                       "--pod-infra-container-image=registry.k8s.io/pause:3.10"])
    assert result.exit_code == 2 and "readOnlyPort: expected 0" in result.output


def test_one_start_up_warning_names_the_fields_not_implemented(tmp_path, monkeypatch, caplog):
    import pykubelet.main

    monkeypatch.setattr(pykubelet.main, "run", lambda settings, stop: None)
    monkeypatch.setattr(pykubelet.main, "preload", lambda: None)
    monkeypatch.setattr(pykubelet.main.signal, "signal", lambda sig, handler: None)
    path = write(tmp_path, {"eventBurst": 100, "httpCheckFrequency": "20s", "cpuManagerReconcilePeriod": "0s",
                            "maxPods": 50})
    with caplog.at_level("INFO", logger="pykubelet"):
        result = CliRunner().invoke(main, ["--config", str(path), "--hostname-override", "n",
                                           "--pod-infra-container-image", "registry.k8s.io/pause:3.10"])
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"--config {path}: taken but not implemented by pykubelet: eventBurst, "
                        "httpCheckFrequency"]
    assert any("--pod-infra-container-image registry.k8s.io/pause:3.10: ignored" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(("doc", "expected"), [
    ({"cpu": "1.5", "memory": "1.5Gi"}, {"cpu": 1500, "memory": 1536 << 20}),
    ({"cpu": "0.5m", "memory": "1e3"}, {"cpu": 1, "memory": 1000}),  # rounded up, as MilliValue and Value
    ({"cpu": 2, "ephemeral-storage": "+1Ki"}, {"cpu": 2000, "ephemeral-storage": 1024}),
])
def test_reservations_are_read_with_the_apis_grammar(doc, expected):
    assert config.reserved(doc) == expected


@pytest.mark.parametrize(("doc", "message"), [
    ({"cpu": "-1"}, "a cpu quantity such as"), ({"cpu": True}, "a cpu quantity such as"),
    ({"memory": "10K"}, "a quantity such as \"10Mi\""),  # k, not K, is the API's kilo
    ({"memory": "-1Mi"}, "a quantity such as \"10Mi\""),
])
def test_a_reservation_that_is_no_quantity_is_refused(doc, message):
    with pytest.raises(ValueError, match=message) as e:
        config.reserved(doc)
    assert getattr(e.value, "path", None) == f".{next(iter(doc))}"
