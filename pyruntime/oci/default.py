"""The config.json that `pyruntime spec` writes: runc's default, so tutorials written for runc work."""
from __future__ import annotations

DEFAULT_CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]

MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def default_spec(rootless: bool = False, cgroup_ns: bool = True) -> dict:
    """`cgroup_ns`: runc's `spec` asks for a cgroup namespace only on a cgroup v2 host; on v1 a config that
    adds its own would then name it twice."""
    spec: dict = {
        "ociVersion": "1.2.1",
        "process": {
            "terminal": True,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {k: list(DEFAULT_CAPS) for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "pyruntime",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")
                           if t != "cgroup" or cgroup_ns],
            "maskedPaths": list(MASKED),
            "readonlyPaths": list(READONLY),
        },
    }
    if rootless:
        spec["linux"]["namespaces"].append({"type": "user"})
        spec["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 1000, "size": 1}]
        spec["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 1000, "size": 1}]
        del spec["linux"]["resources"]
    return spec
