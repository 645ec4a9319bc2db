"""A pod's pause from an image (`--sandbox-image`), beside the built-in one: which of the two a pod gets,
and how each is made and taken apart.

Some sites require the infra container to be an image they vet (a pause image from their own registry), as
containerd runs it. Such a pause is made the way any container is: its image pulled through the image
service (so the configured mirrors and credentials apply), a writable snapshot from the image store, a
config.json, and Runtime.create in a supervisor forked by the launcher (the daemon never forks), then
Runtime.start. Its config.json asks for new net, ipc and uts namespaces (and always a pid namespace of its
own, which the pod's containers join when the pod shares one), so the runtime makes them; for a pod with a
user namespace of its own, that one is made and pinned first, the rootfs idmapped through it, and the
container joins it, so that it owns the others. Once it is created
they are pinned under Layout.ns_dir exactly as the built-in pause pins its own, and the rest of the daemon
(CNI, containers joining by path, stats, recovery) can't tell the two apart: SandboxRecord.pause_pid is the
pause container's init, with its start time.

Everything of a pause container lives under `<sandbox dir>/pause` (bundle: config.json and the supervisor's
record; exit.json) and `<state>/sandboxes/<id>/pause` (the supervisor's socket); its runtime id is the
sandbox id and its snapshot key `pause-<sandbox id>`. release() finds it by that bundle, whichever pause the
daemon is configured for now: a restart with another setting still takes apart the pods made before.

Threat model: the image is code from a registry run as the pod's infra process, in the pod's namespaces
only, with no capabilities, no new privileges, a read-only rootfs and the runtime's default masked paths;
the sysctls it gets are checked as for the built-in pause (namespaced ones only).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from dataclasses import asdict, replace
from typing import Any

from proto import api_pb2
from pynode_os.files import atomic_write
from pynode_os.proc import process_alive, process_start_time
from pyruntime.cri.jobs import ContainerJob, PauseInfo, PauseJob, SupervisorInfo
from pyruntime.cri.model import Layout, SandboxRecord
from pyruntime.cri.ocispec import ANN_CONTAINER_TYPE, ANN_SANDBOX_ID, cgroups_path, restricted_oom_score_adj
from pyruntime.cri.pause import check_sysctls, pin, release_pause, unpin
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from pyruntime.images.mount import IdMap
from pyruntime.oci.default import MASKED, READONLY

log = logging.getLogger(__name__)

# containerd's defaultSandboxOOMAdj: the pause goes after every container (Guaranteed ones are -997), before the
# node's daemons (the kubelet's -999); never below this server's own score
SANDBOX_OOM_SCORE_ADJ = -998
EXIT_WAIT = 10.0  # seconds a killed pause's supervisor has to record the exit and go
SUPERVISOR_RECORD = "supervisor.json"  # the pause's supervisor (pid, start time), in its bundle


def snapshot_key(sandbox_id: str) -> str:
    return f"pause-{sandbox_id}"


class Pauses:
    """run_pause/release for Sandboxes (its `launcher` and `release_pause`): the built-in pause through
    `launcher`, or with `image` set, that image as a container. `images`: cri/images.py's ImageService
    (pulls with the configured credentials); `runtime`: pyruntime.runtime.Runtime over Layout.runtime_root."""

    def __init__(self, image: str, *, launcher: Any, runtime: Any, images: Any, layout: Layout, kernel: Any,
                 cgroup_driver: str = "cgroupfs") -> None:
        self.image = image
        self.launcher = launcher
        self.runtime = runtime
        self.images = images
        self.layout = layout
        self.kernel = kernel
        self.cgroup_driver = cgroup_driver

    def bundle(self, sandbox_id: str) -> str:
        return os.path.join(self.layout.sandbox_dir(sandbox_id), "pause")

    def _supervisor_dir(self, sandbox_id: str) -> str:
        return os.path.join(os.path.dirname(self.layout.ns_dir(sandbox_id)), "pause")

    # ---- run ----------------------------------------------------------------------------------------------

    def run_pause(self, job: PauseJob) -> PauseInfo:
        if not self.image:
            return self.launcher.run_pause(replace(job, systemd_cgroup=self.cgroup_driver == "systemd"))
        check_sysctls(job.sysctls, new_net=job.new_net, new_ipc=job.new_ipc)
        bundle = self.bundle(job.sandbox_id)
        os.makedirs(bundle, mode=0o700, exist_ok=True)
        try:
            return self._run(job, bundle)
        except BaseException:
            try:
                self._release(job.sandbox_id, job.ns_dir)
            except Exception:
                log.exception("pod sandbox %s: undoing a failed pause container", job.sandbox_id)
            raise

    def _run(self, job: PauseJob, bundle: str) -> PauseInfo:
        image = self._pulled()
        user_ns = self._user_namespace(job) if job.uid_map else None
        idmap = IdMap(user_ns, job.uid_map[0][1], job.gid_map[0][1]) if user_ns else None
        rootfs = str(self.images.store.prepare_rootfs(image.id, snapshot_key(job.sandbox_id), idmap))
        image_config = json.loads(self.images.store.content.read(image.config_digest)).get("config") or {}
        spec = self.spec(job, image_config, rootfs, user_ns)
        atomic_write(os.path.join(bundle, "config.json"), json.dumps(spec).encode(), mode=0o600)
        info: SupervisorInfo = self.launcher.create_container(ContainerJob(
            container_id=job.sandbox_id, bundle=bundle, log_path="", tty=False, stdin=False, stdin_once=False,
            exit_path=os.path.join(bundle, "exit.json"), supervisor_dir=self._supervisor_dir(job.sandbox_id)))
        atomic_write(os.path.join(bundle, SUPERVISOR_RECORD), json.dumps(asdict(info)).encode(), mode=0o600)
        namespaces = pin(job, self.kernel, proc=str(info.init_pid), user=False)
        if user_ns:
            namespaces["user"] = user_ns
        if job.share_pid:
            namespaces["pid"] = f"/proc/{info.init_pid}/ns/pid"
        start = process_start_time(info.init_pid)
        if start is None:
            raise FailedPreconditionError(f"sandbox_image {self.image}: the pause container's init "
                                          f"({info.init_pid}) exited before it started")
        self.runtime.start(job.sandbox_id)
        return PauseInfo(pid=info.init_pid, start_time=start, namespaces=namespaces)

    def _user_namespace(self, job: PauseJob) -> str:
        """The pod's user namespace, made and pinned before the pause container: its rootfs is idmapped
        through it (the image's files the pod root's, as in the pod's containers), and the container joins
        it to make the namespaces it will own. Made by the launcher's built-in pause step, asked for that
        namespace alone (the daemon, with gRPC's threads, never forks)."""
        alone = replace(job, hostname="", new_net=False, new_ipc=False, new_uts=False, share_pid=False,
                        sysctls={}, cgroup_parent="")
        return self.launcher.run_pause(alone).namespaces["user"]

    def _pulled(self) -> Any:
        """The sandbox image, pulled first if the store lacks it (as containerd pulls its sandbox image)."""
        try:
            return self.images.store.get(self.image)
        except NotFoundError:
            pass
        log.info("pulling the sandbox image %s", self.image)
        self.images.pull_image(api_pb2.ImageSpec(image=self.image))
        return self.images.store.get(self.image)

    def spec(self, job: PauseJob, image: dict, rootfs: str, user_ns: str | None = None) -> dict:
        """The pause container's config.json: the image's command as an unprivileged pod infra process;
        `user_ns`: the pod's user namespace, to join."""
        args = list(image.get("Entrypoint") or []) + list(image.get("Cmd") or [])
        if not args:
            raise InvalidArgumentError(f"sandbox_image: {self.image} has neither Entrypoint nor Cmd")
        user = {"uid": 0, "gid": 0}
        if image.get("User"):
            uid, _, gid = image["User"].partition(":")
            if not uid.isdigit() or (gid and not gid.isdigit()):
                raise InvalidArgumentError(f"sandbox_image: {self.image}: User {image['User']!r} must be numeric "
                                           "(a pause image has no /etc/passwd to look names up in)")
            user = {"uid": int(uid), "gid": int(gid or uid)}
        namespaces = [{"type": "user", "path": user_ns}] if user_ns else []
        namespaces += [{"type": "mount"}, {"type": "pid"}]
        namespaces += [{"type": kind} for kind, new in (("network", job.new_net), ("ipc", job.new_ipc),
                                                         ("uts", job.new_uts)) if new]
        spec: dict = {
            "ociVersion": "1.2.1",
            "process": {"terminal": False, "user": user, "args": args, "env": list(image.get("Env") or []),
                        "cwd": image.get("WorkingDir") or "/", "noNewPrivileges": True,
                        "oomScoreAdj": restricted_oom_score_adj(SANDBOX_OOM_SCORE_ADJ),
                        "capabilities": {k: [] for k in ("bounding", "effective", "permitted")}},
            "root": {"path": rootfs, "readonly": True},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            ],
            "linux": {"namespaces": namespaces, "sysctl": dict(job.sysctls), "maskedPaths": list(MASKED),
                      "readonlyPaths": list(READONLY), "resources": {"devices": [{"allow": False, "access": "rwm"}]},
                      "cgroupsPath": cgroups_path(job.cgroup_parent, job.sandbox_id, self.cgroup_driver)},
            "annotations": {ANN_CONTAINER_TYPE: "sandbox", ANN_SANDBOX_ID: job.sandbox_id},
        }
        if job.new_uts and job.hostname:
            spec["hostname"] = job.hostname
        return spec

    # ---- release ------------------------------------------------------------------------------------------

    def release(self, record: SandboxRecord, ns_dir: str) -> None:
        """Kills the pod's pause, whichever kind it is, and takes apart what it held. Idempotent."""
        self._release(record.id, ns_dir, record)

    def _release(self, sandbox_id: str, ns_dir: str, record: SandboxRecord | None = None) -> None:
        bundle = self.bundle(sandbox_id)
        if os.path.isdir(bundle):
            self._kill(sandbox_id, bundle)
            self.runtime.delete(sandbox_id, force=True)
            self.images.store.release_rootfs(snapshot_key(sandbox_id))
            shutil.rmtree(self._supervisor_dir(sandbox_id), ignore_errors=True)
        if record is not None:
            # a built-in pause; and the pins of either
            release_pause(record, ns_dir, self.kernel, systemd=self.cgroup_driver == "systemd")
        else:
            unpin(ns_dir, self.kernel)
        shutil.rmtree(bundle, ignore_errors=True)

    def _kill(self, sandbox_id: str, bundle: str) -> None:
        """SIGKILL to every process of the pause container, then its supervisor's exit record (or its end)."""
        try:
            self.runtime.kill(sandbox_id, signal.SIGKILL, all_processes=True)
        except (NotFoundError, FailedPreconditionError) as e:  # never created, or stopped already
            log.debug("pod sandbox %s: kill pause: %s", sandbox_id, e)
        try:
            with open(os.path.join(bundle, SUPERVISOR_RECORD), "rb") as f:
                supervisor = json.loads(f.read())
        except (OSError, ValueError):
            return  # no supervisor was made
        deadline = time.monotonic() + EXIT_WAIT
        while (not os.path.exists(os.path.join(bundle, "exit.json"))
               and process_alive(supervisor["pid"], supervisor["start_time"]) and time.monotonic() < deadline):
            time.sleep(0.01)
