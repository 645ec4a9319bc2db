"""The two ways preparing a pod's volumes and a container's env fails, as the kubelet reports them.

A VolumeError blocks the whole pod before its sandbox (it waits in ContainerCreating with a FailedMount
event and is retried at each sync); a ContainerConfigError blocks one container (its waiting reason is
CreateContainerConfigError with this message). Both messages name the volume, field or object at fault.
This module imports only the error kinds, so pykubelet/pods/sync.py can catch them without importing the
volume code. Both are FailedPrecondition: the pod is well formed, what it needs is not there yet.
"""

from pykubelet.errors import FailedPreconditionError


class VolumeError(FailedPreconditionError):
    pass


class ContainerConfigError(FailedPreconditionError):
    pass
