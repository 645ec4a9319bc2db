"""The stock control plane the kubelet and cluster tests stand on: what they rely on about identities and
authorization holds (a node's certificate is `system:node:NAME` in `system:nodes`, and NodeRestriction
keeps one node's kubelet from writing another node's objects)."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.kit.controlplane import ControlPlane, peer


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    yield cp
    cp.stop()


def _as(kubeconfig, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([peer("kubectl"), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)


def test_node_identity_is_what_the_node_authorizer_expects(control_plane):
    who = _as(control_plane.node_kubeconfig("node-a"), "auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    user = json.loads(who.stdout)["status"]["userInfo"]
    assert user["username"] == "system:node:node-a"
    assert "system:nodes" in user["groups"]


def test_node_restriction_keeps_a_node_to_its_own_objects(control_plane, tmp_path):
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}
    manifest = tmp_path / "node-b.json"
    manifest.write_text(json.dumps(node))
    created = _as(control_plane.node_kubeconfig("node-b"), "create", "-f", str(manifest))
    assert created.returncode == 0, created.stderr
    try:
        other = _as(control_plane.node_kubeconfig("node-a"), "label", "node", "node-b", "stolen=yes")
        assert other.returncode != 0
        assert "forbidden" in other.stderr.lower()
    finally:
        control_plane.kubectl("delete", "node", "node-b")
