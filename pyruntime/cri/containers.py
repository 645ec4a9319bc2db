"""The container half of the CRI RuntimeService: create, start, stop, remove, status, list, update, exec-sync,
log reopening, and the settling of containers whose supervisor ended.

Crash safety: each step is preceded by the record that lets a restarted daemon finish or undo it
(container.json before the rootfs and the supervisor; started_at before Runtime.start), and the state the CRI
sees is derived from the records, never kept apart from them: exit.json -> EXITED, started_at -> RUNNING,
else CREATED. A container whose supervisor is gone without an exit record is settled the one way that is
always true: killed, and recorded as exited with "supervisor died" (the watcher, and recover() at start-up).

A failed CreateContainer undoes everything it made (runtime container, mounts, writable layer, directories,
name), so the kubelet's retry starts clean. Remove is idempotent: each step tolerates its object already gone.
The daemon never forks: containers are made by the launcher (a fork server), everything else calls
pyruntime's Runtime directly.
"""
from __future__ import annotations

import builtins
import json
import logging
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from proto import api_pb2
from pynode_os.files import DATA, NONE, atomic_write, make_dirs
from pyruntime.cri import stats
from pyruntime.cri.events import EventHub
from pyruntime.cri.model import ContainerRecord, ExitRecord, Layout, decode_pb, encode_pb
from pyruntime.cri.ocispec import image_volume_dir
from pyruntime.cri.store import RecordStore, container_name
from pyruntime.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from pyruntime.images.mount import IdMap, mount_all, unmount
from pyruntime.runtime import parse_signal

log = logging.getLogger(__name__)

EXEC_OUTPUT_CAP = 16 * 1024 * 1024  # bytes of stdout and of stderr ExecSync keeps (the kubelet's own cap)
KILL_GRACE = 10.0  # seconds a SIGKILLed container has to be reaped and recorded by its supervisor
SUPERVISOR_DIED = "supervisor died"


class ExecTimeoutError(UnavailableError):
    """ExecSync's command outlived its timeout (killed). A retry may succeed, hence Unavailable; the gRPC
    layer answers DEADLINE_EXCEEDED, which is what a kubelet's probe counts as a timeout."""


def _now() -> int:
    return time.time_ns()


def _idmap(sandbox: Any, sandbox_config: api_pb2.PodSandboxConfig) -> IdMap | None:
    """For a pod with a user namespace of its own: its root is to own the files root owns in the image."""
    path = sandbox.namespaces.get("user")
    if not path:
        return None
    opts = sandbox_config.linux.security_context.namespace_options.userns_options
    return IdMap(path, opts.uids[0].host_id, opts.gids[0].host_id)  # container id 0: checked at RunPodSandbox


class Containers:
    """`launcher`: cri/launcher.py's Launcher; `runtime`: pyruntime.runtime.Runtime over layout.runtime_root;
    `images`: pyruntime.images.store.ImageStore; `container_spec`: ocispec.container_spec; `linux_resources`:
    a CRI LinuxContainerResources -> the OCI linux.resources dict (ocispec's); `reopen_log`: attach.reopen_log;
    `job_types`: cri/jobs.py's (ContainerJob, ExecJob). All are parameters so that unit tests
    pass fakes."""

    def __init__(self, store: RecordStore, layout: Layout, *, launcher: Any, runtime: Any, images: Any,
                 events: EventHub, container_spec: Callable[..., dict], linux_resources: Callable[[Any], dict],
                 reopen_log: Callable[[str], None], job_types: tuple[type, type], kernel: Any,
                 cgroup_driver: str = "cgroupfs") -> None:
        self.store = store
        self.layout = layout
        self.launcher = launcher
        self.runtime = runtime
        self.images = images
        self.events = events
        self.container_spec = container_spec
        self.linux_resources = linux_resources
        self.reopen_log = reopen_log
        self.ContainerJob, self.ExecJob = job_types
        self.kernel = kernel
        self.cgroup_driver = cgroup_driver
        self.watch: Callable[[str, int, int], None] = lambda cid, pid, start: None  # set to the watcher's
        # A sandbox status for the container events; sandbox.py's Sandboxes sets it (it owns pod status).
        self.pod_status: Callable[[str], api_pb2.PodSandboxStatus | None] = lambda sandbox_id: None
        self._exited = threading.Condition()
        self._reported: set[str] = set()  # containers whose STOPPED event went out (stop() or the watcher)

    # ---- create / start -----------------------------------------------------------------------------------

    def create(self, req: api_pb2.CreateContainerRequest) -> str:
        config = req.config
        sandbox = self.store.sandbox(req.pod_sandbox_id)
        if not sandbox.ready:
            raise FailedPreconditionError(f"pod sandbox {sandbox.id} is not ready: no containers can be created in it")
        if not config.metadata.name:
            raise InvalidArgumentError("config.metadata.name: must not be empty")
        if not config.image.image:
            raise InvalidArgumentError("config.image.image: must not be empty")
        container_id = secrets.token_hex(32)
        name = container_name(sandbox.id, config)
        self.store.reserve(name, container_id, "container")
        try:
            with self.store.lock(container_id):
                self._create(container_id, sandbox, config)
        except BaseException:
            self._undo_create(container_id)
            self.store.release(name, container_id)
            raise
        self._emit(container_id, api_pb2.CONTAINER_CREATED_EVENT)
        return container_id

    def _create(self, container_id: str, sandbox: Any, config: api_pb2.ContainerConfig) -> None:
        image = self.images.get(config.image.image)
        volumes = self._image_volumes(config)
        sandbox_config = decode_pb(api_pb2.PodSandboxConfig, sandbox.config)
        log_path = ""
        if sandbox_config.log_directory and config.log_path:
            log_path = os.path.join(sandbox_config.log_directory, config.log_path)
        record = ContainerRecord(id=container_id, sandbox_id=sandbox.id, config=encode_pb(config),
                                 created_at=_now(), image_ref=config.image.image, image_id=image.id,
                                 log_path=log_path)
        self.store.save_container(record)
        bundle = self.layout.bundle(container_id)
        rootfs = os.path.join(bundle, "rootfs")
        userns = _idmap(sandbox, sandbox_config)
        # containerd's bundle mode since CVE-2021-41103: below is the container's whole filesystem, setuid
        # files included, which a host user must not reach; 0710 to the group of a user namespace's root, as
        # containerd's, whose init names the rootfs from the bundle after it entered that namespace
        make_dirs(bundle, 0o700, chmod=self.kernel.chmod)
        if userns is not None:
            self.kernel.chown(bundle, -1, userns.root_gid)
            self.kernel.chmod(bundle, 0o710)
        os.makedirs(rootfs, mode=0o755, exist_ok=True)
        self._mount_rootfs(image.id, container_id, rootfs, userns)
        for index, image_id in volumes.items():
            target = image_volume_dir(self.layout, container_id, index)
            os.makedirs(target, mode=0o755, exist_ok=True)
            self._mount_rootfs(image_id, f"{container_id}-{os.path.basename(target)}", target, userns)
        image_config = json.loads(self.images.content.read(image.config_digest))
        spec = self.container_spec(config, sandbox, sandbox_config, image_config, rootfs, layout=self.layout,
                                   cgroup_driver=self.cgroup_driver, container_id=container_id,
                                   kernel=self.kernel, target_pid_ns=self._pid_namespace_of)
        atomic_write(os.path.join(bundle, "config.json"), json.dumps(spec).encode(), mode=0o600, sync=NONE)
        if log_path:
            os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
        supervisor_dir = self.layout.supervisor_dir(container_id)
        os.makedirs(supervisor_dir, mode=0o700, exist_ok=True)
        info = self.launcher.create_container(self.ContainerJob(
            container_id=container_id, bundle=bundle, log_path=log_path, tty=config.tty, stdin=config.stdin,
            stdin_once=config.stdin_once, exit_path=self.layout.exit_record(container_id),
            supervisor_dir=supervisor_dir))
        record.supervisor_pid, record.supervisor_start_time = info.pid, info.start_time
        record.init_pid = info.init_pid
        self.store.save_container(record, sync=DATA)  # adds only live processes' pids and start times
        self.watch(container_id, info.pid, info.start_time)

    def _image_volumes(self, config: api_pb2.ContainerConfig) -> dict[int, str]:
        """config.mounts index -> image id of each image volume; the id goes into the request's ImageSpec
        (image_ref), which ContainerStatus reports back as the kubelet expects."""
        out = {}
        for index, mount in enumerate(config.mounts):
            if mount.HasField("image") and mount.image.image:
                try:
                    out[index] = mount.image.image_ref = self.images.get(mount.image.image).id
                except NotFoundError as e:
                    raise NotFoundError(f"config.mounts[{index}].image: {e}") from e
        return out

    def _mount_rootfs(self, image_id: str, container_id: str, rootfs: str, userns: IdMap | None) -> None:
        """The image store's writable snapshot, mounted at the bundle's rootfs (or, for an image volume, at
        its directory, bound read-only into the container); where the kernel refuses the overlay the store's
        copy snapshotter stands in (as ImageStore.prepare_rootfs does)."""
        prepared = self.images.prepare_mounts(image_id, container_id)
        try:
            mount_all(prepared.mounts, rootfs, self.kernel, userns)
        except OSError:
            if prepared.driver != "overlay":
                raise
            unmount(rootfs, self.kernel)
            self.images.release_rootfs(container_id)
            prepared = self.images.prepare_mounts(image_id, container_id, driver="copy")
            mount_all(prepared.mounts, rootfs, self.kernel, userns)

    def _undo_create(self, container_id: str) -> None:
        try:
            self._dismantle(container_id)
        except Exception:
            log.exception("container %s: undoing a failed create", container_id)

    def start(self, container_id: str) -> None:
        record = self.store.container(container_id)
        with self.store.lock(record.id):
            if self.store.exit_of(record.id) is not None:
                raise FailedPreconditionError(f"container {record.id} has exited: it can't be started again")
            if record.started_at:
                raise FailedPreconditionError(f"container {record.id} is already started")
            record.started_at = _now()
            self.store.save_container(record, sync=DATA)  # a power cut ends the process it dates, as the pids
            try:
                self.runtime.start(record.id)
            except BaseException:
                record.started_at = 0
                self.store.save_container(record, sync=DATA)
                raise
        self._emit(record.id, api_pb2.CONTAINER_STARTED_EVENT)

    # ---- stop / remove ------------------------------------------------------------------------------------

    def stop(self, container_id: str, timeout: int) -> None:
        """The stop signal, `timeout` seconds, then SIGKILL to every process; returns once the exit is
        recorded. Stopping an exited or unknown container is a success (the CRI: stop is idempotent, and a
        kubelet retries it after a remove it did not see answered)."""
        try:
            record = self.store.container(container_id)
        except NotFoundError:
            return
        with self.store.lock(record.id):
            if self.store.exit_of(record.id) is not None:
                return
            if timeout > 0 and record.started_at:
                self._kill(record.id, self._stop_signal(record), all_processes=False)
                if self.wait_exit(record.id, timeout):
                    self._report_exit(record.id)
                    return
            self._kill(record.id, signal.SIGKILL, all_processes=True)
            if not self.wait_exit(record.id, KILL_GRACE):
                raise UnavailableError(f"container {record.id}: no exit recorded {KILL_GRACE:.0f}s after SIGKILL "
                                       "(its supervisor is still running)")
        self._report_exit(record.id)

    def _report_exit(self, container_id: str) -> None:
        """The STOPPED event, once per container, from whichever sees the exit first: StopContainer returning
        or the watcher seeing the supervisor go."""
        with self._exited:
            if container_id in self._reported:
                return
            self._reported.add(container_id)
            self._exited.notify_all()
        self._emit(container_id, api_pb2.CONTAINER_STOPPED_EVENT)

    def _stop_signal(self, record: ContainerRecord) -> int:
        """The request's stop signal, else the image's StopSignal, else SIGTERM; an image's signal that is no
        signal is logged and SIGTERM used, so a bad image can't make a container unstoppable."""
        config = decode_pb(api_pb2.ContainerConfig, record.config)
        if config.stop_signal != api_pb2.SIGNAL_RUNTIME_DEFAULT:
            return parse_signal(api_pb2.Signal.Name(config.stop_signal).removeprefix("SIGNAL_"))
        try:
            image_signal = self.images.get(record.image_id).config.stop_signal
        except NotFoundError:  # the image was removed since: the runtime's default
            image_signal = ""
        try:
            return parse_signal(image_signal) if image_signal else signal.SIGTERM
        except InvalidArgumentError as e:
            log.warning("container %s: image StopSignal %r: %s; using SIGTERM", record.id, image_signal, e)
            return signal.SIGTERM

    def _kill(self, container_id: str, sig: int | str, all_processes: bool) -> None:
        try:
            self.runtime.kill(container_id, sig, all_processes=all_processes)
        except (NotFoundError, FailedPreconditionError) as e:  # already stopped, or gone from the runtime
            log.debug("container %s: kill %s: %s", container_id, sig, e)

    def wait_exit(self, container_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._exited:
            while self.store.exit_of(container_id) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._exited.wait(min(left, 0.5))  # also polls: an exit.json written before a restart
        return True

    def remove(self, container_id: str) -> None:
        """Kills what still runs, deletes the runtime's container, its mounts, writable layer and directories.
        A container already gone is a success."""
        try:
            record = self.store.container(container_id)
        except NotFoundError:
            return
        with self.store.lock(record.id):
            if self.store.exit_of(record.id) is None:
                self._kill(record.id, signal.SIGKILL, all_processes=True)
                if self.wait_exit(record.id, KILL_GRACE):
                    self._report_exit(record.id)
            self._dismantle(record.id)
            with self._exited:
                self._reported.discard(record.id)
            config = decode_pb(api_pb2.ContainerConfig, record.config)
            self.store.release(container_name(record.sandbox_id, config), record.id)
        self._emit(record.id, api_pb2.CONTAINER_DELETED_EVENT, record=record)

    def _pid_namespace_of(self, container_id: str) -> str:
        """The pid namespace a TARGET-mode container joins: that of the running container it names."""
        try:
            record = self.running(container_id)
        except FailedPreconditionError as e:
            raise FailedPreconditionError(f"config.linux.security_context.namespace_options.target_id: {e}") from e
        return f"/proc/{record.init_pid}/ns/pid"

    def _dismantle(self, container_id: str) -> None:
        """Every step tolerates its object being gone already, so a half-made or half-removed container
        comes apart the same way."""
        self.runtime.delete(container_id, force=True)
        bundle = self.layout.bundle(container_id)
        unmount(os.path.join(bundle, "rootfs"), self.kernel)
        self.images.release_rootfs(container_id)
        for name in os.listdir(bundle) if os.path.isdir(bundle) else ():
            if name.startswith("image-volume-"):
                unmount(os.path.join(bundle, name), self.kernel)
                self.images.release_rootfs(f"{container_id}-{name}")
        shutil.rmtree(self.layout.supervisor_dir(container_id), ignore_errors=True)
        shutil.rmtree(self.layout.container_dir(container_id), ignore_errors=True)
        self.store.forget_container(container_id)
        stats.forget(container_id)

    # ---- supervisors ending -------------------------------------------------------------------------------

    def supervisor_exited(self, container_id: str) -> None:
        """The watcher's callback. Without exit.json the supervisor died before its container: the container is
        killed (nothing would reap or log it any more) and its exit recorded in the supervisor's place."""
        try:
            record = self.store.container(container_id)
        except NotFoundError:
            return  # removed meanwhile
        if self.store.exit_of(record.id) is None:
            self._kill(record.id, signal.SIGKILL, all_processes=True)
            try:
                ExitRecord(exit_code=255, finished_at=_now(), reason="Error",
                           message=SUPERVISOR_DIED).dump(self.layout.exit_record(record.id))
            except FileNotFoundError:
                return  # its directory went: removed meanwhile
            log.warning("container %s: %s; killed it and recorded exit code 255", record.id, SUPERVISOR_DIED)
        self._report_exit(record.id)

    def recover(self) -> None:
        """After store.recover(): watch every live supervisor; settle (through the same callback) those gone."""
        for record in self.store.containers():
            if self.store.exit_of(record.id) is None:
                self.watch(record.id, record.supervisor_pid, record.supervisor_start_time)

    # ---- status / list ------------------------------------------------------------------------------------

    def status(self, container_id: str, verbose: bool = False) -> api_pb2.ContainerStatusResponse:
        record = self.store.container(container_id)
        response = api_pb2.ContainerStatusResponse(status=self._status(record))
        if verbose:
            response.info["info"] = json.dumps({
                "sandboxID": record.sandbox_id, "pid": record.init_pid, "supervisorPid": record.supervisor_pid,
                "bundle": self.layout.bundle(record.id), "runtimeSpec": self._spec(record)})
        return response

    def _spec(self, record: ContainerRecord) -> dict | None:
        try:
            with open(os.path.join(self.layout.bundle(record.id), "config.json"), "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def _state(self, record: ContainerRecord) -> tuple[api_pb2.ContainerState, ExitRecord | None]:
        exited = self.store.exit_of(record.id)
        if exited is not None:
            return api_pb2.CONTAINER_EXITED, exited
        return (api_pb2.CONTAINER_RUNNING if record.started_at else api_pb2.CONTAINER_CREATED), None

    def _status(self, record: ContainerRecord) -> api_pb2.ContainerStatus:
        config = decode_pb(api_pb2.ContainerConfig, record.config)
        state, exited = self._state(record)
        status = api_pb2.ContainerStatus(
            id=record.id, metadata=config.metadata, state=state, created_at=record.created_at,
            started_at=record.started_at, image=api_pb2.ImageSpec(image=record.image_ref),
            image_ref=self._image_ref(record), image_id=record.image_id, labels=config.labels,
            annotations=config.annotations, mounts=config.mounts, log_path=record.log_path,
            stop_signal=config.stop_signal)
        if config.linux.HasField("resources"):
            status.resources.linux.CopyFrom(config.linux.resources)
        user = ((self._spec(record) or {}).get("process") or {}).get("user")
        if user:  # the identity config.json starts the process with (supplemental groups policy shows here)
            status.user.linux.uid = user.get("uid", 0)
            status.user.linux.gid = user.get("gid", 0)
            status.user.linux.supplemental_groups.extend(user.get("additionalGids") or [])
        if exited is not None:
            status.finished_at = exited.finished_at
            status.exit_code = exited.exit_code
            status.reason = exited.reason
            status.message = exited.message
        return status

    def _image_ref(self, record: ContainerRecord) -> str:
        """The image's repo digest (what the kubelet shows as imageID), its id when it has none or is gone."""
        try:
            digests = self.images.get(record.image_id).repo_digests
        except NotFoundError:
            return record.image_id
        return digests[0] if digests else record.image_id

    def statuses(self, sandbox_id: str) -> builtins.list[api_pb2.ContainerStatus]:
        return [self._status(r) for r in self.store.containers(sandbox_id)]

    def list(self, f: api_pb2.ContainerFilter | None = None) -> builtins.list[api_pb2.Container]:
        out = []
        for record in self.store.containers():
            config = decode_pb(api_pb2.ContainerConfig, record.config)
            state, _ = self._state(record)
            if f is not None:
                if f.id and not record.id.startswith(f.id):
                    continue
                if f.pod_sandbox_id and not record.sandbox_id.startswith(f.pod_sandbox_id):
                    continue
                if f.HasField("state") and f.state.state != state:
                    continue
                if any(config.labels.get(k) != v for k, v in f.label_selector.items()):
                    continue
            out.append(api_pb2.Container(
                id=record.id, pod_sandbox_id=record.sandbox_id, metadata=config.metadata,
                image=api_pb2.ImageSpec(image=record.image_ref), image_ref=self._image_ref(record), state=state,
                created_at=record.created_at, labels=config.labels, annotations=config.annotations,
                image_id=record.image_id))
        return out

    # ---- update / log / exec ------------------------------------------------------------------------------

    def update_resources(self, container_id: str, resources: api_pb2.LinuxContainerResources) -> None:
        """The new limits go into the record first (ContainerStatus reports them), then to the cgroup."""
        record = self.store.container(container_id)
        with self.store.lock(record.id):
            if self.store.exit_of(record.id) is not None:
                raise FailedPreconditionError(f"container {record.id} has exited: its resources can't change")
            oci = self.linux_resources(resources)
            config = decode_pb(api_pb2.ContainerConfig, record.config)
            config.linux.resources.CopyFrom(resources)
            record.config = encode_pb(config)
            self.store.save_container(record)
            self.runtime.update(record.id, oci)

    def running(self, container_id: str) -> ContainerRecord:
        """The container's record; FailedPreconditionError when it is not running (exec, attach, log reopen)."""
        record = self.store.container(container_id)
        if self._state(record)[0] != api_pb2.CONTAINER_RUNNING:
            raise FailedPreconditionError(f"container {record.id} is not running")
        return record

    def reopen_container_log(self, container_id: str) -> None:
        record = self.running(container_id)
        self.reopen_log(os.path.join(self.layout.supervisor_dir(record.id), "supervisor.sock"))

    def exec_sync(self, container_id: str, cmd: builtins.list[str], timeout: int) -> api_pb2.ExecSyncResponse:
        """Runs `cmd` in the container, its output captured through pipes (each capped at EXEC_OUTPUT_CAP);
        `timeout` seconds (0: none) then the command is killed and ExecTimeoutError raised."""
        if not cmd:
            raise InvalidArgumentError("cmd: must not be empty")
        record = self.running(container_id)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            handle = self.launcher.exec(self.ExecJob(container_id=record.id, argv=list(cmd), tty=False),
                                        None, out_w, err_w)
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        readers = [_Drain(out_r), _Drain(err_r)]
        try:
            code = handle.wait(timeout if timeout > 0 else None)
            if code is None:
                handle.kill()
                raise ExecTimeoutError(f"container {record.id}: command {list(cmd)!r} timed out after {timeout}s")
            for r in readers:  # the command ended; a child of it may still hold the pipes: don't wait for good
                r.join(KILL_GRACE)
        finally:
            handle.close()
        return api_pb2.ExecSyncResponse(stdout=readers[0].data(), stderr=readers[1].data(), exit_code=code)

    # ---- events -------------------------------------------------------------------------------------------

    def _emit(self, container_id: str, kind: api_pb2.ContainerEventType,
              record: ContainerRecord | None = None) -> None:
        try:
            record = record or self.store.container(container_id)
        except NotFoundError:
            return
        event = api_pb2.ContainerEventResponse(container_id=container_id, container_event_type=kind,
                                               created_at=_now())
        pod = self.pod_status(record.sandbox_id)
        if pod is not None:
            event.pod_sandbox_status.CopyFrom(pod)
            event.containers_statuses.extend(self.statuses(record.sandbox_id))
        self.events.publish(event)


class _Drain(threading.Thread):
    """Reads one pipe to EOF, keeping at most EXEC_OUTPUT_CAP bytes (the rest is read and dropped, so the
    writer never blocks on a full pipe)."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="exec-output", daemon=True)
        self.fd = fd
        self.chunks: list[bytes] = []
        self.size = 0
        self.start()

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):
                if self.size < EXEC_OUTPUT_CAP:
                    self.chunks.append(chunk[:EXEC_OUTPUT_CAP - self.size])
                    self.size += len(self.chunks[-1])
        finally:
            os.close(self.fd)

    def data(self) -> bytes:
        return b"".join(self.chunks)
