"""The kubelet's only way to a container runtime: a CRI v1 client (RuntimeService and ImageService) over
gRPC on a unix socket, built on the generated stubs in proto/.

It keeps the kubelet runtime-agnostic: containerd 1.6 and pyruntime-cri answer the same calls, and the
differences that matter (containerd 1.6 has no GetContainerEvents) surface as typed errors the callers
branch on, never as grpc types. Every failure is a CRIError subclass chosen from the gRPC status code in
one table, naming the RPC, so a caller can tell "the runtime is down" (Unavailable) from "that container
is gone" (NotFound) without parsing messages.

Calls are synchronous and thread-safe (one grpc channel shared by the kubelet's threads); each unary
call has a deadline (`timeout`), except the ones whose length is the caller's (pull, exec_sync's own
timeout plus a margin, the event stream).
"""
from __future__ import annotations

from collections.abc import Iterator

import grpc

from proto import api_pb2, api_pb2_grpc
from pykubelet.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    KubeletError,
    NotFoundError,
    UnavailableError,
)


class CRIError(KubeletError):
    """A CRI call failed; `rpc` names the call, `code` is the gRPC status code. Each subclass is the one
    kind its code is (pykubelet/errors.py)."""

    def __init__(self, rpc: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"CRI {rpc}: {code.name}: {details}")
        self.rpc, self.code, self.details = rpc, code, details


class NotFound(CRIError, NotFoundError):
    pass


class AlreadyExists(CRIError, AlreadyExistsError):
    pass


class InvalidArgument(CRIError, InvalidArgumentError):
    pass


class FailedPrecondition(CRIError, FailedPreconditionError):
    pass


class Unavailable(CRIError, UnavailableError):
    """The runtime cannot be reached (not started, crashed, socket gone)."""


class DeadlineExceeded(CRIError, DeadlineExceededError):
    pass


class Unimplemented(CRIError, FailedPreconditionError):
    """The runtime lacks this call (containerd 1.6: GetContainerEvents): a runtime without the feature."""


class Internal(CRIError, InternalError):
    """Any other code: the runtime's own failure."""


ERRORS: dict[grpc.StatusCode, type[CRIError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def error_from(rpc: str, e: grpc.RpcError) -> CRIError:
    code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (e.details() if isinstance(e, grpc.Call) else str(e)) or ""
    return ERRORS.get(code, Internal)(rpc, code, details)


class CRIRuntime:
    """A CRI endpoint, e.g. "unix:///run/containerd/containerd.sock" (a bare path is taken as unix://)."""

    MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's maxMsgSize: ListContainers on a full node is large

    def __init__(self, endpoint: str, timeout: float = 120) -> None:
        self.endpoint = endpoint if "://" in endpoint else f"unix://{endpoint}"
        if not self.endpoint.startswith("unix://"):
            raise ValueError(f"--container-runtime-endpoint {endpoint!r}: only unix:// sockets are supported")
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.endpoint, options=[
            ("grpc.max_receive_message_length", self.MAX_MESSAGE),
            ("grpc.max_send_message_length", self.MAX_MESSAGE)])
        self._runtime = api_pb2_grpc.RuntimeServiceStub(self._channel)
        self._images = api_pb2_grpc.ImageServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, stub, rpc: str, request, timeout: float | None = -1.0):
        try:
            return getattr(stub, rpc)(request, timeout=self.timeout if timeout == -1.0 else timeout)
        except grpc.RpcError as e:
            raise error_from(rpc, e) from e

    # --- RuntimeService -----------------------------------------------------------------------------

    def version(self) -> api_pb2.VersionResponse:
        return self._call(self._runtime, "Version", api_pb2.VersionRequest(version="v1"))

    def status(self, verbose: bool = False) -> api_pb2.StatusResponse:
        return self._call(self._runtime, "Status", api_pb2.StatusRequest(verbose=verbose))

    def run_pod_sandbox(self, config: api_pb2.PodSandboxConfig, runtime_handler: str = "") -> str:
        return self._call(self._runtime, "RunPodSandbox", api_pb2.RunPodSandboxRequest(
            config=config, runtime_handler=runtime_handler)).pod_sandbox_id

    def stop_pod_sandbox(self, pod_sandbox_id: str) -> None:
        self._call(self._runtime, "StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_sandbox_id))

    def remove_pod_sandbox(self, pod_sandbox_id: str) -> None:
        self._call(self._runtime, "RemovePodSandbox",
                   api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_sandbox_id))

    def pod_sandbox_status(self, pod_sandbox_id: str, verbose: bool = False) -> api_pb2.PodSandboxStatusResponse:
        return self._call(self._runtime, "PodSandboxStatus",
                          api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_sandbox_id, verbose=verbose))

    def list_pod_sandbox(self, filter: api_pb2.PodSandboxFilter | None = None) -> list[api_pb2.PodSandbox]:
        return list(self._call(self._runtime, "ListPodSandbox", api_pb2.ListPodSandboxRequest(filter=filter)).items)

    def create_container(self, pod_sandbox_id: str, config: api_pb2.ContainerConfig,
                         sandbox_config: api_pb2.PodSandboxConfig) -> str:
        return self._call(self._runtime, "CreateContainer", api_pb2.CreateContainerRequest(
            pod_sandbox_id=pod_sandbox_id, config=config, sandbox_config=sandbox_config)).container_id

    def start_container(self, container_id: str) -> None:
        self._call(self._runtime, "StartContainer", api_pb2.StartContainerRequest(container_id=container_id))

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        """`timeout` is the grace period in seconds before SIGKILL; the call may last that long."""
        self._call(self._runtime, "StopContainer", api_pb2.StopContainerRequest(
            container_id=container_id, timeout=timeout), timeout=self.timeout + timeout)

    def remove_container(self, container_id: str) -> None:
        self._call(self._runtime, "RemoveContainer", api_pb2.RemoveContainerRequest(container_id=container_id))

    def list_containers(self, filter: api_pb2.ContainerFilter | None = None) -> list[api_pb2.Container]:
        return list(self._call(self._runtime, "ListContainers",
                               api_pb2.ListContainersRequest(filter=filter)).containers)

    def container_status(self, container_id: str, verbose: bool = False) -> api_pb2.ContainerStatusResponse:
        return self._call(self._runtime, "ContainerStatus",
                          api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose))

    def reopen_container_log(self, container_id: str) -> None:
        self._call(self._runtime, "ReopenContainerLog",
                   api_pb2.ReopenContainerLogRequest(container_id=container_id))

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> tuple[bytes, bytes, int]:
        """Runs `cmd` in the container; `timeout` seconds (0: none) is the runtime's, the call gets a margin."""
        r = self._call(self._runtime, "ExecSync", api_pb2.ExecSyncRequest(
            container_id=container_id, cmd=cmd, timeout=timeout), timeout=timeout + 10 if timeout else None)
        return r.stdout, r.stderr, r.exit_code

    def exec(self, request: api_pb2.ExecRequest) -> str:
        return self._call(self._runtime, "Exec", request).url

    def attach(self, request: api_pb2.AttachRequest) -> str:
        return self._call(self._runtime, "Attach", request).url

    def port_forward(self, request: api_pb2.PortForwardRequest) -> str:
        return self._call(self._runtime, "PortForward", request).url

    def container_stats(self, container_id: str) -> api_pb2.ContainerStats:
        return self._call(self._runtime, "ContainerStats",
                          api_pb2.ContainerStatsRequest(container_id=container_id)).stats

    def list_container_stats(self, filter: api_pb2.ContainerStatsFilter | None = None) -> list[api_pb2.ContainerStats]:
        return list(self._call(self._runtime, "ListContainerStats",
                               api_pb2.ListContainerStatsRequest(filter=filter)).stats)

    def update_container_resources(self, container_id: str, linux: api_pb2.LinuxContainerResources) -> None:
        self._call(self._runtime, "UpdateContainerResources", api_pb2.UpdateContainerResourcesRequest(
            container_id=container_id, linux=linux))

    def update_pod_sandbox_resources(self, pod_sandbox_id: str, resources: api_pb2.LinuxContainerResources) -> None:
        self._call(self._runtime, "UpdatePodSandboxResources", api_pb2.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id=pod_sandbox_id, resources=resources))

    def runtime_config(self) -> api_pb2.RuntimeConfigResponse:
        return self._call(self._runtime, "RuntimeConfig", api_pb2.RuntimeConfigRequest())

    def update_runtime_config(self, pod_cidr: str) -> None:
        self._call(self._runtime, "UpdateRuntimeConfig", api_pb2.UpdateRuntimeConfigRequest(
            runtime_config=api_pb2.RuntimeConfig(network_config=api_pb2.NetworkConfig(pod_cidr=pod_cidr))))

    def container_events(self) -> Iterator[api_pb2.ContainerEventResponse]:
        """The runtime's container event stream, until the caller stops iterating or the runtime ends it.
        Raises Unimplemented (on the first next()) when the runtime has none, Unavailable when it goes away."""
        stream = self._runtime.GetContainerEvents(api_pb2.GetEventsRequest())
        try:
            yield from stream
        except grpc.RpcError as e:
            raise error_from("GetContainerEvents", e) from e
        finally:
            stream.cancel()

    # --- ImageService -------------------------------------------------------------------------------

    def pull_image(self, image: str, auth: api_pb2.AuthConfig | None = None,
                   sandbox_config: api_pb2.PodSandboxConfig | None = None) -> str:
        """Returns the image reference the runtime stored (its id or digest). No deadline: a pull's length
        is the image's; the runtime's own progress timeout bounds it."""
        return self._call(self._images, "PullImage", api_pb2.PullImageRequest(
            image=api_pb2.ImageSpec(image=image), auth=auth, sandbox_config=sandbox_config), timeout=None).image_ref

    def image_status(self, image: str, verbose: bool = False) -> api_pb2.ImageStatusResponse:
        """`.image` is unset (ByteSize() == 0) when the runtime does not have it."""
        return self._call(self._images, "ImageStatus", api_pb2.ImageStatusRequest(
            image=api_pb2.ImageSpec(image=image), verbose=verbose))

    def list_images(self, filter: api_pb2.ImageFilter | None = None) -> list[api_pb2.Image]:
        return list(self._call(self._images, "ListImages", api_pb2.ListImagesRequest(filter=filter)).images)

    def remove_image(self, image: str) -> None:
        self._call(self._images, "RemoveImage", api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image=image)))

    def image_fs_info(self) -> api_pb2.ImageFsInfoResponse:
        return self._call(self._images, "ImageFsInfo", api_pb2.ImageFsInfoRequest())
