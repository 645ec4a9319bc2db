"""The runtime's settings, built once at the edge and passed down.

Only the edges read the environment: the CLI's main (after its flags) and a daemon's config loader
call `Settings.from_env`; everything below takes a `Settings` or the single values it needs as
parameters. So a long-running process (the CRI server) can run two runtimes with different roots
side by side, a test can build settings without touching os.environ, and nothing changes behaviour
because a variable happened to be set when a module was imported.

The environment variables are documented overrides of the built-in defaults; explicit values (CLI
flags, a config file) override both:
  PYRUNTIME_IMAGE_ROOT       image store root (default /var/lib/pyruntime/images)
  PYRUNTIME_REGISTRY_CONFIG  registry hosts directory, containerd's certs.d layout (default /etc/pyruntime/certs.d)
  PYRUNTIME_SNAPSHOTTER      "overlay" or "copy" (default overlay; without root the image code falls back to copy)
  PYRUNTIME_REGISTRY_CREDS   HOST=USER:PASSWORD, for `image pull`s from HOST only (no default; never in a repr)
  PYRUNTIME_DEBUG            any non-empty value: tracebacks with errors, also from the container's set-up

A plain immutable class, not a frozen dataclass: the CLI builds one on every command, and importing
dataclasses (with inspect) or typing for a NamedTuple would be paid by every command.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_ROOT = "/run/pyruntime"
DEFAULT_IMAGE_ROOT = "/var/lib/pyruntime/images"
DEFAULT_HOSTS_DIR = "/etc/pyruntime/certs.d"
SNAPSHOTTERS = ("overlay", "copy")
LOG_FORMATS = ("text", "json")
ENVIRONMENT = {"image_root": "PYRUNTIME_IMAGE_ROOT", "hosts_dir": "PYRUNTIME_REGISTRY_CONFIG",
               "snapshotter": "PYRUNTIME_SNAPSHOTTER", "registry_creds": "PYRUNTIME_REGISTRY_CREDS",
               "debug": "PYRUNTIME_DEBUG"}


class Settings:
    """root: container state (runc's --root); image_root, hosts_dir, snapshotter: the image store;
    registry_creds: HOST=USER:PASSWORD for pulls from HOST; debug: tracebacks; log, log_format: where the CLI also
    writes its errors (runc's --log); systemd_cgroup: containers this runtime creates get the systemd driver's
    scopes (runc's --systemd-cgroup; the others are managed by the driver their state records)."""

    FIELDS = ("root", "image_root", "hosts_dir", "snapshotter", "registry_creds", "debug", "log", "log_format",
              "systemd_cgroup")
    __slots__ = FIELDS

    root: str
    image_root: str
    hosts_dir: str
    snapshotter: str
    registry_creds: str | None
    debug: bool
    log: str | None
    log_format: str
    systemd_cgroup: bool

    def __init__(self, root: str = DEFAULT_ROOT, image_root: str = DEFAULT_IMAGE_ROOT,
                 hosts_dir: str = DEFAULT_HOSTS_DIR, snapshotter: str = "overlay", registry_creds: str | None = None,
                 debug: bool = False, log: str | None = None, log_format: str = "text",
                 systemd_cgroup: bool = False) -> None:
        from pyruntime.errors import InvalidArgumentError
        if snapshotter not in SNAPSHOTTERS:
            raise InvalidArgumentError(f"snapshotter: must be one of {', '.join(SNAPSHOTTERS)}, got {snapshotter!r}")
        if log_format not in LOG_FORMATS:
            raise InvalidArgumentError(f"log_format: must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
        for field, path in (("root", root), ("image_root", image_root), ("hosts_dir", hosts_dir)):
            if not path:
                raise InvalidArgumentError(f"{field}: must not be empty")
        values = (root, image_root, hosts_dir, snapshotter, registry_creds or None, bool(debug), log or None,
                  log_format, bool(systemd_cgroup))
        for name, value in zip(self.FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Settings are immutable: use replace({name}=...)")

    def replace(self, **changes: object) -> Settings:
        return Settings(**{**{k: getattr(self, k) for k in self.FIELDS}, **changes})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.FIELDS))

    def __repr__(self) -> str:
        shown = {k: getattr(self, k) for k in self.FIELDS}
        if shown["registry_creds"]:
            shown["registry_creds"] = "<hidden>"  # a repr lands in logs and tracebacks
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults, then the environment (os.environ unless given), then `overrides`; an override of
        None means "not given" (an unset CLI flag) and leaves the lower layers' value."""
        import os
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, var in ENVIRONMENT.items():
            if env.get(var):
                values[name] = bool(env[var]) if name == "debug" else env[var]
        for name, value in overrides.items():
            if name not in cls.FIELDS:
                raise TypeError(f"Settings.from_env() got an unexpected keyword argument {name!r}")
            if value is not None:
                values[name] = value
        return cls(**values)  # type: ignore[arg-type]  # checked by __init__


def cni_plugin_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of our own CNI plugins (PYCNI_*, e.g. PYCNI_HELPER=off) in the environment (os.environ
    unless given): pyruntime-cri passes them on to its plugins, and nothing else of its environment."""
    import os
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith("PYCNI_")}


def interpreter_env(path: list[str]) -> dict[str, str]:
    """This process's environment with PYTHONPATH `path` (this interpreter's sys.path): what a fresh
    interpreter of ours is started with, so that it imports the same code whatever path this one came from."""
    import os
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
