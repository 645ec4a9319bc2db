"""The CRI ImageService over pyruntime's image store: what the kubelet asks of images, answered as
containerd answers it.

The store (pyruntime.images.store.ImageStore) does the work: pulls through the registry client with the
mirrors of its hosts dir, keeps the records, collects what no record names. This module only translates:
an ImageSpec's reference to a store lookup, the request's AuthConfig to registry credentials (never
logged, and only sent to the registry it names), a store image to a CRI Image (repo tags and digests,
size, the image's user, pinned). The CRI's own rules are kept here: ImageStatus of an unknown image is an
empty answer, not NOT_FOUND, and RemoveImage of one is success.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Callable, Iterable

from proto import api_pb2
from pyruntime.errors import InvalidArgumentError, NotFoundError
from pyruntime.images import reference as refs
from pyruntime.images.metadata import Image
from pyruntime.images.request import Credentials
from pyruntime.images.store import ImageStore

_INT64 = re.compile(r"[+-]?[0-9]+")


def _uid_and_name(user: str) -> tuple[int | None, str]:
    """The image's USER as the CRI reports it, as containerd's getUserFromImage: what parses as an int64 is a
    uid (negative too: the kubelet refuses it under runAsNonRoot), anything else a username (a number out
    of int64's range too, so that an image's config cannot fail the ImageStatus or ListImages of every
    image)."""
    name = user.partition(":")[0]
    if not name:
        return None, ""
    if _INT64.fullmatch(name) and -(2**63) <= int(name) < 2**63:
        return int(name), ""
    return None, name


def credentials(auth: api_pb2.AuthConfig | None, ref: str) -> Credentials | None:
    """The registry credentials an AuthConfig gives for pulling `ref`; None for none, or when the
    AuthConfig names another registry (server_address), so a secret never goes to a host it is not for."""
    if auth is None:
        return None
    if auth.server_address:
        server = auth.server_address.split("://", 1)[-1].split("/", 1)[0]
        try:
            domain = refs.parse(f"{server}/x").domain
        except refs.ReferenceFormatError as e:
            raise InvalidArgumentError(f"auth.server_address: {auth.server_address!r} is not a registry") from e
        if refs.parse(ref).domain != domain:
            return None
    if auth.username:
        return Credentials(auth.username, auth.password)
    token = auth.identity_token or auth.registry_token
    if token:
        return Credentials(token=token)
    if auth.auth:
        try:
            user, sep, password = base64.b64decode(auth.auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"auth.auth: not base64 of USER:PASSWORD: {e}") from e
        if not sep:
            raise InvalidArgumentError("auth.auth: not base64 of USER:PASSWORD (no ':')")
        return Credentials(user, password)
    return None


class ImageService:
    """`pinned`: references (or ids) of images the kubelet's image GC must not remove, e.g. the sandbox image.
    `registry_auths` (registry host -> credentials): the daemon's configured credentials, used for a pull
    whose request brings none for its registry; a registry with no entry is pulled from without any.
    `pull(ref, credentials) -> image id` runs a pull: pyruntime-cri's goes to a child process (its launcher's
    PullJob); None pulls here, into `store`, in the caller's process."""

    FS_INFO_TTL = 10.0  # seconds an ImageFsInfo walk is reused: the kubelet asks every few seconds

    def __init__(self, store: ImageStore, *, pinned: Iterable[str] = (),
                 registry_auths: dict[str, Credentials] | None = None,
                 pull: Callable[[str, Credentials | None], str] | None = None) -> None:
        self.store = store
        self._pull = pull or (lambda ref, auth: store.pull(ref, auth=auth).id)
        self.pinned = tuple(pinned)
        self.registry_auths = dict(registry_auths or {})
        self._fs_info: tuple[float, api_pb2.ImageFsInfoResponse] | None = None

    def _pinned_ids(self) -> set[str]:
        ids = set()
        for ref in self.pinned:
            try:
                ids.add(self.store.get(ref).id)
            except (NotFoundError, InvalidArgumentError):
                continue
        return ids

    def _cri_image(self, image: Image, pinned: set[str]) -> api_pb2.Image:
        out = api_pb2.Image(id=image.id, repo_tags=image.repo_tags, repo_digests=image.repo_digests,
                            size=image.size, pinned=image.id in pinned)
        uid, username = _uid_and_name(image.config.user)
        if uid is not None:
            out.uid.value = uid
        out.username = username
        return out

    def _find(self, spec: api_pb2.ImageSpec, where: str) -> Image | None:
        if not spec.image:
            raise InvalidArgumentError(f"{where}.image: must name an image")
        try:
            return self.store.get(spec.image)
        except NotFoundError:
            return None

    def list_images(self, image_filter: api_pb2.ImageFilter | None = None) -> list[api_pb2.Image]:
        pinned = self._pinned_ids()
        if image_filter is not None and image_filter.image.image:
            found = self._find(image_filter.image, "filter.image")
            return [self._cri_image(found, pinned)] if found else []
        return [self._cri_image(i, pinned) for i in self.store.list()]

    def image_status(self, spec: api_pb2.ImageSpec, verbose: bool = False) -> api_pb2.ImageStatusResponse:
        image = self._find(spec, "image")
        if image is None:
            return api_pb2.ImageStatusResponse()
        response = api_pb2.ImageStatusResponse(image=self._cri_image(image, self._pinned_ids()))
        if verbose:
            config = json.loads(self.store.content.read(image.config_digest))
            response.info["info"] = json.dumps({
                "imageSpec": config, "chainID": image.chain_ids[-1] if image.chain_ids else "",
                "manifestDigest": image.manifest_digest, "indexDigest": image.index_digest,
                "diskUsage": image.disk_usage})
        return response

    def pull_image(self, spec: api_pb2.ImageSpec, auth: api_pb2.AuthConfig | None = None) -> str:
        """Returns the image id (the config digest), the image_ref PullImage answers with."""
        if not spec.image:
            raise InvalidArgumentError("image.image: must name an image")
        creds = credentials(auth, spec.image)
        if creds is None:
            creds = self.registry_auths.get(refs.parse(spec.image).domain)
        return self._pull(spec.image, creds)

    def remove_image(self, spec: api_pb2.ImageSpec) -> None:
        """Removes the image with every name it has, as containerd does; an unknown one is already removed."""
        image = self._find(spec, "image")
        if image is not None:
            try:
                self.store.remove(image.id)
            except NotFoundError:  # removed concurrently
                pass

    def fs_info(self) -> api_pb2.ImageFsInfoResponse:
        """The bytes and inodes the store uses on its filesystem (blobs, snapshots, writable layers), walked at
        most once per FS_INFO_TTL as containerd samples it in the background."""
        cached = self._fs_info
        if cached is not None and time.monotonic() - cached[0] < self.FS_INFO_TTL:
            return cached[1]
        from pyruntime.cri.stats import disk_usage
        used, inodes = disk_usage(str(self.store.root))
        usage = api_pb2.FilesystemUsage(timestamp=time.time_ns(),
                                        fs_id=api_pb2.FilesystemIdentifier(mountpoint=str(self.store.root)))
        usage.used_bytes.value = used
        usage.inodes_used.value = inodes
        response = api_pb2.ImageFsInfoResponse(image_filesystems=[usage])
        self._fs_info = (time.monotonic(), response)
        return response
