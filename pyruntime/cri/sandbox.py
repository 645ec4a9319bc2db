"""The pod sandbox half of the CRI RuntimeService: run, stop, remove, status, list. A sandbox is a record, the
pod's namespaces pinned by bind mounts (and a pause process, only when the pod shares a pid namespace:
pause.py), the files its containers mount (resolv.conf, hostname, hosts in the sandbox dir) and, unless it
uses the host's network, a CNI attachment. RunPodSandbox writes the record first and then makes the rest in
order; a failure at any step takes apart everything made so far, so a failed pod leaves no address, process or
mount.

StopPodSandbox is the call the known anchors get wrong: a pod stuck Terminating because CNI DEL failed or the
netns had already gone, and its address leaked. Here it always succeeds: the pod is marked not ready first (a
restarted daemon sees that), the network teardown is asked to release the addresses whatever state the
netns is in, and a failure of it is logged, not returned. Remove is idempotent: an unknown id is success.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from typing import Any

from proto import api_pb2
from pynode_os.files import DATA, NONE, atomic_write
from pyruntime.cri import stats
from pyruntime.cri.containers import Containers
from pyruntime.cri.model import Layout, SandboxRecord, decode_pb, encode_pb
from pyruntime.cri.store import RecordStore, sandbox_name
from pyruntime.errors import InvalidArgumentError, NotFoundError, PyRuntimeError

log = logging.getLogger(__name__)

RUNTIME_HANDLERS = ("", "pyruntime", "runc")  # runc: the name a RuntimeClass made for containerd uses
ID_LIMIT = (1 << 32) - 1  # (uid_t)-1 is no id: the last id a user namespace can map is 2^32 - 2
DEFAULT_HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def resolv_conf(dns: api_pb2.DNSConfig) -> bytes:
    lines = [f"nameserver {s}" for s in dns.servers]
    if dns.searches:
        lines.append("search " + " ".join(dns.searches))
    if dns.options:
        lines.append("options " + " ".join(dns.options))
    return "".join(f"{line}\n" for line in lines).encode()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def user_namespace_maps(config: api_pb2.PodSandboxConfig) -> dict[str, list[list[int]]]:
    """The pause job's uid_map and gid_map for the pod's user namespace: empty for the host's (mode NODE,
    or no userns_options at all, whatever the enum's zero says); one range each for mode POD. Refuses, naming
    the field, what the kubelet never sends and containerd refuses too: other modes, more or fewer than one
    range, a range that leaves the pod's root unmapped, and a host namespace beside a user namespace of
    the pod's own (its network, IPC and pid namespaces would answer to the host's root, not the pod's)."""
    ns = config.linux.security_context.namespace_options
    where = "config.linux.security_context.namespace_options"
    if not ns.HasField("userns_options") or ns.userns_options.mode == api_pb2.NamespaceMode.NODE:
        return {"uid_map": [], "gid_map": []}
    opts = ns.userns_options
    if opts.mode != api_pb2.NamespaceMode.POD:
        raise InvalidArgumentError(f"{where}.userns_options.mode: {api_pb2.NamespaceMode.Name(opts.mode)}: a pod's "
                                   "user namespace is the host's (NODE) or its own (POD)")
    for kind in ("network", "ipc", "pid"):
        if getattr(ns, kind) == api_pb2.NamespaceMode.NODE:
            raise InvalidArgumentError(f"{where}.{kind}: NODE: the host's {kind} namespace can't go with a user "
                                       "namespace of the pod's own (userns_options.mode POD)")
    maps: dict[str, list[list[int]]] = {}
    for key, name in (("uids", "uid_map"), ("gids", "gid_map")):
        ranges = getattr(opts, key)
        if len(ranges) != 1:
            raise InvalidArgumentError(f"{where}.userns_options.{key}: {len(ranges)} mappings: a pod's user "
                                       "namespace takes exactly one")
        m = ranges[0]
        if m.container_id != 0:
            raise InvalidArgumentError(f"{where}.userns_options.{key}[0].container_id: {m.container_id}: the "
                                       "pod's root (id 0) must be mapped")
        if not 0 < m.length <= ID_LIMIT - m.host_id:
            raise InvalidArgumentError(f"{where}.userns_options.{key}[0]: host_id {m.host_id} and length "
                                       f"{m.length}: not a non-empty range of host ids below {ID_LIMIT}")
        maps[name] = [[m.container_id, m.host_id, m.length]]
    return maps


class Sandboxes:
    """`launcher`: cri/launcher.py's Launcher (run_pause); `pause_job`: cri/jobs.py's PauseJob;
    `release_pause(record, ns_dir)`: kills the pause (pid and start time checked) and unmounts the pins,
    idempotent; `network`: cri/network.py's Network. Parameters, so unit tests pass fakes."""

    def __init__(self, store: RecordStore, layout: Layout, containers: Containers, *, launcher: Any, pause_job: type,
                 release_pause: Callable[[SandboxRecord, str], None], network: Any) -> None:
        self.store = store
        self.layout = layout
        self.containers = containers
        self.launcher = launcher
        self.PauseJob = pause_job
        self.release_pause = release_pause
        self.network = network
        containers.pod_status = self._pod_status

    # ---- run ----------------------------------------------------------------------------------------------

    def run(self, req: api_pb2.RunPodSandboxRequest) -> str:
        config = req.config
        for field in ("name", "namespace", "uid"):
            if not getattr(config.metadata, field):
                raise InvalidArgumentError(f"config.metadata.{field}: must not be empty")
        user_namespace_maps(config)  # refused before anything is made
        if req.runtime_handler not in RUNTIME_HANDLERS:
            raise NotFoundError(f"runtime_handler: no runtime handler {req.runtime_handler!r} (this runtime has "
                                f"{', '.join(repr(h) for h in RUNTIME_HANDLERS)})")
        sandbox_id = secrets.token_hex(32)
        name = sandbox_name(config)
        self.store.reserve(name, sandbox_id, "pod sandbox")
        record = SandboxRecord(id=sandbox_id, config=encode_pb(config), created_at=time.time_ns(),
                               runtime_handler=req.runtime_handler, cgroup_parent=config.linux.cgroup_parent)
        try:
            with self.store.lock(sandbox_id):
                self.store.save_sandbox(record)
                self._run(record, config)
        except BaseException:
            try:
                self._teardown(record, config)
                self._dismantle(record.id)
            except Exception:
                log.exception("pod sandbox %s: undoing a failed run", sandbox_id)
            self.store.release(name, sandbox_id)
            raise
        return sandbox_id

    def _run(self, record: SandboxRecord, config: api_pb2.PodSandboxConfig) -> None:
        options = config.linux.security_context.namespace_options
        host_network = options.network == api_pb2.NODE
        self._write_files(record.id, config, host_network)
        info = self.launcher.run_pause(self.PauseJob(
            sandbox_id=record.id, ns_dir=self.layout.ns_dir(record.id), hostname=config.hostname,
            new_net=not host_network, new_ipc=options.ipc != api_pb2.NODE, new_uts=not host_network,
            share_pid=options.pid == api_pb2.POD, sysctls=dict(config.linux.sysctls),
            cgroup_parent=config.linux.cgroup_parent, **user_namespace_maps(config)))
        record.pause_pid, record.pause_start_time = info.pid, info.start_time
        record.namespaces, record.pinned = dict(info.namespaces), True
        self.store.save_sandbox(record)  # durable before the network: teardown DELs only what this says exists
        if not host_network:
            m = config.metadata
            record.ips = list(self.network.setup(
                record.id, record.namespaces["net"], name=m.name, namespace=m.namespace, uid=m.uid,
                port_mappings=list(config.port_mappings), cgroup_parent=config.linux.cgroup_parent))
            self.store.save_sandbox(record, DATA)  # the CNI cache, written durably, is what DEL works from

    def _write_files(self, sandbox_id: str, config: api_pb2.PodSandboxConfig, host_network: bool) -> None:
        """resolv.conf, hostname and hosts, as containerd makes them: the pod's DNS config or else the host's
        resolv.conf; the host's hosts file and name for a hostNetwork pod."""
        directory = self.layout.sandbox_dir(sandbox_id)
        dns = config.dns_config
        resolv = resolv_conf(dns) if (dns.servers or dns.searches or dns.options) else _read("/etc/resolv.conf")
        hostname = config.hostname or (os.uname().nodename if host_network else "")
        hosts = _read("/etc/hosts") if host_network else DEFAULT_HOSTS
        for name, data in (("resolv.conf", resolv), ("hostname", f"{hostname}\n".encode()), ("hosts", hosts)):
            # read only while the sandbox is ready (its containers bind them), which no power cut outlives
            atomic_write(os.path.join(directory, name), data, mode=0o644, sync=NONE)

    # ---- stop / remove ------------------------------------------------------------------------------------

    def stop(self, sandbox_id: str) -> None:
        """Kills the pod's containers, releases its network (addresses, host ports) and its pause. Succeeds
        for a sandbox already stopped or unknown (all its resources are reclaimed)."""
        try:
            record = self.store.sandbox(sandbox_id)
        except NotFoundError:
            return
        with self.store.lock(record.id):
            for container in self.store.containers(record.id):
                self.containers.stop(container.id, 0)
            if record.ready:
                record.ready = False
                self.store.save_sandbox(record, DATA)  # a power cut ends the pause: recover() says so again
            self._teardown(record, decode_pb(api_pb2.PodSandboxConfig, record.config))

    def _teardown(self, record: SandboxRecord, config: api_pb2.PodSandboxConfig) -> None:
        if not record.network_torn_down:
            # namespaces not made: the run stopped before the network was set up (they are saved first)
            if record.namespaces_made() and config.linux.security_context.namespace_options.network != api_pb2.NODE:
                netns = record.namespaces.get("net")
                m = config.metadata
                try:
                    self.network.teardown(record.id, netns if netns and os.path.exists(netns) else None,
                                          name=m.name, namespace=m.namespace, uid=m.uid,
                                          port_mappings=list(config.port_mappings),
                                          cgroup_parent=config.linux.cgroup_parent)
                except (PyRuntimeError, OSError) as e:  # the network releases the addresses regardless
                    log.warning("pod sandbox %s: network teardown: %s", record.id, e)
            record.network_torn_down = True
            self.store.save_sandbox(record, DATA)  # lost, the next stop DELs again, which the CNI allows
        self.release_pause(record, self.layout.ns_dir(record.id))

    def remove(self, sandbox_id: str) -> None:
        try:
            record = self.store.sandbox(sandbox_id)
        except NotFoundError:
            return
        self.stop(record.id)
        with self.store.lock(record.id):
            for container in self.store.containers(record.id):
                self.containers.remove(container.id)
            self._dismantle(record.id)
            self.store.release(sandbox_name(decode_pb(api_pb2.PodSandboxConfig, record.config)), record.id)

    def _dismantle(self, sandbox_id: str) -> None:
        shutil.rmtree(os.path.dirname(self.layout.ns_dir(sandbox_id)), ignore_errors=True)
        shutil.rmtree(self.layout.sandbox_dir(sandbox_id), ignore_errors=True)
        self.store.forget_sandbox(sandbox_id)
        stats.forget("pod:" + sandbox_id)

    # ---- recovery -----------------------------------------------------------------------------------------

    def recover(self) -> None:
        """After store.recover(): a ready sandbox whose pause is gone (killed), or whose run a crash cut short
        (before its namespaces were made, or after but before its network), is not ready any more;
        StopPodSandbox from the kubelet then releases what it holds."""
        for record in self.store.sandboxes():
            if not record.ready:
                continue
            if not record.namespaces_held():
                log.warning("pod sandbox %s: its pause process is gone, or its namespaces were never made; "
                            "marking it not ready", record.id)
            elif not self._network_done(record):
                log.warning("pod sandbox %s: its RunPodSandbox was cut short before the network was set up; "
                            "marking it not ready", record.id)
            else:
                continue
            record.ready = False
            self.store.save_sandbox(record, DATA)  # decided again at every start

    @staticmethod
    def _network_done(record: SandboxRecord) -> bool:
        """The last step of a run: the pod's IPs recorded (a hostNetwork pod has none to wait for)."""
        config = decode_pb(api_pb2.PodSandboxConfig, record.config)
        return bool(record.ips) or config.linux.security_context.namespace_options.network == api_pb2.NODE

    # ---- status / list ------------------------------------------------------------------------------------

    def _state(self, record: SandboxRecord) -> api_pb2.PodSandboxState:
        ready = record.ready and record.namespaces_held()
        return api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY

    def _pod_status(self, sandbox_id: str) -> api_pb2.PodSandboxStatus | None:
        try:
            record = self.store.sandbox(sandbox_id)
        except NotFoundError:
            return None
        config = decode_pb(api_pb2.PodSandboxConfig, record.config)
        status = api_pb2.PodSandboxStatus(
            id=record.id, metadata=config.metadata, state=self._state(record), created_at=record.created_at,
            labels=config.labels, annotations=config.annotations, runtime_handler=record.runtime_handler)
        status.linux.namespaces.options.CopyFrom(config.linux.security_context.namespace_options)
        if record.ips and not record.network_torn_down:
            status.network.ip = record.ips[0]
            status.network.additional_ips.extend(api_pb2.PodIP(ip=ip) for ip in record.ips[1:])
        return status

    def status(self, sandbox_id: str, verbose: bool = False) -> api_pb2.PodSandboxStatusResponse:
        record = self.store.sandbox(sandbox_id)
        status = self._pod_status(record.id)
        if status is None:
            raise NotFoundError(f"pod sandbox {sandbox_id!r} not found")
        response = api_pb2.PodSandboxStatusResponse(status=status, timestamp=time.time_ns())
        response.containers_statuses.extend(self.containers.statuses(record.id))
        if verbose:
            response.info["info"] = json.dumps({
                "pid": record.pause_pid, "namespaces": record.namespaces, "cgroupParent": record.cgroup_parent,
                "networkTornDown": record.network_torn_down, "sandboxDir": self.layout.sandbox_dir(record.id)})
        return response

    def list(self, f: api_pb2.PodSandboxFilter | None = None) -> list[api_pb2.PodSandbox]:
        out = []
        for record in self.store.sandboxes():
            config = decode_pb(api_pb2.PodSandboxConfig, record.config)
            state = self._state(record)
            if f is not None:
                if f.id and not record.id.startswith(f.id):
                    continue
                if f.HasField("state") and f.state.state != state:
                    continue
                if any(config.labels.get(k) != v for k, v in f.label_selector.items()):
                    continue
            out.append(api_pb2.PodSandbox(id=record.id, metadata=config.metadata, state=state,
                                          created_at=record.created_at, labels=config.labels,
                                          annotations=config.annotations, runtime_handler=record.runtime_handler))
        return out
