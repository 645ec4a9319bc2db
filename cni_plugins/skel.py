"""The CNI execution protocol: environment, stdin config, version checks, results and error JSON.

The plugins only see a validated `CmdArgs` and raise `CNIError`; this module turns a request (an
environment and the stdin bytes) into stdout bytes and an exit status, so the same code serves a plugin
run in-process and one served by the resident helper.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cni_plugins.result import Result, ResultError
from cni_plugins.versions import COMMAND_SINCE, LATEST, SUPPORTED_VERSIONS, UNVERSIONED, version_tuple

ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENVIRONMENT = 4
ERR_IO_FAILURE = 5
ERR_DECODING_FAILURE = 6
ERR_INVALID_NETWORK_CONFIG = 7
ERR_TRY_AGAIN_LATER = 11
ERR_NOT_AVAILABLE = 50
ERR_LIMITED_CONNECTIVITY = 51
ERR_INTERNAL = 999

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "VERSION", "GC")
REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "GC": (),
    "STATUS": (),
    "VERSION": (),
}
# matched with fullmatch: `$` would also match before a final newline, which the spec's rules do not allow
CONTAINER_ID_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
NETWORK_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")


class CNIError(Exception):
    """An error the plugin reports to its caller with a spec error code."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_json(self, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


@dataclass
class CmdArgs:
    command: str
    container_id: str
    netns: str
    ifname: str
    args: dict[str, str]
    path: list[str]
    stdin: bytes
    config: dict[str, Any]
    version: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def network_name(self) -> str:
        return self.config.get("name", "")

    def prev_result(self) -> Result | None:
        raw = self.config.get("prevResult")
        if not raw:
            return None
        try:
            return Result.from_json(raw)
        except ResultError as exc:
            raise CNIError(ERR_DECODING_FAILURE, "failed to decode prevResult", str(exc)) from exc

    def runtime_config(self) -> dict[str, Any]:
        runtime = self.config.get("runtimeConfig") or {}
        return runtime if isinstance(runtime, dict) else {}


class Plugin(Protocol):
    def add(self, args: CmdArgs) -> Result: ...

    def delete(self, args: CmdArgs) -> None: ...

    def check(self, args: CmdArgs) -> None: ...

    def status(self, args: CmdArgs) -> None: ...

    def gc(self, args: CmdArgs) -> None: ...


def parse_cni_args(raw: str) -> dict[str, str]:
    """CNI_ARGS is `K=V;K=V`; a malformed pair is an environment error naming the pair."""
    out: dict[str, str] = {}
    for pair in filter(None, raw.split(";")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CNIError(ERR_INVALID_ENVIRONMENT, f"invalid CNI_ARGS pair {pair!r}")
        out[key] = value
    return out


def validate_ifname(name: str) -> None:
    """The spec's interface name rules; the message names CNI_IFNAME, as the spec asks of code 4."""
    if not name:
        raise CNIError(ERR_INVALID_ENVIRONMENT, "CNI_IFNAME: interface name is empty")
    if len(name) > 15:
        raise CNIError(
            ERR_INVALID_ENVIRONMENT,
            "CNI_IFNAME: interface name is too long",
            f"interface name should be less than 16 characters: {name!r}",
        )
    if name in (".", "..") or any(c in name for c in "/: \t\n\r\x0b\x0c"):
        raise CNIError(ERR_INVALID_ENVIRONMENT, "CNI_IFNAME: interface name contains an invalid character", repr(name))


def _decode_config(stdin: bytes) -> dict[str, Any]:
    try:
        config = json.loads(stdin)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CNIError(ERR_DECODING_FAILURE, "error decoding network config", f"{exc}") from exc
    if not isinstance(config, dict):
        raise CNIError(ERR_DECODING_FAILURE, "error decoding network config", "network config is not a JSON object")
    version = config.get("cniVersion", UNVERSIONED)
    if not isinstance(version, str):
        raise CNIError(ERR_DECODING_FAILURE, "error decoding network config", "cniVersion must be a string")
    return config


def _parse(env: Mapping[str, str], stdin: bytes) -> CmdArgs:
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CNIError(ERR_INVALID_ENVIRONMENT, "required env variables [CNI_COMMAND] missing")
    if command not in COMMANDS:
        raise CNIError(ERR_INVALID_ENVIRONMENT, f"unknown CNI_COMMAND: {command}")
    missing = [name for name in REQUIRED_ENV[command] if not env.get(name)]
    if missing:
        raise CNIError(ERR_INVALID_ENVIRONMENT, f"required env variables [{','.join(missing)}] missing")
    config = _decode_config(stdin) if command != "VERSION" or stdin.strip() else {"cniVersion": LATEST}
    version = config.get("cniVersion", UNVERSIONED)
    args = CmdArgs(
        command=command,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        ifname=env.get("CNI_IFNAME", ""),
        args=parse_cni_args(env.get("CNI_ARGS", "")),
        path=[p for p in env.get("CNI_PATH", "").split(":") if p],
        stdin=stdin,
        config=config,
        version=version,
        env=env,
    )
    if command == "VERSION":
        return args
    if version not in SUPPORTED_VERSIONS:
        raise CNIError(ERR_INCOMPATIBLE_VERSION, "incompatible CNI versions",
                       f"config is {version!r}, plugin supports {list(SUPPORTED_VERSIONS)}")
    if command in COMMAND_SINCE and version_tuple(version) < COMMAND_SINCE[command]:
        raise CNIError(ERR_INCOMPATIBLE_VERSION, f"config version does not allow {command}", f"config is {version!r}")
    if command in ("ADD", "DEL", "CHECK"):
        if not CONTAINER_ID_RE.fullmatch(args.container_id):
            raise CNIError(ERR_INVALID_ENVIRONMENT, "invalid characters in CNI_CONTAINERID", repr(args.container_id))
        validate_ifname(args.ifname)
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "missing network name")
    if not NETWORK_NAME_RE.fullmatch(name):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "invalid characters found in network name", repr(name))
    return args


def _version_info(args: CmdArgs) -> dict[str, Any]:
    version = args.version if args.version in SUPPORTED_VERSIONS else LATEST
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}


def execute(plugin: Plugin, env: Mapping[str, str], stdin: bytes) -> tuple[int, bytes]:
    """Runs one CNI request; returns (exit status, stdout bytes). Never raises."""
    version = LATEST
    try:
        args = _parse(env, stdin)
        version = args.version if args.version in SUPPORTED_VERSIONS else LATEST
        output = _dispatch(plugin, args)
    except CNIError as exc:
        return 1, error_reply(exc.code, exc.msg, _with_notes(exc.details, exc), version)
    except Exception as exc:  # an unexpected failure still owes the caller the spec's error JSON
        return 1, error_reply(ERR_INTERNAL, f"{type(exc).__name__}: {exc}", _with_notes("", exc), version)
    return 0, _dump(output) if output is not None else b""


def error_reply(code: int, msg: str, details: str = "", version: str = LATEST) -> bytes:
    """The spec's error result as a plugin prints it on stdout."""
    return _dump(CNIError(code, msg, details).to_json(version))


def _with_notes(details: str, exc: BaseException) -> str:
    """Details plus the notes a failed step added (an ADD's rollback failures), so none is lost."""
    return "; ".join(filter(None, [details, *getattr(exc, "__notes__", ())]))


def _dispatch(plugin: Plugin, args: CmdArgs) -> dict[str, Any] | None:
    handlers: dict[str, Callable[[CmdArgs], Any]] = {
        "DEL": plugin.delete, "CHECK": plugin.check, "STATUS": plugin.status, "GC": plugin.gc,
    }
    if args.command == "VERSION":
        return _version_info(args)
    if args.command == "ADD":
        return plugin.add(args).to_json(args.version)
    handlers[args.command](args)
    return None


def _dump(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=4) + "\n").encode()
