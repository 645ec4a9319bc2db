"""The typed pod (pykubelet/api/podmodel.py): the API server's defaults applied once, the raw dicts kept
for what is sent back or hashed, and every error naming its field's path."""
from __future__ import annotations

import pytest

from pykubelet.api.fields import FieldError
from pykubelet.api.podmodel import (
    ClusterTrustBundleProjection,
    ConfigMapSource,
    Container,
    DownwardAPIFile,
    DownwardAPISource,
    EmptyDirSource,
    ExecAction,
    HTTPGetAction,
    ImageSource,
    KeyToPath,
    LabelSelector,
    Pod,
    PodCertificateProjection,
    Probe,
    ProjectedSource,
    Resources,
    ServiceAccountTokenProjection,
    SleepAction,
    UnsupportedProjection,
    UnsupportedSource,
    parse_pod,
    pull_policy,
)
from pykubelet.errors import InvalidArgumentError, kind_of


def pod(**spec) -> dict:
    return {"metadata": {"name": "web", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}], **spec}}


def test_the_api_servers_defaults_are_applied_once_here():
    p = parse_pod(pod())
    assert p.metadata.namespace == "default" and p.status.phase == "Pending"
    spec = p.spec
    assert (spec.restart_policy, spec.termination_grace_period_seconds, spec.dns_policy) == ("Always", 30,
                                                                                            "ClusterFirst")
    assert not spec.host_network and spec.host_users and spec.enable_service_links
    c = spec.containers[0]
    assert (c.image_pull_policy, c.termination_message_path, c.termination_message_policy) == (
        "IfNotPresent", "/dev/termination-log", "File")
    assert c.restart_policy is None and not c.is_sidecar


def test_ports_probes_and_resources_get_their_defaults():
    c = parse_pod(pod(containers=[{
        "name": "c", "image": "nginx", "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
        "livenessProbe": {"httpGet": {"path": "/", "port": 80}},
        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 0, "failureThreshold": 5},
        "resources": {"limits": {"cpu": "1", "memory": 64}, "requests": {"cpu": "500m"}}}])).spec.containers[0]
    assert [(p.container_port, p.protocol, p.host_port) for p in c.ports] == [(80, "TCP", 0), (53, "UDP", 0)]
    assert c.liveness_probe == Probe(HTTPGetAction(port=80, path="/"))
    assert c.readiness_probe == Probe(ExecAction(("true",)), failure_threshold=5)
    assert c.readiness_probe is not None and c.readiness_probe.period_seconds == 10
    assert c.readiness_probe.failure_threshold == 5 and c.readiness_probe.timeout_seconds == 1
    assert c.startup_probe is None
    # requests default to the limits; a manifest's bare number is a quantity as the API writes it
    assert c.resources.limits == {"cpu": "1", "memory": "64"}
    assert c.resources.requests == {"cpu": "500m", "memory": "64"}
    assert c.image_pull_policy == "Always"  # no tag


@pytest.mark.parametrize(("image", "policy"), [
    ("busybox", "Always"), ("busybox:latest", "Always"), ("busybox:1.36", "IfNotPresent"),
    ("registry:5000/busybox", "Always"), ("registry:5000/busybox:1", "IfNotPresent"),
    ("busybox@sha256:" + "a" * 64, "IfNotPresent")])
def test_pull_policy_by_tag(image: str, policy: str):
    assert pull_policy(image) == policy


@pytest.mark.parametrize(("raw", "message"), [
    ({"spec": {"containers": []}}, "metadata: required"),
    ({"metadata": {"name": "web", "uid": "u"}}, "spec: required"),
    (pod(containers=[{"name": "c"}]), "spec.containers[0].image: required"),
    (pod(containers=[{"name": "c", "image": "i", "ports": [{"containerPort": 80}, {"containerPort": "80"}]}]),
     'spec.containers[0].ports[1].containerPort: must be an integer, got "80"'),
    (pod(containers=[{"name": "c", "image": "i", "ports": [{"containerPort": 70000}]}]),
     "spec.containers[0].ports[0].containerPort: 70000 is out of range [1, 65535]"),
    (pod(restartPolicy="Sometimes"), 'spec.restartPolicy: unknown restart policy "Sometimes"'),
    (pod(terminationGracePeriodSeconds=True), "spec.terminationGracePeriodSeconds: must be an integer, got true"),
    (pod(initContainers=[{"name": "s", "image": "i", "livenessProbe": {"periodSeconds": 3}}]),
     "spec.initContainers[0].livenessProbe: must have exactly one of exec, httpGet, tcpSocket, grpc, got 0"),
    (pod(volumes=[{"name": "v", "emptyDir": {}, "hostPath": {"path": "/"}}]),
     "spec.volumes[0]: must have exactly one volume source, got emptyDir, hostPath"),
    (pod(volumes=[{"name": "v", "hostPath": "/"}]), 'spec.volumes[0].hostPath: must be an object, got "/"'),
    (pod(securityContext={"sysctls": [{"value": "1"}]}), "spec.securityContext.sysctls[0].name: required"),
    (pod(volumes=[{"name": "v", "configMap": {"name": "c", "items": [{"key": "k"}]}}]),
     "spec.volumes[0].configMap.items[0].path: required"),
    (pod(volumes=[{"name": "v", "secret": {"defaultMode": 0o1777}}]),
     "spec.volumes[0].secret.defaultMode: 1023 is out of range [0, 511]"),
    (pod(ephemeralContainers=[{"name": "debugger", "image": "busybox", "targetContainerName": 1}]),
     "spec.ephemeralContainers[0].targetContainerName: must be a string, got 1"),
    (pod(ephemeralContainers=[{"name": "debugger"}]), "spec.ephemeralContainers[0].image: required"),
    (pod(containers=[{"name": "c", "image": "i", "resizePolicy": [{"resourceName": "gpu",
                                                                  "restartPolicy": "NotRequired"}]}]),
     'spec.containers[0].resizePolicy[0].resourceName: unknown resize policy resource "gpu"'),
    (pod(containers=[{"name": "c", "image": "i", "resizePolicy": [{"resourceName": "cpu"}]}]),
     "spec.containers[0].resizePolicy[0].restartPolicy: required"),
    (pod(resources={"limits": {"cpu": []}}),
     'spec.resources.limits["cpu"]: must be a string or an integer or a number, got []'),
    (pod(containers=[{"name": "c", "image": "i", "restartPolicy": "Sometimes"}]),
     'spec.containers[0].restartPolicy: unknown container restart policy "Sometimes"'),
    (pod(containers=[{"name": "c", "image": "i", "restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}, {"action": "Restart"}]}]),
     "spec.containers[0].restartPolicyRules[1].exitCodes: required"),
    (pod(containers=[{"name": "c", "image": "i", "restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Ignore", "exitCodes": {"operator": "In", "values": [42]}}]}]),
     'spec.containers[0].restartPolicyRules[0].action: unknown container restart rule action "Ignore"'),
    (pod(containers=[{"name": "c", "image": "i", "restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": ["42"]}}]}]),
     'spec.containers[0].restartPolicyRules[0].exitCodes.values[0]: must be an integer, got "42"'),
])
def test_errors_name_the_field_path(raw: dict, message: str):
    with pytest.raises(FieldError) as err:
        parse_pod(raw)
    assert str(err.value) == message
    assert kind_of(err.value) is InvalidArgumentError and isinstance(err.value, ValueError)


def test_the_raw_dicts_are_kept_for_what_is_sent_back_and_hashed():
    raw = pod(containers=[{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}])
    p = parse_pod(raw)
    assert p.raw is raw and p.spec.containers[0].raw is raw["spec"]["containers"][0]
    assert "protocol" not in p.spec.containers[0].raw["ports"][0]  # the default is the record's, not the dict's


def test_a_volume_without_a_source_is_an_empty_dir():
    volume = parse_pod(pod(volumes=[{"name": "scratch"}])).spec.volumes[0]
    assert (volume.name, volume.kind, volume.source) == ("scratch", "emptyDir", EmptyDirSource())


def test_hooks_are_typed_and_may_sleep():
    c = parse_pod(pod(containers=[{"name": "c", "image": "i", "lifecycle": {
        "postStart": {"httpGet": {"port": "web", "httpHeaders": [{"name": "X", "value": "1"}]}},
        "preStop": {"sleep": {"seconds": 5}}}}])).spec.containers[0]
    assert c.post_start == HTTPGetAction(port="web", headers=(("X", "1"),)) and c.pre_stop == SleepAction(5)
    with pytest.raises(FieldError, match=r"spec.containers\[0\].livenessProbe: must have exactly one of exec, "):
        parse_pod(pod(containers=[{"name": "c", "image": "i", "livenessProbe": {"sleep": {"seconds": 1}}}]))


def test_volume_sources_are_typed_with_their_defaults():
    volumes = parse_pod(pod(volumes=[
        {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "k", "path": "p", "mode": 0o400}]}},
        {"name": "sec", "secret": {"secretName": "s", "defaultMode": 0o600, "optional": True}},
        {"name": "down", "downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "sa", "projected": {"defaultMode": 0o640, "sources": [
            {"serviceAccountToken": {"path": "token"}}, {"secret": {"name": "s2"}},
            {"clusterTrustBundle": {"name": "b", "path": "ca.pem"}},
            {"podCertificate": {"signerName": "x/y", "keyType": "ED25519", "keyPath": "k",
                                "userAnnotations": {"b": "2", "a": "1"}}},
            {"futureSource": {}}]}},
        {"name": "img", "image": {"reference": "registry.example/data:1"}},
        {"name": "latest", "image": {"reference": "registry.example/data", "pullPolicy": "Never"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "c"}}])).spec.volumes
    assert [v.source for v in volumes] == [
        EmptyDirSource("Memory", "64Mi"),
        ConfigMapSource("configmap", "c", (KeyToPath("k", "p", 0o400),)),
        ConfigMapSource("secret", "s", default_mode=0o600, optional=True),
        DownwardAPISource((DownwardAPIFile("l", field_path="metadata.labels"),)),
        ProjectedSource((ServiceAccountTokenProjection("token", expiration_seconds=3600),
                         ConfigMapSource("secret", "s2", default_mode=0o640),
                         ClusterTrustBundleProjection("ca.pem", name="b"),
                         PodCertificateProjection("x/y", "ED25519", key_path="k",
                                                  user_annotations=(("a", "1"), ("b", "2"))),
                         UnsupportedProjection(("futureSource",))), default_mode=0o640),
        ImageSource("registry.example/data:1", "IfNotPresent"), ImageSource("registry.example/data", "Never"),
        UnsupportedSource()]
    assert [v.kind for v in volumes][-1] == "persistentVolumeClaim"


def test_a_trust_bundle_projection_names_a_bundle_or_selects_a_signers():
    def projected(*bundles: dict) -> tuple:
        [volume] = parse_pod(pod(volumes=[{"name": "ca", "projected": {
            "sources": [{"clusterTrustBundle": b} for b in bundles]}}])).spec.volumes
        assert isinstance(volume.source, ProjectedSource)
        return volume.source.sources

    assert projected({"signerName": "example.com/s", "path": "a.pem", "optional": True},
                     {"signerName": "example.com/s", "path": "b.pem", "labelSelector": {}},
                     {"signerName": "example.com/s", "path": "c.pem", "labelSelector": {
                         "matchLabels": {"b": "2", "a": "1"},
                         "matchExpressions": [{"key": "c", "operator": "In", "values": ["x", "y"]},
                                              {"key": "d", "operator": "DoesNotExist"}]}}) == (
        ClusterTrustBundleProjection("a.pem", signer_name="example.com/s", optional=True),
        ClusterTrustBundleProjection("b.pem", signer_name="example.com/s", label_selector=LabelSelector()),
        ClusterTrustBundleProjection("c.pem", signer_name="example.com/s", label_selector=LabelSelector(
            (("a", "1"), ("b", "2")), (("c", "In", ("x", "y")), ("d", "DoesNotExist", ())))))
    for bundle, message in (
            ({"path": "p"}, r"sources\[0\].clusterTrustBundle: must set exactly one of name and signerName"),
            ({"path": "p", "name": "n", "signerName": "s"}, "exactly one of name and signerName"),
            ({"name": "n"}, r"clusterTrustBundle.path: (is )?required"),
            ({"path": "p", "signerName": "s", "labelSelector": {"matchExpressions": [
                {"key": "k", "operator": "Gt", "values": ["1"]}]}},
             r"labelSelector.matchExpressions\[0\].operator: unknown label selector operator \"Gt\""),
            ({"path": "p", "signerName": "s", "labelSelector": {"matchExpressions": [
                {"key": "k", "operator": "In"}]}}, r"matchExpressions\[0\].values: In needs some"),
            ({"path": "p", "signerName": "s", "labelSelector": {"matchLabels": {"k": 1}}},
             r"labelSelector.matchLabels.k: must be a string")):
        with pytest.raises(FieldError, match=message):
            projected(bundle)


def test_records_are_frozen_and_compare_by_their_fields():
    a, b = parse_pod(pod()), parse_pod(pod())
    assert a == b and a is not b
    with pytest.raises(AttributeError):
        a.spec.containers[0].name = "other"  # type: ignore[misc] # frozen: what the test checks


def test_lookups_of_containers_and_sidecars():
    p: Pod = parse_pod(pod(initContainers=[{"name": "side", "image": "i", "restartPolicy": "Always"},
                                           {"name": "setup", "image": "i"}]))
    assert [c.name for c in p.spec.all_containers] == ["side", "setup", "c"]
    side: Container = p.container("side")
    assert side.is_sidecar and p.is_init("side") and not p.is_init("c") and p.key == "default/web"
    with pytest.raises(StopIteration):
        p.container("missing")


def test_ephemeral_containers_are_parsed_apart_with_their_target():
    """What `kubectl debug -it web --image=busybox --target=c` adds through the ephemeralcontainers subresource."""
    raw = pod(ephemeralContainers=[{"name": "debugger-x", "image": "busybox", "targetContainerName": "c",
                                    "stdin": True, "tty": True, "terminationMessagePolicy": "File"}])
    p = parse_pod(raw)
    (debugger,) = p.spec.ephemeral_containers
    assert (debugger.target_container_name, debugger.stdin, debugger.tty, debugger.image_pull_policy) == (
        "c", True, True, "Always")
    assert debugger.raw is raw["spec"]["ephemeralContainers"][0]
    # not among the containers the pod's phase, probes and admission read; found by name all the same
    assert [c.name for c in p.spec.all_containers] == ["c"] and p.container("debugger-x") is debugger
    assert p.is_ephemeral("debugger-x") and not p.is_init("debugger-x") and not p.is_ephemeral("c")
    assert p.spec.containers[0].target_container_name == ""
    assert [p.field_path(n) for n in ("debugger-x", "c")] == ["spec.ephemeralContainers{debugger-x}",
                                                               "spec.containers{c}"]


def test_resize_policies_pod_level_resources_and_the_generation():
    p = parse_pod({**pod(containers=[{"name": "c", "image": "i", "resizePolicy": [
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}]}],
        resources={"limits": {"cpu": "2"}, "requests": {"memory": "1Gi"}}),
        "metadata": {"name": "web", "uid": "u-1", "generation": 3}})
    assert p.spec.containers[0].resize_policy == {"memory": "RestartContainer"}
    assert p.spec.resources == Resources(requests={"cpu": "2", "memory": "1Gi"}, limits={"cpu": "2"})
    assert p.metadata.generation == 3
    assert parse_pod(pod()).spec.resources is None


def test_a_containers_own_restart_policy_and_rules():
    """ContainerRestartRules (on in 1.37): a regular container's restartPolicy and restartPolicyRules."""
    p = parse_pod(pod(containers=[{"name": "c", "image": "i", "restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 1]}}]}]))
    (c,) = p.spec.containers
    (rule,) = c.restart_policy_rules
    assert c.restart_policy == "Never" and not c.is_sidecar and rule.action == "Restart"
    assert rule.matches(42) and not rule.matches(1)
