"""The CNI spec versions the plugins speak, and the version that brought each difference between them.

Said once here so that the spec's history is not restated as literals in the skel and the result: a config
is refused outside SUPPORTED_VERSIONS, a command before its version, and a result is printed with what its
version carries.
"""
from __future__ import annotations

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED_VERSIONS[-1]
UNVERSIONED = "0.1.0"  # what a config without cniVersion is (the spec)

COMMAND_SINCE = {"CHECK": (0, 4, 0), "GC": (1, 1, 0), "STATUS": (1, 1, 0)}
V1_RESULT_SINCE = (1, 0, 0)  # IPs without `version`, an empty `dns` left out
MTU_SINCE = (1, 1, 0)  # an interface's `mtu`, and a route's mtu, advmss, priority, table and scope


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
