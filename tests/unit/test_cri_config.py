"""pyruntime-cri's settings: file, flags and their precedence, and a bad setting stopping start-up with a
message that names it."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pynode_os.cgroups import CGROUP2_SUPER_MAGIC
from pyruntime.cri import config
from pyruntime.cri.main import claim_socket, main
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError
from pyruntime.linux.syscalls import Syscalls


def test_defaults_pass_their_own_checks():
    defaults = config.Config()
    for key, check in config.CHECKS.items():
        check(getattr(defaults, key))
    assert defaults.socket_path == "/run/pyruntime/cri.sock"
    assert {o.key for o in config.OPTIONS} == set(config.CHECKS) == set(vars(defaults))


def test_file_then_flags(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('root = "/srv/cri"\ncni_bin_dirs = ["/a", "/b"]\nlog_level = "debug"\n')
    cfg = config.load(str(path), {"log_level": "warning", "cni_bin_dirs": (), "state": None})
    assert cfg.root == "/srv/cri" and cfg.cni_bin_dirs == ["/a", "/b"] and cfg.log_level == "warning"
    assert cfg.state == "/run/pyruntime-cri"
    cfg = config.load(str(path), {"cni_bin_dirs": ("/c",)})
    assert cfg.cni_bin_dirs == ["/c"]


@pytest.mark.parametrize(("text", "named"), [
    ('cni_bin_dirs = "/opt/cni/bin"', "config.toml: cni_bin_dirs: must be a list of strings"),
    ('cni_bin_dirs = ["relative"]', "config.toml: cni_bin_dirs: must be an absolute path"),
    ('listen = "tcp://127.0.0.1:1"', "config.toml: listen: must be unix://PATH"),
    ('stream_address = "127.0.0.1"', "config.toml: stream_address: must be HOST:PORT"),
    ('log_level = "loud"', "config.toml: log_level: must be one of"),
    ('image_pull_progress_timeout = "5 minutes"', "config.toml: image_pull_progress_timeout: must be a duration"),
    ('listne = "unix:///x"', "config.toml: listne: unknown setting"),
    ("root = [", "config.toml: not valid TOML"),
])
def test_bad_file_setting_is_named(tmp_path, text, named):
    path = tmp_path / "config.toml"
    path.write_text(text + "\n")
    with pytest.raises(InvalidArgumentError) as e:
        config.load(str(path), {})
    assert str(e.value).startswith(f"{tmp_path}/{named}")


def test_bad_flag_is_named():
    with pytest.raises(InvalidArgumentError, match=r"^--stream-address: must be HOST:PORT"):
        config.load(None, {"stream_address": "nowhere:99999"})


def test_image_pull_progress_timeout_is_a_go_duration():
    assert config.Config().pull_progress_timeout == 300.0  # containerd's default
    for text, seconds in (("90s", 90.0), ("1m30s", 90.0), ("1h", 3600.0), ("500ms", 0.5), ("0", 0.0)):
        assert config.load(None, {"image_pull_progress_timeout": text}).pull_progress_timeout == seconds
    with pytest.raises(InvalidArgumentError, match=r"^--image-pull-progress-timeout: must be a duration"):
        config.load(None, {"image_pull_progress_timeout": "5"})


def test_registry_creds_never_in_repr():
    cfg = config.load(None, {"registry_creds": "r.example=user:secret"})
    assert "secret" not in repr(cfg)
    assert cfg.runtime_settings("/r", "/i").registry_creds == "r.example=user:secret"


@pytest.mark.parametrize("value", ["user:s3cret", "user:s3=cret", "user:pw:with=equals:x"])
def test_unscoped_registry_creds_are_refused_without_the_secret(value):
    """USER:PASSWORD for every registry went to whatever registry a pod's image named (its owner gets the
    node's password): refused at start, with the setting named and the password not quoted."""
    with pytest.raises(InvalidArgumentError, match=r"^--registry-creds: must be HOST=USER:PASSWORD") as e:
        config.load(None, {"registry_creds": value})
    assert "s3" not in str(e.value) and "cret" not in str(e.value) and "equals" not in str(e.value)


def test_cli_stops_on_a_bad_setting_naming_it(tmp_path):
    result = CliRunner().invoke(main, ["--root", "relative/dir"])
    assert result.exit_code == 1
    assert "--root: must be an absolute path" in result.output
    result = CliRunner().invoke(main, ["--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 1 and "--config:" in result.output


def test_claim_socket_removes_a_stale_one_and_refuses_a_live_one(tmp_path):
    path = str(tmp_path / "cri.sock")
    claim_socket(path)  # nothing there
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # bound, never listening: what a killed daemon leaves
    claim_socket(path)
    assert not (tmp_path / "cri.sock").exists()
    live = socket.socket(socket.AF_UNIX)
    live.bind(path)
    live.listen()
    try:
        with pytest.raises(FailedPreconditionError, match="another pyruntime-cri"):
            claim_socket(path)
    finally:
        live.close()


DAEMON = str(Path(sys.executable).with_name("pyruntime-cri"))


@pytest.mark.parametrize(("setting", "named"), [
    ('listne = "unix:///x"', "config.toml: listne: unknown setting"),
    ('listen = "tcp://127.0.0.1:10010"', "config.toml: listen: must be unix://PATH"),
    ('root = "var/lib/cri"', "config.toml: root: must be an absolute path"),
    ('cni_bin_dirs = ["{tmp}/no-such-bin"]', "config.toml: cni_bin_dirs: {tmp}/no-such-bin: no such directory"),
    ('cgroup_driver = "cgroupv2"', "config.toml: cgroup_driver: must be one of cgroupfs, systemd"),
    ('sandbox_image = "Pause:3.10"', "config.toml: sandbox_image: "),
    ('registry_creds = "alice"', "config.toml: registry_creds: must be HOST=USER:PASSWORD"),
    ('registry_creds = "alice:pw"', "config.toml: registry_creds: must be HOST=USER:PASSWORD"),
])
def test_daemon_with_a_bad_setting_exits_before_making_anything(tmp_path, setting, named):
    """The real entry point: a non-zero exit, the setting named on stderr, and no directory, socket or
    launcher made (the other settings point into tmp_path, which must stay as it was)."""
    cni_bin = tmp_path / "cni-bin"
    cni_bin.mkdir()
    key = setting.split(" ", 1)[0]
    good = {"listen": f'"unix://{tmp_path}/run/cri.sock"', "root": f'"{tmp_path}/root"',
            "state": f'"{tmp_path}/state"', "cni_bin_dirs": f'["{cni_bin}"]', "cni_conf_dir": f'"{tmp_path}/net.d"'}
    lines = [f"{k} = {v}" for k, v in good.items() if k != key] + [setting.format(tmp=tmp_path)]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run([DAEMON, "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"{tmp_path}/{named.format(tmp=tmp_path)}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_daemon_names_a_missing_cni_bin_dir_flag(tmp_path):
    result = subprocess.run([DAEMON, "--root", str(tmp_path / "root"), "--state", str(tmp_path / "state"),
                             "--cni-bin-dir", str(tmp_path / "bin")], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and f"--cni-bin-dir: {tmp_path}/bin: no such directory" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_registry_creds_and_auths_per_host_only():
    cfg = config.load(None, {"registry_creds": "other.example=any:one",
                             "registry_auths": ("r.example:5000=alice:pw:with:colons",)})
    by_host = cfg.pull_credentials()
    assert sorted(by_host) == ["other.example", "r.example:5000"]  # nothing for any other registry
    assert (by_host["other.example"].username, by_host["other.example"].password) == ("any", "one")
    assert (by_host["r.example:5000"].username, by_host["r.example:5000"].password) == ("alice", "pw:with:colons")
    assert "alice" not in repr(cfg) and "pw" not in repr(cfg)


SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(("value", "message"), [
    (f"alice:{SECRET}", "must be HOST=USER:PASSWORD"),  # unscoped: the whole item is a credential
    (f"r.example={SECRET}", "must be HOST=USER:PASSWORD"),
    (f"https://r.example=alice:{SECRET}", "must be HOST=USER:PASSWORD"),
    (f"r_x.example=alice:{SECRET}", "r_x.example: not a registry host"),
])
def test_bad_registry_auth_is_named_without_its_secret(value, message):
    with pytest.raises(InvalidArgumentError) as raised:
        config.load(None, {"registry_auths": (value,)})
    text = str(raised.value)
    assert text.startswith("--registry-auth: ") and message in text
    assert SECRET not in text and "alice" not in text


TMPFS_MAGIC = 0x01021994


class CgroupRoot(Syscalls):
    """A host whose cgroup root is of filesystem type `magic`."""

    def __init__(self, magic: int) -> None:
        self.magic = magic

    def statfs_type(self, path: str) -> int:
        return self.magic


def test_the_systemd_driver_is_refused_at_start_on_a_host_without_systemd(tmp_path, monkeypatch):
    """Taken as a setting anywhere; at start (with the host's syscall layer) only where the driver works, with
    its reason."""
    from pyruntime.linux.cgroups import systemd
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flags = {"cgroup_driver": "systemd", "cni_bin_dirs": (str(bin_dir),)}
    cfg = config.load(None, flags)
    assert cfg.cgroup_driver == "systemd"
    assert cfg.runtime_settings("/r", "/i").systemd_cgroup
    v1, v2 = CgroupRoot(TMPFS_MAGIC), CgroupRoot(CGROUP2_SUPER_MAGIC)  # a legacy or hybrid host's root; unified
    monkeypatch.setattr(systemd, "booted", lambda: False)
    with pytest.raises(InvalidArgumentError, match=r"^--cgroup-driver: systemd: systemd is not running on this host"):
        config.load(None, flags, host=v2)
    monkeypatch.setattr(systemd, "booted", lambda: True)
    with pytest.raises(InvalidArgumentError, match=r"^--cgroup-driver: systemd: the systemd cgroup driver needs a "
                                                   r"cgroup v2"):
        config.load(None, flags, host=v1)
    assert config.load(None, flags, host=v2).cgroup_driver == "systemd"
    assert config.load(None, {**flags, "cgroup_driver": "cgroupfs"}, host=v1).cgroup_driver == "cgroupfs"


def test_the_daemon_checks_the_systemd_driver_against_this_host(tmp_path, monkeypatch):
    from pyruntime.cri import main as cri_main
    from pyruntime.linux.cgroups import systemd
    monkeypatch.setattr(systemd, "booted", lambda: False)
    monkeypatch.setattr(cri_main, "serve", lambda cfg: pytest.fail("served without the host's checks"))
    result = CliRunner().invoke(main, ["--cgroup-driver", "systemd", "--cni-bin-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "--cgroup-driver: systemd: systemd is not running on this host" in result.output
