"""What the runtime has of one pod, read back through the kubelet's labels: the input of every decision a
pod sync, the status manager and the probes make, so that none of them trusts a memory of this process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.podmodel import Pod
from pykubelet.pods import terminationmessage
from pykubelet.pods.labels import CONTAINER_NAME, POD_UID


@dataclass
class RuntimePod:
    """What the runtime has of one pod: its sandboxes and containers, newest first, with statuses."""
    sandboxes: list[api_pb2.PodSandbox] = field(default_factory=list)
    containers: list[api_pb2.Container] = field(default_factory=list)
    statuses: dict[str, api_pb2.ContainerStatus] = field(default_factory=dict)
    sandbox_status: api_pb2.PodSandboxStatus | None = None

    @property
    def sandbox(self) -> api_pb2.PodSandbox | None:
        """The newest ready sandbox: the one the pod's containers run in."""
        return next((s for s in self.sandboxes if s.state == api_pb2.SANDBOX_READY), None)

    def history(self, name: str) -> list[api_pb2.ContainerStatus]:
        """The statuses of container `name`, newest first."""
        return [self.statuses[c.id] for c in self.containers
                if c.labels.get(CONTAINER_NAME) == name and c.id in self.statuses]


def observe(runtime: cri.CRIRuntime, uid: str) -> RuntimePod:
    selector = {POD_UID: uid}
    sandboxes = runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector))
    containers = runtime.list_containers(api_pb2.ContainerFilter(label_selector=selector))
    state = RuntimePod(sorted(sandboxes, key=lambda s: -s.created_at), sorted(containers, key=lambda c: -c.created_at))
    for c in state.containers:
        try:
            status = runtime.container_status(c.id).status
        except cri.NotFound:
            continue  # removed meanwhile
        terminationmessage.fill_in(status)
        state.statuses[c.id] = status
    if state.sandbox is not None:
        try:
            state.sandbox_status = runtime.pod_sandbox_status(state.sandbox.id).status
        except cri.NotFound:
            pass
    return state


def pod_ip(pod: Pod, state: RuntimePod, node_ip: str | None) -> str:
    """Where the pod's probes and HTTP hooks go: its sandbox's IP (the node's for hostNetwork)."""
    net = state.sandbox_status.network if state.sandbox_status is not None else None
    if net is not None and net.ip:
        return net.ip
    return (node_ip or "") if pod.spec.host_network else ""
