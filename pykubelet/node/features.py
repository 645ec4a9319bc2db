"""The node's declared features (status.declaredFeatures, NodeDeclaredFeatures: GA and locked on in 1.37).

The scheduler places a pod that needs a feature (a container restart rule RestartAllContainers, a pod with
hostNetwork and its own user namespace, ...) only on a node that declares it, and the API server admits an
update of a pod (a resize of its pod-level resources, of an init container) only if its node declares
what the update needs. So a declaration is a promise: a node that declares a feature it lacks gets pods,
and resizes, it then runs wrongly. The stock kubelet declares each feature of component-helpers'
nodedeclaredfeatures registry whose gate is on (and, for two, that the runtime supports); this kubelet
declares, of those, the ones it implements. With 1.37's default gates the stock kubelet declares
ExtendWebSocketsToKubelet, InPlacePodLevelResourcesVerticalScaling, InPlacePodVerticalScalingInitContainers
and RestartAllContainersOnContainerExits; this one declares all but ExtendWebSocketsToKubelet (pods/actions.py
resizes a running init container and resets a pod): its server proxies a websocket to the runtime as it comes
(the stock kubelet translates v5 websockets to the runtime's SPDY). A pod that needs it stays Pending ("didn't
match Pod's required features"), as it would on a node that lacks it, and one bound here directly is refused
(`missing`). The gate off, RestartAllContainersOnContainerExits is not declared, and so no pod that needs
it is admitted here.
"""
from __future__ import annotations

from collections.abc import Mapping

from pykubelet.api.podmodel import Pod

# the registry's features this kubelet implements -> its gate's default in 1.37 (a feature's gate is its name)
RESTART_ALL = "RestartAllContainersOnContainerExits"
IMPLEMENTED = {"InPlacePodLevelResourcesVerticalScaling": True, "InPlacePodVerticalScalingInitContainers": True,
               RESTART_ALL: True}
USERNS_HOST_NETWORK = "UserNamespacesHostNetworkSupport"
BIND_MOUNT_OPTIONS = "VolumeBindMountOptions"
FEATURE_UNSUPPORTED = "PodFeatureUnsupported"  # the kubelet's admission reason


def declared_features(gates: Mapping[str, bool]) -> tuple[str, ...]:
    """status.declaredFeatures: the features implemented here whose gate (`gates`, the kubelet's
    featureGates, else the default) is on, sorted by name as the registry is."""
    return tuple(sorted(name for name, default in IMPLEMENTED.items() if gates.get(name, default)))


def required_features(pod: Pod) -> list[str]:
    """The features the scheduler infers a pod needs (the registry's InferForScheduling), sorted."""
    spec = pod.spec
    out = set()
    if any(rule.action == "RestartAllContainers" for c in spec.containers + spec.init_containers
           for rule in c.restart_policy_rules):
        out.add(RESTART_ALL)
    if spec.host_network and not spec.host_users:
        out.add(USERNS_HOST_NETWORK)
    # a field the typed pod does not read: the container's dict, as the API sent it
    if any(m.get("bindMountOptions") for c in spec.all_containers for m in c.raw.get("volumeMounts") or ()
           if isinstance(m, dict)):
        out.add(BIND_MOUNT_OPTIONS)
    return sorted(out)


def missing(pod: Pod, declared: tuple[str, ...]) -> str | None:
    """The kubelet's declared-features admission: why the node cannot run `pod` (the message of a
    PodFeatureUnsupported rejection), or None."""
    lacking = [name for name in required_features(pod) if name not in declared]
    if not lacking:
        return None
    return f"Pod requires node features that are not available: {', '.join(lacking)}"
