"""A pod's spec read as the kubelet reads it: the API's defaults where a field is left out, and the values
derived from it (QoS class, merged security context, expanded $(VAR) references).

Pure functions of the pod: the sync's decisions (pods/actions.py), the CRI configs (pods/criconfig.py),
admission, eviction and env resolution all read the spec through here, so they agree on it. Nothing here
imports the node's settings: eviction's policy reads the QoS class, and the settings read eviction's
policy.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

DEFAULT_GRACE = 30
TERMINAL_PHASES = ("Succeeded", "Failed")


def parse_quantity(value: Any) -> Decimal:
    """A resource quantity ("100m", "1.5", "64Mi", "1G", "1e3") as a number (cores or bytes)."""
    s = str(value)
    for suffix, mult in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("Pi", 2**50), ("Ei", 2**60),
                         ("n", Decimal("1e-9")), ("u", Decimal("1e-6")), ("m", Decimal("1e-3")), ("k", 10**3),
                         ("M", 10**6), ("G", 10**9), ("T", 10**12), ("P", 10**15), ("E", 10**18)):
        if s.endswith(suffix):
            return Decimal(s[: -len(suffix)]) * mult
    return Decimal(s)


def qos_class(pod: dict) -> str:
    containers = pod["spec"].get("containers", []) + pod["spec"].get("initContainers", [])
    requests = [c.get("resources", {}).get("requests", {}) for c in containers]
    limits = [c.get("resources", {}).get("limits", {}) for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    if all(lim.get("cpu") and lim.get("memory") and req.get("cpu", lim["cpu"]) == lim["cpu"]
           and req.get("memory", lim["memory"]) == lim["memory"] for req, lim in zip(requests, limits, strict=True)):
        return "Guaranteed"
    return "Burstable"


def find_container(pod: dict, name: str) -> dict:
    """The spec of container `name`, regular or init (the API keeps their names apart)."""
    spec = pod["spec"]
    return next(c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name)


def is_init(pod: dict, name: str) -> bool:
    return any(c.get("name") == name for c in pod["spec"].get("initContainers", []))


def is_sidecar(container: dict) -> bool:
    """An init container that keeps running beside the regular ones (restartPolicy: Always)."""
    return container.get("restartPolicy") == "Always"


def restart_policy(pod: dict) -> str:
    return pod["spec"].get("restartPolicy", "Always")


def termination_grace(pod: dict) -> int:
    """The spec's terminationGracePeriodSeconds (0 or none: the default), what the kubelet's own stops of a
    running pod's containers get: a failed probe, a finished pod's sidecars, a failed postStart."""
    return int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE) or DEFAULT_GRACE)


def is_finished(pod: dict) -> bool:
    """Whether the pod's phase is terminal: nothing of it starts again."""
    return pod.get("status", {}).get("phase") in TERMINAL_PHASES


def security_context(pod: dict, container: dict | None) -> dict:
    """The container's securityContext over the pod's (the fields both have)."""
    merged = {k: v for k, v in pod["spec"].get("securityContext", {}).items()
              if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}
    merged.update((container or {}).get("securityContext", {}))
    return merged


def supplemental_groups(pod: dict) -> list[int]:
    """The groups the pod's processes get besides their own: fsGroup first (what gives them its volumes),
    then supplementalGroups, as the kubelet's security context."""
    sc = pod["spec"].get("securityContext") or {}
    fs_group = [sc["fsGroup"]] if sc.get("fsGroup") is not None else []
    return fs_group + [g for g in sc.get("supplementalGroups") or [] if g not in fs_group]


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The API's $(VAR) references: to the value of VAR when defined, kept as written when not; $$ is $."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def plain_env(container: dict) -> dict[str, str]:
    """The container's env with plain values, each expanded against those before it (valueFrom is resolved
    by pykubelet/pods/env.py)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" not in e:
            env[e["name"]] = expand(e.get("value", ""), env)
    return env
