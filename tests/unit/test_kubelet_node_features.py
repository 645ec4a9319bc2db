"""The node's declared features (pykubelet/node/features.py): what status.declaredFeatures says with the
1.37 default gates and with a gate turned off, what a pod needs, and the kubelet's admission of a pod whose
needs the node does not declare (PodFeatureUnsupported, the kubelet's message): with the gate off, one that
has a RestartAllContainers rule."""
from __future__ import annotations

from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.node import features
from pykubelet.pods.admission import check

RESTART_ALL = {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}


def pod(container: dict | None = None, **spec) -> Pod:
    return parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                      "spec": {"containers": [{"name": "c", "image": "i", **(container or {})}], **spec}})


def test_declared_features_are_those_implemented_whose_gate_is_on():
    assert features.declared_features({}) == ("InPlacePodLevelResourcesVerticalScaling",
                                              "InPlacePodVerticalScalingInitContainers",
                                              "RestartAllContainersOnContainerExits")
    assert features.declared_features({"InPlacePodLevelResourcesVerticalScaling": False,
                                       "RestartAllContainersOnContainerExits": False}) == (
        "InPlacePodVerticalScalingInitContainers",)  # GA, locked on
    # a gate on for a feature this kubelet lacks declares nothing: the declaration is a promise
    gates = {"ExtendWebSocketsToKubelet": True, "RestartAllContainersOnContainerExits": False}
    assert features.declared_features(gates) == ("InPlacePodLevelResourcesVerticalScaling",
                                                 "InPlacePodVerticalScalingInitContainers")


def test_what_a_pod_needs_as_the_schedulers_inference():
    assert features.required_features(pod()) == []
    assert features.required_features(pod({"restartPolicy": "Never", "restartPolicyRules": [RESTART_ALL]})) == [
        "RestartAllContainersOnContainerExits"]
    assert features.required_features(pod(hostNetwork=True, hostUsers=False)) == ["UserNamespacesHostNetworkSupport"]
    mounts = {"volumeMounts": [{"name": "v", "mountPath": "/v", "bindMountOptions": ["noexec"]}]}
    assert features.required_features(pod(mounts, volumes=[{"name": "v", "emptyDir": {}}])) == [
        "VolumeBindMountOptions"]


def test_a_pod_needing_an_undeclared_feature_is_refused_at_admission():
    needy = pod({"restartPolicy": "Never", "restartPolicyRules": [RESTART_ALL]})
    declared = features.declared_features({"RestartAllContainersOnContainerExits": False})
    verdict = check(needy, [], allocatable={"cpu": "2", "memory": "1Gi", "pods": "10"}, labels={}, node_name="n",
                    declared=declared)
    assert (verdict.admit, verdict.reason, verdict.message) == (
        False, "PodFeatureUnsupported",
        "Pod requires node features that are not available: RestartAllContainersOnContainerExits")
    assert check(pod(), [], allocatable={"cpu": "2", "memory": "1Gi", "pods": "10"}, labels={}, node_name="n",
                 declared=declared).admit
    assert check(needy, [], allocatable={"cpu": "2", "memory": "1Gi", "pods": "10"}, labels={}, node_name="n",
                 declared=features.declared_features({})).admit
