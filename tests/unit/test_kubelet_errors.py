"""pykubelet's error kinds (pykubelet/errors.py): every exception class the kubelet defines is of exactly one
kind, so a caller branches on the kind and never on a module's class or a message."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import grpc
import pytest

import pykubelet
from pykubelet import errors
from pykubelet import runtime as cri

# the classes with no kind of their own: the CRI error's base (each code's class has its kind) and the
# HTTP answers of the kubelet's API, whose kind is their status
KINDLESS = {"pykubelet.runtime.CRIError", "pykubelet.server.app.HTTPError", "pykubelet.server.app._Refused"}


def defined_errors() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(pykubelet.__path__, "pykubelet."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__ and module is not errors:
                found.append(cls)
    return found


def test_every_error_class_has_exactly_one_kind():
    classes = defined_errors()
    assert len(classes) > 25
    for cls in classes:
        name = f"{cls.__module__}.{cls.__qualname__}"
        kinds = [k for k in errors.KINDS if issubclass(cls, k)]
        assert issubclass(cls, errors.KubeletError), f"{name} is not a KubeletError"
        assert len(kinds) == (0 if name in KINDLESS else 1), f"{name} has kinds {kinds}"


@pytest.mark.parametrize(("code", "kind"), [
    (grpc.StatusCode.NOT_FOUND, errors.NotFoundError), (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExistsError),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgumentError),
    (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPreconditionError),
    (grpc.StatusCode.UNAVAILABLE, errors.UnavailableError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceededError),
    (grpc.StatusCode.UNIMPLEMENTED, errors.FailedPreconditionError), (grpc.StatusCode.UNKNOWN, errors.InternalError),
])
def test_a_cri_error_is_of_its_codes_kind(code: grpc.StatusCode, kind: type[errors.KubeletError]):
    error = cri.ERRORS.get(code, cri.Internal)("RunPodSandbox", code, "details")
    assert errors.kind_of(error) is kind and isinstance(error, cri.CRIError)
    assert not isinstance(error, OSError)  # a deadline is not caught with the host's OSErrors


def test_anything_not_raised_on_purpose_is_internal():
    assert errors.kind_of(KeyError("x")) is errors.InternalError
    assert errors.kind_of(errors.InvalidArgumentError("x")) is errors.InvalidArgumentError
