"""What pykubelet puts into a container, end to end (stock kube-apiserver, containerd 1.6 and pyruntime-cri), as
Kubernetes' own [NodeConformance] specs check it:

- the kubelet-managed /etc/hosts ("KubeletManagedEtcHosts should test kubelet managed /etc/hosts file", "Kubelet
  when scheduling an agnhost Pod with hostAliases [and hostNetwork] should write entries to /etc/hosts"): the
  pod's IP with its hostname and subdomain FQDN and the hostAliases block, in each container but one that mounts
  /etc/hosts itself; a hostNetwork pod gets the node's file with its aliases;
- the hostname from spec.hostnameOverride ("Override hostname of Pod"), in the UTS namespace and /etc/hosts;
- the termination message ("Container Runtime blackbox test on terminated container should report termination
  message ..."): from the file, also written as a non-root user at a path of its own, and from the log's end with
  FallbackToLogsOnError only when the container failed and the file is empty;
- ConfigMap keys such as data-1 in the env, through configMapKeyRef and envFrom with the spec's prefixes ("ConfigMap
  should be consumable via environment variable" and its neighbours); the env is printed by the env applet
  itself, as the stand-in busybox's sh (Debian's 1.35) drops the names that are no shell identifiers.

A container's files are read through CRI ExecSync; a finished container's output from its CRI log file."""
from __future__ import annotations

from pathlib import Path

import pytest

from pykubelet.pods.hosts import HOST_NETWORK_HEADER, LOCALHOST, MANAGED_HEADER
from tests.kit.kubelet_node import BUSYBOX, apply, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-files"
NODE_IP = "10.201.0.52"
KUBELET_CONFIG = {"clusterDomain": "cluster.local"}
IDLE = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
ALIASES = [{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}]


@pytest.fixture
def env_data(control_plane):
    yield "env-data"
    control_plane.kubectl("delete", "configmap", "env-data", "--ignore-not-found", check=False)


def running(control_plane, name: str) -> dict:
    return wait_pod(control_plane, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running"
                    and all(cs.get("ready") for cs in p["status"].get("containerStatuses", [])))


def finished(control_plane, name: str) -> dict:
    return wait_pod(control_plane, name, "finished",
                    lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"))


def exec_in(runtime, pod: dict, container: str, *argv: str) -> str:
    cid = next(cs["containerID"] for cs in pod["status"]["containerStatuses"] if cs["name"] == container)
    out, err, code = runtime.exec_sync(cid.split("://", 1)[1], list(argv), 10)
    assert code == 0, (argv, err)
    return out.decode()


def output(kubelet, pod: dict, container: str = "c") -> str:
    """What the finished container wrote, from its CRI log file."""
    meta = pod["metadata"]
    log = kubelet.pods_dir / f"default_{meta['name']}_{meta['uid']}" / container / "0.log"
    return "".join(line.split(" ", 3)[3] + ("\n" if line.split(" ", 3)[2] == "F" else "")
                   for line in log.read_text().splitlines())


def test_managed_etc_hosts_with_aliases_but_not_over_a_containers_own(control_plane, runtime, pods, tmp_path):
    own = tmp_path / "own-hosts"
    own.write_text("10.9.9.9\town\n")
    pods.append("etc-hosts")
    apply(control_plane, tmp_path, kit_pod_spec(
        NODE, "etc-hosts", {"name": "c", "image": BUSYBOX, "command": IDLE},
        containers=[{"name": "c", "image": BUSYBOX, "command": IDLE},
                    {"name": "own", "image": BUSYBOX, "command": IDLE,
                     "volumeMounts": [{"name": "hosts", "mountPath": "/etc/hosts"}]}],
        volumes=[{"name": "hosts", "hostPath": {"path": str(own), "type": "File"}}],
        hostname="h", subdomain="sub", hostAliases=ALIASES))
    pod = running(control_plane, "etc-hosts")
    ip = pod["status"]["podIP"]
    assert exec_in(runtime, pod, "c", "cat", "/etc/hosts") == (
        MANAGED_HEADER + LOCALHOST + f"{ip}\th.sub.default.svc.cluster.local\th\n"
        "\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n")
    assert exec_in(runtime, pod, "c", "hostname").strip() == "h"
    assert exec_in(runtime, pod, "own", "cat", "/etc/hosts") == "10.9.9.9\town\n"


def test_a_host_network_pod_gets_the_nodes_hosts_file_with_its_aliases(control_plane, runtime, pods, tmp_path):
    pods.append("host-etc-hosts")
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "host-etc-hosts", {"name": "c", "image": BUSYBOX,
                                                                        "command": IDLE},
                                                hostNetwork=True, hostAliases=ALIASES))
    pod = running(control_plane, "host-etc-hosts")
    assert exec_in(runtime, pod, "c", "cat", "/etc/hosts") == (HOST_NETWORK_HEADER + Path("/etc/hosts").read_text()
                                                             + "\n# Entries added by HostAliases.\n"
                                                             "123.45.67.89\tfoo\tbar\n")


def test_hostname_override_wins_over_hostname_and_subdomain(control_plane, runtime, pods, tmp_path):
    pods.append("override")
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "override", {"name": "c", "image": BUSYBOX, "command": IDLE},
                                                hostname="custom-host", subdomain="t",
                                                hostnameOverride="override.example.host"))
    pod = running(control_plane, "override")
    assert exec_in(runtime, pod, "c", "hostname").strip() == "override.example.host"
    hosts = exec_in(runtime, pod, "c", "cat", "/etc/hosts")
    assert f"{pod['status']['podIP']}\toverride.example.host\n" in hosts and "custom-host" not in hosts


@pytest.mark.parametrize("name, container, phase, message", [
    # "should report termination message if TerminationMessagePath is set"
    ("as-root", {"args": ["/bin/echo -n DONE > /dev/termination-log"], "securityContext": {"runAsUser": 0}},
     "Succeeded", "DONE"),
    # "... if TerminationMessagePath is set as non-root user and at a non-default path"
    ("as-non-root", {"args": ["/bin/echo -n DONE > /dev/termination-custom-log"],
                     "terminationMessagePath": "/dev/termination-custom-log",
                     "securityContext": {"runAsUser": 10000}}, "Succeeded", "DONE"),
    # "... from log output if TerminationMessagePolicy FallbackToLogsOnError is set"
    ("from-log", {"args": ["/bin/echo -n DONE; /bin/false"], "terminationMessagePolicy": "FallbackToLogsOnError"},
     "Failed", "DONE"),
    # "... as empty when pod succeeds and TerminationMessagePolicy FallbackToLogsOnError is set"
    ("empty", {"args": ["/bin/echo -n DONE; /bin/true"], "terminationMessagePolicy": "FallbackToLogsOnError"},
     "Succeeded", ""),
    # "... from file when pod succeeds and TerminationMessagePolicy FallbackToLogsOnError is set"
    ("from-file", {"args": ["/bin/echo -n OK > /dev/termination-log; /bin/echo DONE; /bin/true"],
                   "terminationMessagePolicy": "FallbackToLogsOnError"}, "Succeeded", "OK"),
])
def test_termination_message(control_plane, pods, tmp_path, name, container, phase, message):
    pods.append(name)
    apply(control_plane, tmp_path, kit_pod_spec(NODE, name, {"name": "c", "image": BUSYBOX,
                                                             "command": ["/bin/sh", "-c"], **container},
                                                restartPolicy="Never"))
    pod = finished(control_plane, name)
    assert pod["status"]["phase"] == phase
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["state"]["terminated"].get("message", "") == message


def test_configmap_keys_that_are_no_shell_names_reach_the_env(control_plane, kubelet, pods, env_data, tmp_path):
    apply(control_plane, tmp_path, {"metadata": {"name": "env-data", "namespace": "default"},
                                    "data": {"data-1": "value-1", "data-2": "value-2"}}, kind="ConfigMap")
    pods.append("env")
    prefixes = ["p-", "1-", "$_-", "ABC_", "#@!"]
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "env", {
        "name": "c", "image": BUSYBOX, "command": ["env"],
        "env": [{"name": "CONFIG_DATA_1", "valueFrom": {"configMapKeyRef": {"name": "env-data", "key": "data-1"}}}],
        "envFrom": [{"configMapRef": {"name": "env-data"}}] + [{"configMapRef": {"name": "env-data"}, "prefix": p}
                                                                  for p in prefixes]}, restartPolicy="Never"))
    pod = finished(control_plane, "env")
    assert pod["status"]["phase"] == "Succeeded"
    lines = output(kubelet, pod).splitlines()
    assert "CONFIG_DATA_1=value-1" in lines
    for prefix in ["", *prefixes]:
        assert f"{prefix}data-1=value-1" in lines and f"{prefix}data-2=value-2" in lines, (prefix, lines)
