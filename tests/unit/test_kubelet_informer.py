"""pykubelet's informer logic against a fake watch source: the cache follows events, bookmarks move the
resourceVersion without events, a 410 makes it list again and turn the difference into events (a deletion
missed while away included), and failures back off with jitter."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from pykubelet.api.informer import ADDED, BOOKMARK, DELETED, MODIFIED, Gone, Informer, key_of
from pykubelet.api.workqueue import WorkQueue


def obj(name: str, rv: str, namespace: str | None = "default"):
    return SimpleNamespace(metadata=SimpleNamespace(name=name, namespace=namespace, resourceVersion=rv))


class FakeSource:
    """Scripted lists and watches: each watch() plays the next script; a script item that is an exception
    is raised there."""

    def __init__(self, lists: list[tuple[str, list]], watches: list[list]) -> None:
        self.lists, self.watches = lists, watches
        self.listed = 0
        self.watched_from: list[str] = []
        self.done = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def list(self):
        self.listed += 1
        return self.lists.pop(0)

    def watch(self, resource_version: str) -> Iterator:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.done.set()
            self.closed.wait(10)  # a quiet watch, until the informer stops
            return
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


def run(source: FakeSource, **kw) -> tuple[Informer, list]:
    inf = Informer(source, name="test", rand=lambda: 0.0, backoff_base=0.001, **kw)
    events: list = []
    inf.add_handler(lambda kind, old, new: events.append((kind, key_of(new), new.metadata.resourceVersion)))
    inf.start()
    assert source.done.wait(5)
    inf.stop()
    assert inf.join(5)
    return inf, events


def test_list_then_watch_keeps_the_cache_and_resource_version():
    source = FakeSource([("10", [obj("a", "5")])], [[
        (ADDED, obj("b", "11")), (MODIFIED, obj("a", "12")), (DELETED, obj("b", "13"))]])
    inf, events = run(source)
    assert events == [(ADDED, "default/a", "5"), (ADDED, "default/b", "11"), (MODIFIED, "default/a", "12"),
                      (DELETED, "default/b", "13")]
    a = inf.get("default/a")
    assert inf.keys() == ["default/a"] and a is not None and a.metadata.resourceVersion == "12"
    assert inf.resource_version == "13" and inf.has_synced()
    assert source.watched_from == ["10", "13"]  # the second watch resumes where the first ended


def test_bookmark_moves_the_version_without_an_event():
    source = FakeSource([("10", [])], [[(BOOKMARK, obj("", "50", None))]])
    _, events = run(source)
    assert events == []
    assert source.watched_from == ["10", "50"] and source.listed == 1


def test_gone_relists_and_delivers_what_changed_meanwhile():
    source = FakeSource(
        [("10", [obj("a", "1"), obj("b", "2"), obj("c", "3")]),
         ("90", [obj("a", "1"), obj("c", "80"), obj("d", "85")])],
        [[Gone("too old")]])
    inf, events = run(source)
    assert source.listed == 2 and source.watched_from == ["10", "90"]
    assert events[3:] == [(DELETED, "default/b", "2"), (MODIFIED, "default/c", "80"), (ADDED, "default/d", "85")]
    assert sorted(inf.keys()) == ["default/a", "default/c", "default/d"]


def test_watch_failure_retries_from_the_same_version_without_listing():
    source = FakeSource([("10", [])], [[ConnectionError("reset")], [(ADDED, obj("a", "11"))]])
    _, events = run(source)
    assert source.listed == 1 and source.watched_from == ["10", "10", "11"]
    assert events == [(ADDED, "default/a", "11")]


def test_failed_list_is_retried():
    class Flaky(FakeSource):
        def list(self):
            if self.listed == 0:
                self.listed += 1
                raise ConnectionError("refused")
            return super().list()

    source = Flaky([("10", [obj("a", "1")])], [])
    inf, _ = run(source)
    assert source.listed == 2 and inf.keys() == ["default/a"]


def test_backoff_doubles_to_the_cap_with_jitter():
    inf = Informer(FakeSource([], []), rand=lambda: 0.5)
    assert [inf.backoff(n) for n in (1, 2, 3, 10)] == pytest.approx([1.2, 2.4, 4.8, 45.0])
    assert Informer(FakeSource([], []), rand=lambda: 0.0).backoff(1) == pytest.approx(0.8)


def test_handlers_enqueue_keys_and_bursts_collapse():
    q = WorkQueue()
    source = FakeSource([("1", [])], [[(ADDED, obj("p", "2")), (MODIFIED, obj("p", "3")), (MODIFIED, obj("p", "4")),
                                       (ADDED, obj("p", "5", "kube-system"))]])
    inf = Informer(source, rand=lambda: 0.0)
    inf.enqueue_into(q)
    inf.start()
    assert source.done.wait(5)
    inf.stop()
    assert inf.join(5)
    assert [q.get(timeout=0), q.get(timeout=0), q.get(timeout=0)] == ["default/p", "kube-system/p", None]


def test_cluster_scoped_keys_are_the_name():
    assert key_of(obj("node-a", "1", None)) == "node-a"


def test_decode_event_reads_only_the_version_of_a_bookmark():
    """The API server's Pod bookmark has `spec.containers: null`, which the typed Pod model refuses: the
    watch used to fail on it and retry ("Expected array, got null at $.spec.containers")."""
    from lightkube.resources.core_v1 import Pod

    from pykubelet.api.informer import decode_event

    line = (b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"123",'
            b'"creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}},'
            b'"spec":{"containers":null},"status":{}}}')
    kind, bookmark = decode_event(line, Pod)
    assert kind == BOOKMARK and bookmark.metadata.resourceVersion == "123"
    kind, pod = decode_event(b'{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p",'
                             b'"namespace":"n","resourceVersion":"7"},"spec":{"containers":[{"name":"c"}]}}}', Pod)
    assert kind == ADDED and isinstance(pod, Pod) and key_of(pod) == "n/p"
    assert pod.spec is not None and pod.spec.containers[0].name == "c"
    with pytest.raises(Gone):
        decode_event(b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure",'
                     b'"message":"too old resource version","reason":"Expired","code":410}}', Pod)


class StallingAPI:
    """A stand-in API server on loopback: an empty pod list at resourceVersion 10; the first watch answers
    its headers and then says nothing (a half-open connection as the kubelet sees one), the next delivers
    the pod created meanwhile."""

    def __init__(self) -> None:
        import http.server

        api = self
        self.watches = 0
        self.release = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if "watch=true" not in self.path:
                    body = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[]}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                api.watches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.flush()
                if api.watches > 1:
                    self.wfile.write(b'{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":'
                                     b'{"name":"late","namespace":"default","resourceVersion":"11"},'
                                     b'"spec":{"containers":[{"name":"c"}]}}}\n')
                    self.wfile.flush()
                api.release.wait(60)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_a_silent_watch_is_dropped_and_the_informer_resumes():
    """Issue 22: a watch had no read timeout, so a connection that went silent (half-open: the API server
    or a middlebox gone without a FIN) froze the pod informer for good while the lease kept the node
    Ready. Now a watch that hears nothing for its read timeout is dropped and watched again."""
    import httpx2
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Pod

    from pykubelet.api.informer import LightkubeSource

    api = StallingAPI()
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": api.url}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"})
    client = Client(config, timeout=httpx2.Timeout(5.0), trust_env=False)
    inf = Informer(LightkubeSource(client, Pod, read_timeout=1.0), name="pods", rand=lambda: 0.0,
                   backoff_base=0.01)
    seen = threading.Event()
    inf.add_handler(lambda kind, _old, new: seen.set() if new.metadata.name == "late" else None)
    try:
        inf.start()
        assert inf.wait_synced(10)
        assert seen.wait(10 * 1.0 + 10), "the informer stayed on a silent watch"
        assert api.watches >= 2 and inf.get("default/late") is not None
    finally:
        inf.stop()
        api.close()
        assert inf.join(10)
