"""The labels and annotations the kubelet puts on every sandbox and container, and reads back.

The runtime is the record of what runs, not a memory of the kubelet: the labels say which pod (name,
namespace, uid) and which container each one is, the annotations what it was made from (the spec hash,
the restart count, the grace period it is to be stopped with). So a kubelet that restarts finds its
pods again and recreates nothing whose spec did not change. The names are the stock kubelet's, so the
tools that read them (crictl, the CRI servers' logs) show what they show for it.
"""
from __future__ import annotations

import hashlib
import json

from proto import api_pb2
from pykubelet.api.podmodel import Container

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
HASH = "io.kubernetes.container.hash"
RESTART_COUNT = "io.kubernetes.container.restartCount"
GRACE = "io.kubernetes.pod.terminationGracePeriod"
TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
PORTS = "io.kubernetes.container.ports"

# the container fields that need a new container when they change: not resources (resized in place), not
# probes or lifecycle hooks, and not fields a newer API server might default (that would restart every pod)
HASHED_FIELDS = ("name", "image", "command", "args", "workingDir", "env", "envFrom", "ports", "securityContext",
                 "volumeMounts", "stdin", "stdinOnce", "tty")


def container_hash(container: Container) -> str:
    """Of the container as it came (its raw dict, not the parsed record): the hash a running container was
    started with stays its spec's across kubelet versions, whatever the parser learns to default."""
    raw = container.raw
    spec = {k: raw[k] for k in HASHED_FIELDS if raw.get(k)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def restart_count(status: api_pb2.ContainerStatus) -> int:
    return int(status.annotations.get(RESTART_COUNT, "0") or 0)
