"""The four probe actions (exec, httpGet, tcpSocket, grpc), shared by the probes and the lifecycle hooks.

A probe talks to a workload the node does not trust: an answer may be slow, huge, a redirect elsewhere
or garbage, so every action has a deadline (timeoutSeconds) for the whole of it, connect, request,
response and redirects together (a timeout per read would let a server that drips a byte just inside it
hold the probe for ever), reads at most a few KiB of what it gets,
follows redirects only to the same host (a redirect to another host is not followed and counts as a
success with a warning, as the kubelet's), and reports a result, never an exception. An action that could
not be run at all (the container went away under it, a port name it lacks) is UNKNOWN: the probe worker
throws that away rather than counting it as a failure. HTTPS is not verified (the kubelet's probes don't:
a pod's certificate is for its clients, not for the node), and the traffic goes only to the pod's IP or the
host its spec names.
"""
from __future__ import annotations

import enum
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

from pykubelet import runtime as cri
from pykubelet.api.podmodel import Action, Container, ExecAction, HTTPGetAction, TCPSocketAction
from pykubelet.errors import DeadlineExceededError, InvalidArgumentError

USER_AGENT = "kube-probe/1.37"
MAX_BODY = 10 * 1024
MAX_REDIRECTS = 10
FOLLOWED = (301, 302, 303, 307, 308)  # the redirects Go's HTTP client follows; any other 3xx is the answer
# the message of a success whose redirect was not followed: the probe manager makes it a ProbeWarning event
REDIRECT_WARNING = "Probe terminated redirects, Response body: "


class Result(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Outcome:
    result: Result
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.result is Result.SUCCESS


class ProbeSpecError(InvalidArgumentError):
    """A probe or hook that names something the container does not have (a port name)."""


def _text(data: bytes) -> str:
    return data[:MAX_BODY].decode("utf-8", "replace").strip()


def resolve_port(port: int | str, container: Container, field_path: str) -> int:
    """A port number, or the number of the container port with that name."""
    if isinstance(port, int) or port.isdigit():
        number = int(port)
    else:
        number = next((p.container_port for p in container.ports if p.name == port), 0)
        if not number:
            raise ProbeSpecError(f"{field_path}: container {container.name!r} has no port named {port!r}")
    if not 0 < number < 65536:
        raise ProbeSpecError(f"{field_path}: invalid port {port!r}")
    return number


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run_exec(runtime: cri.CRIRuntime, container_id: str, command: list[str], timeout: float) -> Outcome:
    """`command` in the container through CRI ExecSync; exit 0 is a success."""
    try:
        stdout, stderr, code = runtime.exec_sync(container_id, list(command), max(1, int(timeout)))
    except cri.DeadlineExceeded:
        return Outcome(Result.FAILURE, f"command {command!r} timed out")
    except cri.CRIError as e:
        if "timeout" in e.details.lower() or "deadline" in e.details.lower():
            return Outcome(Result.FAILURE, f"command {command!r} timed out")
        return Outcome(Result.UNKNOWN, f"exec {command!r}: {e.details}")
    output = _text(stdout + stderr)
    if code == 0:
        return Outcome(Result.SUCCESS, output)
    return Outcome(Result.FAILURE, output or f"command {command!r} exited with {code}")


def http_url(action: HTTPGetAction, default_host: str, container: Container,
             field_path: str) -> tuple[str, dict[str, str]]:
    """The URL and the headers of an httpGet action."""
    port = resolve_port(action.port, container, f"{field_path}.port")
    host = action.host or default_host
    scheme = action.scheme.lower()
    path = action.path or "/"
    if not path.startswith("/"):
        path = "/" + path
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
    for name, value in action.headers:
        for known in list(headers):  # a header given in the spec replaces the default, in any case
            if known.lower() == name.lower():
                del headers[known]
        headers[name] = value
    return f"{scheme}://{host_port(host, port)}{path}", headers


class ProbeTimeout(DeadlineExceededError, TimeoutError):
    """The probe's deadline passed; a TimeoutError too, as the socket's own timeouts it stands for."""


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """A TCP connection to host:port, each address tried with what is left of the deadline."""
    error: OSError = ProbeTimeout()
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProbeTimeout()
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(remaining)
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            error = ProbeTimeout()
        except OSError as e:
            sock.close()
            error = e
    raise error


class _Watchdog:
    """Shuts the connection down when the deadline passes, whichever read or handshake is waiting then.
    It holds a dup of the socket's fd: shutdown(2) acts on the connection, and TLS takes over the fd of
    the socket it wraps."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock.dup()
        self.fired = threading.Event()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the connection ended meanwhile

    def close(self) -> None:
        self._timer.cancel()
        self._timer.join()
        self._sock.close()


def _get(url: str, headers: dict[str, str], deadline: float) -> tuple[int, str | None, bytes]:
    """(status, Location, up to MAX_BODY bytes of the body) of one GET, all of it before `deadline`."""
    import http.client
    import ssl

    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    sock = _connect(host, port, deadline)
    watchdog = _Watchdog(sock, deadline)
    conn = http.client.HTTPSConnection(host, port) if https else http.client.HTTPConnection(host, port)
    try:
        if https:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            sock = context.wrap_socket(sock, server_hostname=host)
        conn.sock = sock
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={**headers, "Connection": "close"})
        res = conn.getresponse()
        body = res.read(MAX_BODY)
        if watchdog.fired.is_set():  # what was read is cut short: the answer did not come in time
            raise ProbeTimeout()
        return res.status, res.getheader("Location"), body
    except (OSError, http.client.HTTPException):
        if watchdog.fired.is_set() or time.monotonic() >= deadline:
            raise ProbeTimeout() from None
        raise
    finally:
        watchdog.close()
        conn.close()
        sock.close()


def run_http(url: str, headers: dict[str, str], timeout: float) -> Outcome:
    """GET `url`; 200-399 is a success (a 3xx that was not followed: with a warning, as the kubelet's
    DoHTTPProbe words it)."""
    import http.client

    deadline = time.monotonic() + timeout
    original = urllib.parse.urlsplit(url).hostname
    for _ in range(MAX_REDIRECTS + 1):
        try:
            status, location, body = _get(url, headers, deadline)
        except ProbeTimeout:
            return Outcome(Result.FAILURE, f'Get "{url}": context deadline exceeded '
                           "(Client.Timeout exceeded while awaiting headers)")
        except (OSError, http.client.HTTPException) as e:
            return Outcome(Result.FAILURE, f'Get "{url}": {_reason(e)}')
        if status in FOLLOWED and location:
            target = urllib.parse.urljoin(url, location)
            if urllib.parse.urlsplit(target).hostname == original:
                url = target
                continue
        if 300 <= status < 400:  # the kubelet's event quotes the body: what a user sees of the redirect
            return Outcome(Result.SUCCESS, f"{REDIRECT_WARNING}{body[:MAX_BODY].decode('utf-8', 'replace')}")
        if 200 <= status < 400:
            return Outcome(Result.SUCCESS, _text(body))
        return Outcome(Result.FAILURE, f"HTTP probe failed with statuscode: {status}")
    return Outcome(Result.FAILURE, f'Get "{url}": stopped after {MAX_REDIRECTS} redirects')


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def run_tcp(host: str, port: int, timeout: float) -> Outcome:
    """A TCP connection to host:port is a success; it is closed at once."""
    try:
        with _connect(host, port, time.monotonic() + timeout):
            return Outcome(Result.SUCCESS)
    except ProbeTimeout:
        return Outcome(Result.FAILURE, f"dial tcp {host_port(host, port)}: i/o timeout")
    except OSError as e:
        return Outcome(Result.FAILURE, f"dial tcp {host_port(host, port)}: {e.strerror or e}")


# grpc.health.v1: HealthCheckRequest {string service = 1}; HealthCheckResponse {ServingStatus status = 1}.
# Two one-field messages, encoded by hand: no generated code and no grpcio-health-checking dependency.
SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        n |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return n, i


def encode_health_request(service: str) -> bytes:
    raw = service.encode()
    return b"\x0a" + _varint(len(raw)) + raw if raw else b""


def decode_health_request(data: bytes) -> str:
    """The service of a HealthCheckRequest (for a test's health server)."""
    i, service = 0, ""
    while i < len(data):
        key, i = _read_varint(data, i)
        if key & 7 == 2:
            length, i = _read_varint(data, i)
            if key >> 3 == 1:
                service = data[i:i + length].decode()
            i += length
        elif key & 7 == 0:
            _, i = _read_varint(data, i)
        else:
            raise ValueError(f"unexpected wire type {key & 7}")
    return service


def encode_health_response(status: int) -> bytes:
    return b"\x08" + _varint(status) if status else b""


def decode_health_response(data: bytes) -> int:
    """The status of a HealthCheckResponse (0, UNKNOWN, when absent); unknown fields are skipped."""
    i, status = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if key >> 3 == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return status


def run_grpc(host: str, port: int, service: str, timeout: float) -> Outcome:
    """grpc.health.v1.Health/Check over plaintext HTTP/2 (as the kubelet's); SERVING is a success."""
    import grpc

    target = host_port(host, port)
    options = [("grpc.enable_http_proxy", 0), ("grpc.primary_user_agent", USER_AGENT)]
    with grpc.insecure_channel(target, options=options) as channel:
        check = channel.unary_unary(HEALTH_CHECK, request_serializer=encode_health_request,
                                    response_deserializer=decode_health_response)
        try:
            status = check(service, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return Outcome(Result.FAILURE, f"timeout: health rpc did not complete within {timeout:g}s")
            if code == grpc.StatusCode.UNAVAILABLE:
                return Outcome(Result.FAILURE, f'failed to connect service "{target}" within {timeout:g}s: '
                               f"{e.details()}")
            return Outcome(Result.FAILURE, f"health rpc probe failed: {code.name}: {e.details()}")
        except ValueError as e:
            return Outcome(Result.FAILURE, f"health rpc probe failed: bad response: {e}")
    if status != 1:
        return Outcome(Result.FAILURE, f"service unhealthy (responded with {SERVING_STATUS.get(status, status)!r})")
    return Outcome(Result.SUCCESS)


def run_action(runtime: cri.CRIRuntime, action: Action, container: Container, container_id: str, pod_ip: str,
               timeout: float, field_path: str) -> Outcome:
    """The probe's or hook's `action` against the container."""
    try:
        if isinstance(action, ExecAction):
            return run_exec(runtime, container_id, list(action.command), timeout)
        if isinstance(action, HTTPGetAction):
            url, headers = http_url(action, pod_ip, container, f"{field_path}.httpGet")
            return run_http(url, headers, timeout)
        if isinstance(action, TCPSocketAction):
            port = resolve_port(action.port, container, f"{field_path}.tcpSocket.port")
            return run_tcp(action.host or pod_ip, port, timeout)
        port = resolve_port(action.port, container, f"{field_path}.grpc.port")
        return run_grpc(pod_ip, port, action.service, timeout)
    except ProbeSpecError as e:  # as the kubelet's: an error, not a verdict on the container
        return Outcome(Result.UNKNOWN, str(e))
