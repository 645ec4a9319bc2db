"""A real registry for the image tests: Debian's docker-registry on 127.0.0.1, with its own config and storage.

Images get into it the way they get into any registry, pushed by skopeo from OCI layouts the test-image kit
builds. Each Registry is a child process of the test session and is stopped (and reaped) by its fixture.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Registry:
    root: Path
    port: int = 0
    auth: str = ""  # "", "htpasswd" or "token"
    users: dict[str, str] = field(default_factory=dict)
    token_realm: str = ""
    token_cert: Path | None = None
    tls: bool = False
    proc: subprocess.Popen | None = None

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _config(self) -> str:
        lines = ["version: 0.1", "log:", "  level: warn", "  accesslog:", "    disabled: true",
                 "storage:", "  filesystem:", f"    rootdirectory: {self.root / 'data'}",
                 "  delete:", "    enabled: true",
                 "http:", f"  addr: 127.0.0.1:{self.port}", "  secret: pynode-test-secret"]
        if self.tls:
            lines += ["  tls:", f"    certificate: {self.cert}", f"    key: {self.root / 'tls.key'}"]
        if self.auth == "htpasswd":
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(
                subprocess.run(["htpasswd", "-Bbn", "-C", "4", u, p], check=True, capture_output=True,
                               text=True).stdout.strip() + "\n" for u, p in self.users.items()))
            lines += ["auth:", "  htpasswd:", "    realm: pynode-test", f"    path: {htpasswd}"]
        elif self.auth == "token":
            lines += ["auth:", "  token:", f"    realm: {self.token_realm}", "    service: pynode-registry",
                      "    issuer: pynode-test-issuer", f"    rootcertbundle: {self.token_cert}"]
        return "\n".join(lines) + "\n"

    def start(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        if self.tls:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-keyout", str(self.root / "tls.key"), "-out", str(self.cert), "-subj", "/CN=127.0.0.1",
                            "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        config = self.root / "config.yml"
        config.write_text(self._config())
        with open(self.root / "registry.log", "wb") as log:
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"docker-registry exited: {(self.root / 'registry.log').read_text()[-2000:]}")
                try:
                    requests.get(f"{self.url}/v2/", timeout=1, verify=str(self.cert) if self.tls else True)
                    return self
                except requests.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError("docker-registry did not start listening")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def push(self, layout: Path, ref: str, *, tag: str = "latest", creds: str | None = None,
             multi_arch: bool = False) -> None:
        """skopeo copy oci:LAYOUT:tag docker://127.0.0.1:PORT/ref over plain HTTP."""
        cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--preserve-digests"]
        if multi_arch:
            cmd.append("--all")
        if creds:
            cmd += ["--dest-creds", creds]
        cmd += [f"oci:{layout}:{tag}", f"docker://{self.host}/{ref}"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
