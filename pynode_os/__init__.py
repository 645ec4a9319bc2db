"""The OS floor: the host-level jobs every package of the node does, each done once, here.

pyruntime, cni_plugins, pykubelet and pynode_cluster are kept apart by the import contracts
(tests/unit/test_layers.py), so the few things they all need from the host were copied into each of them,
and the copies drifted (four atomic writes, each with its own durability and modes). This package sits
below all of them: every package may import it, and it imports none of them, only the standard library.

One module per job:
- files: replacing a file atomically, at one of three durability levels.

Every module here is on the runtime CLI's start path or may be: they import the stdlib's cheapest modules
only (tests/unit/test_start_path_imports.py).
"""
