"""The test images' busybox, under the name the tests import it by: the builder is the package's
(pynode_cluster/busybox.py), since `pynode run` makes its sample pod's image with it where no test code is."""
from pynode_cluster.busybox import (
    ARCH,
    CACHE,
    PT_INTERP,
    STATIC_ROOT,
    OCIImage,
    build_busybox_image,
    build_rootfs,
    busybox_from_deb,
    elf_interpreter,
    require_static,
    static_busybox,
    tar_directory,
    write_oci_layout,
)

__all__ = ["ARCH", "CACHE", "PT_INTERP", "STATIC_ROOT", "OCIImage", "build_busybox_image", "build_rootfs",
           "busybox_from_deb", "elf_interpreter", "require_static", "static_busybox", "tar_directory",
           "write_oci_layout"]
