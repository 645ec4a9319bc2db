"""The error kinds of pykubelet, what its callers branch on instead of a module's own class.

As pyruntime/errors.py for the runtime: each module keeps its precise class (`ManifestError`,
`VolumeError`, `CRIError`'s subclasses), and each derives from exactly one kind here, so a caller that
needs only "was the input wrong" or "may a retry help" catches a kind and parses no message. The kinds
are the gRPC codes the kubelet acts on, as the runtime's, plus DeadlineExceeded (a hook or a probe that
ran out of its time is neither the caller's mistake nor the node's failure).
"""
from __future__ import annotations


class KubeletError(Exception):
    """The root of every error pykubelet raises on purpose."""


class NotFoundError(KubeletError):
    """The named object (a container, a pod's volume source, an API object) does not exist."""


class AlreadyExistsError(KubeletError):
    """The object to be made (a static pod's name, a CRI container) is taken."""


class InvalidArgumentError(KubeletError, ValueError):
    """The input is malformed: a pod's field, a manifest, a setting, a request's query.
    Also a ValueError, so code that validates with the builtin still catches it."""


class FailedPreconditionError(KubeletError):
    """The request is well formed but cannot be done in the present state (a container that must not run
    as root, a pod the node does not admit, a volume not mountable now)."""


class UnavailableError(KubeletError):
    """A dependency could not be reached and a retry may succeed (the runtime, the API server)."""


class DeadlineExceededError(KubeletError):
    """A bounded wait ran out (a probe, a CRI call). Not a TimeoutError, which is an OSError: code that
    catches OSError for the host's failures must not catch the runtime's deadline with them."""


class InternalError(KubeletError):
    """The kubelet or the runtime failed in a way the caller cannot fix by asking differently."""


KINDS: tuple[type[KubeletError], ...] = (NotFoundError, AlreadyExistsError, InvalidArgumentError,
                                         FailedPreconditionError, UnavailableError, DeadlineExceededError,
                                         InternalError)


def kind_of(error: BaseException) -> type[KubeletError]:
    """The kind a caller should act on; anything not raised on purpose is internal."""
    for kind in KINDS:
        if isinstance(error, kind):
            return kind
    return InternalError
