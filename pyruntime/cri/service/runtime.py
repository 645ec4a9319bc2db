"""The CRI RuntimeService over gRPC: protobuf in, a call of the domain (sandbox.py, containers.py, events.py,
stats.py, the streaming server), protobuf out. No logic lives here beyond picking the call; errors are
mapped by instrument.py."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from proto import api_pb2, api_pb2_grpc
from pyruntime.cri.containers import Containers
from pyruntime.cri.events import EventHub
from pyruntime.cri.sandbox import Sandboxes
from pyruntime.cri.service.instrument import instrumented
from pyruntime.cri.store import RecordStore
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError

log = logging.getLogger(__name__)

RUNTIME_NAME = "pyruntime"
API_VERSION = "v1"
CGROUP_DRIVERS = {"cgroupfs": api_pb2.CGROUPFS, "systemd": api_pb2.SYSTEMD}


@instrumented("RuntimeService")
class RuntimeServicer(api_pb2_grpc.RuntimeServiceServicer):
    """`network`: cri/network.py's Network (status); `streaming`: the StreamingServer; `stats`: the
    cri/stats.py module; `info`: what Status(verbose) shows of the daemon's configuration."""

    def __init__(self, store: RecordStore, sandboxes: Sandboxes, containers: Containers, events: EventHub, *,
                 network: Any, streaming: Any, stats: Any, runtime: Any, layout: Any, cgroup_driver: str,
                 version: str, info: dict) -> None:
        self.store = store
        self.sandboxes = sandboxes
        self.containers = containers
        self.events = events
        self.network = network
        self.streaming = streaming
        self.stats = stats
        self.runtime = runtime
        self.layout = layout
        self.cgroup_driver = cgroup_driver
        self.version = version
        self.info = info
        self.pod_cidr = ""

    # ---- runtime ----

    def Version(self, request: Any, context: Any) -> Any:
        return api_pb2.VersionResponse(version="0.1.0", runtime_name=RUNTIME_NAME, runtime_version=self.version,
                                       runtime_api_version=API_VERSION)

    def Status(self, request: Any, context: Any) -> Any:
        ready, reason, message = self.network.status()
        response = api_pb2.StatusResponse(status=api_pb2.RuntimeStatus(conditions=[
            api_pb2.RuntimeCondition(type="RuntimeReady", status=True),
            api_pb2.RuntimeCondition(type="NetworkReady", status=ready, reason=reason, message=message)]))
        handler = response.runtime_handlers.add(name="")
        # pyruntime applies "rro" with mount_setattr(2) (Linux >= 5.12), which ocispec asks for
        handler.features.recursive_read_only_mounts = True
        # a POD user namespace: the pause maps and pins it, containers join it with their rootfs idmapped
        handler.features.user_namespaces = True
        response.features.supplemental_groups_policy = True  # ocispec applies Strict and Merge
        if request.verbose:
            response.info["config"] = json.dumps(dict(self.info, podCIDR=self.pod_cidr))
        return response

    def RuntimeConfig(self, request: Any, context: Any) -> Any:
        return api_pb2.RuntimeConfigResponse(
            linux=api_pb2.LinuxRuntimeConfiguration(cgroup_driver=CGROUP_DRIVERS[self.cgroup_driver]))

    def UpdateRuntimeConfig(self, request: Any, context: Any) -> Any:
        cidr = request.runtime_config.network_config.pod_cidr
        if cidr != self.pod_cidr:
            log.info("pod CIDR: %s", cidr or "(none)")
            self.pod_cidr = cidr
        return api_pb2.UpdateRuntimeConfigResponse()

    # ---- sandboxes ----

    def RunPodSandbox(self, request: Any, context: Any) -> Any:
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=self.sandboxes.run(request))

    def StopPodSandbox(self, request: Any, context: Any) -> Any:
        self.sandboxes.stop(request.pod_sandbox_id)
        return api_pb2.StopPodSandboxResponse()

    def RemovePodSandbox(self, request: Any, context: Any) -> Any:
        self.sandboxes.remove(request.pod_sandbox_id)
        return api_pb2.RemovePodSandboxResponse()

    def PodSandboxStatus(self, request: Any, context: Any) -> Any:
        return self.sandboxes.status(request.pod_sandbox_id, request.verbose)

    def ListPodSandbox(self, request: Any, context: Any) -> Any:
        f = request.filter if request.HasField("filter") else None
        return api_pb2.ListPodSandboxResponse(items=self.sandboxes.list(f))

    # ---- containers ----

    def CreateContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.CreateContainerResponse(container_id=self.containers.create(request))

    def StartContainer(self, request: Any, context: Any) -> Any:
        self.containers.start(request.container_id)
        return api_pb2.StartContainerResponse()

    def StopContainer(self, request: Any, context: Any) -> Any:
        self.containers.stop(request.container_id, request.timeout)
        return api_pb2.StopContainerResponse()

    def RemoveContainer(self, request: Any, context: Any) -> Any:
        self.containers.remove(request.container_id)
        return api_pb2.RemoveContainerResponse()

    def ListContainers(self, request: Any, context: Any) -> Any:
        f = request.filter if request.HasField("filter") else None
        return api_pb2.ListContainersResponse(containers=self.containers.list(f))

    def ContainerStatus(self, request: Any, context: Any) -> Any:
        return self.containers.status(request.container_id, request.verbose)

    def UpdateContainerResources(self, request: Any, context: Any) -> Any:
        self.containers.update_resources(request.container_id, request.linux)
        return api_pb2.UpdateContainerResourcesResponse()

    def ReopenContainerLog(self, request: Any, context: Any) -> Any:
        self.containers.reopen_container_log(request.container_id)
        return api_pb2.ReopenContainerLogResponse()

    def ExecSync(self, request: Any, context: Any) -> Any:
        return self.containers.exec_sync(request.container_id, list(request.cmd), request.timeout)

    def CheckpointContainer(self, request: Any, context: Any) -> Any:
        raise NotImplementedError("CheckpointContainer: checkpointing is not supported by pyruntime")

    def GetContainerEvents(self, request: Any, context: Any) -> Iterator[Any]:
        yield from self.events.subscribe(context.is_active)

    # ---- streaming ----

    def Exec(self, request: Any, context: Any) -> Any:
        if not (request.stdin or request.stdout or request.stderr):
            raise InvalidArgumentError("one of stdin, stdout and stderr must be set")
        if request.tty and request.stderr:
            raise InvalidArgumentError("tty and stderr: a terminal has no separate stderr; set one of them")
        if not request.cmd:
            raise InvalidArgumentError("cmd: must not be empty")
        self.containers.running(request.container_id)
        return self.streaming.get_exec(request)

    def Attach(self, request: Any, context: Any) -> Any:
        if not (request.stdin or request.stdout or request.stderr):
            raise InvalidArgumentError("one of stdin, stdout and stderr must be set")
        self.containers.running(request.container_id)
        return self.streaming.get_attach(request)

    def PortForward(self, request: Any, context: Any) -> Any:
        if self.sandboxes.status(request.pod_sandbox_id).status.state != api_pb2.SANDBOX_READY:
            raise FailedPreconditionError(f"pod sandbox {request.pod_sandbox_id} is not ready")
        return self.streaming.get_port_forward(request)

    # ---- stats ----

    def ContainerStats(self, request: Any, context: Any) -> Any:
        record = self.store.container(request.container_id)
        return api_pb2.ContainerStatsResponse(stats=self.stats.container_stats(record, self.runtime, self.layout))

    def ListContainerStats(self, request: Any, context: Any) -> Any:
        f = request.filter
        selected = api_pb2.ContainerFilter(id=f.id, pod_sandbox_id=f.pod_sandbox_id, label_selector=f.label_selector)
        selected.state.state = api_pb2.CONTAINER_RUNNING
        response = api_pb2.ListContainerStatsResponse()
        for container in self.containers.list(selected):
            try:
                record = self.store.container(container.id)
            except NotFoundError:  # removed since the listing
                continue
            response.stats.append(self.stats.container_stats(record, self.runtime, self.layout))
        return response

    def PodSandboxStats(self, request: Any, context: Any) -> Any:
        return api_pb2.PodSandboxStatsResponse(stats=self._sandbox_stats(request.pod_sandbox_id))

    def ListPodSandboxStats(self, request: Any, context: Any) -> Any:
        f = request.filter
        selected = api_pb2.PodSandboxFilter(id=f.id, label_selector=f.label_selector)
        selected.state.state = api_pb2.SANDBOX_READY
        response = api_pb2.ListPodSandboxStatsResponse()
        for sandbox in self.sandboxes.list(selected):
            try:
                response.stats.append(self._sandbox_stats(sandbox.id))
            except NotFoundError:  # removed since the listing
                continue
        return response

    def _sandbox_stats(self, sandbox_id: str) -> Any:
        record = self.store.sandbox(sandbox_id)
        return self.stats.sandbox_stats(record, self.store.containers(record.id), self.runtime, self.layout)

    def ListMetricDescriptors(self, request: Any, context: Any) -> Any:
        return api_pb2.ListMetricDescriptorsResponse(descriptors=self.stats.metric_descriptors())

    def ListPodSandboxMetrics(self, request: Any, context: Any) -> Any:
        selected = api_pb2.PodSandboxFilter()
        selected.state.state = api_pb2.SANDBOX_READY
        response = api_pb2.ListPodSandboxMetricsResponse()
        for sandbox in self.sandboxes.list(selected):
            try:
                record = self.store.sandbox(sandbox.id)
            except NotFoundError:  # removed since the listing
                continue
            response.pod_metrics.append(self.stats.sandbox_metrics(record, self.store.containers(record.id),
                                                                   self.runtime, self.layout))
        return response
