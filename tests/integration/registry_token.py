"""A token server for docker-registry's `auth: token`: checks Basic credentials and issues RS256 JWTs.

The registry trusts the self-signed certificate made here (rootcertbundle) and the token carries it in its
x5c header. Signing uses the openssl command line, so the tests need no crypto library of their own.
"""
from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

ISSUER = "pynode-test-issuer"
SERVICE = "pynode-registry"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, workdir: Path, users: dict[str, str], *, anonymous_repos: tuple[str, ...] = ()) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.users = users
        self.anonymous_repos = anonymous_repos
        self.key = self.dir / "token.key"
        self.cert = self.dir / "token.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "2", "-subj", "/CN=pynode-token"],
                       check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.requests: list[dict] = []
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def realm(self) -> str:
        assert self.httpd is not None, "start() first"
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/token"

    def sign(self, claims: dict) -> str:
        header = {"alg": "RS256", "typ": "JWT", "x5c": [self.x5c]}
        payload = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=payload.encode(),
                             check=True, capture_output=True).stdout
        return payload + "." + _b64(sig)

    def _grant(self, user: str | None, scope: str) -> list[dict]:
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        if kind != "repository":
            return []
        if user is not None:
            return [{"type": "repository", "name": name, "actions": actions.split(",")}]
        if name in self.anonymous_repos:
            return [{"type": "repository", "name": name, "actions": ["pull"]}]
        return []

    def start(self) -> TokenServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                user = None
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    name, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                    if server.users.get(name) != password:
                        self.send_response(401)
                        self.end_headers()
                        return
                    user = name
                server.requests.append({"user": user, "scope": query.get("scope", [])})
                access = [g for s in query.get("scope", []) for g in server._grant(user, s)]
                now = int(time.time())
                token = server.sign({"iss": ISSUER, "sub": user or "", "aud": query.get("service", [SERVICE])[0],
                                     "exp": now + 300, "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex,
                                     "access": access})
                body = json.dumps({"token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.httpd and self.thread:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()
            self.httpd = None
