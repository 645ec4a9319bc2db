"""The Node's status as the kubelet reports it: capacity and allocatable read from the machine, addresses,
nodeInfo, and the Ready / MemoryPressure / DiskPressure / PIDPressure conditions (the pressure ones are the
eviction manager's, pykubelet/eviction: it holds them for evictionPressureTransitionPeriod).

The scheduler places pods by allocatable and skips nodes whose Ready is not True, so this must be
truthful and timely, yet cheap for the API server: the status is computed every
nodeStatusUpdateFrequency (10 s) and sent only when something changed, or when nodeStatusReportFrequency
(5 min) has passed since the last report (the Lease is the frequent heartbeat). Conditions keep their
lastTransitionTime until their status flips (each flip is an event: NodeReady, NodeNotReady,
NodeHasSufficientMemory...), and Ready says which part failed: "container runtime is
down" names the CRI endpoint, so a NotReady node tells its operator where to look.

A runtime that answers slowly is not a runtime that is down: only a failed CRI Status call or a runtime
that says it is not ready turns Ready False, never a slow pod sync (upstream's "PLEG is not healthy"); and
the host shutting down ("node is shutting down", pykubelet/node/shutdown.py).
"""
from __future__ import annotations

import datetime
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pykubelet import KUBELET_VERSION
from pykubelet import runtime as cri
from pykubelet.api import quantity
from pykubelet.config import Settings
from pykubelet.events import NORMAL, EventRecorder, node_ref
from pykubelet.eviction import policy
from pykubelet.node import hostfacts
from pykubelet.node.features import declared_features

log = logging.getLogger(__name__)

# the kubelet's event reason for each condition's status
NODE_EVENTS = {("Ready", "True"): "NodeReady", ("Ready", "False"): "NodeNotReady",
               ("MemoryPressure", "False"): "NodeHasSufficientMemory",
               ("MemoryPressure", "True"): "NodeHasInsufficientMemory",
               ("DiskPressure", "False"): "NodeHasNoDiskPressure", ("DiskPressure", "True"): "NodeHasDiskPressure",
               ("PIDPressure", "False"): "NodeHasSufficientPID", ("PIDPressure", "True"): "NodeHasInsufficientPID"}
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
        "riscv64": "riscv64"}.get(platform.machine(), platform.machine())


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip('"')
    return "Linux"


def machine_capacity(settings: Settings) -> dict[str, str]:
    fs = os.statvfs(hostfacts.existing(settings.root_dir))
    return {"cpu": str(hostfacts.cpu_count()), "memory": quantity.binary_si(hostfacts.meminfo()["MemTotal"]),
            "ephemeral-storage": quantity.binary_si(fs.f_blocks * fs.f_frsize), "pods": str(settings.max_pods),
            "hugepages-2Mi": "0", "hugepages-1Gi": "0"}


def allocatable(capacity: dict[str, str], hard: Mapping[str, policy.Value] | None = None,
                reserved: Mapping[str, int] | None = None) -> dict[str, str]:
    """Capacity less what is reserved for the system and the kubelet (`reserved`: resource -> cpu
    millicores, bytes, or pids: systemReserved and kubeReserved summed, reserved_for(settings)) and less the
    hard eviction thresholds (`hard`: evictionHard, the kubelet's defaults if None), as the kubelet's node
    allocatable."""
    hard = policy.DEFAULT_HARD if hard is None else hard
    reserved = reserved or {}
    none = policy.Value(quantity=0)
    out = dict(capacity)
    if reserved.get("cpu"):
        millicores = max(0, quantity.milli_value(quantity.parse(capacity["cpu"])) - reserved["cpu"])
        out["cpu"] = quantity.milli_decimal_si(millicores)
    memory = quantity.value(quantity.parse(capacity["memory"]))
    memory_left = memory - reserved.get("memory", 0) - hard.get("memory.available", none).of(memory)
    out["memory"] = quantity.binary_si(max(0, memory_left))
    storage = quantity.value(quantity.parse(capacity["ephemeral-storage"]))
    storage_left = storage - reserved.get("ephemeral-storage", 0) - hard.get("nodefs.available", none).of(storage)
    out["ephemeral-storage"] = quantity.binary_si(max(0, storage_left))
    return out


def reserved_for(settings: Settings) -> dict[str, int]:
    """systemReserved and kubeReserved summed, by resource."""
    out = dict(settings.system_reserved)
    for name, amount in settings.kube_reserved.items():
        out[name] = out.get(name, 0) + amount
    return out


def node_allocatable(settings: Settings) -> dict[str, str]:
    """This node's allocatable, as its status reports it."""
    return allocatable(machine_capacity(settings), settings.eviction_hard, reserved_for(settings))


def node_info(version: Any) -> dict[str, str]:
    """`version` is the CRI VersionResponse: containerd says runtime_name "containerd", so the node shows
    "containerd://1.6.20" as the stock kubelet does."""
    return {"machineID": _read("/etc/machine-id"), "systemUUID": _read("/sys/class/dmi/id/product_uuid").lower(),
            "bootID": _read("/proc/sys/kernel/random/boot_id"), "kernelVersion": platform.release(),
            "osImage": os_image(), "containerRuntimeVersion": f"{version.runtime_name}://{version.runtime_version}",
            "kubeletVersion": KUBELET_VERSION, "operatingSystem": "linux", "architecture": ARCH}


def addresses(settings: Settings) -> list[dict[str, str]]:
    out = [{"type": "InternalIP", "address": settings.node_ip}] if settings.node_ip else []
    return out + [{"type": "Hostname", "address": settings.node_name}]


NETWORK_NOT_READY = "container runtime network not ready"


def runtime_problems(runtime: cri.CRIRuntime, endpoint: str) -> list[str]:
    """Why the runtime cannot run pods (empty: it can), in the stock kubelet's words."""
    try:
        status = runtime.status()
    except cri.CRIError as e:
        return [f"container runtime is down: {endpoint}: {e}"]
    conditions = {c.type: c for c in status.status.conditions}
    problems = []
    for kind, what in (("RuntimeReady", "container runtime not ready"),
                       ("NetworkReady", NETWORK_NOT_READY)):
        c = conditions.get(kind)
        if c is None or not c.status:
            detail = f"reason:{c.reason} message:{c.message}" if c is not None else "not reported"
            problems.append(f"{what}: {kind}=false {detail}")
    return problems


CONDITION_TEXT = {  # type -> (reason, message) when fine, (reason, message) under pressure
    "MemoryPressure": (("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                       ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available")),
    "DiskPressure": (("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                     ("KubeletHasDiskPressure", "kubelet has disk pressure")),
    "PIDPressure": (("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ("KubeletHasInsufficientPID", "kubelet has insufficient PID available")),
}


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeStatus:
    """Computes the node's status and reports it; run() is the kubelet's status loop."""

    def __init__(self, client, runtime: cri.CRIRuntime, settings: Settings,
                 clock: Callable[[], float] = time.monotonic, events: EventRecorder | None = None,
                 pressure: Callable[[], list[str]] = list,
                 shutdown: Callable[[], str | None] = lambda: None) -> None:
        # pressure(): the pressure conditions that hold (the eviction manager's, pykubelet/eviction);
        # shutdown(): "node is shutting down" while it is (pykubelet/node/shutdown.py), else None
        self.client, self.runtime, self.settings, self.events = client, runtime, settings, events
        self.pressure, self.shutdown = pressure, shutdown
        self._clock = clock
        self._transitions: dict[str, tuple[str, str]] = {}  # type -> (status, lastTransitionTime)
        self._last_sent: dict | None = None
        self._last_report = 0.0
        self._runtime_version: Any = None
        self.changed = threading.Event()  # set() by anyone who knows the status changed: report now

    def version(self) -> Any:
        if self._runtime_version is None:
            self._runtime_version = self.runtime.version()
        return self._runtime_version

    def conditions(self) -> list[dict[str, str]]:
        now = now_rfc3339()
        out = []
        holding = self.pressure()
        for kind in CONDITION_TEXT:
            under = kind in holding
            reason, message = CONDITION_TEXT[kind][under]
            out.append(self._condition(kind, "True" if under else "False", reason, message, now))
        problems = runtime_problems(self.runtime, self.settings.container_runtime_endpoint)
        shutting_down = self.shutdown()
        if shutting_down is not None:
            problems.append(shutting_down)
        if problems:
            out.append(self._condition("Ready", "False", "KubeletNotReady", "; ".join(problems), now))
        else:
            out.append(self._condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now))
        return out

    def _condition(self, kind: str, status: str, reason: str, message: str, now: str) -> dict[str, str]:
        before = self._transitions.get(kind)
        since = before[1] if before and before[0] == status else now
        if (before is None or before[0] != status) and self.events is not None:
            name = self.settings.node_name
            self.events.event(node_ref(name), NORMAL, NODE_EVENTS[kind, status], f"Node {name} status is now: "
                              f"{NODE_EVENTS[kind, status]}")
        self._transitions[kind] = (status, since)
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since}

    def build(self) -> dict[str, Any]:
        capacity = machine_capacity(self.settings)
        status: dict[str, Any] = {"capacity": capacity,
                                  "allocatable": allocatable(capacity, self.settings.eviction_hard,
                                                             reserved_for(self.settings)),
                                  "addresses": addresses(self.settings), "conditions": self.conditions(),
                                  "daemonEndpoints": {"kubeletEndpoint": {"Port": self.settings.port}},
                                  "declaredFeatures": list(declared_features(self.settings.feature_gates))}
        try:
            status["nodeInfo"] = node_info(self.version())
        except cri.CRIError:
            pass  # runtime down: Ready says so; nodeInfo keeps what was last reported
        return status

    @staticmethod
    def _comparable(status: dict[str, Any]) -> dict[str, Any]:
        return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                                         for c in status["conditions"]]}

    def update(self, force: bool = False) -> bool:
        """Computes the status and patches it when it changed or the report period is over; True if sent."""
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        status = self.build()
        due = self._clock() - self._last_report >= self.settings.node_status_report_frequency
        if not force and not due and self._last_sent == self._comparable(status):
            return False
        self.client.patch(Node.Status, self.settings.node_name, {"status": status}, patch_type=PatchType.STRATEGIC)
        self._last_sent, self._last_report = self._comparable(status), self._clock()
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.update()
            except Exception as e:
                log.warning("node status update failed: %s", e)
            self.changed.wait(self.settings.node_status_update_frequency)
            self.changed.clear()
