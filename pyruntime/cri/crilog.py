"""A container's output in the kubelet's CRI log format, written by its supervisor.

The kubelet (`kubectl logs`, its log rotation) and crictl read this file, never the runtime, so the
format is theirs (pkg/kubelet/kuberuntime/logs): one entry per line,
`<RFC3339Nano timestamp> <stdout|stderr> <P|F> <text>\\n`, F closing a line of the container's output
and P a piece of a longer one. The pieces follow containerd's CRI logger, which kubelets are tested
against: a line is cut at '\\n' (a '\\r' before it goes too, so a tty's "\\r\\n" is one line end), a line
longer than containerd's default max_container_log_line_size (16 KiB) goes out in P pieces of that size
followed by an F, and what is left without a '\\n' when the stream ends goes out as a P entry.

A container can write without end or stop mid-line forever: the writer keeps at most one unfinished
piece per stream in memory, and a write error (a full disk) drops the entries instead of stopping the
supervisor from draining the container's pipes (a container blocked on a full pipe would hang).
"""
from __future__ import annotations

import os
import time

MAX_LINE = 16 * 1024  # containerd's default max_container_log_line_size
STREAMS = ("stdout", "stderr")
_MODE = 0o640  # containerd's: the log is the pod's, readable by the node's log agents in the group


def timestamp(ns: int) -> str:
    """RFC3339Nano in UTC with all nine digits (the kubelet's RFC3339NanoFixed), so entries sort as text."""
    seconds, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


class CriLogWriter:
    """`path`: the file the kubelet asked for (created with its directory if missing, appended to);
    "" means the container has no log file and its output only goes to attached clients."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pending = {stream: bytearray() for stream in STREAMS}
        self._fd = self._open() if path else None

    def _open(self) -> int:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, _MODE)

    def write(self, stream: str, data: bytes) -> None:
        """Logs what the container wrote to `stream` ("stdout" or "stderr"); an unfinished line waits for
        its end, unless it grew past MAX_LINE."""
        buf = self._pending[stream]
        buf += data
        out: list[bytes] = []
        head = timestamp(time.time_ns()).encode() + b" " + stream.encode() + b" "
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            end = nl - 1 if nl > start and buf[nl - 1] == 0x0D else nl
            self._line(out, head, buf[start:end])
            start = nl + 1
        del buf[:start]
        while len(buf) > MAX_LINE:
            out.append(head + b"P " + bytes(buf[:MAX_LINE]) + b"\n")
            del buf[:MAX_LINE]
        self._emit(out)

    def flush(self, stream: str | None = None) -> None:
        """The stream ended (or, with None, every stream did): its unfinished line goes out as a P
        entry, as containerd logs a last line without '\\n'."""
        out: list[bytes] = []
        head_time = timestamp(time.time_ns()).encode()
        for name in (stream,) if stream else STREAMS:
            buf = self._pending[name]
            if buf:
                out.append(head_time + b" " + name.encode() + b" P " + bytes(buf) + b"\n")
                buf.clear()
        self._emit(out)

    def reopen(self) -> None:
        """After the kubelet renamed the file away (ReopenContainerLog, its rotation): later entries go to
        a new file at `path`. If that can't be opened the old one stays in use and the error is raised."""
        if not self.path:
            return
        fd = self._open()
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def _line(out: list[bytes], head: bytes, line: bytearray) -> None:
        while len(line) > MAX_LINE:
            out.append(head + b"P " + bytes(line[:MAX_LINE]) + b"\n")
            line = line[MAX_LINE:]
        out.append(head + b"F " + bytes(line) + b"\n")

    def _emit(self, entries: list[bytes]) -> None:
        if not entries or self._fd is None:
            return
        data = memoryview(b"".join(entries))
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            pass  # see the module doc: the output is drained and dropped rather than left to block the container
