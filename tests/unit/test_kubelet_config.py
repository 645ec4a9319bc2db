"""pykubelet's settings: flags over the KubeletConfiguration file over defaults, as the kubelet merges
them, and an unknown or invalid setting stops start-up naming it."""
from __future__ import annotations

import json

import pytest
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


def test_command_line_stops_naming_the_setting(tmp_path):
    result = CliRunner().invoke(main, ["--config", str(write(tmp_path, {"maxPods": 3, "bogus": 1})),
                                       "--hostname-override", "n"])
    assert result.exit_code == 2
    assert "unknown field bogus" in result.output


def test_the_systemd_cgroup_driver_stops_the_start_on_a_host_without_systemd(tmp_path, monkeypatch):
    from pykubelet import main as kubelet_main
    monkeypatch.setattr(kubelet_main, "booted", lambda: False)
    result = CliRunner().invoke(main, ["--config", str(write(tmp_path, {"cgroupDriver": "systemd"})),
                                       "--hostname-override", "n"])
    assert result.exit_code == 2
    assert "cgroupDriver: systemd: systemd is not running on this host" in result.output
