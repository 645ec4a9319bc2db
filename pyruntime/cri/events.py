"""Container events: the fan-out behind GetContainerEvents, and the watcher that notices supervisors ending.

A kubelet with evented PLEG reacts to these events instead of relisting every second, so an event lost is a
pod that looks stuck until the next relist: every subscriber gets every event, in order, from a queue of its
own; a subscriber that stops reading is dropped (its queue bounded) rather than making the daemon hold an
ever-growing backlog or blocking the publisher.

The watcher learns of a container's end from its supervisor's exit, the one process that outlives the
container and writes exit.json. It holds a pidfd per supervisor (os.pidfd_open works on processes that are
not our children, so it works the same after a daemon restart) and opens it against the recorded start
time, so a recycled pid is never mistaken for the supervisor.
"""
from __future__ import annotations

import logging
import os
import queue
import select
import threading
from collections.abc import Callable, Iterator

from proto import api_pb2
from pynode_os.proc import process_alive

log = logging.getLogger(__name__)

SUBSCRIBER_BACKLOG = 1024


class EventHub:
    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._subscribers: list[queue.Queue] = []
        self._closed = False

    def publish(self, event: api_pb2.ContainerEventResponse) -> None:
        with self._mutex:
            subscribers = list(self._subscribers)
        for q in subscribers:
            try:
                q.put_nowait(event)
            except queue.Full:
                log.warning("container events: a subscriber fell %d events behind; dropping it", SUBSCRIBER_BACKLOG)
                self._drop(q)

    def subscribe(self, alive: Callable[[], bool] = lambda: True, poll: float = 1.0) -> Iterator[
            api_pb2.ContainerEventResponse]:
        """The events published from now on, until `alive()` turns False (the client went), the subscriber
        is dropped, or the hub closes."""
        q: queue.Queue = queue.Queue(SUBSCRIBER_BACKLOG)
        with self._mutex:
            self._subscribers.append(q)
        try:
            while alive() and not self._closed:
                try:
                    event = q.get(timeout=poll)
                except queue.Empty:
                    with self._mutex:
                        if q not in self._subscribers:
                            return
                    continue
                if event is None:
                    return
                yield event
        finally:
            self._drop(q)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            subscribers, self._subscribers = self._subscribers, []
        for q in subscribers:
            try:
                q.put_nowait(None)
            except queue.Full:
                pass

    def _drop(self, q: queue.Queue) -> None:
        with self._mutex:
            if q in self._subscribers:
                self._subscribers.remove(q)


class SupervisorWatcher:
    """Calls `on_exit(container_id)` from its own thread once the container's supervisor has ended (at once
    when it is already gone at `watch`)."""

    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self._on_exit = on_exit
        self._mutex = threading.Lock()
        self._fds: dict[int, str] = {}  # pidfd -> container id
        self._pending: list[int] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._poll = select.poll()
        self._poll.register(self._wake_r, select.POLLIN)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="supervisor-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, container_id: str, pid: int, start_time: int) -> None:
        try:
            fd = os.pidfd_open(pid) if pid > 0 else -1
        except ProcessLookupError:
            fd = -1
        if fd >= 0 and not process_alive(pid, start_time):  # the pid was recycled: ours is gone
            os.close(fd)
            fd = -1
        if fd < 0:
            self._notify(container_id)
            return
        with self._mutex:
            self._fds[fd] = container_id
            self._pending.append(fd)  # registered by the watcher thread: a poll object is not shared
        os.write(self._wake_w, b"w")

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"s")
        if self._thread.is_alive():
            self._thread.join()
        with self._mutex:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while not self._stopping:
            for fd, _ in self._poll.poll():
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    with self._mutex:
                        pending, self._pending = self._pending, []
                    for new in pending:
                        self._poll.register(new, select.POLLIN)
                    continue
                with self._mutex:
                    container_id = self._fds.pop(fd, None)
                self._poll.unregister(fd)
                os.close(fd)
                if container_id is not None:
                    self._notify(container_id)

    def _notify(self, container_id: str) -> None:
        try:
            self._on_exit(container_id)
        except Exception:  # a failing handler must not stop the watching of every other container
            log.exception("container %s: handling its supervisor's exit failed", container_id)
