"""The registry client's deadlines against a stand-in registry on loopback: a manifest dripped a byte at
a time is given up within the progress timeout, not fetched for as long as each byte comes inside the
read timeout."""
from __future__ import annotations

import http.server
import threading

from pyruntime.images import reference
from pyruntime.images.registry import RegistryClient, RegistryError

BODY = b'{"schemaVersion":2' + b" " * 4000 + b"}"


class DrippingRegistry:
    """Answers every manifest GET with a 200 whose body comes one byte every `interval` seconds; `sent`
    counts the bytes it has written."""

    def __init__(self, interval: float) -> None:
        stop = self.stop = threading.Event()
        self.sent = 0
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                for i in range(len(BODY)):
                    if stop.wait(interval):
                        return
                    try:
                        self.wfile.write(BODY[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        return
                    registry.sent += 1

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_a_dripped_manifest_is_given_up_within_the_progress_timeout(tmp_path):
    """Issue 22: a manifest was read with a timeout per read only, so a registry that sent a byte every
    few seconds held the pull (and the pod waiting on it) for as long as it liked."""
    registry = DrippingRegistry(0.1)
    client = RegistryClient(reference.parse(f"{registry.host}/drip/image:1"), hosts_dir=tmp_path,
                            progress_timeout=1.0)
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            client.get_manifest("1")
        except BaseException as e:
            errors.append(e)

    fetcher = threading.Thread(target=fetch, daemon=True)
    try:
        fetcher.start()
        fetcher.join(60)  # the whole body would take the registry over 400 s
        assert not fetcher.is_alive(), "the manifest fetch outlived its progress timeout"
        assert errors and isinstance(errors[0], RegistryError) and "1s" in str(errors[0]), errors
        assert registry.sent < len(BODY)  # given up while the bytes still came, each within the read timeout
    finally:
        registry.close()
        fetcher.join(30)
        client.close()


def test_the_manifest_deadline_is_off_with_a_progress_timeout_of_zero():
    client = RegistryClient(reference.parse("127.0.0.1:1/x/y:1"), progress_timeout=0)
    try:
        assert client.progress_timeout == float("inf") and client.timeout == 60.0
    finally:
        client.close()
