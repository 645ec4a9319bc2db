"""A TCP proxy on loopback for tests of clients whose server is slow, cuts them off, or is not there yet."""
from __future__ import annotations

import socket
import threading
import time


class CuttingProxy:
    """A TCP proxy on loopback to a local server (a registry, an API server) that drops the first `cuts`
    connections after `limit` bytes of response, and with `pause` set, sleeps after each 64 kB it forwards (a
    slow link, so kills land mid-pull)."""

    def __init__(self, upstream: int, *, limit: int = 0, cuts: int = 0, pause: float = 0.0,
                 stall: bool = False, port: int = 0) -> None:
        """`stall`: a cut connection is left open, silent, instead of closed (until stop()); `port`: the one
        to listen on (0: any free one)."""
        self.upstream, self.limit, self.cuts, self.pause, self.stall = upstream, limit, cuts, pause, stall
        self.stopped = threading.Event()
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.conns: list[socket.socket] = []
        self.stopping = False
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns += [client, server]
            cut = self.cuts > 0
            self.cuts -= 1
            for src, dst, limit, log in ((client, server, None, True), (server, client, self.limit if cut else None,
                                                                        False)):
                t = threading.Thread(target=self._pipe, args=(src, dst, limit, log), daemon=True)
                t.start()
                self.threads.append(t)

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None, log: bool) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if log:
                    self.requests.append(data)
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: limit - sent])
                    if self.stall:
                        self.stopped.wait()
                    break
                dst.sendall(data)
                sent += len(data)
                if self.pause and not log:
                    time.sleep(self.pause)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self.stopping = True
        self.stopped.set()
        self.sock.shutdown(socket.SHUT_RDWR)  # close() alone does not wake a thread blocked in accept()
        self.sock.close()
        for c in self.conns:
            c.close()
        for t in self.threads:
            t.join(5)
        self.accepter.join(5)
