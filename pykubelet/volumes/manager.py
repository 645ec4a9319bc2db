"""The volume manager: each volume of a pod made real on the node before its containers start, kept up to
date while it runs, and gone, mounts and all, when the pod leaves.

Layout as the kubelet's, under --root-dir: ROOT/pods/UID/volumes/kubernetes.io~PLUGIN/NAME for each
volume (empty-dir, configmap, secret, downward-api, projected; a hostPath is the node's own path), and
ROOT/pods/UID/volume-subpaths/VOLUME/CONTAINER/INDEX for the pinned subPath mounts. Memory-backed
volumes are tmpfs mounts: emptyDir medium Memory (sizeLimit is the tmpfs size), and the secret and
projected volumes, so secret bytes never reach a disk. The API-data volumes (configMap, secret,
downwardAPI, projected) are mounted read-only into containers, as upstream's.

Every pod sync calls mount_pod again (the pod's sync period, 10 s in the tests, is the resync of
upstream's volume manager): an unchanged volume costs one GET per object and no write; a changed
configMap, secret or refreshed token is written through the AtomicWriter (pykubelet/volumes/atomic.py),
so running containers see the update without a restart (the container hash covers only the spec).
With the pod's fsGroup, each volume but hostPath is given to that group (pykubelet/volumes/ownership.py).
A projected clusterTrustBundle source is one PEM file of trust anchors (pykubelet/volumes/trustbundles.py),
a podCertificate source the pod's key and issued chain (pykubelet/volumes/podcertificates.py).
Not done: SELinux relabelling, persistent volumes (CSI, PVCs): such a volume fails with a message naming it.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from proto import api_pb2
from pykubelet import dirs
from pykubelet.api import quantity
from pykubelet.api.podmodel import (
    ClusterTrustBundleProjection,
    ConfigMapSource,
    Container,
    DownwardAPISource,
    EmptyDirSource,
    HostPathSource,
    ImageSource,
    Pod,
    PodCertificateProjection,
    ProjectedSource,
    ServiceAccountTokenProjection,
    Volume,
    VolumeSource,
)
from pykubelet.config import Settings
from pykubelet.pods import env as envs
from pykubelet.pods.podspec import expand, parse_quantity
from pykubelet.volumes import atomic, hostpath, mount, objects, ownership, podcertificates, trustbundles
from pykubelet.volumes.errors import ContainerConfigError, VolumeError
from pykubelet.volumes.subpath import bind_subpath
from pynode_os import files

log = logging.getLogger(__name__)

PLUGIN_DIRS = {"emptyDir": "kubernetes.io~empty-dir", "configMap": "kubernetes.io~configmap",
               "secret": "kubernetes.io~secret", "downwardAPI": "kubernetes.io~downward-api",
               "projected": "kubernetes.io~projected"}
API_DATA = ("configMap", "secret", "downwardAPI", "projected")  # mounted read-only
MEMORY_BACKED = ("secret", "projected")
EMPTY_DIR_MODE = 0o777
READY = "ready"  # the kubelet's marker of a volume set up, under ROOT/pods/UID/plugins/PLUGIN/NAME
PROPAGATION = {"HostToContainer": api_pb2.PROPAGATION_HOST_TO_CONTAINER,
               "Bidirectional": api_pb2.PROPAGATION_BIDIRECTIONAL}

Payload = dict[str, tuple[bytes, int]]


def pod_dir(root_dir: Path, uid: str) -> Path:
    return root_dir / "pods" / uid


def remove_pod(root_dir: Path, uid: str) -> None:
    """Unmounts everything under the pod's directory (deepest first) and removes it; a mount that stays
    leaves the directory in place (removing through a mount would delete what it shows)."""
    base = pod_dir(root_dir, uid)
    if not base.exists():
        return
    for point, _fstype in mount.mounts_under(base):
        try:
            mount.unmount(point)
        except mount.MountError as e:
            log.warning("pod %s: %s", uid, e)
    left = mount.mounts_under(base)
    if left:
        raise VolumeError(f"pod {uid}: {base} still has mounts {[str(p) for p, _ in left]}: not removed")
    shutil.rmtree(base, ignore_errors=True)


class VolumeManager:
    def __init__(self, client, settings: Settings, allocatable: Callable[[], dict[str, str]] | None = None) -> None:
        self.client, self.settings = client, settings
        self.tokens = objects.TokenManager(client)
        self.certificates = podcertificates.PodCertificates(client, settings.node_name)
        self._allocatable = allocatable

    def allocatable(self) -> dict[str, str]:
        """The node's allocatable resources: the default limits of the downward API."""
        if self._allocatable is None:
            from pykubelet.node.status import node_allocatable

            return node_allocatable(self.settings)
        return self._allocatable()

    # --- volumes --------------------------------------------------------------------------------------

    def volume_path(self, pod: Pod, volume: Volume) -> Path:
        if isinstance(volume.source, HostPathSource):
            return Path(volume.source.path)
        if volume.kind not in PLUGIN_DIRS:
            raise VolumeError(f'volume "{volume.name}": {volume.kind} volumes are not supported by this node')
        return pod_dir(self.settings.root_dir, pod.uid) / "volumes" / PLUGIN_DIRS[volume.kind] / volume.name

    def mount_pod(self, pod: Pod) -> None:
        """Sets up (or brings up to date) every volume of `pod`; raises VolumeError naming the first one
        that fails, after trying them all."""
        errors = []
        for i, volume in enumerate(pod.spec.volumes):
            try:
                self._set_up(pod, volume, f"spec.volumes[{i}]")
            except (VolumeError, objects.ObjectError, ContainerConfigError, OSError) as e:
                errors.append(f'MountVolume.SetUp failed for volume "{volume.name}" : {e}')
        if errors:
            raise VolumeError("; ".join(errors))

    def _set_up(self, pod: Pod, volume: Volume, field: str) -> None:
        source = volume.source
        if isinstance(source, HostPathSource):
            hostpath.check(f"{field}.hostPath", source.path, source.type)
            return
        if isinstance(source, ImageSource):  # the runtime's to mount, once the sync has pulled it
            return
        path = self.volume_path(pod, volume)
        dirs.make_dirs(path.parent)  # pods/UID/volumes/PLUGIN, closed (pykubelet/dirs.py)
        if isinstance(source, EmptyDirSource):
            self._set_up_empty_dir(pod, volume.name, source, path)
            return
        dirs.make_dirs(path, atomic.VOLUME_MODE, narrow=False)  # the container's
        fs_group = pod.spec.security_context.fs_group
        if volume.kind in MEMORY_BACKED and mount.fs_type(path) is None:
            mount.mount_tmpfs(path, mode=0o755)
        payload = self._payload(pod, source, f"{field}.{volume.kind}")
        wrote = atomic.write(path, payload)
        if wrote:
            log.info("pod %s: volume %s written (%d files)", pod.key, volume.name, len(payload))
        if fs_group is not None and (wrote or ownership.requires_change(path, fs_group, readonly=True)):
            ownership.set_ownership(path, fs_group, readonly=True)

    def _set_up_empty_dir(self, pod: Pod, name: str, source: EmptyDirSource, path: Path) -> None:
        """As the kubelet's emptyDir SetUpAt: the directory 0777; for medium Memory a tmpfs on it, whose root
        keeps tmpfs's own 1777 (sticky, as /tmp); then with the pod's fsGroup the whole volume given to that
        group (setgid added: 02777, 03777 on tmpfs), which a missing subPath made in it copies. Once, as the
        plugin's ready file marks: the volume is then the container's, and later syncs leave its mode as the
        container set it (a directory removed or a tmpfs unmounted under the ready file is set up again)."""
        ready = pod_dir(self.settings.root_dir, pod.uid) / "plugins" / PLUGIN_DIRS["emptyDir"] / name / READY
        memory = source.medium == "Memory"
        mounted = memory and mount.fs_type(path) is not None
        if ready.exists() and (mounted if memory else path.is_dir()):
            return
        dirs.make_dirs(path, EMPTY_DIR_MODE, narrow=False)
        if stat.S_IMODE(os.stat(path).st_mode) & 0o777 != EMPTY_DIR_MODE:  # the permission bits only, as setupDir
            os.chmod(path, EMPTY_DIR_MODE)
        if memory and not mounted:
            limit = source.size_limit
            mount.mount_tmpfs(path, quantity.value(parse_quantity(limit)) if limit else None)
        sc = pod.spec.security_context
        if sc.fs_group is not None:
            ownership.set_ownership(path, sc.fs_group, False, sc.fs_group_change_policy)
        dirs.make_dirs(ready.parent)
        files.atomic_write(ready, b"", mode=0o600)

    def _payload(self, pod: Pod, source: VolumeSource, field: str) -> Payload:
        """The files of an API-data volume: a configMap's or secret's keys, the downward API's values, or
        the projected sources' in order."""
        if isinstance(source, ConfigMapSource):
            return self._keyed(pod, source)
        if isinstance(source, DownwardAPISource):
            return self._downward(pod, source, field)
        assert isinstance(source, ProjectedSource), source  # the rest have no files, or no path (volume_path)
        payload: Payload = {}
        # upstream's choice for trust bundles and pod certificates: with an fsGroup the files are the owner's,
        # and the group's by ownership.py
        certificate_mode = 0o600 if pod.spec.security_context.fs_group is not None else source.default_mode
        for i, projection in enumerate(source.sources):
            if isinstance(projection, ConfigMapSource):
                payload.update(self._keyed(pod, projection))
            elif isinstance(projection, DownwardAPISource):
                payload.update(self._downward(pod, projection, f"{field}.sources[{i}].downwardAPI"))
            elif isinstance(projection, ServiceAccountTokenProjection):
                account = pod.spec.service_account_name or "default"
                token = self.tokens.get(pod, account, projection.audience, projection.expiration_seconds)
                payload[projection.path] = (token.encode(), source.default_mode)
            elif isinstance(projection, ClusterTrustBundleProjection):
                payload[projection.path] = (trustbundles.anchors(self.client, projection), certificate_mode)
            elif isinstance(projection, PodCertificateProjection):
                key, chain = self.certificates.bundle(pod, f"{field}.sources[{i}]", projection)
                for path, data in ((projection.credential_bundle_path, key + chain), (projection.key_path, key),
                                   (projection.certificate_chain_path, chain)):
                    if path:
                        payload[path] = (data, certificate_mode)
            else:
                raise VolumeError(f"{field}.sources[{i}]: {list(projection.kinds)} projections are not supported "
                                  "by this node")
        return payload

    def _keyed(self, pod: Pod, source: ConfigMapSource) -> Payload:
        kind, name, default = source.kind, source.name, source.default_mode
        fetch = objects.config_map if kind == "configmap" else objects.secret
        data = fetch(self.client, pod.metadata.namespace, name)
        if data is None:
            if source.optional:
                return {}
            raise objects.not_found(kind, name)
        if not source.items:
            return {key: (value, default) for key, value in data.items()}
        payload: Payload = {}
        for item in source.items:
            if item.key not in data:
                if source.optional:
                    continue
                raise VolumeError(f"{kind} references non-existent {'config' if kind == 'configmap' else 'secret'} "
                                  f"key: {item.key}")
            payload[item.path] = (data[item.key], default if item.mode is None else item.mode)
        return payload

    def _downward(self, pod: Pod, source: DownwardAPISource, field: str) -> Payload:
        payload: Payload = {}
        for i, item in enumerate(source.items):
            if item.field_path is not None:
                value = envs.field_value(pod, item.field_path)
            elif item.resource is not None:
                value = envs.resource_value(pod, None, item.resource, self.allocatable)
            else:
                raise VolumeError(f"{field}.items[{i}]: needs fieldRef or resourceFieldRef")
            payload[item.path] = (value.encode(), source.default_mode if item.mode is None else item.mode)
        return payload

    # --- a container's mounts ---------------------------------------------------------------------------

    def mounts(self, pod: Pod, container: Container, env: dict[str, str],
               images: Mapping[str, str] | None = None) -> list[api_pb2.Mount]:
        """The container's CRI mounts (`env`, its resolved env, expands subPathExpr; `images`, the image
        reference the sync pulled for each image volume by volume name); raises ContainerConfigError."""
        volumes = {v.name: v for v in pod.spec.volumes}
        field = _container_field(pod, container)
        out = []
        for i, vm in enumerate(container.volume_mounts):
            where = f"{field}.volumeMounts[{i}]"
            volume = volumes.get(vm.name)
            if volume is None:
                raise ContainerConfigError(f"{where}.name: volume {vm.name!r} is not in spec.volumes")
            sub, sub_field = vm.sub_path, f"{where}.subPath"
            if vm.sub_path_expr:
                sub, sub_field = expand(vm.sub_path_expr, env), f"{where}.subPathExpr"
            if isinstance(volume.source, ImageSource):
                out.append(self._image_mount(volume.source, vm.mount_path, sub, sub_field,
                                             (images or {}).get(volume.name)))
                continue
            try:
                host = self.volume_path(pod, volume)
            except VolumeError as e:
                raise ContainerConfigError(str(e)) from e
            if sub:
                target = (pod_dir(self.settings.root_dir, pod.uid) / "volume-subpaths" / vm.name / container.name
                          / str(i))
                try:
                    host = bind_subpath(sub_field, vm.name, host, sub, target)
                except OSError as e:
                    raise ContainerConfigError(f"failed to prepare subPath for volumeMount {vm.name!r} of "
                                               f"container {container.name!r}: {e}") from e
            out.append(api_pb2.Mount(container_path=vm.mount_path, host_path=str(host),
                                     readonly=vm.read_only or volume.kind in API_DATA,
                                     propagation=PROPAGATION.get(vm.mount_propagation, api_pb2.PROPAGATION_PRIVATE)))
        return out

    @staticmethod
    def _image_mount(source: ImageSource, path: str, sub: str, sub_field: str, ref: str | None) -> api_pb2.Mount:
        """The image's root (or its directory `sub`) read-only at `path`: the runtime mounts the image it
        pulled; its image_sub_path must stay inside the image, which the runtime checks again on its side."""
        if ref is None:
            raise ContainerConfigError(f"image volume {source.reference!r} has not been pulled")
        if sub.startswith("/") or ".." in sub.split("/"):
            raise ContainerConfigError(f"{sub_field}: {sub!r} must be a relative path inside the image, "
                                       "without '..'")
        return api_pb2.Mount(container_path=path, readonly=True, image_sub_path=sub,
                             image=api_pb2.ImageSpec(image=ref, user_specified_image=source.reference))


def _container_field(pod: Pod, container: Container) -> str:
    for kind, containers in (("initContainers", pod.spec.init_containers), ("containers", pod.spec.containers),
                             ("ephemeralContainers", pod.spec.ephemeral_containers)):
        for i, c in enumerate(containers):
            if c.name == container.name:
                return f"spec.{kind}[{i}]"
    return f"container {container.name!r}"
