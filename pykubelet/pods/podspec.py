"""What the kubelet derives from a pod's spec (QoS class, merged security context, expanded $(VAR)
references); the spec itself, with the API's defaults, is pykubelet/api/podmodel.py's Pod.

Pure functions of the pod: the sync's decisions (pods/actions.py), the CRI configs (pods/criconfig.py),
admission, eviction and env resolution all read the spec through here, so they agree on it. Nothing here
imports the node's settings: eviction's policy reads the QoS class, and the settings read eviction's
policy.
"""
from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pykubelet.api.podmodel import DEFAULT_GRACE, Container, Pod, SecurityContext
from pykubelet.api.quantity import parse

# who a pod is: the kubelet's types.IsCriticalPod and IsNodeCriticalPod read these
CONFIG_SOURCE, CONFIG_MIRROR = "kubernetes.io/config.source", "kubernetes.io/config.mirror"
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
SYSTEM_NODE_CRITICAL = "system-node-critical"

TERMINAL_PHASES = ("Succeeded", "Failed")


def parse_quantity(value: Any) -> Decimal:
    """A pod's resource quantity ("100m", "1.5", "64Mi") as its amount (cores or bytes), read as the API decodes
    one from JSON: a string without its surrounding spaces, or a number. ValueError names the value (a static
    pod's file or a config's threshold, which no API server checked)."""
    try:
        return parse(str(value).strip())
    except ValueError:
        raise ValueError(f"not a quantity: {value!r}") from None


def qos_class(pod: Pod) -> str:
    """The API's ComputePodQOS: of the pod-level resources when they name cpu or memory, else of its containers'
    (a Burstable one, or a mix, makes the pod Burstable). A resize never changes it (the API server refuses one
    that would)."""
    pod_level = pod.spec.resources
    if pod_level is not None and any(r in ("cpu", "memory") for r in (*pod_level.requests, *pod_level.limits)):
        return _requirements_qos(pod_level.requests, pod_level.limits)
    classes = {_requirements_qos(c.resources.requests, c.resources.limits) for c in pod.spec.all_containers}
    return classes.pop() if len(classes) == 1 else "Burstable"


def _requirements_qos(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> str:
    """requirementsQOS: Guaranteed when cpu and memory each have a request equal to a limit that is not zero,
    BestEffort when neither has either; a request left out is its limit, as the API server defaults it."""
    if not requests and not limits:
        return "BestEffort"
    classes = set()
    for r in ("cpu", "memory"):
        limit = parse_quantity(limits.get(r, 0))
        if parse_quantity(requests.get(r, limit)) != limit:
            return "Burstable"
        classes.add("BestEffort" if limit == 0 else "Guaranteed")
    return classes.pop() if len(classes) == 1 else "Burstable"


def is_static(pod: Pod) -> bool:
    """The kubelet's IsStaticPod: a pod of a source other than the API server (a manifest)."""
    return pod.metadata.annotations.get(CONFIG_SOURCE, "api") != "api"


def is_critical(pod: Pod) -> bool:
    """The kubelet's IsCriticalPod: a static pod, a mirror pod, or one of system-critical priority."""
    return is_static(pod) or CONFIG_MIRROR in pod.metadata.annotations \
        or pod.spec.priority >= SYSTEM_CRITICAL_PRIORITY


def is_node_critical(pod: Pod) -> bool:
    """IsNodeCriticalPod: critical, and of the system-node-critical class (kubeadm's control plane)."""
    return is_critical(pod) and pod.spec.priority_class_name == SYSTEM_NODE_CRITICAL


DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def deadline_left(pod: Pod, start_time: str | None, now: datetime.datetime) -> float | None:
    """Seconds until the pod's activeDeadlineSeconds runs out from its status's startTime (<= 0: it has),
    as the kubelet's activeDeadlineHandler; None without a deadline or a start time. The spec's value as it
    is now: a client may shorten it on a running pod."""
    seconds = pod.spec.active_deadline_seconds
    if seconds is None or not start_time:
        return None
    start = datetime.datetime.fromisoformat(start_time.replace("Z", "+00:00"))
    return seconds - (now - start).total_seconds()


def termination_grace(pod: Pod) -> int:
    """The spec's terminationGracePeriodSeconds (0: the default), what the kubelet's own stops of a running
    pod's containers get: a failed probe, a finished pod's sidecars, a failed postStart."""
    return pod.spec.termination_grace_period_seconds or DEFAULT_GRACE


def should_restart(container: Container, pod: Pod, exit_code: int) -> bool:
    """The kubelet's ContainerShouldRestart (ContainerRestartRules, on in 1.37): whether a container that
    exited with `exit_code` starts again. A container with a restartPolicy of its own is restarted by its
    first restartPolicyRules entry that matches the exit code (action Restart, or RestartAllContainers,
    which starts it again with all the others: restarts_all), else by its own policy; one without, by the
    pod's."""
    policy = pod.spec.restart_policy
    if container.restart_policy is not None:
        rule = next((r for r in container.restart_policy_rules if r.matches(exit_code)), None)
        if rule is not None:
            return True
        policy = container.restart_policy
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


RESTART_ALL = "RestartAllContainers"


def restarts_all(container: Container, exit_code: int) -> bool:
    """Whether the container's exit with `exit_code` restarts the whole pod in place: its first
    restartPolicyRules entry that matches is RestartAllContainers (RestartAllContainersOnContainerExits,
    beta and on in 1.37), as the kubelet's FindMatchingContainerRestartRule."""
    rule = next((r for r in container.restart_policy_rules if r.matches(exit_code)), None)
    return rule is not None and rule.action == RESTART_ALL


def could_restart_all(pod: Pod) -> bool:
    """Whether any init or regular container has a RestartAllContainers rule (AllContainersCouldRestart):
    only such a pod has the AllContainersRestarting condition."""
    return any(r.action == RESTART_ALL for c in pod.spec.init_containers + pod.spec.containers
               for r in c.restart_policy_rules)


def is_finished(pod: Pod) -> bool:
    """Whether the pod's phase is terminal: nothing of it starts again."""
    return pod.status.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class EffectiveSecurity:
    """A container's securityContext over its pod's, for the fields both have."""
    run_as_user: int | None
    run_as_group: int | None
    run_as_non_root: bool | None
    seccomp_profile: dict[str, Any] | None


def security_context(pod: Pod, container: Container | None) -> EffectiveSecurity:
    """The container's securityContext over the pod's (the fields both have)."""
    p = pod.spec.security_context
    c = container.security_context if container is not None else SecurityContext()
    return EffectiveSecurity(
        run_as_user=p.run_as_user if c.run_as_user is None else c.run_as_user,
        run_as_group=p.run_as_group if c.run_as_group is None else c.run_as_group,
        run_as_non_root=p.run_as_non_root if c.run_as_non_root is None else c.run_as_non_root,
        seccomp_profile=p.seccomp_profile if c.seccomp_profile is None else c.seccomp_profile)


def supplemental_groups(pod: Pod) -> list[int]:
    """The groups the pod's processes get besides their own: fsGroup first (what gives them its volumes),
    then supplementalGroups, as the kubelet's security context."""
    sc = pod.spec.security_context
    fs_group = [sc.fs_group] if sc.fs_group is not None else []
    return fs_group + [g for g in sc.supplemental_groups if g not in fs_group]


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The API's $(VAR) references: to the value of VAR when defined, kept as written when not; $$ is $."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def plain_env(container: Container) -> dict[str, str]:
    """The container's env with plain values, each expanded against those before it (valueFrom is resolved
    by pykubelet/pods/env.py)."""
    env: dict[str, str] = {}
    for e in container.env:
        if e.value_from is None:
            env[e.name] = expand(e.value, env)
    return env
