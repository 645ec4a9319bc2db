from __future__ import annotations

import fcntl
import hashlib
import threading
import time
from pathlib import Path

import pytest

from pyruntime.images.content import LOCKS, ContentStore, DigestError, flock, sha256_digest
from pyruntime.images.registry import endpoints_for


def test_put_verifies_digest(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = store.put(b"hello")
    assert store.read(digest) == b"hello"
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DigestError, match=wrong):
        store.put(b"hello", wrong)
    assert store.list() == [digest]


def test_writer_commits_only_verified_blobs(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = b"x" * 10000
    digest = sha256_digest(data)
    with store.lock(digest), store.writer(digest, len(data)) as w:
        w.write(data)
    assert store.has(digest)

    lie = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(DigestError, match=lie), store.lock(lie), store.writer(lie, len(data)) as w:
        w.write(data)
    assert not store.has(lie)
    assert list(store.ingest.iterdir()) == []


def test_writer_resumes_partial(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = bytes(range(256)) * 100
    digest = sha256_digest(data)
    with pytest.raises(ConnectionError), store.writer(digest, len(data)) as w:
        w.write(data[:5000])
        raise ConnectionError("cut")
    assert store.partial_size(digest) == 5000
    with store.writer(digest, len(data)) as w:
        assert w.offset == 5000
        w.write(data[5000:])
    assert store.read(digest) == data


def test_oversized_blob_is_refused(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = sha256_digest(b"abc")
    with pytest.raises(DigestError, match="more than the expected"), store.writer(digest, 2) as w:
        w.write(b"abc")


def test_malformed_digest_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(DigestError, match="malformed"):
        ContentStore(tmp_path).path("sha256:../../etc/passwd")


def test_hosts_toml_mirrors_then_server(tmp_path: Path) -> None:
    (tmp_path / "docker.io").mkdir()
    (tmp_path / "docker.io" / "hosts.toml").write_text(
        'server = "https://registry-1.docker.io"\n'
        '[host."http://127.0.0.1:5001"]\n  capabilities = ["pull", "resolve"]\n'
        '[host."https://mirror.example"]\n  ca = "ca.pem"\n')
    eps = endpoints_for("docker.io", tmp_path)
    assert [e.url for e in eps] == ["http://127.0.0.1:5001", "https://mirror.example", "https://registry-1.docker.io"]
    assert eps[1].ca == str(tmp_path / "docker.io" / "ca.pem") and eps[0].mirror and not eps[2].mirror
    assert [e.url for e in endpoints_for("127.0.0.1:5000", tmp_path)] == ["http://127.0.0.1:5000"]
    assert [e.url for e in endpoints_for("quay.io", tmp_path)] == ["https://quay.io"]


def test_a_lock_removed_with_what_it_guards_leaves_no_file_and_no_mutex(tmp_path: Path) -> None:
    lock = tmp_path / "container-c1.lock"
    with LOCKS.hold(lock, remove=True):
        assert lock.exists() and str(lock) in LOCKS._mutexes
    assert not lock.exists() and str(lock) not in LOCKS._mutexes
    with LOCKS.hold(lock):  # an ordinary hold keeps its file, and forgets its mutex all the same
        pass
    assert lock.exists() and str(lock) not in LOCKS._mutexes


def test_who_waited_for_a_lock_file_removed_meanwhile_locks_the_one_at_its_path(tmp_path: Path) -> None:
    lock = tmp_path / "container-c1.lock"
    seen: list[bool] = []

    def waiter() -> None:
        with flock(lock, fcntl.LOCK_EX):
            seen.append(lock.exists())

    with flock(lock, fcntl.LOCK_EX):
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)  # the waiter is blocked on this file's lock
        assert not seen
        lock.unlink()
    thread.join(5)
    assert seen == [True]
