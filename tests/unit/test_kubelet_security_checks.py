"""The kubelet's pod-security checks as pure functions: runAsNonRoot against the image's user
(pykubelet/pods/securitycontext.py, the kubelet's verifyRunAsNonRoot) and sysctl admission
(pykubelet/pods/sysctls.py, the kubelet's pkg/kubelet/sysctl), messages as the kubelet's, word for word."""
from __future__ import annotations

import pytest

from proto import api_pb2
from pykubelet import config
from pykubelet.api.podmodel import Container, Pod, parse_pod
from pykubelet.pods import admission, securitycontext, sysctls
from pykubelet.volumes.errors import ContainerConfigError

POD_Q = '"web_default(uid-1)"'


def pod(pod_sc: dict | None = None, container_sc: dict | None = None, **spec) -> tuple[dict, dict]:
    container = {"name": "app", "image": "busybox", **({"securityContext": container_sc} if container_sc else {})}
    return ({"metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
             "spec": {"containers": [container], **({"securityContext": pod_sc} if pod_sc else {}), **spec}},
            container)


def typed(p: dict, _c: dict) -> tuple[Pod, Container]:
    parsed = parse_pod(p)
    return parsed, parsed.spec.containers[0]


ROOT_IMAGE = f"container has runAsNonRoot and image will run as root (pod: {POD_Q}, container: app)"
RUN_AS_ROOT = f"container's runAsUser breaks non-root policy (pod: {POD_Q}, container: app)"


def non_numeric(user: str) -> str:
    return (f"container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root "
            f"(pod: {POD_Q}, container: app)")


@pytest.mark.parametrize(("pod_sc", "container_sc", "uid", "username", "message"), [
    # runAsNonRoot unset or false: nothing is checked
    (None, None, 0, "", None),
    ({"runAsNonRoot": False}, None, 0, "", None),
    ({"runAsNonRoot": True}, {"runAsNonRoot": False}, 0, "", None),
    # the image's user decides when no runAsUser is set
    ({"runAsNonRoot": True}, None, 0, "", ROOT_IMAGE),
    (None, {"runAsNonRoot": True}, 0, "", ROOT_IMAGE),
    ({"runAsNonRoot": True}, None, 1000, "", None),
    ({"runAsNonRoot": True}, None, None, "root", non_numeric("root")),
    ({"runAsNonRoot": True}, None, None, "www-data", non_numeric("www-data")),
    ({"runAsNonRoot": True}, None, -1, "",
     "container has runAsNonRoot and image has an invalid user id (-1). (Must be 1-(2147483647)): must be between "
     f"0 and 2147483647, inclusive (pod: {POD_Q}, container: app)"),
    # a runAsUser (the container's over the pod's) decides alone
    ({"runAsNonRoot": True, "runAsUser": 0}, None, 1000, "", RUN_AS_ROOT),
    ({"runAsNonRoot": True, "runAsUser": 1000}, {"runAsUser": 0}, 1000, "", RUN_AS_ROOT),
    ({"runAsNonRoot": True, "runAsUser": 0}, {"runAsUser": 1000}, 0, "", None),
    ({"runAsNonRoot": True, "runAsUser": 1000}, None, None, "root", None),
])
def test_verify_run_as_non_root(pod_sc, container_sc, uid, username, message):
    p, c = typed(*pod(pod_sc, container_sc))
    assert securitycontext.verify_run_as_non_root(p, c, uid, username) == message


@pytest.mark.parametrize(("image", "user"), [
    (api_pb2.Image(id="sha256:x"), (0, "")),  # names no user: root
    (None, (0, "")),
    (api_pb2.Image(id="sha256:x", username="nobody"), (None, "nobody")),
    (api_pb2.Image(id="sha256:x", uid={"value": 0}), (0, "")),
    (api_pb2.Image(id="sha256:x", uid={"value": 1000}), (1000, "")),
])
def test_image_user_as_get_image_user(image, user):
    assert securitycontext.image_user(image) == user


def test_check_asks_the_image_only_when_it_decides():
    asked: list[int] = []

    def image() -> api_pb2.Image:
        asked.append(1)
        return api_pb2.Image(id="sha256:x")

    securitycontext.check_run_as_non_root(*typed(*pod()), image)
    securitycontext.check_run_as_non_root(*typed(*pod({"runAsNonRoot": True, "runAsUser": 5})), image)
    assert asked == []
    with pytest.raises(ContainerConfigError) as err:
        securitycontext.check_run_as_non_root(*typed(*pod({"runAsNonRoot": True})), image)
    assert str(err.value) == ROOT_IMAGE and asked == [1]
    with pytest.raises(ContainerConfigError, match="runAsUser breaks"):
        securitycontext.check_run_as_non_root(*typed(*pod({"runAsNonRoot": True, "runAsUser": 0})), image)


# --- sysctls ------------------------------------------------------------------------------------------


def test_safe_set_by_kernel():
    assert sysctls.safe_sysctls("6.1.0-18-amd64") == list(sysctls.SAFE) + [
        "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]
    assert sysctls.safe_sysctls("4.9.0") == list(sysctls.SAFE) + ["net.ipv4.ip_local_reserved_ports"]
    assert sysctls.safe_sysctls("garbage") == list(sysctls.SAFE)


@pytest.mark.parametrize(("name", "ns"), [
    ("kernel.sem", "ipc"), ("kernel.shmmax", "ipc"), ("kernel.msgmax", "ipc"), ("fs.mqueue.msg_max", "ipc"),
    ("net.core.somaxconn", "net"), ("kernel.semx", ""), ("kernel.pid_max", ""), ("fs.mqueue", ""),
    ("vm.swappiness", ""), ("kernel.hostname", ""), ("kernel.domainname", ""),
])
def test_namespaced_by(name, ns):
    assert sysctls.namespaced_by(name) == ns


@pytest.mark.parametrize(("allowed", "sysctl", "host_net", "host_ipc", "why"), [
    ([], "net.ipv4.ip_unprivileged_port_start", False, False, None),
    ([], "net/ipv4/ip_unprivileged_port_start", False, False, None),
    ([], "kernel.shm_rmid_forced", False, False, None),
    ([], "kernel.msgmax", False, False, '"kernel.msgmax" not allowlisted'),
    ([], "kernel.pid_max", False, False, '"kernel.pid_max" not allowlisted'),
    ([], "net.core.somaxconn", False, False, '"net.core.somaxconn" not allowlisted'),
    ([], "net.ipv4.ip_unprivileged_port_start", True, False,
     '"net.ipv4.ip_unprivileged_port_start" not allowed with host net enabled'),
    ([], "kernel.shm_rmid_forced", False, True, '"kernel.shm_rmid_forced" not allowed with host ipc enabled'),
    ([], "kernel.shm_rmid_forced", True, False, None),
    (["kernel.msg*"], "kernel.msgmax", False, False, None),
    (["kernel.msg*"], "kernel.msgmax", False, True, '"kernel.msgmax" not allowed with host ipc enabled'),
    (["kernel.msg*"], "kernel.shmmax", False, False, '"kernel.shmmax" not allowlisted'),
    (["kernel.msgmax"], "kernel.msgmnb", False, False, '"kernel.msgmnb" not allowlisted'),
    (["net.core.*"], "net/core/somaxconn", False, False, None),
    (["net.core.*"], "net.core.somaxconn", True, False, '"net.core.somaxconn" not allowed with host net enabled'),
    (["kernel.sem"], "kernel.sem", False, False, None),
    (["fs.mqueue.*"], "fs.mqueue.msg_max", False, True, '"fs.mqueue.msg_max" not allowed with host ipc enabled'),
])
def test_allowlist_refusal(allowed, sysctl, host_net, host_ipc, why):
    assert sysctls.Allowlist.for_node(allowed, "6.1.0").refusal(sysctl, host_net, host_ipc) == why


@pytest.mark.parametrize("pattern", ["kernel.pid_max", "vm.*", "*", "kernel.*", "Net.Core.X", "net..x", "net.x**", "",
                                     "x" * 254])
def test_allowed_unsafe_refuses_what_is_not_namespaced(pattern):
    with pytest.raises(ValueError):
        sysctls.check_pattern(pattern)


@pytest.mark.parametrize("pattern", ["kernel.msg*", "kernel.sem", "net.core.somaxconn", "net/core/*", "fs.mqueue.*",
                                     "kernel.shm*"])
def test_allowed_unsafe_patterns(pattern):
    sysctls.check_pattern(pattern)


def test_admission_rejects_a_forbidden_sysctl_first():
    unsafe, _ = pod({"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"},
                                 {"name": "kernel.msgmax", "value": "65536"}]})

    def check(p: dict, allowlist: sysctls.Allowlist | None = None) -> admission.Verdict:
        return admission.check(parse_pod(p), [], allocatable={"pods": "110", "cpu": "2", "memory": "1Gi"}, labels={},
                               node_name="n", sysctls=allowlist)

    verdict = check(unsafe)
    assert verdict == admission.Verdict(False, "SysctlForbidden", 'forbidden sysctl: "kernel.msgmax" not allowlisted')
    assert admission.rejected_status(parse_pod(unsafe), verdict)["message"] == \
        'Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted'
    assert check(unsafe, sysctls.Allowlist.for_node(["kernel.msg*"])).admit
    host_net, _ = pod({"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
                      hostNetwork=True)
    assert check(host_net).message == \
        'forbidden sysctl: "net.ipv4.ip_unprivileged_port_start" not allowed with host net enabled'
    assert check(pod()[0]).admit


def test_allowed_unsafe_sysctls_setting():
    flags = {**dict.fromkeys(config.FLAGS), "hostname_override": "n"}
    assert config.build(flags).allowed_unsafe_sysctls == []
    assert config.build({**flags, "allowed_unsafe_sysctls": "kernel.msg*,net.core.somaxconn"}).allowed_unsafe_sysctls \
        == ["kernel.msg*", "net.core.somaxconn"]
    with pytest.raises(config.ConfigError, match=r"--allowed-unsafe-sysctls: .*'kernel\.pid_max' is not known "
                                                 r"to be namespaced"):
        config.build({**flags, "allowed_unsafe_sysctls": "kernel.pid_max"})


def test_allowed_unsafe_sysctls_in_the_file(tmp_path):
    path = tmp_path / "kubelet.yaml"
    path.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                    "allowedUnsafeSysctls: [\"kernel.msg*\"]\n")
    flags = {**dict.fromkeys(config.FLAGS), "hostname_override": "n"}
    assert config.build(flags, path).allowed_unsafe_sysctls == ["kernel.msg*"]
    path.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                    "allowedUnsafeSysctls: \"kernel.msg*\"\n")  # a list, as the kubelet's
    with pytest.raises(config.ConfigError, match="allowedUnsafeSysctls: expected a list"):
        config.build(flags, path)
    path.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                    "allowedUnsafeSysctls: [\"vm.*\"]\n")
    with pytest.raises(config.ConfigError, match="allowedUnsafeSysctls: expected"):
        config.build(flags, path)
