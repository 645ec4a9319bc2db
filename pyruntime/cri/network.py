"""The pod network: the CNI runtime side, as libcni and containerd's go-cni do it, with the plugins exec'd
per the CNI spec (never imported), so any CNI plugin works and ours are only the default.

The network is the first valid config (lexically) among the .conflist/.conf/.json files of the conf dir;
a .conf or .json holds one plugin and is wrapped in a list. The directory is re-read whenever a file in
it changes, so NetworkReady follows it without a restart (the anchors' "cni config uninitialized" until a
restart), and a bad file is skipped with its reason logged instead of taking the node's network down.
Every pod's `lo` is set up by the runtime itself, as CRI-O's ocicni does, rather than by an exec of the
loopback plugin as go-cni does: the same result for one ioctl instead of a process on every RunPodSandbox
(bench.cri). An attachment of "cni-loopback" cached by an earlier version is still DEL'd with its cache.

ADD runs the chain in order, each plugin getting the previous one's result; the final result, the config
bytes used and the attachment's CNI_ARGS and capability args are cached under cache_dir/results in
libcni's format (cniCacheV1), so DEL and CHECK run with what ADD ran with, even if the conf dir changed
since. A failed ADD is rolled back (DEL of the whole chain) before its error is raised: nothing is left
half-made. Teardown must succeed when the netns is gone (CNI_NETNS is then empty, which the spec allows
for DEL) or when a plugin already forgot the pod (error code 3), and runs every plugin's DEL even when
one fails, so the pod's addresses are released whenever the IPAM plugin can release them.

Threat model: the conf dir and the bin dirs are the administrator's (root-owned); what comes from a
request (names, namespaces, port mappings) reaches plugins only as CNI_ARGS values and runtimeConfig,
never as a path or a plugin name. Each plugin exec is bounded by a timeout.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pynode_os.files import atomic_write
from pyruntime.errors import (
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PyRuntimeError,
    UnavailableError,
)

if TYPE_CHECKING:
    from proto import api_pb2
    from pyruntime.linux.syscalls import Syscalls

log = logging.getLogger(__name__)

IFNAME = "eth0"
CONF_EXTENSIONS = (".conf", ".conflist", ".json")
# The CNI versions this runtime speaks, its own as libcni has its own: the CRI server execs plugins by the spec
# and shares no code with them (tests/unit/test_layers.py).
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CHECK_SINCE = "0.4.0"  # CHECK, and prevResult on DEL
CACHE_KIND = "cniCacheV1"
NOT_READY = "NetworkPluginNotReady"
NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
PROTOCOLS = {0: "tcp", 1: "udp", 2: "sctp"}  # api_pb2.Protocol
ERR_UNKNOWN_CONTAINER = 3
DEFAULT_TIMEOUT = 60.0
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}  # plugins exec iptables


class PluginError:
    """What a plugin's error result said (the spec's code, msg, details), on each of the error classes below:
    `except PluginError` catches them all, the kind (their other base) says what the caller should do."""

    def __init__(self, message: str, code: int, msg: str, details: str) -> None:
        super().__init__(message)  # type: ignore[call-arg]  # the next class in the MRO is the kind (an Exception)
        self.code = code
        self.msg = msg
        self.details = details


class PluginConfigError(PluginError, FailedPreconditionError):
    """The node's network config or plugins don't fit (codes 1, 2, 6, 7)."""


class PluginUnknownContainerError(PluginError, NotFoundError):
    """The plugin knows no such container (code 3)."""


class PluginArgumentError(PluginError, InvalidArgumentError):
    """The plugin refused the runtime's parameters (code 4)."""


class PluginUnavailableError(PluginError, UnavailableError):
    """Try again later (codes 11, 50, 51)."""


class PluginInternalError(PluginError, InternalError):
    """Any other failure (I/O, 999, plugin-specific codes)."""


ERROR_KINDS: dict[int, type[PyRuntimeError]] = {1: PluginConfigError, 2: PluginConfigError, 6: PluginConfigError,
                                             7: PluginConfigError, 3: PluginUnknownContainerError,
                                             4: PluginArgumentError, 11: PluginUnavailableError,
                                             50: PluginUnavailableError, 51: PluginUnavailableError}


def _version(value: str, where: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in value.split("."))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise InvalidArgumentError(f"{where}: {value!r} is not a version")
    return parts


_LATEST = _version(SUPPORTED_VERSIONS[-1], "SUPPORTED_VERSIONS")
_CHECK_SINCE = _version(CHECK_SINCE, "CHECK_SINCE")


@dataclass(frozen=True)
class NetworkList:
    """A validated network configuration list; `raw` is what libcni caches and what DEL re-reads."""
    name: str
    version: str
    plugins: tuple[dict[str, Any], ...]
    raw: bytes
    source: str
    disable_check: bool = False


def parse_conf(data: bytes, source: str, is_list: bool | None = None) -> NetworkList:
    """A configuration list (by default: when `source` is a .conflist), or a single plugin config wrapped in
    a list; raises InvalidArgumentError naming the file and the field."""
    try:
        conf = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidArgumentError(f"{source}: not JSON: {e}") from e
    if not isinstance(conf, dict):
        raise InvalidArgumentError(f"{source}: not a JSON object")
    if not (source.endswith(".conflist") if is_list is None else is_list):
        if not isinstance(conf.get("type"), str) or not conf["type"]:
            raise InvalidArgumentError(f"{source}: type: missing (a .conf holds one plugin; a list needs .conflist)")
        conf = {"name": conf.get("name"), "cniVersion": conf.get("cniVersion"), "plugins": [conf]}
        data = json.dumps(conf).encode()
    name = conf.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidArgumentError(f"{source}: name: {name!r} is not a valid network name")
    versions = [conf["cniVersion"]] if conf.get("cniVersion") is not None else []
    extra = conf.get("cniVersions", [])
    if not isinstance(extra, list):
        raise InvalidArgumentError(f"{source}: cniVersions: not a list")
    versions += extra
    for i, v in enumerate(versions):
        if not isinstance(v, str):
            raise InvalidArgumentError(f"{source}: cniVersion{'s' if i else ''}: {v!r} is not a string")
    # the highest version this runtime speaks (newer ones are ignored, as libcni does)
    usable = sorted((v for v in versions if _version(v, f"{source}: cniVersion") <= _LATEST),
                    key=lambda v: _version(v, source))
    if not usable or usable[-1] not in SUPPORTED_VERSIONS:
        raise InvalidArgumentError(f"{source}: cniVersion: {versions or 'missing'}; supported: {SUPPORTED_VERSIONS}")
    plugins = conf.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise InvalidArgumentError(f"{source}: plugins: missing or empty")
    for i, plugin in enumerate(plugins):
        if not isinstance(plugin, dict):
            raise InvalidArgumentError(f"{source}: plugins[{i}]: not an object")
        kind = plugin.get("type")
        if not isinstance(kind, str) or not kind or "/" in kind or kind in (".", ".."):
            raise InvalidArgumentError(f"{source}: plugins[{i}].type: {kind!r} is not a plugin name")
        if not isinstance(plugin.get("capabilities", {}), dict):
            raise InvalidArgumentError(f"{source}: plugins[{i}].capabilities: not an object")
    disable_check = conf.get("disableCheck", False)
    if isinstance(disable_check, str) and disable_check.lower() in ("true", "false"):
        disable_check = disable_check.lower() == "true"
    if not isinstance(disable_check, bool):
        raise InvalidArgumentError(f"{source}: disableCheck: {disable_check!r} is not a boolean")
    return NetworkList(name, usable[-1], tuple(plugins), data, source, disable_check)


@dataclass
class Attachment:
    """The parameters of one pod's attachment to one network (libcni's RuntimeConf)."""
    container_id: str
    netns: str
    ifname: str
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)


def pod_ips(result: dict[str, Any], ifname: str = IFNAME) -> list[str]:
    """The addresses of `ifname` in the sandbox from a CNI result, IPv4 first (the CRI's primary IP), without
    prefix lengths; addresses the result ties to no interface count when none is tied to `ifname`."""
    interfaces = result.get("interfaces") or []
    ours, loose = [], []
    for ip in result.get("ips") or []:
        address = str(ip.get("address", "")).split("/")[0]
        index = ip.get("interface")
        if index is None:
            loose.append(address)
        elif 0 <= index < len(interfaces) and interfaces[index].get("name") == ifname \
                and interfaces[index].get("sandbox"):
            ours.append(address)
    found = ours or loose
    return sorted(found, key=lambda a: ":" in a)


def _port_mappings(port_mappings: Iterable[api_pb2.PortMapping]) -> list[dict[str, Any]]:
    """The portMappings capability as containerd builds it: mappings without a host port are not mapped."""
    out = []
    for p in port_mappings:
        if p.host_port <= 0:
            continue
        entry: dict[str, Any] = {"hostPort": p.host_port, "containerPort": p.container_port,
                                 "protocol": PROTOCOLS.get(p.protocol, "tcp")}
        if p.host_ip:
            entry["hostIP"] = p.host_ip
        out.append(entry)
    return out


class Network:
    """The pod network of one pyruntime-cri: thread-safe (calls for different sandboxes run in parallel).

    `env` is the environment every plugin runs with, besides the CNI_* variables (default: PATH only, so
    the daemon's own environment never reaches a plugin unless the daemon passes it); `kernel` tells a
    live netns from a gone one."""

    def __init__(self, conf_dir: str, bin_dirs: Sequence[str], cache_dir: str, *, kernel: Syscalls,
                 env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.conf_dir = conf_dir
        self.bin_dirs = list(bin_dirs)
        self.cache_dir = cache_dir
        self.kernel = kernel
        self.env = dict(DEFAULT_ENV if env is None else env)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._loaded = False
        self._key: tuple[tuple[str, int, int, int], ...] | None = None
        self._conf: NetworkList | None = None
        self._why = ""

    # the conf dir
    def _scan(self) -> tuple[tuple[str, int, int, int], ...] | None:
        try:
            with os.scandir(self.conf_dir) as it:
                found = []
                for entry in it:
                    if entry.name.endswith(CONF_EXTENSIONS) and entry.is_file():
                        st = entry.stat()
                        found.append((entry.name, st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            return None
        except OSError as e:
            return (("", e.errno or 0, 0, 0),)
        return tuple(sorted(found))

    def network(self) -> tuple[NetworkList | None, str]:
        """The network in use now and, when there is none, why (naming the conf dir and each file skipped).
        A stat per file per call; the files are parsed again only when one changed."""
        key = self._scan()
        with self._lock:
            if not self._loaded or key != self._key:
                self._loaded, self._key = True, key
                self._conf, self._why = self._load(key)
            return self._conf, self._why

    def _load(self, key: tuple[tuple[str, int, int, int], ...] | None) -> tuple[NetworkList | None, str]:
        if key is None:
            return None, f"no network config in {self.conf_dir}: the directory does not exist"
        skipped = []
        for name, *_ in key:
            path = os.path.join(self.conf_dir, name)
            try:
                with open(path, "rb") as f:
                    conf = parse_conf(f.read(), path)
            except (OSError, InvalidArgumentError) as e:
                log.warning("CNI config skipped: %s", e)
                skipped.append(str(e))
                continue
            log.info("CNI network %r (cniVersion %s) from %s", conf.name, conf.version, path)
            return conf, ""
        why = f"no valid network config in {self.conf_dir}"
        return None, why + (f" (skipped: {'; '.join(skipped)})" if skipped else "")

    def status(self) -> tuple[bool, str, str]:
        """(ready, reason, message) for the CRI's NetworkReady condition."""
        conf, why = self.network()
        if conf is None:
            return False, NOT_READY, f"cni plugin not initialized: {why}"
        return True, "", ""

    # exec
    def _find(self, kind: str) -> str | None:
        for directory in self.bin_dirs:
            path = os.path.join(directory, kind)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None

    def _exec(self, command: str, net: NetworkList, plugin: dict[str, Any], att: Attachment,
              prev: dict[str, Any] | None, kind: str = "") -> dict[str, Any] | None:
        """`kind`: the executable to run with the plugin's config (default: its type)."""
        kind = kind or plugin["type"]
        what = f"CNI network {net.name!r} plugin {kind!r} {command} for sandbox {att.container_id}"
        path = self._find(kind)
        if path is None:
            raise FailedPreconditionError(f"{what}: no executable {kind!r} in {':'.join(self.bin_dirs)}")
        conf = dict(plugin, name=net.name, cniVersion=net.version)
        if prev is not None:
            conf["prevResult"] = prev
        runtime = {cap: att.capability_args[cap] for cap, on in (plugin.get("capabilities") or {}).items()
                   if on and cap in att.capability_args}
        if runtime:
            conf["runtimeConfig"] = runtime
        env = {k: v for k, v in self.env.items() if not k.startswith("CNI_")}
        env.update(CNI_COMMAND=command, CNI_CONTAINERID=att.container_id, CNI_NETNS=att.netns,
                   CNI_IFNAME=att.ifname, CNI_ARGS=";".join(f"{k}={v}" for k, v in att.cni_args),
                   CNI_PATH=os.pathsep.join(self.bin_dirs))
        try:
            proc = subprocess.run([path], input=json.dumps(conf).encode(), env=env, capture_output=True,
                                  timeout=self.timeout, check=False, close_fds=True)
        except subprocess.TimeoutExpired as e:
            raise UnavailableError(f"{what}: timed out after {self.timeout:g}s (killed)") from e
        except OSError as e:
            raise FailedPreconditionError(f"{what}: cannot exec {path}: {e.strerror}") from e
        if proc.returncode != 0:
            raise self._error(what, proc)
        if command != "ADD":
            return None
        try:
            result = json.loads(proc.stdout)
        except ValueError as e:
            raise InternalError(f"{what}: the result is not JSON: {proc.stdout[:200]!r}") from e
        if not isinstance(result, dict):
            raise InternalError(f"{what}: the result is not a JSON object: {proc.stdout[:200]!r}")
        return result

    @staticmethod
    def _error(what: str, proc: subprocess.CompletedProcess[bytes]) -> PyRuntimeError:
        try:
            err = json.loads(proc.stdout)
            code, msg, details = int(err["code"]), str(err.get("msg", "")), str(err.get("details", "") or "")
        except (ValueError, TypeError, KeyError):
            output = (proc.stderr or proc.stdout).decode(errors="replace").strip()[-500:]
            return InternalError(f"{what}: exit status {proc.returncode}: {output or 'no output'}")
        message = f"{what}: code {code}: {msg}" + (f": {details}" if details else "")
        return ERROR_KINDS.get(code, PluginInternalError)(message, code, msg, details)

    # the cache (libcni's layout and format)
    def _cache_path(self, network: str, att: Attachment) -> str:
        return os.path.join(self.cache_dir, "results", f"{network}-{att.container_id}-{att.ifname}")

    def _cache_write(self, net: NetworkList, att: Attachment, result: dict[str, Any]) -> None:
        record = {"kind": CACHE_KIND, "containerId": att.container_id, "config": base64.b64encode(net.raw).decode(),
                  "ifName": att.ifname, "networkName": net.name, "netns": att.netns,
                  "cniArgs": [list(a) for a in att.cni_args], "capabilityArgs": att.capability_args,
                  "result": result}
        path = self._cache_path(net.name, att)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic_write(path, json.dumps(record).encode(), mode=0o600)

    def _cached(self, container_id: str, ifname: str) -> list[tuple[str, NetworkList, Attachment, dict[str, Any]]]:
        """Every cached attachment of the sandbox on `ifname`: (cache file, network, parameters, result)."""
        directory = os.path.join(self.cache_dir, "results")
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(f"-{container_id}-{ifname}"))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    record = json.load(f)
                if record.get("kind") != CACHE_KIND or record.get("containerId") != container_id \
                        or record.get("ifName") != ifname:
                    continue
                net = parse_conf(base64.b64decode(record["config"]), path, is_list=True)
                args = [(str(k), str(v)) for k, v in record.get("cniArgs") or []]
                att = Attachment(container_id, "", ifname, args, record.get("capabilityArgs") or {})
                found.append((path, net, att, record.get("result") or {}))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("CNI cache %s unreadable, removed: %s", path, e)
                _remove(path)
        return found

    def _netns_alive(self, path: str) -> bool:
        from pyruntime.linux.syscalls import CLONE_NEWNET
        try:
            return self.kernel.ns_type(path) == CLONE_NEWNET
        except OSError:
            return False

    # the operations
    @staticmethod
    def _attachment(sandbox_id: str, netns: str, ifname: str, name: str, namespace: str, uid: str,
                    port_mappings: Iterable[api_pb2.PortMapping], cgroup_parent: str) -> Attachment:
        args = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", namespace), ("K8S_POD_NAME", name),
                ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id), ("K8S_POD_UID", uid)]
        caps: dict[str, Any] = {"portMappings": _port_mappings(port_mappings)}
        if cgroup_parent:
            caps["cgroupPath"] = cgroup_parent
        return Attachment(sandbox_id, netns, ifname, args, caps)

    def setup(self, sandbox_id: str, netns: str, *, name: str, namespace: str, uid: str,
              port_mappings: Iterable[api_pb2.PortMapping] = (), cgroup_parent: str = "") -> list[str]:
        """Sets lo up and attaches the pod (netns: the pinned netns path) to the network; returns its IPs,
        IPv4 first. On failure nothing stays attached, and the error carries the plugin's CNI code, msg and
        details."""
        conf, why = self.network()
        if conf is None:
            raise FailedPreconditionError(f"sandbox {sandbox_id}: network not ready: cni plugin not initialized: {why}")
        self.kernel.loopback_up(netns)
        att = self._attachment(sandbox_id, netns, IFNAME, name, namespace, uid, port_mappings, cgroup_parent)
        try:
            result = self._add(conf, att)
        except PyRuntimeError as e:
            for failure in self._delete(conf, att, None):
                e.add_note(f"rollback: {failure}")
            _remove(self._cache_path(conf.name, att))
            raise
        return pod_ips(result)

    def _add(self, net: NetworkList, att: Attachment) -> dict[str, Any]:
        result: dict[str, Any] | None = None
        for plugin in net.plugins:
            result = self._exec("ADD", net, plugin, att, result)
        assert result is not None  # a list has at least one plugin
        self._cache_write(net, att, result)
        return result

    def _delete(self, net: NetworkList, att: Attachment, prev: dict[str, Any] | None) -> list[PyRuntimeError]:
        """DEL through the chain in reverse; every plugin runs even if one fails (so IPAM still releases).
        Returns the failures; a plugin that no longer knows the container (code 3) has nothing to undo."""
        if _version(net.version, net.source) < _CHECK_SINCE:
            prev = None
        failures: list[PyRuntimeError] = []
        for plugin in reversed(net.plugins):
            try:
                self._exec("DEL", net, plugin, att, prev)
            except PluginUnknownContainerError:
                continue
            except PyRuntimeError as e:
                failures.append(e)
                self._release_addresses(net, plugin, att, prev, e)
        return failures

    def _release_addresses(self, net: NetworkList, plugin: dict[str, Any], att: Attachment,
                           prev: dict[str, Any] | None, failure: PyRuntimeError) -> None:
        """A main plugin whose DEL failed never reached its IPAM: DEL of the IPAM plugin itself, as the main
        plugin would have delegated it (the same config), so the pod's addresses are not leaked."""
        ipam = plugin.get("ipam")
        if not isinstance(ipam, dict) or not isinstance(ipam.get("type"), str) or not ipam["type"]:
            return
        try:
            self._exec("DEL", net, plugin, att, prev, kind=ipam["type"])
        except PluginUnknownContainerError:
            pass
        except PyRuntimeError as e:
            failure.add_note(f"IPAM {ipam['type']!r} DEL: {e}")

    def teardown(self, sandbox_id: str, netns: str | None, *, name: str = "", namespace: str = "", uid: str = "",
                 port_mappings: Iterable[api_pb2.PortMapping] = (), cgroup_parent: str = "") -> None:
        """Detaches the pod and releases its addresses; idempotent. Runs with what ADD ran with (the cache);
        without a cache entry, with the current network and these arguments. A gone netns is no error."""
        live = netns if netns and self._netns_alive(netns) else ""
        failures: list[PyRuntimeError] = []
        mappings = list(port_mappings)
        for ifname in (IFNAME, "lo"):
            cached = self._cached(sandbox_id, ifname)
            for path, net, att, result in cached:
                att.netns = live
                errors = self._delete(net, att, result)
                if not errors:
                    _remove(path)
                failures += errors
            if cached or ifname != IFNAME:
                continue  # an uncached lo was set up without a plugin: nothing to DEL
            current = self.network()[0]
            if current is not None:
                failures += self._delete(current, self._attachment(sandbox_id, live, ifname, name, namespace, uid,
                                                               mappings, cgroup_parent), None)
        if failures:
            first = failures[0]
            for other in failures[1:]:
                first.add_note(str(other))
            raise first

    def check(self, sandbox_id: str, netns: str) -> None:
        """CHECK of the pod's attachment with its cached config and result (lo's 0.3.1 has no CHECK)."""
        cached = self._cached(sandbox_id, IFNAME)
        if not cached:
            raise NotFoundError(f"sandbox {sandbox_id}: no CNI attachment cached in {self.cache_dir}")
        for _path, net, att, result in cached:
            if net.disable_check:
                continue
            if _version(net.version, net.source) < _CHECK_SINCE:
                raise FailedPreconditionError(f"{net.source}: cniVersion {net.version} has no CHECK "
                                              f"({CHECK_SINCE} or later)")
            att.netns = netns
            for plugin in net.plugins:
                self._exec("CHECK", net, plugin, att, result)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
