"""The OS floor: the host-level jobs every package of the node does, each done once, here.

pyruntime, cni_plugins, pykubelet and pynode_cluster are kept apart by the import contracts
(tests/unit/test_layers.py), so the few things they all need from the host were copied into each of them,
and the copies drifted (four atomic writes, each with its own durability and modes; three ways to make
directories with exact modes). This package sits below all of them: every package may import it, and it
imports none of them, only the standard library.

One module per job:
- files: replacing a file atomically, at one of three durability levels, and making directories with
  exact modes whatever the umask.

Where a floor function changes the system on its way (make_dirs' chmod), it takes that call from its
caller instead of making it: pyruntime hands its Syscalls object's, so the runtime's syscall layer stays
its only way to the kernel (pyruntime/linux/syscalls.py); the other packages hand the os module's.

Every module here is on the runtime CLI's start path or may be: they import the stdlib's cheapest modules
only (tests/unit/test_start_path_imports.py).
"""
