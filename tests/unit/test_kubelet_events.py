"""The kubelet's events: what reaches the API server of events that repeat, vary or flood, as client-go's
EventCorrelator decides for the stock kubelet."""
from __future__ import annotations

import datetime

from lightkube import ApiError

from pykubelet.eventcorrelator import COMBINED, EventCorrelator
from pykubelet.events import WARNING, EventRecorder

T0 = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
POD = {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "default", "uid": "u1"}
OTHER = dict(POD, name="db", uid="u2")


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


class FakeClient:
    """Records the writes; a patch of a name in `gone` is refused 404."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict]] = []
        self.gone: set[str] = set()

    def create(self, event, namespace: str) -> None:
        self.writes.append(("create", event.metadata.name, {"count": event.count, "message": event.message}))

    def patch(self, _kind, name: str, body: dict, namespace: str, patch_type) -> None:
        if name in self.gone:
            raise ApiError(status=type("Status", (), {"code": 404, "message": "not found"})())
        self.writes.append(("patch", name, body))


def send(recorder: EventRecorder, ref: dict, reason: str, message: str, seconds: float) -> None:
    recorder._send(ref, WARNING, reason, message, at(seconds))


def test_a_repeated_event_patches_the_count_of_the_first():
    client = FakeClient()
    recorder = EventRecorder(client, "node-a")
    for i in range(3):
        send(recorder, POD, "FailedMount", 'configmap "cfg" not found', i * 2)
    (kind, name, first), *patches = client.writes
    assert (kind, first) == ("create", {"count": 1, "message": 'configmap "cfg" not found'})
    assert [(k, n, b["count"]) for k, n, b in patches] == [("patch", name, 2), ("patch", name, 3)]
    assert patches[-1][2]["lastTimestamp"] == "2026-12-07T12:00:04Z"


def test_an_object_gets_25_writes_then_one_per_five_minutes():
    """A pod stuck on a missing configMap, retried every 2 s for 20 min: the stock kubelet's budget."""
    client = FakeClient()
    recorder = EventRecorder(client, "node-a")
    for i in range(601):
        send(recorder, POD, "FailedMount", 'configmap "cfg" not found', i * 2)
    assert len(client.writes) == 25 + 4  # the burst, then the refills of 300, 600, 900 and 1200 s
    assert client.writes[-1][2]["count"] == 601  # every occurrence counted, written or not


def test_the_budget_is_per_object():
    client = FakeClient()
    recorder = EventRecorder(client, "node-a")
    for i in range(30):
        send(recorder, POD, "BackOff", "back-off", i)
    send(recorder, OTHER, "BackOff", "back-off", 31)
    assert len(client.writes) == 26
    assert client.writes[-1][0] == "create"


def test_more_than_ten_messages_of_one_reason_are_combined():
    correlator = EventCorrelator()
    decisions = [correlator.correlate(POD, WARNING, "Unhealthy", f"probe failed: {i}", at(i)) for i in range(12)]
    assert [d.message if d else None for d in decisions[:10]] == [f"probe failed: {i}" for i in range(10)]
    combined = decisions[10]
    assert combined is not None and combined.message == COMBINED + "probe failed: 10" and combined.count == 1
    correlator.made(combined, "web.1", "default")
    again = correlator.correlate(POD, WARNING, "Unhealthy", "probe failed: 11", at(12))
    assert again is not None and (again.name, again.count, again.message) == (
        "web.1", 2, COMBINED + "probe failed: 11")
    later = correlator.correlate(POD, WARNING, "Unhealthy", "probe failed: 12", at(12 + 601))
    assert later is not None and later.message == "probe failed: 12"  # ten quiet minutes start a new window


def test_an_event_whose_object_expired_is_made_again():
    client = FakeClient()
    recorder = EventRecorder(client, "node-a")
    send(recorder, POD, "BackOff", "back-off", 0)
    client.gone.add(client.writes[0][1])
    send(recorder, POD, "BackOff", "back-off", 3600)
    assert [(k, b["count"]) for k, _, b in client.writes] == [("create", 1), ("create", 2)]
    send(recorder, POD, "BackOff", "back-off", 3601)
    assert client.writes[-1][:2] == ("patch", client.writes[1][1])
