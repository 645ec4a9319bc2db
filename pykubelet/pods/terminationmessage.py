"""A container's termination message, as the kubelet gives it: the file it wrote at terminationMessagePath, or
with terminationMessagePolicy FallbackToLogsOnError, when it failed and that file is empty, the end of its log.

Before each container is created the kubelet makes an empty file for it under PODDIR/containers/NAME/ (a new
one per container, so a restart starts empty) and bind-mounts it at terminationMessagePath; the file is 0666,
so that a container running as any user can write its message there (kuberuntime's makeMounts). Once the
container has exited, the message is read back from the host side of that mount, found among the container
status's mounts by its path in the container (the annotation the container carries): at most the file's last
4096 bytes; from the log, the last 2048 bytes of its last 80 lines (convertToKubeContainerStatus). The
runtime's own message, if it gave one, comes first, then ": " and this one.
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from proto import api_pb2
from pykubelet import dirs
from pykubelet.pods.labels import TERMINATION_MESSAGE_PATH, TERMINATION_MESSAGE_POLICY
from pykubelet.server.logs import tail_offset

MAX_FILE_BYTES = 4 * 1024  # MaxContainerTerminationMessageLength
MAX_LOG_BYTES = 2 * 1024  # MaxContainerTerminationMessageLogLength
MAX_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
FALLBACK = "FallbackToLogsOnError"
FILE_MODE = 0o666


def new_file(pod_dir: Path, container: str) -> Path:
    """A new empty message file for one container of the pod, writable by any user in it."""
    directory = pod_dir / "containers" / container
    dirs.make_dirs(directory)
    path = directory / f"{secrets.randbits(32):08x}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # whatever the umask
    finally:
        os.close(fd)
    return path


def host_file(status: api_pb2.ContainerStatus) -> str | None:
    """The host path of the message file the container had mounted, if any (getTerminationMessage)."""
    path = status.annotations.get(TERMINATION_MESSAGE_PATH, "")
    if not path:
        return None
    return next((m.host_path for m in status.mounts if m.container_path == path), None)


def falls_back(status: api_pb2.ContainerStatus) -> bool:
    """Whether an empty (or missing) file means the log's tail: FallbackToLogsOnError and a failure of a
    container that ran (one that could not start has no log)."""
    return (status.annotations.get(TERMINATION_MESSAGE_POLICY) == FALLBACK and status.exit_code != 0
            and status.reason != "ContainerCannotRun")


def message(status: api_pb2.ContainerStatus, read_file: Callable[[str], bytes],
            read_log: Callable[[str], bytes]) -> str:
    """The exited container's status message: the runtime's, then the termination message. `read_file(path)`
    gives the end of the message file (FileNotFoundError when it is gone), `read_log(path)` the end of the
    log."""
    fallback = falls_back(status)
    text, check_logs = "", fallback
    path = host_file(status)
    if path is not None:
        try:
            data = read_file(path)
            text, check_logs = data.decode(errors="replace"), fallback and not data
        except FileNotFoundError:
            pass
        except OSError as e:
            text, check_logs = f"Error on reading termination log {path}: {e}", False
    if check_logs:
        try:
            text = read_log(status.log_path).decode(errors="replace")
        except OSError as e:
            text = f"Error on reading termination message from logs: {e}"
    if not text:
        return status.message
    return f"{status.message}: {text}" if status.message else text


def read_file_end(path: str) -> bytes:
    """The last MAX_FILE_BYTES of the file (tail.ReadAtMost)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - MAX_FILE_BYTES))
        return f.read(MAX_FILE_BYTES)


def read_log_end(path: str) -> bytes:
    """The container's output of its last MAX_LOG_LINES lines, cut to its last MAX_LOG_BYTES: each CRI log
    record's message, a newline after a full (F) one, so that a last line the container left without its
    newline (a P record no F record ends) is there too, as the kubelet's ReadLogs gives it."""
    if not path:
        return b""
    out = b""
    with open(path, "rb") as f:
        f.seek(tail_offset(f, MAX_LOG_LINES))
        for record in f:
            parts = record.rstrip(b"\n").split(b" ", 3)
            if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
                continue  # not a CRI log record: the kubelet's parser skips it
            message = parts[3] if len(parts) == 4 else b""
            out = (out + message + (b"" if parts[2].split(b":")[0] == b"P" else b"\n"))[-MAX_LOG_BYTES:]
    return out


def fill_in(status: api_pb2.ContainerStatus) -> None:
    """Sets an exited container's message as the kubelet reports it."""
    if status.state == api_pb2.CONTAINER_EXITED:
        status.message = message(status, read_file_end, read_log_end)
