"""pyruntime-cri's node-wide registry credentials go to the registry they name and to no other host: not to a
second registry an image names (played here by a recording server on another loopback port that asks for
Basic credentials, as any registry owner could), not across a redirect to another host, and not into the
daemon's debug log; nor do the credentials a pull request brings in its AuthConfig, as the kubelet sends a
pod's pull secret."""
from __future__ import annotations

import base64
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyruntime.errors import FailedPreconditionError, UnavailableError
from pyruntime.images import reference
from pyruntime.images.registry import RegistryClient
from pyruntime.images.request import Credentials
from tests.conformance.critest import CRICTL, PyruntimeCri
from tests.integration.registry_server import Registry
from tests.kit.images import push_busybox

USER, PASSWORD = "alice", "n0de-wide-s3cret"


class Recorder:
    """An HTTP server on loopback that answers every request with `status` (401 with a Basic challenge, or a
    redirect to `location`) and keeps each request's Authorization header (None when it had none)."""

    def __init__(self, status: int = 401, location: str = "") -> None:
        self.seen: list[str | None] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                recorder.seen.append(self.headers.get("Authorization"))
                self.send_response(status)
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="owner-of-b"')
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.stop()


@pytest.fixture
def registry_a(tmp_path: Path) -> Iterator[Registry]:
    """A registry with a password, holding busybox as private/busybox:1."""
    reg = Registry(tmp_path / "reg-a", auth="htpasswd", users={USER: PASSWORD}).start()
    try:
        push_busybox(reg, tmp_path, "private/busybox:1", creds=f"{USER}:{PASSWORD}")
        yield reg
    finally:
        reg.stop()


class ScopedCredsCri(PyruntimeCri):
    creds = ""

    def cni_setup(self) -> None:
        self.cni_conf.mkdir(parents=True, exist_ok=True)  # no pod here: no plugins, no network
        (self.work / "cni-bin").mkdir(parents=True, exist_ok=True)

    def argv(self) -> list[str]:
        daemon = str(Path(sys.executable).with_name("pyruntime-cri"))  # this venv's, whatever PATH says
        creds = ["--registry-creds", self.creds] if self.creds else []
        return [daemon, *super().argv()[1:], *creds, "--log-level", "debug"]


def crictl(daemon: PyruntimeCri, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CRICTL), "--runtime-endpoint", daemon.url, "--image-endpoint", daemon.url,
                           "--timeout", "60s", *args], capture_output=True, text=True, timeout=120)


def test_node_credentials_never_reach_another_registry(tmp_path: Path, registry_a: Registry,
                                                       recorder: Recorder) -> None:
    """A pod names an image on the attacker's registry first: its 401 gets no Authorization (before, the
    daemon answered any registry's challenge with the node's credentials), and the registry they are for
    still takes them."""
    hosts = tmp_path / "certs.d"
    hosts.mkdir()
    daemon = ScopedCredsCri(tmp_path / "cri", hosts)
    daemon.creds = f"{registry_a.host}={USER}:{PASSWORD}"
    try:
        daemon.start()
        refused = crictl(daemon, "pull", f"{recorder.host}/private/busybox:1")
        assert recorder.seen and all(h is None for h in recorder.seen), recorder.seen
        assert refused.returncode != 0 and "requires credentials" in refused.stderr, refused.stderr
        pulled = crictl(daemon, "pull", f"{registry_a.host}/private/busybox:1")
        assert pulled.returncode == 0, pulled.stderr + daemon.log_tail()
        crictl(daemon, "rmi", f"{registry_a.host}/private/busybox:1")
    finally:
        daemon.stop()
    assert PASSWORD not in (daemon.work / "daemon.log").read_text(errors="replace")


def test_credentials_of_a_pull_request_stay_out_of_the_debug_log(tmp_path: Path, registry_a: Registry) -> None:
    """A pull with the credentials in PullImage's AuthConfig (crictl --creds: the kubelet's way with a pod's pull
    secret), and one with a wrong password, which fails: the daemon logs each at debug level, and neither
    password shows in its log, nor USER:PASSWORD in base64 (a Basic header's and an auth field's form)."""
    hosts = tmp_path / "certs.d"
    hosts.mkdir()
    daemon = ScopedCredsCri(tmp_path / "cri", hosts)
    image, wrong = f"{registry_a.host}/private/busybox:1", "not-the-s3cret-either"
    try:
        daemon.start()
        refused = crictl(daemon, "pull", "--creds", f"{USER}:{wrong}", image)
        assert refused.returncode != 0, refused.stdout
        pulled = crictl(daemon, "pull", "--creds", f"{USER}:{PASSWORD}", image)
        assert pulled.returncode == 0, pulled.stderr + daemon.log_tail()
        crictl(daemon, "rmi", image)
    finally:
        daemon.stop()
    log = (daemon.work / "daemon.log").read_text(errors="replace")
    assert [line for line in log.splitlines() if " DEBUG " in line and "PullImage" in line], log[-2000:]
    for secret in (PASSWORD, wrong):
        assert secret not in log
        assert base64.b64encode(f"{USER}:{secret}".encode()).decode() not in log


def test_unscoped_node_credentials_stop_the_daemon(tmp_path: Path) -> None:
    """An unscoped USER:PASSWORD (once sent to any registry) stops the daemon at start, the setting named and
    the password not quoted; a daemon that serves with it instead is stopped and fails the test."""
    daemon = ScopedCredsCri(tmp_path / "cri", tmp_path)
    daemon.creds = f"{USER}:{PASSWORD}"
    daemon.cni_setup()
    log = daemon.work / "daemon.log"
    with open(log, "wb") as out:
        daemon.proc = subprocess.Popen(daemon.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = daemon.proc.wait(timeout=30)
        daemon.proc = None
    except subprocess.TimeoutExpired:
        code = None
    finally:
        daemon.stop()
    output = log.read_text(errors="replace")
    assert code is not None and code != 0, f"the daemon served with unscoped credentials: {output[-2000:]}"
    assert "--registry-creds: must be HOST=USER:PASSWORD" in output
    assert PASSWORD not in output


def test_credentials_are_not_sent_across_a_redirect(recorder: Recorder) -> None:
    """A registry that redirects (as to a blob store) hands the request to another host: requests drops the
    Authorization header there, so the other host sees no credentials."""
    redirecting = Recorder(status=307, location=f"http://{recorder.host}/elsewhere")
    try:
        client = RegistryClient(reference.parse(f"{redirecting.host}/private/busybox:1"),
                                credentials=Credentials(token="a-registry-token"))
        try:
            with pytest.raises((FailedPreconditionError, UnavailableError)):
                client.get_manifest("1")
        finally:
            client.close()
        assert redirecting.seen and all(h == "Bearer a-registry-token" for h in redirecting.seen)
        assert recorder.seen and all(h is None for h in recorder.seen), recorder.seen
    finally:
        redirecting.stop()
