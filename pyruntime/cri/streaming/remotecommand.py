"""Exec and attach sessions: the remotecommand protocols between a kubectl/crictl and a container's
process, over SPDY (stream types error/stdin/stdout/stderr/resize; channel.k8s.io, v2, v3, v4) or a
websocket (channel protocols, v4 and v5).

Why the care with the error stream: kubectl and crictl learn the exit code only from it. In v4 and v5 it
carries a metav1.Status as JSON, which client-go decodes into CodeExitError (`command terminated with
non-zero exit code`); v1-v3 carry just the message of a failure. The JSON is written byte for byte as
Go's encoding/json writes the kubelet's status struct, so what a client sees from us is what it sees
from the kubelet over containerd.

The backend works on file descriptors (StreamBackend): this module turns the client's streams into
pipes and pumps them. The command's output is forwarded until the process and everything holding its
pipes are done, with a grace period (`DRAIN_GRACE`) so a daemonized child holding stdout cannot hang the
session (an exec whose process ended never hangs).
"""
from __future__ import annotations

import json
import logging
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pyruntime.cri.streaming.backend import StreamBackend

log = logging.getLogger(__name__)

DRAIN_GRACE = 2.0
STREAM_CREATION_TIMEOUT = 30.0
# The kubelet's order: the first one a client offers that is here is chosen (v5 only over websockets).
SPDY_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
NON_ZERO_EXIT_REASON = "NonZeroExitCode"
EXIT_CODE_CAUSE = "ExitCode"


class Reader(Protocol):
    def read(self, n: int = ...) -> bytes: ...


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...


@dataclass
class Session:
    """A client's streams, whatever carries them. A stream the request did not ask for is None."""

    stdin: Reader | None
    stdout: Writer | None
    stderr: Writer | None
    resize: Reader | None
    write_status: Callable[[dict], None]
    close: Callable[[], None]


# --- the status on the error stream -----------------------------------------------------------------

SUCCESS: dict = {"status": "Success"}


def exit_status(cmd: list[str], code: int) -> dict:
    """What the kubelet writes for a command that exited non-zero (over containerd: its CodeExitError's
    message names the command the way Go's %v prints a []string)."""
    return {
        "status": "Failure",
        "message": (f"command terminated with non-zero exit code: error executing command "
                    f"[{' '.join(cmd)}], exit code {code}"),
        "reason": NON_ZERO_EXIT_REASON,
        "details": {"causes": [{"reason": EXIT_CODE_CAUSE, "message": str(code)}]},
    }


def internal_error(message: str) -> dict:
    return {"status": "Failure", "message": f"Internal error occurred: {message}", "reason": "InternalError",
            "code": 500}


def go_json(value: object) -> bytes:
    """encoding/json's output: compact, UTF-8, with <, >, & and U+2028/9 escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text.encode()


def status_writer(write: Callable[[bytes], None], v4: bool) -> Callable[[dict], None]:
    """v4/v5: the status as JSON, also on success; v1-v3: the message of a failure only."""
    def write_status(status: dict) -> None:
        if v4:
            write(go_json(status))
        elif status["status"] != "Success":
            write(status["message"].encode())
    return write_status


# --- running a session ------------------------------------------------------------------------------

def resize_source(reader: Reader | None) -> Callable[[], tuple[int, int] | None]:
    """The resize stream (a sequence of JSON {"Width":w,"Height":h}) as a blocking call returning the next
    size, or None once the stream has ended."""
    decoder = json.JSONDecoder()
    buf = ""

    def next_size() -> tuple[int, int] | None:
        nonlocal buf
        while reader is not None:
            text = buf.lstrip()
            if text:
                try:
                    value, end = decoder.raw_decode(text)
                except ValueError:
                    value, end = None, -1
                if end >= 0:
                    buf = text[end:]
                    if isinstance(value, dict):
                        width, height = value.get("Width", 0), value.get("Height", 0)
                        if isinstance(width, int) and isinstance(height, int):
                            return (width & 0xFFFF, height & 0xFFFF)
                    continue
                if len(text) > 4096:
                    return None  # no JSON object is that long: the client is not speaking the protocol
            data = reader.read(4096)
            if not data:
                return None
            buf = text + data.decode(errors="replace")
        return None
    return next_size


def _pump_in(source: Reader, fd: int) -> None:
    try:
        while data := source.read(65536):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
    except OSError:
        pass  # the process closed its stdin or exited
    finally:
        os.close(fd)


def _pump_out(fd: int, sink: Writer, stop: int) -> None:
    """Copies fd to sink until EOF, or until `stop` becomes readable (the grace after exit is over)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(stop, select.POLLIN)
    try:
        while True:
            ready = dict(poller.poll())
            if fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    break
                sink.write(data)
            elif stop in ready:
                break
    except OSError as e:
        log.debug("output pump ended: %s", e)
    finally:
        os.close(fd)
        try:
            sink.close()
        except OSError:
            pass


def run(session: Session, backend: StreamBackend, *, container_id: str, cmd: list[str] | None, tty: bool) -> None:
    """Runs an exec (`cmd`) or an attach (cmd None) to its end, writes the status, closes the session."""
    keep: list[int] = []  # our fds to close once the backend returned
    threads: list[threading.Thread] = []
    stop_r, stop_w = os.pipe()
    stdin_fd = stdout_fd = stderr_fd = None
    outputs: list[threading.Thread] = []
    try:
        if session.stdin is not None:
            stdin_fd, w = os.pipe()
            keep.append(stdin_fd)
            threads.append(threading.Thread(target=_pump_in, args=(session.stdin, w), daemon=True))
        for name, sink in (("stdout", session.stdout), ("stderr", session.stderr)):
            if sink is None:
                continue
            r, w = os.pipe()
            keep.append(w)
            if name == "stdout":
                stdout_fd = w
            else:
                stderr_fd = w
            outputs.append(threading.Thread(target=_pump_out, args=(r, sink, stop_r), daemon=True))
        for thread in threads + outputs:
            thread.start()
        resize = resize_source(session.resize if tty else None)
        try:
            if cmd is not None:
                code = backend.exec(container_id, cmd, tty=tty, stdin=stdin_fd, stdout=stdout_fd,
                                    stderr=stderr_fd, resize=resize)
                status = SUCCESS if code == 0 else exit_status(cmd, code)
            else:
                backend.attach(container_id, tty=tty, stdin=stdin_fd, stdout=stdout_fd, stderr=stderr_fd,
                               resize=resize)
                status = SUCCESS
        except Exception as e:
            what = "executing command in container" if cmd is not None else "attaching to container"
            log.warning("streaming: error %s %s: %s", what, container_id, e)
            status = internal_error(f"error {what}: {e}")
        for fd in keep:
            os.close(fd)
        keep.clear()
        for thread in outputs:
            thread.join(DRAIN_GRACE)
        os.write(stop_w, b"x")
        for thread in outputs:
            thread.join()
        try:
            session.write_status(status)
        except OSError as e:
            log.debug("streaming: status not delivered: %s", e)
    finally:
        for fd in keep:
            os.close(fd)
        session.close()  # ends the stdin pump's read, whatever the client does
        for thread in threads:
            thread.join(DRAIN_GRACE)
        os.close(stop_r)
        os.close(stop_w)
