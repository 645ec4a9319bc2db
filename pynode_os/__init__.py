"""The OS floor: the host-level jobs every package of the node does, each done once, here.

pyruntime, cni_plugins, pykubelet and pynode_cluster are kept apart by the import contracts
(tests/unit/test_layers.py), so the few things they all need from the host were copied into each of them,
and the copies drifted. This package sits below all of them: every package may import it, and it imports
none of them, only the standard library (and jeepney, systemd's D-Bus client, when `systemd` first talks to it).

One module per job, each the one implementation there is:
- files: replacing a file atomically, at one of three durability levels (there were four writers, each
  with its own durability and modes), and making directories with exact modes whatever the umask (three);
- mountinfo: /proc/PID/mountinfo parsed, its escapes undone (the kubelet's copy failed on a path with \\089);
- libc: the one ctypes handle on the C library (there were three);
- mounts: mount(2), umount2(2) and statfs(2), with errors that name the call and the path (the kubelet had
  its own libc binding for its volumes' mounts);
- proc: a process named for good by its pid and its start time (/proc/PID/stat was parsed four ways);
- cgroups: the host's cgroup version and where its hierarchies are mounted (the kubelet detected v2 by a
  file of its own, in two places);
- sysctl: which namespace makes which sysctl private, and a sysctl's /proc/sys path (the table was kept
  three times: the OCI validation, the CRI pause, the kubelet's admission);
- systemd: slice naming and units started and stopped over D-Bus, for the runtime's systemd cgroup driver (its
  scopes) and the kubelet's (its slices), which may not import each other.
- logind: systemd-logind's shutdown inhibitor lock and PrepareForShutdown, for the kubelet's graceful node
  shutdown, over `systemd`'s D-Bus helpers.
- fieldreader: JSON objects' fields read with their types checked and errors that name the field's path, for
  the runtime's config.json and the kubelet's API objects (two copies, whose wording was kept the same by hand);
  each package's subclass raises its own error kind.

The runtime's syscall layer stays its only way to the kernel: its modules make mount(2), umount2(2) and
statfs(2) through the Syscalls object they are handed (pyruntime/linux/syscalls.py), whose LinuxSyscalls
calls `mounts` here, so that a unit test's FakeSyscalls records every mount and nothing reaches the host
behind it; tests/unit/test_syscall_layer.py keeps `mounts` and `libc` out of every other runtime module.
The layer calls the floor, never the floor the layer: the layer is the runtime's seam for its tests, while
the call itself and the wording of its errors are one for every package. Where a floor function changes
the system or asks the kernel on its way (make_dirs' chmod, cgroups' statfs), it takes that call from its
caller instead of making it: pyruntime hands its Syscalls object's, the other packages the os module's or
`mounts`'.

Every module here is on the runtime CLI's start path or may be: they import the stdlib's cheapest modules
only, and ctypes only in libc and mounts (tests/unit/test_start_path_imports.py).
"""
