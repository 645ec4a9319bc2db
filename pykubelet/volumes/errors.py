"""The two ways preparing a pod's volumes and a container's env fails, as the kubelet reports them.

A VolumeError blocks the whole pod before its sandbox (it waits in ContainerCreating with a FailedMount
event and is retried at each sync); a ContainerConfigError blocks one container (its waiting reason is
CreateContainerConfigError with this message). Both messages name the volume, field or object at fault.
This module imports nothing, so pykubelet/pods/sync.py can catch them without importing the volume code.
"""


class VolumeError(Exception):
    pass


class ContainerConfigError(Exception):
    pass
