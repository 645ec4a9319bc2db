"""A CRI runtime in memory, for pykubelet's unit tests: the CRIRuntime that pykubelet/runtime.py is, without a
socket, over sandboxes, containers and images that a test sets up and reads back, every call recorded.

Containers behave as a runtime's do, simply: created, running once started, exited (code 0 unless a test
makes one exit otherwise) once stopped, gone once removed; a sandbox is ready until stopped. A test
scripts the rest: `errors` (the error a call answers), `exec_answers` (ExecSync by command),
`registry_passwords`/`anonymous_pulls` (which pulls succeed), the runtime's conditions. A call this fake
does not answer raises UNIMPLEMENTED, as a runtime without it would.
"""
from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import grpc

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.pods.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID


class FakeCRI(cri.CRIRuntime):
    def __init__(self) -> None:  # no channel: every call is answered below
        self.endpoint, self.timeout = "unix:///fake/cri.sock", 0.0
        self.sandboxes: dict[str, api_pb2.PodSandbox] = {}
        self.sandbox_ips: dict[str, str] = {}
        self.statuses: dict[str, api_pb2.ContainerStatus] = {}  # the containers, by id
        self.sandbox_of: dict[str, str] = {}  # container id -> its sandbox's
        self.images: list[api_pb2.Image] = []
        self.stats: list[api_pb2.ContainerStats] = []  # what ListContainerStats answers
        self.memory_usage: dict[str, int] = {}  # ContainerStats: container id -> its memory usage (else none)
        self.conditions = {"RuntimeReady": api_pb2.RuntimeCondition(type="RuntimeReady", status=True),
                           "NetworkReady": api_pb2.RuntimeCondition(type="NetworkReady", status=True)}
        self.handlers: list[api_pb2.RuntimeHandler] = []
        self.info: dict[str, str] = {}  # Status(verbose)'s
        self.runtime_name, self.runtime_version = "fake", "0.1"
        self.image_fs_mountpoint = "/"
        self.errors: dict[str, cri.CRIError] = {}  # RPC name -> the error it answers
        self.exec_answers: dict[str, int | Exception] = {}  # ExecSync: cmd[0] -> exit code or error (else 0)
        self.registry_passwords: set[str] = set()  # PullImage with one of these passwords succeeds
        self.anonymous_pulls = True  # PullImage without credentials succeeds
        self.stream_url = ""  # what Exec answers
        self.pod_cidr = ""  # the last UpdateRuntimeConfig's
        self.calls: list[tuple] = []  # (RPC name, its arguments) of every call
        self.execs: list[api_pb2.ExecRequest] = []
        self.started: list[str] = []  # the containers started, in order
        self._clock = itertools.count(1)

    # --- what a test sets up -------------------------------------------------------------------------------

    def add_sandbox(self, sandbox_id: str, name: str = "p", namespace: str = "ns", uid: str = "uid-1",
                    ip: str = "10.0.0.9", ready: bool = True) -> api_pb2.PodSandbox:
        sandbox = self.sandboxes[sandbox_id] = api_pb2.PodSandbox(
            id=sandbox_id, metadata=api_pb2.PodSandboxMetadata(name=name, namespace=namespace, uid=uid),
            state=api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY, created_at=self._now(),
            labels={POD_NAME: name, POD_NAMESPACE: namespace, POD_UID: uid})
        self.sandbox_ips[sandbox_id] = ip
        return sandbox

    def add_container(self, container_id: str, name: str, sandbox_id: str = "",
                      state: api_pb2.ContainerState = api_pb2.CONTAINER_RUNNING, *, log_path: str = "",
                      image: str = "", image_ref: str = "", labels: dict[str, str] | None = None,
                      annotations: dict[str, str] | None = None) -> api_pb2.ContainerStatus:
        """A container named `name` (its label too), of the pod of `sandbox_id` (its labels too) if any."""
        pod = self.sandboxes[sandbox_id].labels if sandbox_id else {}
        status = self.statuses[container_id] = api_pb2.ContainerStatus(
            id=container_id, metadata=api_pb2.ContainerMetadata(name=name), state=state, created_at=self._now(),
            image=api_pb2.ImageSpec(image=image), image_ref=image_ref, log_path=log_path,
            labels={**pod, CONTAINER_NAME: name, **(labels or {})}, annotations=annotations or {})
        self.sandbox_of[container_id] = sandbox_id
        return status

    def add_image(self, image_id: str, *tags: str, size: int = 10, pinned: bool = False) -> api_pb2.Image:
        image = api_pb2.Image(id=image_id, repo_tags=list(tags), size=size, pinned=pinned)
        self.images.append(image)
        return image

    def set_condition(self, kind: str, ready: bool, reason: str = "", message: str = "") -> None:
        self.conditions[kind] = api_pb2.RuntimeCondition(type=kind, status=ready, reason=reason, message=message)

    def exit(self, container_id: str, code: int) -> None:
        """The container's process ends by itself with `code`."""
        status = self.statuses[container_id]
        status.state, status.exit_code, status.finished_at = api_pb2.CONTAINER_EXITED, code, time.time_ns()

    # --- the calls -------------------------------------------------------------------------------------------

    def _call(self, stub, rpc: str, request, timeout: float | None = -1.0):
        raise cri.Unimplemented(rpc, grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: not answered by the fake runtime")

    def close(self) -> None:
        pass

    def _rpc(self, rpc: str, *args) -> None:
        self.calls.append((rpc, *args))
        if rpc in self.errors:
            raise self.errors[rpc]

    def _now(self) -> int:
        return time.time_ns() + next(self._clock)  # distinct, so that newest-first orders are stable

    def _status(self, rpc: str, container_id: str) -> api_pb2.ContainerStatus:
        if container_id not in self.statuses:
            raise cri.NotFound(rpc, grpc.StatusCode.NOT_FOUND, f"container {container_id} not found")
        return self.statuses[container_id]

    def version(self) -> api_pb2.VersionResponse:
        self._rpc("Version")
        return api_pb2.VersionResponse(runtime_name=self.runtime_name, runtime_version=self.runtime_version,
                                       runtime_api_version="v1")

    def status(self, verbose: bool = False) -> api_pb2.StatusResponse:
        self._rpc("Status")
        return api_pb2.StatusResponse(status=api_pb2.RuntimeStatus(conditions=list(self.conditions.values())),
                                      runtime_handlers=self.handlers, info=self.info if verbose else {})

    def run_pod_sandbox(self, config: api_pb2.PodSandboxConfig, runtime_handler: str = "") -> str:
        self._rpc("RunPodSandbox", config)
        sandbox_id = f"sandbox-{config.metadata.uid}-{config.metadata.attempt}"
        self.sandboxes[sandbox_id] = api_pb2.PodSandbox(id=sandbox_id, metadata=config.metadata,
                                                        state=api_pb2.SANDBOX_READY, created_at=self._now(),
                                                        labels=config.labels, annotations=config.annotations)
        self.sandbox_ips[sandbox_id] = "10.0.0.9"
        return sandbox_id

    def stop_pod_sandbox(self, pod_sandbox_id: str) -> None:
        self._rpc("StopPodSandbox", pod_sandbox_id)
        if pod_sandbox_id in self.sandboxes:
            self.sandboxes[pod_sandbox_id].state = api_pb2.SANDBOX_NOTREADY

    def remove_pod_sandbox(self, pod_sandbox_id: str) -> None:
        self._rpc("RemovePodSandbox", pod_sandbox_id)
        self.sandboxes.pop(pod_sandbox_id, None)

    def pod_sandbox_status(self, pod_sandbox_id: str, verbose: bool = False) -> api_pb2.PodSandboxStatusResponse:
        self._rpc("PodSandboxStatus", pod_sandbox_id)
        if pod_sandbox_id not in self.sandboxes:
            raise cri.NotFound("PodSandboxStatus", grpc.StatusCode.NOT_FOUND, f"sandbox {pod_sandbox_id} not found")
        sandbox = self.sandboxes[pod_sandbox_id]
        return api_pb2.PodSandboxStatusResponse(status=api_pb2.PodSandboxStatus(
            id=pod_sandbox_id, metadata=sandbox.metadata, state=sandbox.state, labels=sandbox.labels,
            network=api_pb2.PodSandboxNetworkStatus(ip=self.sandbox_ips.get(pod_sandbox_id, ""))))

    def list_pod_sandbox(self, filter: api_pb2.PodSandboxFilter | None = None) -> list[api_pb2.PodSandbox]:
        self._rpc("ListPodSandbox")
        selector = dict(filter.label_selector) if filter is not None else {}
        return [s for s in self.sandboxes.values() if selector.items() <= dict(s.labels).items()]

    def create_container(self, pod_sandbox_id: str, config: api_pb2.ContainerConfig,
                         sandbox_config: api_pb2.PodSandboxConfig) -> str:
        """The container's id is NAME-ATTEMPT, so that a test names the containers a sync makes."""
        self._rpc("CreateContainer", pod_sandbox_id, config)
        container_id = f"{config.metadata.name}-{config.metadata.attempt}"
        self.statuses[container_id] = api_pb2.ContainerStatus(
            id=container_id, metadata=config.metadata, state=api_pb2.CONTAINER_CREATED, created_at=self._now(),
            image=config.image, image_ref=config.image.image, labels=config.labels, annotations=config.annotations,
            log_path=config.log_path, mounts=config.mounts)
        self.statuses[container_id].resources.linux.CopyFrom(config.linux.resources)
        self.sandbox_of[container_id] = pod_sandbox_id
        return container_id

    def start_container(self, container_id: str) -> None:
        self._rpc("StartContainer", container_id)
        status = self._status("StartContainer", container_id)
        status.state, status.started_at = api_pb2.CONTAINER_RUNNING, time.time_ns()
        self.started.append(container_id)

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        self._rpc("StopContainer", container_id, timeout)
        status = self._status("StopContainer", container_id)
        if status.state == api_pb2.CONTAINER_RUNNING:
            status.state, status.finished_at = api_pb2.CONTAINER_EXITED, time.time_ns()

    def remove_container(self, container_id: str) -> None:
        """Idempotent, as CRI's: a container removed already is no error."""
        self._rpc("RemoveContainer", container_id)
        self.statuses.pop(container_id, None)
        self.sandbox_of.pop(container_id, None)

    def list_containers(self, filter: api_pb2.ContainerFilter | None = None) -> list[api_pb2.Container]:
        self._rpc("ListContainers")
        selector = dict(filter.label_selector) if filter is not None else {}
        return [api_pb2.Container(id=s.id, pod_sandbox_id=self.sandbox_of.get(s.id, ""), metadata=s.metadata,
                                  image=s.image, image_ref=s.image_ref, state=s.state, created_at=s.created_at,
                                  labels=s.labels, annotations=s.annotations)
                for s in self.statuses.values()
                if selector.items() <= dict(s.labels).items() and (filter is None or not filter.HasField("state")
                                                                   or filter.state.state == s.state)]

    def container_status(self, container_id: str, verbose: bool = False) -> api_pb2.ContainerStatusResponse:
        self._rpc("ContainerStatus", container_id)
        status = api_pb2.ContainerStatus()
        status.CopyFrom(self._status("ContainerStatus", container_id))
        return api_pb2.ContainerStatusResponse(status=status)

    def reopen_container_log(self, container_id: str) -> None:
        self._rpc("ReopenContainerLog", container_id)
        Path(self._status("ReopenContainerLog", container_id).log_path).touch()

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> tuple[bytes, bytes, int]:
        self._rpc("ExecSync", container_id, tuple(cmd), timeout)
        answer = self.exec_answers.get(cmd[0], 0)
        if isinstance(answer, Exception):
            raise answer
        return b"out", b"", answer

    def exec(self, request: api_pb2.ExecRequest) -> str:
        self._rpc("Exec", request)
        self.execs.append(request)
        return self.stream_url

    def update_container_resources(self, container_id: str, linux: api_pb2.LinuxContainerResources) -> None:
        self._rpc("UpdateContainerResources", container_id, linux)
        self._status("UpdateContainerResources", container_id).resources.linux.CopyFrom(linux)

    def update_pod_sandbox_resources(self, pod_sandbox_id: str, resources: api_pb2.LinuxContainerResources) -> None:
        self._rpc("UpdatePodSandboxResources", pod_sandbox_id, resources)

    def container_stats(self, container_id: str) -> api_pb2.ContainerStats:
        self._rpc("ContainerStats", container_id)
        stats = api_pb2.ContainerStats(attributes=api_pb2.ContainerAttributes(id=container_id))
        if container_id in self.memory_usage:
            stats.memory.usage_bytes.value = self.memory_usage[container_id]
        return stats

    def list_container_stats(self, filter: api_pb2.ContainerStatsFilter | None = None) -> list[api_pb2.ContainerStats]:
        self._rpc("ListContainerStats")
        return list(self.stats)

    def update_runtime_config(self, pod_cidr: str) -> None:
        self._rpc("UpdateRuntimeConfig", pod_cidr)
        self.pod_cidr = pod_cidr

    def pull_image(self, image: str, auth: api_pb2.AuthConfig | None = None,
                   sandbox_config: api_pb2.PodSandboxConfig | None = None) -> str:
        """Succeeds with a password of `registry_passwords`, or without credentials when `anonymous_pulls`."""
        self._rpc("PullImage", image, None if auth is None else auth.password)
        if (auth is None and not self.anonymous_pulls) or (auth is not None and auth.password not in
                                                           self.registry_passwords):
            who = "anonymous" if auth is None else auth.username
            raise cri.CRIError("PullImage", grpc.StatusCode.UNKNOWN, f"{who}: 401 Unauthorized")
        found = self._image(image)
        return found.id if found is not None else self.add_image("sha256:" + "a" * 64, image).id

    def image_status(self, image: str, verbose: bool = False) -> api_pb2.ImageStatusResponse:
        self._rpc("ImageStatus", image)
        found = self._image(image)
        return api_pb2.ImageStatusResponse(image=found) if found is not None else api_pb2.ImageStatusResponse()

    def _image(self, ref: str) -> api_pb2.Image | None:
        return next((i for i in self.images if ref == i.id or ref in i.repo_tags), None)

    def list_images(self, filter: api_pb2.ImageFilter | None = None) -> list[api_pb2.Image]:
        self._rpc("ListImages")
        return list(self.images)

    def remove_image(self, image: str) -> None:
        self._rpc("RemoveImage", image)
        self.images = [i for i in self.images if i.id != image]

    def image_fs_info(self) -> api_pb2.ImageFsInfoResponse:
        self._rpc("ImageFsInfo")
        return api_pb2.ImageFsInfoResponse(image_filesystems=[api_pb2.FilesystemUsage(
            fs_id=api_pb2.FilesystemIdentifier(mountpoint=self.image_fs_mountpoint))])

    def sandbox_image(self, image: str) -> None:
        """The pause image the runtime reports in Status(verbose), as containerd's config."""
        self.info["config"] = json.dumps({"sandboxImage": image})
