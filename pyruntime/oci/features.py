"""`pyruntime features`: what this runtime implements, in the runtime spec's features.json shape."""
from __future__ import annotations

from pyruntime.linux.mount_options import FLAG_OPTIONS, IGNORED_OPTIONS, PROPAGATION_OPTIONS, RECURSIVE_OPTIONS
from pyruntime.linux.syscalls import Syscalls
from pyruntime.oci.spec import HOOK_KINDS, NAMESPACE_TYPES
from pyruntime.oci.state import OCI_VERSION


def features(kernel: Syscalls) -> dict:
    from pynode_os.systemd import booted
    from pyruntime.linux import capabilities
    from pyruntime.linux.cgroups import detect
    from pyruntime.linux.seccomp import compiler
    version = detect(kernel)
    return {
        "ociVersionMin": "1.0.0",
        "ociVersionMax": OCI_VERSION,
        "hooks": list(HOOK_KINDS),
        "mountOptions": sorted(set(FLAG_OPTIONS) | set(PROPAGATION_OPTIONS) | set(RECURSIVE_OPTIONS)
                               | IGNORED_OPTIONS - {"idmap", "ridmap"}),
        "linux": {
            "namespaces": list(NAMESPACE_TYPES),
            "capabilities": [capabilities.name(c) for c in range(capabilities.last_cap() + 1)],
            "cgroup": {"v1": version == "v1", "v2": version == "v2", "systemd": version == "v2" and booted(),
                       "systemdUser": False,
                       "rdma": False},
            "seccomp": compiler.features(),
            "apparmor": {"enabled": False},
            "selinux": {"enabled": False},
            "intelRdt": {"enabled": False},
            "mountExtensions": {"idmap": {"enabled": False}},
        },
        "annotations": {"io.github.pynode.pyruntime.version": "0.1.0"},
    }
