"""Graceful termination: a pod leaves the node only through here, and leaves nothing behind.

A deleted pod's containers get their stop signal (SIGTERM, or the image's STOPSIGNAL) and the grace
period the API server recorded (deletionGracePeriodSeconds: `kubectl delete --grace-period` or the pod's
terminationGracePeriodSeconds) before the runtime kills them; all containers stop in parallel, as the
kubelet's. Then the sandbox (its network: the pod IP is released), the containers, the sandbox, the pod's
cgroup and log directory go. Only then does the kubelet delete the pod object with grace 0: the API
server's object is the promise that something still runs, so it must outlive everything on the node.
"""
from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.podmodel import DEFAULT_GRACE, Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods import lifecycle
from pykubelet.pods.criconfig import log_directory
from pykubelet.pods.labels import CONTAINER_NAME, GRACE, POD_NAME, POD_NAMESPACE
from pykubelet.pods.runtimepod import RuntimePod
from pynode_os import cgroups, mounts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pykubelet.pods.slices import PodSlices

log = logging.getLogger(__name__)


def grace_period(pod: Pod | None, state: RuntimePod) -> int:
    """The pod's grace (what the API server set on deletion, else its spec); for a pod the API server no
    longer has, what its containers were started with."""
    if pod is not None:
        grace = pod.metadata.deletion_grace_period_seconds
        return pod.spec.termination_grace_period_seconds if grace is None else grace
    graces = [int(c.annotations.get(GRACE, "") or DEFAULT_GRACE) for c in state.containers]
    return max(graces, default=DEFAULT_GRACE)


def _ignore_missing(call, *args) -> None:
    try:
        call(*args)
    except cri.NotFound:
        pass


def kill_pod(runtime: cri.CRIRuntime, state: RuntimePod, grace: int, pod: Pod | None = None,
             event: lifecycle.EventFn | None = None) -> None:
    """Stops every container of the pod, then removes all of it from the runtime."""
    stop_containers(runtime, state, grace, pod, event)
    remove_from_runtime(runtime, state)


def stop_containers(runtime: cri.CRIRuntime, state: RuntimePod, grace: int, pod: Pod | None = None,
                    event: lifecycle.EventFn | None = None, deadline: lifecycle.Deadline | None = None) -> None:
    """Stops every container of the pod (`grace` seconds in all, or by `deadline` if it moves earlier;
    preStop hooks first: the regular ones in parallel, then the sidecars one by one in reverse order, as the
    kubelet's). They stay in the runtime, with their exit codes and finish times, for the pod's final status."""
    running = [c for c in state.containers if c.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_CREATED)]
    sidecars = [] if pod is None else [c.name for c in pod.spec.init_containers if c.is_sidecar]
    net = state.sandbox_status.network if state.sandbox_status is not None else None
    pod_ip = net.ip if net is not None else ""
    bound = deadline or lifecycle.Deadline(grace)
    errors: list[Exception] = []

    def stop(c: api_pb2.Container) -> None:
        try:
            lifecycle.stop_container(runtime, pod, c.labels.get(CONTAINER_NAME, ""), c.id, grace, pod_ip, event,
                                     deadline=bound)
        except cri.CRIError as e:
            errors.append(e)

    threads = [threading.Thread(target=stop, args=(c,), name=f"stop-{c.id[:12]}") for c in running
               if c.labels.get(CONTAINER_NAME) not in sidecars]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in reversed(sidecars):
        for c in running:
            if c.labels.get(CONTAINER_NAME) == name:
                stop(c)
    if errors:
        raise errors[0]


def remove_from_runtime(runtime: cri.CRIRuntime, state: RuntimePod) -> None:
    """Stops the pod's sandboxes (its network: the pod IP is released) and removes them and its containers."""
    for s in state.sandboxes:
        _ignore_missing(runtime.stop_pod_sandbox, s.id)
    for c in state.containers:
        _ignore_missing(runtime.remove_container, c.id)
    for s in state.sandboxes:
        _ignore_missing(runtime.remove_pod_sandbox, s.id)


def kill_pod_sandbox(runtime: cri.CRIRuntime, state: RuntimePod) -> None:
    """Stops the sandboxes of a pod whose containers have all ended (its network and IP go)."""
    for s in state.sandboxes:
        if s.state == api_pb2.SANDBOX_READY:
            _ignore_missing(runtime.stop_pod_sandbox, s.id)


def cgroup_hierarchies() -> list[Path]:
    """The cgroup v2 root, or each v1 hierarchy (the runtime makes the pod's cgroup in all of them)."""
    return [Path(h) for h in cgroups.hierarchy_roots(mounts.statfs_type)]


def clean_node(pod: Pod, settings: Settings, slices: PodSlices | None = None) -> None:
    """What the kubelet itself made for the pod: its volumes (mounts and directory under --root-dir), its
    cgroup (cgroupfs driver: the directories; systemd: `slices`, the pod's slice stopped) and its log
    directory."""
    from pykubelet.volumes.manager import remove_pod

    remove_pod(settings.root_dir, pod.uid)
    if settings.cgroup_driver == "cgroupfs":
        pod_dir = f"pod{pod.uid}"  # under any QoS class: a pod known only by its labels has no spec
        for hierarchy in cgroup_hierarchies():
            kubepods = hierarchy / settings.cgroup_root.strip("/") / "kubepods"
            for cgroup in (kubepods / pod_dir, kubepods / "burstable" / pod_dir, kubepods / "besteffort" / pod_dir):
                try:
                    cgroup.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("pod %s: removing cgroup %s: %s", pod.metadata.name, cgroup, e)
    elif slices is not None:
        slices.remove_pod(pod.uid)
    shutil.rmtree(log_directory(pod, settings), ignore_errors=True)


def identity(state: RuntimePod, uid: str) -> Pod | None:
    """A pod skeleton (name, namespace, uid, no resources) from the runtime's labels, for a pod the API
    server no longer has."""
    for item in list(state.sandboxes) + list(state.containers):
        if POD_NAME in item.labels:
            return parse_pod({"metadata": {"name": item.labels[POD_NAME],
                                           "namespace": item.labels.get(POD_NAMESPACE, ""), "uid": uid},
                              "spec": {}})
    return None


def delete_from_api(client, pod: Pod) -> None:
    """The last step: the pod object goes (grace 0), now that nothing of it runs."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources import core_v1

    meta = pod.metadata
    try:
        client.delete(core_v1.Pod, meta.name, namespace=meta.namespace, grace_period=0)
    except ApiError as e:
        if e.status.code != 404:
            raise
    log.info("pod %s: terminated and deleted", pod.key)
