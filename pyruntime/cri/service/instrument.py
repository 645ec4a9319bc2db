"""Every RPC goes through here: the one table from pyruntime's error kinds to gRPC status codes, the log
line per call, and the guarantee that a request can't take the daemon down.

A CRI client acts on the status code, not on the message (the kubelet treats NOT_FOUND on removal as done,
retries UNAVAILABLE, shows INVALID_ARGUMENT to the user, counts DEADLINE_EXCEEDED as a probe timeout), so the
mapping lives in one place. Anything that is not a pyruntime error is a bug: it is logged with its traceback
and answered INTERNAL with its message, and the server thread goes on serving.
"""
from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from pyruntime.cri.containers import ExecTimeoutError
from pyruntime.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PyRuntimeError,
    UnavailableError,
)

log = logging.getLogger("pyruntime.cri.rpc")

# Checked in order: the first class the error is an instance of gives the code (subclasses first).
CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (ExecTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (InternalError, grpc.StatusCode.INTERNAL),
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),  # an RPC this runtime does not offer
)


def status_of(error: BaseException) -> grpc.StatusCode:
    for cls, code in CODES:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def _fail(context: Any, name: str, error: Exception) -> None:
    code = status_of(error)
    if isinstance(error, PyRuntimeError | NotImplementedError):
        message = str(error)
        level = logging.INFO if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED) \
            else logging.WARNING
        log.log(level, "%s: %s: %s", name, code.name, message)
    else:
        message = f"{name}: internal error: {type(error).__name__}: {error}"
        log.exception("%s failed", name)
    context.abort(code, message)  # raises: grpc answers with the status


def rpc(name: str, method: Callable) -> Callable:
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self: Any, request: Any, context: Any) -> Any:
            log.debug("%s: stream opened", name)
            try:
                yield from method(self, request, context)
            except Exception as e:
                _fail(context, name, e)
            log.debug("%s: stream closed", name)
        return stream

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: Any) -> Any:
        started = time.monotonic()
        try:
            response = method(self, request, context)
        except Exception as e:
            _fail(context, name, e)
        log.debug("%s: OK in %.1f ms", name, (time.monotonic() - started) * 1000)
        return response
    return unary


def instrumented(service: str) -> Callable[[type], type]:
    """A class decorator: wraps every method of the class that is an RPC of `service` (e.g. "RuntimeService")."""
    from proto import api_pb2
    rpcs = set(api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name)

    def wrap(cls: type) -> type:
        for attr, value in list(vars(cls).items()):
            if attr in rpcs and callable(value):
                setattr(cls, attr, rpc(attr, value))
        return cls
    return wrap
