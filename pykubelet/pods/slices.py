"""The kubelet's cgroups under the systemd cgroup driver: the kubepods, QoS and pod slices, made through
systemd as the stock kubelet makes them (its libcontainer systemd manager's Apply(-1): StartTransientUnit of
the slice, wanted by its parent, an existing one left as it is) and stopped when the pod is gone.

Names are the stock kubelet's (CgroupName.ToSystemd): the pod with uid 12-34 of QoS class Burstable is
kubepods-burstable-pod12_34.slice, at /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice,
which is also the cgroup parent the runtime is given (criconfig.cgroup_parent). The D-Bus calls are the OS
floor's (pynode_os.systemd), shared with the runtime's systemd driver: the kubelet may not import pyruntime,
and it reaches containerd's runc the same way. A connection is opened per call and closed after it: the
kubelet's pod workers run on many threads, and a D-Bus connection is not one to share between them.
"""
from __future__ import annotations

import logging
import os

from pykubelet.api.podmodel import Pod
from pykubelet.config import Settings
from pykubelet.pods.podspec import qos_class
from pynode_os.systemd import DBusSystemd, SystemdBus, SystemdError, cgroup_name_to_systemd, slice_properties

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pynode_os.systemd import Property

log = logging.getLogger(__name__)

ROOT_SLICE = "-.slice"
QOS_CLASSES = ("Burstable", "BestEffort")  # a Guaranteed pod's slice is right under kubepods


def kubepods(settings: Settings) -> list[str]:
    """The kubelet's CgroupName of the kubepods cgroup: --cgroup-root's components, then kubepods."""
    return [c for c in settings.cgroup_root.split("/") if c] + ["kubepods"]


def pod_cgroup_name(uid: str, qos: str, settings: Settings) -> list[str]:
    return kubepods(settings) + ([] if qos == "Guaranteed" else [qos.lower()]) + [f"pod{uid}"]


def pod_slice_path(pod: Pod, settings: Settings) -> str:
    """The pod slice's expanded path, which the stock kubelet sends as the pod's cgroup parent."""
    return cgroup_name_to_systemd(pod_cgroup_name(pod.uid, qos_class(pod), settings))


def _unit(path: str) -> tuple[str, str]:
    """(parent slice, slice) of an expanded slice path, as the kubelet's libctCgroupConfig splits it."""
    parent, name = os.path.split(path)
    return (os.path.basename(parent) if parent != "/" else ROOT_SLICE), name


class PodSlices:
    """`bus()`: a fresh connection to systemd (tests: a fake recording the calls)."""

    def __init__(self, settings: Settings, bus: Callable[[], SystemdBus] = DBusSystemd) -> None:
        self.settings = settings
        self._bus = bus

    def apply(self, name: list[str], properties: list[Property], update: bool) -> None:
        """The slice of the kubelet's CgroupName `name` started with `properties` (its limits), or, when it
        exists already, left as it is (a pod's, as EnsureExists) or given them (`update`: kubepods at start, the
        QoS slices, a resized pod's). Its parents are made by systemd for a slice whose parent is missing."""
        from pynode_os.systemd import start_unit
        parent, unit = _unit(cgroup_name_to_systemd(name))
        bus = self._bus()
        try:
            start_unit(bus, unit, slice_properties(parent, unit) + properties, ignore_exists=True)
            if update and properties:
                bus.set_unit_properties(unit, properties)
        finally:
            bus.close()

    def update_unit(self, unit: str, properties: list[Property]) -> None:
        """An existing unit's limits (systemReservedCgroup's, kubeReservedCgroup's)."""
        bus = self._bus()
        try:
            bus.set_unit_properties(unit, properties)
        finally:
            bus.close()

    def remove_pod(self, uid: str) -> None:
        """Stops the pod's slice under whichever QoS class it had (a pod known only by its uid has no spec);
        one that is not there counts as removed. A failure is logged: the pod is gone from the runtime."""
        from pynode_os.systemd import stop_unit
        bus = self._bus()
        try:
            for qos in ("Guaranteed", *QOS_CLASSES):
                name = _unit(cgroup_name_to_systemd(pod_cgroup_name(uid, qos, self.settings)))[1]
                try:
                    stop_unit(bus, name)
                except SystemdError as e:
                    log.warning("pod %s: stopping %s: %s", uid, name, e)
        finally:
            bus.close()
