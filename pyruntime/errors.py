"""The error kinds of pyruntime's library, the one thing every caller branches on.

A caller (the runc-compatible CLI, the CRI server, a test) never parses a message to decide what
happened: it catches a kind. Each module's own exception class derives from exactly one kind, so the
module keeps a precise name (`SpecError`, `RegistryError`) while the CLI maps kinds to exit messages
in one place and the CRI server maps them to gRPC status codes in one table. Causes are kept with
`raise ... from e`, so the errno or the original exception survives for logs and for callers that
need it.

The kinds mirror the gRPC codes that CRI clients act on (the kubelet retries UNAVAILABLE, reports
INVALID_ARGUMENT to the user, treats NOT_FOUND on removal as done), which is why there are six and
not more.
"""
from __future__ import annotations


class PyRuntimeError(Exception):
    """The root of every error raised on purpose by pyruntime's library code."""


class NotFoundError(PyRuntimeError):
    """The named object (container, image, blob, snapshot, manifest) does not exist."""


class AlreadyExistsError(PyRuntimeError):
    """The object to be made (a container id, a snapshot key) is taken."""


class InvalidArgumentError(PyRuntimeError, ValueError):
    """The caller's input is malformed: a spec field, a reference, a flag value, a digest.
    Also a ValueError, so code that validates with the builtin still catches it."""


class FailedPreconditionError(PyRuntimeError):
    """The request is well formed but the object is in the wrong state for it (start of a running
    container, removal of an image in use, a host that lacks a needed kernel feature)."""


class UnavailableError(PyRuntimeError):
    """A dependency could not be reached and a retry may succeed (a registry, a helper process)."""


class InternalError(PyRuntimeError):
    """The runtime or the kernel failed in a way the caller can't fix by changing its request."""


KINDS: tuple[type[PyRuntimeError], ...] = (NotFoundError, AlreadyExistsError, InvalidArgumentError,
                                            FailedPreconditionError, UnavailableError, InternalError)


def kind_of(error: BaseException) -> type[PyRuntimeError]:
    """The kind a caller should act on; anything not raised on purpose is internal."""
    for kind in KINDS:
        if isinstance(error, kind):
            return kind
    return InternalError
