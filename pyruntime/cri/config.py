"""pyruntime-cri's settings: one table, read from a TOML file (`--config`) and overridden by flags.

A daemon that starts with a wrong setting fails late and far from the cause (a CNI bin dir typo shows up as
"plugin not found" on the first pod, a listen address as a kubelet that never connects). So every value is
checked here, before anything is made, and a bad one stops start-up with a message naming where it came from
and the setting (`config.toml: cni_bin_dirs: ...`, `--stream-address: ...`). Unknown keys in the file are
errors too: a misspelt key silently ignored is a default silently used.

The table below is the one list of settings: main.py derives its click flags from it, so a setting can't
exist in the file and not as a flag or the other way round.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyruntime.errors import InvalidArgumentError
from pyruntime.images.request import Credentials
from pyruntime.settings import DEFAULT_HOSTS_DIR, Settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.syscalls import Syscalls

CGROUP_DRIVERS = ("cgroupfs", "systemd")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class Option:
    """One setting: its TOML key, its flag, its help; `multiple` settings are lists (a repeatable flag)."""
    key: str
    flag: str
    help: str
    multiple: bool = False
    secret: bool = False
    metavar: str | None = None


OPTIONS: tuple[Option, ...] = (
    Option("listen", "--listen", "unix://PATH the CRI gRPC server listens on"),
    Option("root", "--root", "persistent state: records, bundles, images, CNI cache"),
    Option("state", "--state", "volatile state (under /run): the runtime's state, pinned namespaces, sockets"),
    Option("cni_conf_dir", "--cni-conf-dir", "CNI network configurations (the first conflist is used)"),
    Option("cni_bin_dirs", "--cni-bin-dir", "where CNI plugin executables are looked up (repeatable)",
           multiple=True),
    Option("registry_config_dir", "--registry-config-dir",
           "registry hosts directory (containerd's certs.d layout: mirrors, CAs)"),
    Option("registry_creds", "--registry-creds",
           "HOST=USER:PASSWORD: credentials for the registry HOST only, as one registry_auths entry (an unscoped "
           "USER:PASSWORD is refused)", secret=True, metavar="HOST=USER:PASSWORD"),
    Option("registry_auths", "--registry-auth",
           "HOST=USER:PASSWORD: credentials for the registry HOST only, over registry_creds (repeatable)",
           multiple=True, secret=True, metavar="HOST=USER:PASSWORD"),
    Option("cgroup_driver", "--cgroup-driver", "cgroupfs or systemd"),
    Option("stream_address", "--stream-address", "HOST:PORT of the exec/attach/port-forward server (port 0 picks one)"),
    Option("sandbox_image", "--sandbox-image", "a pause image for sandboxes instead of the built-in pause process"),
    Option("log_level", "--log-level", "debug, info, warning or error"),
    Option("image_pull_progress_timeout", "--image-pull-progress-timeout",
           "a pull whose bytes stand still this long is cancelled (a duration: 5m, 90s; 0 never)"),
    Option("stream_idle_timeout", "--stream-idle-timeout",
           "an exec, attach or port-forward session with no traffic this long is closed (a duration; 0 never)"),
)


@dataclass
class Config:
    listen: str = "unix:///run/pyruntime/cri.sock"
    root: str = "/var/lib/pyruntime-cri"
    state: str = "/run/pyruntime-cri"
    cni_conf_dir: str = "/etc/cni/net.d"
    cni_bin_dirs: list[str] = field(default_factory=lambda: ["/opt/cni/bin"])
    registry_config_dir: str = DEFAULT_HOSTS_DIR
    registry_creds: str = field(default="", repr=False)  # a repr lands in logs
    registry_auths: list[str] = field(default_factory=list, repr=False)
    cgroup_driver: str = "cgroupfs"
    stream_address: str = "127.0.0.1:0"
    sandbox_image: str = ""
    log_level: str = "info"
    image_pull_progress_timeout: str = "5m"  # containerd's default
    stream_idle_timeout: str = "4h"  # containerd's default

    @property
    def socket_path(self) -> str:
        return self.listen.removeprefix("unix://")

    @property
    def pull_progress_timeout(self) -> float:
        """image_pull_progress_timeout in seconds (0: never)."""
        return parse_duration(self.image_pull_progress_timeout)

    def pull_credentials(self) -> dict[str, Credentials]:
        """What PullImage uses when the request has no AuthConfig for its registry: credentials by registry
        host (registry_creds, then registry_auths over it); a pull from any other host gets none."""
        items = ([self.registry_creds] if self.registry_creds else []) + self.registry_auths
        return dict(Credentials.parse_scoped(item) for item in items)

    def runtime_settings(self, runtime_root: str, image_root: str) -> Settings:
        """The pyruntime library's settings for this daemon (the environment's documented overrides apply
        below the explicit values, as for the CLI)."""
        return Settings.from_env(root=runtime_root, image_root=image_root, hosts_dir=self.registry_config_dir,
                                 registry_creds=self.registry_creds or None,
                                 debug=True if self.log_level == "debug" else None,
                                 systemd_cgroup=self.cgroup_driver == "systemd")


_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: str) -> float:
    """Seconds of a Go duration as containerd's config takes one ("5m", "1m30s", "500ms", "0")."""
    import re

    if value == "0":
        return 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"must be a duration such as 5m, 90s or 1m30s, got {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def _check_duration(value: str) -> None:
    parse_duration(value)


def _absolute(value: str) -> None:
    if not value or not os.path.isabs(value):
        raise ValueError(f"must be an absolute path, got {value!r}")


def _check_listen(value: str) -> None:
    if not value.startswith("unix://"):
        raise ValueError(f"must be unix://PATH, got {value!r}")
    _absolute(value.removeprefix("unix://"))


def _check_dirs(value: list[str]) -> None:
    if not value:
        raise ValueError("must name at least one directory")
    for item in value:
        _absolute(item)


def _check_choice(choices: tuple[str, ...]) -> Any:
    def check(value: str) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
    return check


def _check_systemd_host(value: str, kernel: Syscalls) -> None:
    """The systemd driver only where it works: a host booted with systemd, on cgroup v2 (the driver's own
    refusal, with its reason). The cgroup version is read through `kernel`, as the runtime reads it."""
    if value != "systemd":
        return
    from pyruntime.errors import PyRuntimeError
    from pyruntime.linux.cgroups import detect
    from pyruntime.linux.cgroups.systemd import require_systemd
    try:
        require_systemd(detect(kernel))
    except PyRuntimeError as e:  # a CgroupError from detect too
        raise ValueError(f"systemd: {str(e).removeprefix('--systemd-cgroup: ')}") from e


def _check_stream_address(value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT with a port of 0-65535, got {value!r}")


def _check_creds(value: str) -> None:
    if value:
        _check_auths([value])


def _check_auths(value: list[str]) -> None:
    from pyruntime.images import reference
    for item in value:
        host, _ = Credentials.parse_scoped(item)  # its ValueError never quotes the item (a password)
        try:
            valid = reference.parse(f"{host}/x").domain == host
        except reference.ReferenceFormatError:
            valid = False
        if not valid:
            raise ValueError(f"{host}: not a registry host (HOST or HOST:PORT)")


def _check_image(value: str) -> None:
    if value:
        from pyruntime.images import reference
        reference.parse(value)  # its ReferenceFormatError names what is wrong


def _check_dirs_exist(value: list[str], _kernel: Syscalls) -> None:
    for item in value:
        if not os.path.isdir(item):
            raise ValueError(f"{item}: no such directory (install the CNI plugins there, e.g. "
                             f"`python -m cni_plugins install --dir {item}`, or name another)")


CHECKS = {"listen": _check_listen, "root": _absolute, "state": _absolute, "cni_conf_dir": _absolute,
          "cni_bin_dirs": _check_dirs, "registry_config_dir": _absolute, "registry_creds": _check_creds,
          "registry_auths": _check_auths,
          "cgroup_driver": _check_choice(CGROUP_DRIVERS), "stream_address": _check_stream_address,
          "sandbox_image": _check_image, "log_level": _check_choice(LOG_LEVELS),
          "image_pull_progress_timeout": _check_duration, "stream_idle_timeout": _check_duration}


# Checked against this machine (its syscall layer given), on the value in effect (a default too), only when the
# daemon starts: a config file can be written and checked elsewhere.
HOST_CHECKS: dict[str, Callable[[Any, Syscalls], None]] = {"cni_bin_dirs": _check_dirs_exist,
                                                           "cgroup_driver": _check_systemd_host}


def _typed(option: Option, value: Any) -> Any:
    if option.multiple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"must be a list of strings, got {value!r}")
        return list(value)
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    return value


def _apply(values: dict[str, Any], raw: dict[str, Any], name_of: Any) -> None:
    """`name_of(key)`: how the message names the setting (`config.toml: root`, `--root`)."""
    by_key = {o.key: o for o in OPTIONS}
    for key, value in raw.items():
        option = by_key.get(key)
        if option is None:
            raise InvalidArgumentError(f"{name_of(key)}: unknown setting (known: {', '.join(by_key)})")
        try:
            values[key] = _typed(option, value)
            CHECKS[key](values[key])
        except (ValueError, InvalidArgumentError) as e:
            raise InvalidArgumentError(f"{name_of(key)}: {e}") from e


def load(path: str | None, flags: dict[str, Any], *, host: Syscalls | None = None) -> Config:
    """Defaults, then the TOML file at `path`, then `flags` (setting key -> value; None or an empty tuple is a
    flag not given). Raises InvalidArgumentError naming the file or flag and the setting. `host`: this
    machine's syscall layer, for the HOST_CHECKS too (what must exist on it), as the daemon does at start."""
    import tomllib
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except OSError as e:
            raise InvalidArgumentError(f"--config: {path}: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise InvalidArgumentError(f"{path}: not valid TOML: {e}") from e
        _apply(values, raw, lambda key: f"{path}: {key}")
    flag_of = {o.key: o.flag for o in OPTIONS}
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    _apply(values, given, lambda key: flag_of[key])
    cfg = Config(**values)
    if host is not None:
        for key, check in HOST_CHECKS.items():
            try:
                check(getattr(cfg, key), host)
            except ValueError as e:
                where = flag_of[key] if key in given else f"{path}: {key}" if key in values else f"{key} (default)"
                raise InvalidArgumentError(f"{where}: {e}") from e
    return cfg
