"""The lab's host side (vagrant/host.py): a daemon counts as running only when its socket accepts. A virtlogd
killed without its clean-up left its socket file, setup took it for running, and every guest failed to start
("Failed to connect socket to '/run/libvirt/virtlogd-sock': Connection refused")."""
import importlib.util
import socket
from pathlib import Path

HOST_PY = Path(__file__).resolve().parents[2] / "vagrant" / "host.py"


def load_host():
    spec = importlib.util.spec_from_file_location("lab_host_py", HOST_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_socket_left_by_a_killed_daemon_is_not_a_running_daemon(tmp_path):
    host = load_host()
    path = tmp_path / "virtlogd-sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        assert host._listening(path)
    assert path.exists() and not host._listening(path)
    assert not host._listening(tmp_path / "none")
