"""Seccomp for config.json's linux.seccomp, one job per module: profile.py reads and validates the section
(what every create imports, without libseccomp), compiler.py turns a profile into the kernel's BPF program with
libseccomp, loader.py loads a program into the calling thread with seccomp(2) and hands a notify listener to its
agent. Each imports only those before it (tests/unit/test_layers.py)."""
