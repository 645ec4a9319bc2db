"""How a failed `pyruntime` command ends, decided by the error's kind in one table.

Every command fails the same way, as runc does: one line on stderr (and in --log) and exit status 1.
runc's callers (containerd's go-runc, runtime-tools, scripts) test for a non-zero status and read the
message, so the status is 1 for every kind; the table is the one place a distinction would go, and
tests/unit/test_errors.py checks that it covers every kind. An error that is none of pyruntime's
kinds, nor a kernel or file error, is a bug: it gets its type in the message and a traceback.

Imported only once a command has failed, so a command that succeeds never pays for it.
"""
from __future__ import annotations

from pyruntime.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PyRuntimeError,
    UnavailableError,
    kind_of,
)

# kind -> (exit status, what the line adds after the error's own message)
EXITS: dict[type[PyRuntimeError], tuple[int, str]] = {
    NotFoundError: (1, ""),
    AlreadyExistsError: (1, ""),
    InvalidArgumentError: (1, ""),
    FailedPreconditionError: (1, ""),
    UnavailableError: (1, " (a retry may succeed)"),
    InternalError: (1, ""),
}


def kind(error: BaseException) -> type[PyRuntimeError]:
    """pyruntime's errors carry their kind. A bare ValueError comes from the CLI's own reading of a flag
    value or a JSON file (int(), json.load()), so it is the caller's invalid argument; the rest is internal."""
    if isinstance(error, ValueError) and not isinstance(error, PyRuntimeError):
        return InvalidArgumentError
    return kind_of(error)


def is_bug(error: BaseException) -> bool:
    return not isinstance(error, (PyRuntimeError, OSError, ValueError))


def report(error: BaseException, command: str | None = None) -> tuple[int, str]:
    """(exit status, the line to print) for an error that ended a command."""
    status, note = EXITS[kind(error)]
    what = f"internal error: {type(error).__name__}: {error}" if is_bug(error) else str(error)
    return status, (f"{command}: " if command else "") + what + note
