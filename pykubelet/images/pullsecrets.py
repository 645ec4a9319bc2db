"""A pod's image pull credentials, read from the API server as the kubelet's getPullSecretsForPod reads them.

Only the pod's spec.imagePullSecrets count: the ServiceAccount admission plugin copies the service account's
pull secrets into the pod when it is created, and the Node authorizer lets the node read only the secrets
its pods name. Each secret is read in the pod's own namespace, so a pod can use no other namespace's
secret. A secret that can't be read (missing, forbidden, no API server) is left out and named in the
caller's FailedToRetrieveImagePullSecret warning: the pull may still work with the runtime's own
credentials. A docker config secret that does not parse fails the pull, as the kubelet's MakeDockerKeyring.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

from proto import api_pb2
from pykubelet.api.podmodel import Pod
from pykubelet.images.keyring import Keyring, RegistryAuth, parse_secret, repository


@dataclass
class PullCredentials:
    """What a pull of one image is given: AuthConfigs to try in order (none: the pull goes without one, and
    the runtime uses its own per-registry credentials), and the pull secrets that could not be read."""
    auths: list[api_pb2.AuthConfig] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _read(client, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
    """(type, data) of a Secret; None when it can't be read."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Secret

    if client is None:
        return None
    try:
        obj = client.get(Secret, name, namespace=namespace)
    except ApiError:
        return None
    return obj.type or "", {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}


def auth_config(auth: RegistryAuth) -> api_pb2.AuthConfig:
    """No server_address, as the kubelet's: the runtime matches it against the host it talks to, and the
    keyring already chose the registry."""
    return api_pb2.AuthConfig(username=auth.username, password=auth.password,
                              identity_token=auth.identity_token, registry_token=auth.registry_token)


def for_image(client, pod: Pod, image: str) -> PullCredentials:
    """Raises keyring.PullSecretError for a docker config secret that is not one."""
    namespace = pod.metadata.namespace
    out = PullCredentials()
    configs = []
    for name in pod.spec.image_pull_secrets:
        if not name:
            continue  # the API accepted empty names once (kubernetes#99454); the kubelet skips them too
        found = _read(client, namespace, name)
        if found is None:
            out.missing.append(name)
            continue
        configs.append(parse_secret(name, *found))
    out.auths = [auth_config(a) for a in Keyring(configs).lookup(repository(image))]
    return out
