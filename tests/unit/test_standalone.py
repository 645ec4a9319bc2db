"""`pynode run`'s node (pynode_cluster.node.StandaloneNode, standalone.py): the command lines and files it is
wired with, as pykubelet reads them; what a wheel must carry for it to run without a checkout (its command,
its static pod); and that `make run` builds none of the tests' Go peers and installs none of their packages."""
from __future__ import annotations

import configparser
import fnmatch
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pykubelet import config as kubelet_config
from pykubelet.main import main as pykubelet_main
from pynode_cluster import main, standalone
from pynode_cluster.node import Node, StandaloneNode
from pyruntime.settings import DEFAULT_HOSTS_DIR

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> StandaloneNode:
    return StandaloneNode(Node("pynode", "127.0.0.1", tmp_path / "var", tmp_path / "run"), bridge="pyt-run0",
                          subnet="10.99.0.0/16", cgroup_root="/pyt-run")


def test_pykubelet_runs_the_static_pods_alone_with_its_command_line(node: StandaloneNode) -> None:
    argv = node.kubelet_argv()
    assert Path(argv[0]).name == "pykubelet"
    params = pykubelet_main.make_context("pykubelet", argv[1:]).params
    config_file = params.pop("config_file")
    settings = kubelet_config.build(params, config_file)
    assert settings.kubeconfig is None  # standalone: no API server
    assert settings.static_pod_path == node.manifests
    assert settings.container_runtime_endpoint == f"unix://{node.node.run}/cri.sock"
    assert settings.cgroup_root == "/pyt-run" and settings.address == "127.0.0.1"
    assert settings.node_name == "pynode" and settings.root_dir == node.node.dir / "kubelet"
    assert settings.pod_logs_dir == node.node.pod_logs


def test_the_cri_server_gets_its_plugins_and_a_network_of_its_own(node: StandaloneNode) -> None:
    argv = node.runtime_argv()
    assert Path(argv[0]).name == "pyruntime-cri"
    flags = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert flags["--listen"] == node.node.endpoint and flags["--registry-config-dir"] == DEFAULT_HOSTS_DIR
    assert {"pybridge", "pyhost-local", "pyportmap"} <= {p.name for p in Path(flags["--cni-bin-dir"]).iterdir()}
    (conflist,) = Path(flags["--cni-conf-dir"]).iterdir()
    bridge = json.loads(conflist.read_text())["plugins"][0]
    assert bridge["bridge"] == "pyt-run0" and bridge["ipam"]["ranges"] == [[{"subnet": "10.99.0.0/16"}]]
    assert bridge["ipam"]["dataDir"] == str(node.node.dir / "ipam")


def test_the_static_pod_ships_with_the_package_and_pulls_nothing() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    globs = cfg["options.package_data"]["pynode_cluster"].split()
    assert any(fnmatch.fnmatch(standalone.MANIFEST, g) for g in globs), "setup.cfg: the wheel lacks the static pod"
    pod = yaml.safe_load((REPO / "pynode_cluster" / standalone.MANIFEST).read_text())
    assert f"{pod['metadata']['name']}-{standalone.NODE.node.name}" == standalone.POD
    (container,) = pod["spec"]["containers"]
    assert container["image"] == standalone.IMAGE and container["imagePullPolicy"] == "Never"


def test_pynode_is_a_command_of_the_package() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].split("\n") if line)
    assert scripts["pynode"] == "pynode_cluster.main:main"


@pytest.mark.parametrize("command", ["run", "stop"])
def test_pynode_refuses_a_user_that_is_not_root(command: str, monkeypatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    result = CliRunner().invoke(main.main, [command])
    assert result.exit_code == 1 and f"`pynode {command}` must run as root" in result.output


def test_make_run_builds_no_peer_and_make_test_builds_them() -> None:
    def commands(target: str) -> str:
        return subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "build-peers.sh" not in commands("run")
    assert "build-peers.sh" in commands("test")


def test_make_run_installs_the_node_alone_and_make_test_adds_the_rest_once(tmp_path: Path) -> None:
    """`make run` on a fresh machine installs the node's Debian packages and the package without its test extra;
    `make test` adds both; each after the other redoes nothing that the first did (a stamp per extra)."""
    for name in ("Makefile", "setup.cfg", "pyproject.toml", "scripts/install-launchers.py", "scripts/node-packages.txt",
                 "scripts/test-packages.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((REPO / name).read_bytes())

    def commands(target: str) -> str:
        return subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout

    def pip_installs(target: str) -> list[str]:
        return [line.split(" -e ", 1)[1] for line in commands(target).splitlines() if " -m pip install " in line]

    assert "node-packages.txt" in commands("run") and "test-packages.txt" not in commands("run")
    assert pip_installs("run") == ["'.'"]
    assert "test-packages.txt" in commands("test") and pip_installs("test") == ["'.'", "'.[test]'"]
    stamps = tmp_path / ".stamps"
    stamps.mkdir()
    (stamps / "venv").touch()  # as `make run` leaves it
    assert pip_installs("run") == [] and pip_installs("test") == ["'.[test]'"]
    (stamps / "venv-test").touch()  # and `make test`
    assert pip_installs("run") == [] and pip_installs("test") == []
