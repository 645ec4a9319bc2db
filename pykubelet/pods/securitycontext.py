"""runAsNonRoot: the kubelet's promise that a container it starts does not run as root.

The API server only checks that the field is a boolean; the image decides the user when the pod names
none, and only the node has the image. So, as the stock kubelet's verifyRunAsNonRoot (in its
generateContainerConfig), before a container is created: with runAsNonRoot true in the effective security
context (the container's over the pod's), runAsUser 0 is refused, and without a runAsUser the image's user
as the runtime's ImageStatus reports it (uid, else username, else root) must be a non-zero numeric uid: an
image user "root", "nobody" or "0" is refused, as is an image that names none. A refused container is never
created in the runtime; it waits with reason CreateContainerConfigError and the kubelet's message, and the
next sync checks again (the image may have changed), as the kubelet's.

Threat model: a pod author may pick any image, including one whose config says USER root, and rely on
the pod's runAsNonRoot to be told. What this cannot see: an image whose numeric user maps to a name with
uid 0 in its own /etc/passwd is not a case (numeric ids are taken as ids); an image run with a user
namespace still runs as root inside it and is refused, as by the kubelet.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from proto import api_pb2
from pykubelet.api.podmodel import Container, Pod
from pykubelet.pods.podspec import security_context
from pykubelet.volumes.errors import ContainerConfigError

MAX_USER_ID = 2**31 - 1  # the API's user ids: [0, MaxInt32]


def pod_desc(pod: Pod) -> str:
    """The kubelet's format.Pod: NAME_NAMESPACE(UID)."""
    meta = pod.metadata
    return f"{meta.name}_{meta.namespace}({meta.uid})"


def _go_quote(text: str) -> str:
    """Go's %q of a string (printable ASCII is kept, the rest escaped), as the kubelet's messages quote."""
    return json.dumps(text)


def image_user(image: api_pb2.Image | None) -> tuple[int | None, str]:
    """The image's user as the kubelet's getImageUser reads ImageStatus: its uid, else its username, else
    root (an image that names no user runs as root)."""
    if image is not None and image.HasField("uid"):
        return image.uid.value, ""
    if image is not None and image.username:
        return None, image.username
    return 0, ""


def verify_run_as_non_root(pod: Pod, container: Container, uid: int | None, username: str) -> str | None:
    """The kubelet's verifyRunAsNonRoot: why `container` breaks runAsNonRoot, given the image's user
    (`uid`, else `username`), or None when it does not."""
    sc = security_context(pod, container)  # the kubelet's DetermineEffectiveSecurityContext
    if sc.run_as_non_root is not True:
        return None
    pod_q, name = _go_quote(pod_desc(pod)), container.name
    run_as_user = sc.run_as_user
    if run_as_user is not None:
        if run_as_user == 0:
            return f"container's runAsUser breaks non-root policy (pod: {pod_q}, container: {name})"
        return None
    if uid is None:
        if username:
            return (f"container has runAsNonRoot and image has non-numeric user ({username}), cannot verify user "
                    f"is non-root (pod: {pod_q}, container: {name})")
        return None
    if uid == 0:
        return f"container has runAsNonRoot and image will run as root (pod: {pod_q}, container: {name})"
    if not 0 <= uid <= MAX_USER_ID:
        return (f"container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({MAX_USER_ID})): "
                f"must be between 0 and {MAX_USER_ID}, inclusive (pod: {pod_q}, container: {name})")
    return None


def check_run_as_non_root(pod: Pod, container: Container, image: Callable[[], api_pb2.Image | None]) -> None:
    """Raises ContainerConfigError when `container` may not start under runAsNonRoot. `image()` gives the
    image's ImageStatus (asked only when the answer depends on it; it raises ContainerConfigError when
    the runtime cannot say)."""
    sc = security_context(pod, container)
    if sc.run_as_non_root is not True:
        return
    uid, username = (None, "") if sc.run_as_user is not None else image_user(image())
    message = verify_run_as_non_root(pod, container, uid, username)
    if message is not None:
        raise ContainerConfigError(message)
