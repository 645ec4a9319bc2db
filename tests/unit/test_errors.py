"""The error-kind contract: every exception class of pyruntime has exactly one kind, the CLI maps every
kind, causes survive, and errnos are compared by name."""
from __future__ import annotations

import ast
import errno
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import pyruntime
from pyruntime import errors
from pyruntime.cli import errors as cli_errors
from pyruntime.cli.main import main
from pyruntime.container.store import ContainerStore, NotFound
from pyruntime.images.reference import ReferenceFormatError, parse
from pyruntime.linux.cgroups.base import CgroupError
from pyruntime.linux.syscalls import LinuxSyscalls, SyscallError
from pyruntime.oci.spec import SpecError, load_bundle

ROOT = Path(pyruntime.__file__).parent


def _exception_classes() -> dict[str, type[BaseException]]:
    found = {}
    for info in pkgutil.walk_packages(pyruntime.__path__, "pyruntime."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_has_exactly_one_kind() -> None:
    classes = _exception_classes()
    own = {name: cls for name, cls in classes.items()
           if cls is not errors.PyRuntimeError and cls not in errors.KINDS}
    assert len(own) >= 20  # the walk found the package's classes, not an empty import
    wrong = {name: [k.__name__ for k in errors.KINDS if issubclass(cls, k)] for name, cls in own.items()}
    assert {name: kinds for name, kinds in wrong.items() if len(kinds) != 1} == {}


def test_builtin_bases_that_callers_catch_are_kept() -> None:
    for cls in (SyscallError, CgroupError):
        e = cls(errno.ENOENT, "open /x: No such file or directory")
        assert isinstance(e, OSError) and e.errno == errno.ENOENT and errors.kind_of(e) is errors.InternalError
    assert issubclass(SpecError, ValueError) and issubclass(ReferenceFormatError, ValueError)


def test_reference_error_no_longer_shadows_the_builtin() -> None:
    with pytest.raises(ReferenceFormatError, match="bad tag") as info:
        parse("busybox:-bad")
    assert errors.kind_of(info.value) is errors.InvalidArgumentError
    assert not issubclass(ReferenceFormatError, ReferenceError)  # the builtin


def test_the_cli_maps_every_kind() -> None:
    assert set(cli_errors.EXITS) == set(errors.KINDS)
    for kind in errors.KINDS:
        status, line = cli_errors.report(kind("boom"), "state")
        assert status == 1 and line.startswith("state: boom")  # runc's status for an ordinary error
    status, line = cli_errors.report(KeyError("x"), "state")
    assert status == 1 and line == "state: internal error: KeyError: 'x'" and cli_errors.is_bug(KeyError("x"))
    assert cli_errors.kind(ValueError("invalid literal for int()")) is errors.InvalidArgumentError


def test_cli_reports_usage_errors_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--bogus"]) == 1
    assert capsys.readouterr().err == "pyruntime: flag provided but not defined: --bogus\n"
    assert main(["--root", str(tmp_path), "frobnicate"]) == 1
    assert capsys.readouterr().err.startswith("pyruntime: unknown command 'frobnicate'")
    assert main(["--root", str(tmp_path), "state", "nope"]) == 1
    assert capsys.readouterr().err == "pyruntime: state: container 'nope' does not exist\n"


def test_causes_are_kept(tmp_path: Path) -> None:
    store = ContainerStore(str(tmp_path / "root"))
    with pytest.raises(NotFound) as info:
        store.load("c1")
    assert isinstance(info.value, errors.NotFoundError) and isinstance(info.value.__cause__, FileNotFoundError)
    store.reserve("c1", LinuxSyscalls())
    with pytest.raises(errors.AlreadyExistsError, match="already exists") as exists:
        store.reserve("c1", LinuxSyscalls())
    assert isinstance(exists.value.__cause__, FileExistsError)
    with pytest.raises(errors.InvalidArgumentError, match="invalid container id"):
        store.reserve("../x", LinuxSyscalls())
    with pytest.raises(SpecError, match="no such file") as spec:
        load_bundle(str(tmp_path / "nobundle"))
    assert isinstance(spec.value.__cause__, FileNotFoundError)


def _numeric_errnos(tree: ast.AST) -> list[int]:
    """Lines that compare an `.errno` with a number or build an OSError-like error from a literal errno."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "errno" for s in sides) and any(
                    (isinstance(c, ast.Constant) and isinstance(c.value, int)) or (isinstance(c, ast.Tuple)
                    and any(isinstance(x, ast.Constant) for x in c.elts)) for c in sides):
                lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Error")
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, int)):
            lines.append(node.lineno)
    return lines


def test_errnos_are_named() -> None:
    found = {str(path.relative_to(ROOT)): lines for path in ROOT.rglob("*.py")
             if (lines := _numeric_errnos(ast.parse(path.read_text())))}
    assert found == {}
