"""jeepney's blocking connection as the OS floor's D-Bus clients (pynode_os/systemd.py, pynode_os/logind.py) use
it, for their unit tests: each call answered by `answer(message)`, the filter handle jeepney's own, and the
signals a test queues handed out as jeepney's recv_until_filtered does (popped off the filter queue and
returned). tests/integration/test_dbus_clients.py runs the same clients over a real bus."""
from __future__ import annotations


class Connection:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.sent: list = []
        self.signals: list = []
        self.filters: list = []  # the rules filter() was given
        self.closed = False

    def send_and_get_reply(self, message, timeout=None):
        self.sent.append(message)
        return self.answer(message)

    def filter(self, rule, queue):
        from jeepney.io.common import FilterHandle, MessageFilters
        self.filters.append(rule)
        return FilterHandle(MessageFilters(), rule, queue)

    def recv_until_filtered(self, queue, timeout=None):
        if not self.signals:
            raise TimeoutError
        queue.append(self.signals.pop(0))
        return queue.popleft()

    def close(self) -> None:
        self.closed = True
