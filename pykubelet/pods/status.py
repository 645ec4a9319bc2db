"""The status manager: what the API server, and so `kubectl get pods`, the scheduler and the endpoints
controller, learn of a pod on this node.

The status is computed from the runtime (what runs, exit codes, the sandbox's IP) and the last pass's
waiting reasons, never from memory, so it is right after a kubelet restart. It goes to pods/status as a
merge patch only when it differs from what was last sent, so a resync of an unchanged pod costs the API
server nothing; condition transition times change only when a condition's status flips.

What the runtime no longer has comes from the status last written (`last`), as the kubelet's does from
its old status: a RestartAllContainers rule (RestartAllContainersOnContainerExits, on in 1.37) removes
every container of the pod before running it again, and its containers keep their restart counts (one
more each: the reset is a restart) and their last termination, and the pod its Initialized condition.
"""
from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import replace
from decimal import Decimal
from typing import Any

from proto import api_pb2
from pykubelet.api import quantity
from pykubelet.api.podmodel import Container, ObjectMeta, Pod, Resources
from pykubelet.pods.cgroupconfig import MIN_SHARES, pod_config
from pykubelet.pods.labels import restart_count
from pykubelet.pods.podresources import pod_limits, pod_requests
from pykubelet.pods.podspec import (
    CONFIG_SOURCE,
    TERMINAL_PHASES,
    could_restart_all,
    parse_quantity,
    restarts_all,
    should_restart,
)
from pykubelet.pods.runtimepod import RuntimePod
from pykubelet.pods.static import SOURCE_FILE
from pykubelet.pods.sync import SyncResult

log = logging.getLogger(__name__)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(ns: int) -> str | None:
    if not ns:
        return None
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminated(s: api_pb2.ContainerStatus, runtime_name: str) -> dict:
    out = {"exitCode": s.exit_code, "reason": s.reason or ("Completed" if s.exit_code == 0 else "Error"),
           "startedAt": _time(s.started_at), "finishedAt": _time(s.finished_at),
           "containerID": f"{runtime_name}://{s.id}"}
    if s.message:
        out["message"] = s.message
    return {k: v for k, v in out.items() if v is not None}


MIN_MILLI_CPU_LIMIT = 10  # the kubelet's MinMilliCPULimit: below it a quota is not what was asked


def _millis(text: str | None) -> int:
    return 0 if text is None else quantity.milli_value(parse_quantity(text))


def status_resources(allocated: Resources, running: api_pb2.ContainerStatus | None,
                     actuated: Resources | None) -> dict[str, dict[str, str]]:
    """status.containerStatuses[].resources, as the kubelet's convertContainerStatusResources: the allocation,
    and for a running container the cpu and memory limits and the cpu request it has in the runtime (its
    ContainerStatus's resources, else what the kubelet last gave it), each where the allocation has a
    limit (a request) at all. The memory request is the allocation's: no cgroup holds it."""
    requests, limits = dict(allocated.requests), dict(allocated.limits)
    if running is not None:
        given = actuated or allocated
        linux = running.resources.linux if running.HasField("resources") else None
        cpu_limit = (linux.cpu_quota * 1000 // linux.cpu_period if linux is not None and linux.cpu_period > 0
                     and linux.cpu_quota > 0 else _millis(given.limits.get("cpu")))
        cpu_request = (-(-linux.cpu_shares * 1000 // 1024) if linux is not None and linux.cpu_shares >= MIN_SHARES
                       else _millis(given.requests.get("cpu")))
        memory_limit = linux.memory_limit_in_bytes if linux is not None else 0
        if limits:
            if cpu_limit and (cpu_limit > MIN_MILLI_CPU_LIMIT or _millis(limits.get("cpu")) > MIN_MILLI_CPU_LIMIT):
                limits["cpu"] = quantity.milli_decimal_si(cpu_limit)
            if memory_limit > 0:
                limits["memory"] = quantity.binary_si(memory_limit)
            elif "memory" in given.limits:
                limits["memory"] = given.limits["memory"]
        if requests and cpu_request and (cpu_request > MIN_SHARES or _millis(requests.get("cpu")) > MIN_SHARES):
            requests["cpu"] = quantity.milli_decimal_si(cpu_request)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _amount(name: str, value: Decimal) -> str:
    """An amount as the API writes it: cpu in cores or millicores, byte-sized ones with the largest exact binary
    suffix (a fraction of a byte, which the API admits, kept: "10m"), a count with the largest decimal one."""
    if name == "cpu":
        return quantity.milli_decimal_si(quantity.milli_value(value))
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        return quantity.binary_si(value)
    return quantity.decimal_si(value)


def _amounts(values: dict[str, Decimal]) -> dict[str, str]:
    return {name: _amount(name, v) for name, v in sorted(values.items())}


def pod_level_status(pod: Pod, actuated: Resources | None = None) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """status.resources and status.allocatedResources of the allocated `pod`, as the kubelet's
    generateAPIPodStatus writes them (InPlacePodLevelResourcesVerticalScaling, on in 1.37): allocatedResources
    is what the pod is granted (PodRequests: its containers' requests, the pod-level ones over them, the
    overhead). resources, of a pod not yet running, is that with PodLimits; of a running one, the pod-level
    resources with the pod's cgroup's cpu limit and memory limit, and the memory request of its containers when
    it has no pod-level one: the kubelet reads the cgroup back, here it is the pod_config the cgroup was written
    with, which reads back the same, and the cpu request the kubelet keeps as allocated when the cgroup's shares
    round-trip to it (always, as the shares are made from it). `actuated`: the pod-level resources its cgroup
    was last given (pods/allocation.py), which a resize not done yet (a memory limit below the usage) is not."""
    requests = pod_requests(pod)
    if pod.status.phase != "Running":
        resources = {"requests": _amounts(requests), "limits": _amounts(pod_limits(pod))}
    else:
        if actuated is not None and pod.spec.resources is not None:  # what the cgroup has: the status reads it
            pod = replace(pod, spec=replace(pod.spec, resources=actuated))
        own = pod.spec.resources or Resources()
        resources = {"requests": dict(own.requests), "limits": dict(own.limits)}
        if "memory" not in own.requests and "memory" in requests:
            resources["requests"]["memory"] = _amount("memory", requests["memory"])
        config = pod_config(pod)
        if config.cpu_quota is not None and config.cpu_quota > 0 and config.cpu_period:
            cpu_limit = config.cpu_quota * 1000 // config.cpu_period
            if cpu_limit > MIN_MILLI_CPU_LIMIT or _millis(own.limits.get("cpu")) > MIN_MILLI_CPU_LIMIT:
                resources["limits"]["cpu"] = quantity.milli_decimal_si(cpu_limit)
        if config.memory:
            resources["limits"]["memory"] = quantity.binary_si(config.memory)
    return {k: v for k, v in resources.items() if v}, _amounts(requests)


RESTARTING_ALL = "RestartingAllContainers"  # a container removed by a RestartAllContainers reset
RESTARTING_ALL_MESSAGE = "The container is removed because RestartAllContainers in place"


def container_status(container: Container, history: list[api_pb2.ContainerStatus], waiting: tuple[str, str] | None,
                     runtime_name: str, default_waiting: str, actuated: Resources | None = None,
                     last: dict | None = None, reset: bool = False) -> dict:
    """`actuated`: what the kubelet last gave the container (pods/allocation.py), for its status resources;
    `last`: its status as last written; `reset`: the pod is being reset (resetting)."""
    out: dict[str, Any] = {"name": container.name, "image": container.image, "imageID": "",
                           "restartCount": 0, "ready": False, "started": False}
    latest = history[0] if history else None
    previous = next((s for s in history[1:] if s.state == api_pb2.CONTAINER_EXITED), None)
    if latest is not None:
        out["restartCount"] = restart_count(latest)
        out["imageID"] = latest.image_ref
        out["containerID"] = f"{runtime_name}://{latest.id}"
        if latest.state == api_pb2.CONTAINER_RUNNING and waiting is None:
            out["state"] = {"running": {"startedAt": _time(latest.started_at)}}
            out["ready"] = out["started"] = True
        elif latest.state == api_pb2.CONTAINER_EXITED and waiting is None:
            out["state"] = {"terminated": _terminated(latest, runtime_name)}
        else:
            if latest.state == api_pb2.CONTAINER_EXITED:
                previous = latest
            out["state"] = {"waiting": {"reason": waiting[0] if waiting else default_waiting}}
            if waiting and waiting[1]:
                out["state"]["waiting"]["message"] = waiting[1]
    else:
        reason, message = waiting or (default_waiting, "")
        out["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    out["lastState"] = {"terminated": _terminated(previous, runtime_name)} if previous is not None else {}
    if last is not None:
        _carry(out, last, latest is not None, reset)
    if latest is not None:  # as the kubelet's: the resources of a container the runtime has
        running = latest if latest.state == api_pb2.CONTAINER_RUNNING else None
        out["resources"] = status_resources(container.resources, running, actuated)
        if container.resources.requests:
            out["allocatedResources"] = dict(container.resources.requests)
    return out


def _carry(out: dict, last: dict, in_runtime: bool, reset: bool) -> None:
    """What the status last written (`last`) keeps of a container, as the kubelet's
    convertToAPIContainerStatuses with RestartAllContainersOnContainerExits: its restart count never goes
    down; one the runtime has no longer was removed by the pod's reset if the pod is being `reset`, and
    waits with a last termination saying so (and one restart more), else it keeps its last termination;
    one the runtime has, with no earlier run there, keeps the termination of the container it replaced."""
    count = last.get("restartCount") or 0
    state, last_state = last.get("state") or {}, last.get("lastState") or {}
    if not in_runtime:
        if reset and "waiting" not in state:
            out["state"] = {"waiting": {"reason": RESTARTING_ALL, "message": RESTARTING_ALL_MESSAGE}}
            out["lastState"] = {"terminated": {"exitCode": 137, "reason": RESTARTING_ALL,
                                               "message": RESTARTING_ALL_MESSAGE}}
            out["restartCount"] = count + 1
            return
        if "terminated" in last_state:
            out["lastState"] = last_state
    out["restartCount"] = max(out["restartCount"], count)
    if in_runtime and not out["lastState"]:
        if last.get("containerID") != out.get("containerID") and "terminated" in state:
            out["lastState"] = {"terminated": state["terminated"]}
        elif "terminated" in last_state:
            out["lastState"] = last_state


def _has(status: dict | None, condition: str) -> bool:
    """Whether `status` has `condition` True."""
    return any(c.get("type") == condition and c.get("status") == "True" for c in (status or {}).get("conditions") or ())


def last_statuses(last: dict) -> dict[str, dict]:
    """The init and regular containers' statuses in the status `last` written, by name."""
    return {s["name"]: s for key in ("initContainerStatuses", "containerStatuses")
            for s in last.get(key) or () if isinstance(s, dict) and "name" in s}


def resetting(pod: Pod, state: RuntimePod, last: dict) -> bool:
    """The kubelet's ShouldAllContainersRestart: a container, as the runtime has it or as the status last
    written shows it, ended with a code its RestartAllContainers rule matches. (Not the kubelet's
    AllContainersRestarting True alone: the reset is decided on the runtime's state, pods/actions.py, and a
    condition that said so by itself would outlive a pod run anew in a new sandbox, which resets nothing.
    The status written before the reset shows that container's end: it says the pod is being reset until
    the status after it, or after a kubelet restart, the API server's copy of it.)"""
    shown = last_statuses(last)
    for c in pod.spec.init_containers + pod.spec.containers:
        history = state.history(c.name)
        if history and history[0].state == api_pb2.CONTAINER_EXITED and restarts_all(c, history[0].exit_code):
            return True
        ended = ((shown.get(c.name) or {}).get("state") or {}).get("terminated")
        if ended is not None and restarts_all(c, ended.get("exitCode", 0)):
            return True
    return False


def carried_restarts(pod: Pod, state: RuntimePod, last: dict) -> dict[str, int]:
    """The restart count the status gives each container the runtime has none of (pods/actions.py starts
    its next one at it, so that its count goes on from there)."""
    again = resetting(pod, state, last)
    out = {}
    for name, s in last_statuses(last).items():
        if state.history(name):
            continue
        count = s.get("restartCount") or 0
        out[name] = count + 1 if again and "waiting" not in (s.get("state") or {}) else count
    return out


def phase(pod: Pod, init_done: bool, init_failed: bool, statuses: list[dict], terminal: bool = False) -> str:
    """The kubelet's getPhase (with ContainerRestartRules: a container restarts by its own policy and rules,
    pods/podspec.should_restart). `terminal`: the pod is being torn down (deleted, its containers all
    stopped), so none of them restarts whatever the policy: Succeeded if each exited 0, else Failed; a
    static pod keeps the policy's phase, as the kubelet's."""
    if init_failed:
        return "Failed"
    if not init_done:
        return "Pending"
    running = sum("running" in s["state"] for s in statuses)
    # each stopped container's termination (the one it ended with, or before the restart it waits for)
    stopped = {s["name"]: s["state"].get("terminated") or s["lastState"]["terminated"]
               for s in statuses if "terminated" in s["state"]
               or ("waiting" in s["state"] and "terminated" in s["lastState"])}
    waiting = len(statuses) - running - len(stopped)
    failed = any(t.get("exitCode", 0) != 0 for t in stopped.values())
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if terminal and stopped and pod.metadata.annotations.get(CONFIG_SOURCE) != SOURCE_FILE:
        return "Failed" if failed else "Succeeded"
    # one of them is restarting: by its policy, or removed by a RestartAllContainers reset
    if any(should_restart(c, pod, stopped[c.name].get("exitCode", 0)) or stopped[c.name].get("reason") == RESTARTING_ALL
           for c in pod.spec.containers if c.name in stopped):
        return "Running"
    return "Failed" if failed else "Succeeded"


# the conditions the kubelet writes; any other (a readiness gate's, set by a controller through pods/status, or
# DisruptionTarget) it keeps as the API server has it, as the kubelet's PodConditionByKubelet
ALL_RESTARTING = "AllContainersRestarting"
KUBELET_CONDITIONS = ("PodScheduled", "Ready", "Initialized", "ContainersReady", "PodReadyToStartContainers",
                      "PodResizeInProgress", "PodResizePending", ALL_RESTARTING)


def _condition(type_: str, ok: bool, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": str(ok), **({"reason": reason} if reason else {}),
            **({"message": message} if message else {})}


def _names(names: list[str]) -> str:
    """A list of names as the kubelet's messages print a Go []string: "[a b]"."""
    return f"[{' '.join(names)}]"


def initialized_condition(pod: Pod, init_statuses: list[dict], init_done: bool, ph: str,
                          was_initialized: bool = False) -> dict[str, str]:
    """The kubelet's GeneratePodInitializedCondition: which init containers have not completed (a sidecar:
    not started) say why a pod is not initialized, e.g. one whose init container failed. A pod initialized
    once (`was_initialized`: its last status says so) stays so while its init containers run again (a
    RestartAllContainers reset), as the kubelet's."""
    if ph == "Succeeded":
        return _condition("Initialized", True, "PodCompleted")
    if init_done or was_initialized:
        return _condition("Initialized", True)
    incomplete = [c.name for c, s in zip(pod.spec.init_containers, init_statuses, strict=True)
                  if not (s["started"] if c.is_sidecar else s["ready"])]
    return _condition("Initialized", False, "ContainersNotInitialized",
                      f"containers with incomplete status: {_names(incomplete)}")


def containers_ready_condition(statuses: list[dict], ph: str) -> dict[str, str]:
    """The kubelet's GenerateContainersReadyCondition over the sidecars' and regular containers' `statuses`;
    a finished pod's containers are not ready, whatever they were when last seen."""
    if ph in ("Succeeded", "Failed"):
        return _condition("ContainersReady", False, "PodCompleted" if ph == "Succeeded" else "PodFailed")
    unready = [s["name"] for s in statuses if not s["ready"]]
    if unready:
        return _condition("ContainersReady", False, "ContainersNotReady",
                          f"containers with unready status: {_names(unready)}")
    return _condition("ContainersReady", True)


def ready_condition(pod: Pod, containers_ready: dict[str, str], conditions: list[dict]) -> dict[str, str]:
    """The kubelet's GeneratePodReadyCondition: ContainersReady's verdict, and once that is True, every
    readiness gate's condition among `conditions` (the ones others set) must be True too."""
    if containers_ready["status"] != "True":
        return {**containers_ready, "type": "Ready"}
    found = {c.get("type"): c.get("status") for c in conditions}
    unready = []
    for gate in pod.spec.readiness_gates:
        if gate not in found:
            unready.append(f'corresponding condition of pod readiness gate "{gate}" does not exist.')
        elif found[gate] != "True":
            unready.append(f'the status of pod readiness gate "{gate}" is not "True", but {found[gate]}')
    if unready:
        return _condition("Ready", False, "ReadinessGatesNotReady", ", ".join(unready))
    return _condition("Ready", True)


def all_restarting_condition(pod: Pod, state: RuntimePod, last: dict, ph: str) -> dict[str, str]:
    """The kubelet's GenerateAllContainersRestartingCondition: True from a container's exit by its
    RestartAllContainers rule until the runtime has none of the pod's init and regular containers."""
    if ph in TERMINAL_PHASES:
        return _condition(ALL_RESTARTING, False, "PodCompleted" if ph == "Succeeded" else "PodFailed")
    if not resetting(pod, state, last) or not any(state.history(c.name)
                                                   for c in pod.spec.init_containers + pod.spec.containers):
        return _condition(ALL_RESTARTING, False)
    return _condition(ALL_RESTARTING, True, "RestartAllContainersStarted", "container exited with restart policy rule")


def _gate_by_probes(s: dict, uid: str, history: list[api_pb2.ContainerStatus], probes) -> None:
    """A running container is started once its startup probe passed and ready once its readiness did."""
    if probes is not None and s["started"]:
        s["started"] = probes.started(uid, s["name"], history[0].id)
        s["ready"] = probes.ready(uid, s["name"], history[0].id)


def pod_status(pod: Pod, state: RuntimePod, result: SyncResult, *, host_ip: str | None, runtime_name: str,
               probes=None, actuated: dict[str, Resources] | None = None, actuated_pod: Resources | None = None,
               resize_conditions: list[dict[str, Any]] | None = None, terminal: bool = False,
               last: dict | None = None) -> dict:
    """Of the allocated `pod` (pods/allocation.py: the resources the kubelet granted it). `probes` (a
    pykubelet.prober.manager.ProbeManager) says which running containers are started and ready; `actuated`
    what each container was last given, `actuated_pod` the pod's cgroup its pod-level resources;
    `resize_conditions` the PodResizePending / PodResizeInProgress ones;
    `terminal`: the final status of a deleted pod whose containers have all stopped (see phase); `last`:
    the status last written (the status manager's, else the API server's; None: nothing is carried)."""
    given = actuated or {}
    # the status as last written (the kubelet's own fields of it, kept: qosClass, startTime)
    spec, previous, uid = pod.spec, pod.raw.get("status") or {}, pod.uid
    shown = last_statuses(last) if last is not None else {}
    again = last is not None and resetting(pod, state, last)
    init_statuses = []
    init_done = True
    regular_ran = any(state.history(c.name) for c in spec.containers)
    for c in spec.init_containers:
        history = state.history(c.name)
        s = container_status(c, history, result.waiting.get(c.name), runtime_name, "PodInitializing",
                             given.get(c.name), shown.get(c.name), again)
        if c.is_sidecar:  # initialized once started; ready by its probes while it runs
            _gate_by_probes(s, uid, history, probes)
            init_done = init_done and (s["started"] or regular_ran)
        else:
            s["ready"] = bool(history) and history[0].state == api_pb2.CONTAINER_EXITED and history[0].exit_code == 0
            init_done = init_done and s["ready"]
        init_statuses.append(s)
    default = "ContainerCreating" if init_done else "PodInitializing"
    statuses = []
    for c in spec.containers:
        history = state.history(c.name)
        s = container_status(c, history, result.waiting.get(c.name), runtime_name, default, given.get(c.name),
                             shown.get(c.name), again)
        _gate_by_probes(s, uid, history, probes)
        statuses.append(s)
    # as the kubelet's: reported as containers are, but no probe makes them ready or started, and they count
    # for neither the phase nor the pod's readiness
    ephemeral_statuses = []
    for c in spec.ephemeral_containers:
        s = container_status(c, state.history(c.name), result.waiting.get(c.name), runtime_name, default)
        s["ready"] = False
        del s["started"]
        ephemeral_statuses.append(s)
    ph = phase(pod, init_done, result.init_failed, statuses, terminal)
    if pod.status.phase in TERMINAL_PHASES:  # as the kubelet's: a finished pod whose sandbox is gone stays so
        ph = pod.status.phase
    foreign = [c for c in previous.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]
    sidecars = [s for c, s in zip(spec.init_containers, init_statuses, strict=True) if c.is_sidecar]
    containers_ready = containers_ready_condition(sidecars + statuses, ph)
    status: dict[str, Any] = {
        "phase": ph, "qosClass": previous.get("qosClass"),
        "startTime": previous.get("startTime") or now(),
        "conditions": [
            *foreign,
            {"type": "PodReadyToStartContainers", "status": str(state.sandbox is not None)},
            initialized_condition(pod, init_statuses, init_done, ph, was_initialized=_has(last, "Initialized")),
            ready_condition(pod, containers_ready, foreign), containers_ready,
            {"type": "PodScheduled", "status": "True"},
            *(resize_conditions or []),
            *([all_restarting_condition(pod, state, last or {}, ph)] if could_restart_all(pod) else [])],
        "containerStatuses": statuses,
    }
    status["resources"], allocated = pod_level_status(pod, actuated_pod)
    if allocated:
        status["allocatedResources"] = allocated
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    if ephemeral_statuses:
        status["ephemeralContainerStatuses"] = ephemeral_statuses
    if host_ip:
        status["hostIP"], status["hostIPs"] = host_ip, [{"ip": host_ip}]
    net = state.sandbox_status.network if state.sandbox_status is not None else None
    if net is not None and net.ip:
        ips = [net.ip] + [a.ip for a in net.additional_ips]
        status["podIP"], status["podIPs"] = ips[0], [{"ip": ip} for ip in ips]
    elif spec.host_network and host_ip:
        status["podIP"], status["podIPs"] = host_ip, [{"ip": host_ip}]
    return {k: v for k, v in status.items() if v is not None}


class StatusManager:
    """`client` None: standalone mode, statuses are only kept (for `last`)."""

    def __init__(self, client) -> None:
        self.client = client
        self._sent: dict[str, dict] = {}  # pod uid -> the status last patched
        self._lock = threading.Lock()

    def _with_transition_times(self, pod_uid: str, status: dict, current: dict) -> dict:
        last = self._sent.get(pod_uid) or current
        before = {c["type"]: c for c in last.get("conditions", [])}
        if last.get("startTime"):
            status["startTime"] = last["startTime"]
        for c in status.get("conditions", []):
            if c["type"] not in KUBELET_CONDITIONS:  # another's: sent back as it is
                continue
            old = before.get(c["type"])
            c["lastProbeTime"] = None
            c["lastTransitionTime"] = old["lastTransitionTime"] if old and old.get("status") == c["status"] \
                and old.get("lastTransitionTime") else now()
        return status

    def _observed(self, pod_uid: str, status: dict, generation: int, current: dict) -> dict:
        """As the kubelet's SetPodStatus (PodObservedGenerationTracking, GA in 1.35): status.observedGeneration
        and each of the kubelet's conditions say which generation of the pod's spec the kubelet acted on, so a
        client that changed the spec (a resize bumps the generation) waits for it, never below what was
        already said. A resize condition keeps the generation of the resize it is about."""
        last = self._sent.get(pod_uid) or current
        status["observedGeneration"] = max(generation, last.get("observedGeneration") or 0)
        for c in status.get("conditions", []):
            if c["type"] in KUBELET_CONDITIONS and "observedGeneration" not in c:
                c["observedGeneration"] = generation
        return status

    def set_pod_status(self, meta: ObjectMeta, status: dict, current: dict | None = None) -> bool:
        """Patches pods/status of the pod `meta` names (its metadata.generation being the one this status was
        made from: see _observed) when `status` differs from what was sent; `current` is the pod's status as
        the API server has it (for the transition times after a restart). True if it patched."""
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        pod_uid, namespace, name, generation = meta.uid, meta.namespace, meta.name, meta.generation

        with self._lock:
            status = self._observed(pod_uid, self._with_transition_times(pod_uid, status, current or {}),
                                    generation, current or {})
            if self._sent.get(pod_uid) == status:
                return False
        if self.client is not None:  # without one (standalone mode) the status is kept here only
            from lightkube.core.exceptions import ApiError
            try:
                self.client.patch(Pod.Status, name, {"status": status}, namespace=namespace,
                                  patch_type=PatchType.MERGE)
            except ApiError as e:
                if e.status.code != 404:
                    raise
                # gone from the API server (the informer tells), or a static pod whose mirror pod is not
                # made yet (it is sent again once it is)
                log.debug("pod %s/%s: no pod to patch the status of", namespace, name)
                return False
        with self._lock:
            self._sent[pod_uid] = status
        log.debug("pod %s/%s: status %s", namespace, name, status["phase"])
        return True

    def last(self, pod_uid: str) -> dict:
        """The status last patched for the pod ({} if none)."""
        with self._lock:
            return self._sent.get(pod_uid, {})

    def forget(self, pod_uid: str) -> None:
        with self._lock:
            self._sent.pop(pod_uid, None)
