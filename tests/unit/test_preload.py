"""The long-running processes import at start every module their code may import later.

A lazy import (inside a function) keeps a command's start path lean, but in a process that lives for weeks it
reads the code on disk whenever it first runs: after `pip install -U`, a `git pull` of an editable install or
the removal of the checkout, it loads a newer module beside the older ones already in memory, or fails for
good (every StopContainer failed with "No module named 'pyruntime.linux.cgroups.v1'" once the checkout a node
was started from was gone, issue 23). So each daemon imports at start what its code imports lazily (its
PRELOAD), and the CLI keeps its lazy imports (tests/unit/test_start_path_imports.py).

For each process this walks the AST of the modules its code reaches (every import, lazy ones included,
followed from its entry module) and checks, in a fresh interpreter that ran the process's start-up imports,
that every module a lazy import there names is loaded. Lazy imports in code that runs in another process
(the launcher's children, the CLI) are named, with the process that runs them, in `elsewhere`. The stdlib is
left out: it changes with the interpreter only, for which a process must restart anyway. A lazy import inside
a third-party package is not seen.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Site:
    """One import statement (or importlib.import_module call) in `module`, inside `where` (the dotted names of
    the enclosing classes and functions, "" at module level)."""
    module: str
    where: str
    line: int
    target: str  # the module imported; for `from X import a` of a third-party X, X ("a" in `attr`)
    attr: str | None = None
    lazy: bool = False  # inside a function: runs when the function first does, not when the module loads
    dynamic: bool = False  # importlib.import_module(<not a literal>): `target` is unknown ("")

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.where or 'module level'})"


@dataclass(frozen=True)
class Process:
    name: str
    start: str  # Python run in a fresh interpreter: what the process imports before it serves
    entry: str  # the module its code starts from
    preloads_in: str  # "module:function" that calls the preload when the process starts
    elsewhere: dict[str, str] = field(default_factory=dict)  # "module:where" prefix -> who runs that code
    dynamic: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "module:where" -> what it imports


def module_file(name: str) -> Path | None:
    """The file of first-party module `name`, None for any other."""
    path = REPO / name.replace(".", "/")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() and name.split(".")[0] != "tests" else None


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_module_call(node: ast.AST) -> ast.expr | None:
    """The name argument of an importlib.import_module (or __import__) call, None for any other node."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
            isinstance(func, ast.Name) and func.id in ("import_module", "__import__")):
        return node.args[0]
    return None


@cache
def sites(module: str) -> tuple[Site, ...]:
    """Every import that runs in `module`, where it stands; imports under `if TYPE_CHECKING:` never run."""
    path = module_file(module)
    assert path is not None, module
    package = path.name == "__init__.py"
    found: list[Site] = []

    def absolute(level: int, name: str | None) -> str:
        base = module.split(".") if package else module.split(".")[:-1]
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, name] if name else base)

    def visit(node: ast.AST, where: tuple[str, ...], lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt, where, lazy)
                continue
            visit_one(child, where, lazy)

    def visit_one(node: ast.AST, where: tuple[str, ...], lazy: bool) -> None:
        at = ".".join(where)
        if isinstance(node, ast.Import):
            found.extend(Site(module, at, node.lineno, alias.name, lazy=lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.level, node.module) if node.level else node.module or ""
            for alias in node.names:
                if module_file(f"{base}.{alias.name}"):
                    found.append(Site(module, at, node.lineno, f"{base}.{alias.name}", lazy=lazy))
                elif module_file(base) or base.split(".")[0] in sys.stdlib_module_names:
                    found.append(Site(module, at, node.lineno, base, lazy=lazy))
                else:
                    found.append(Site(module, at, node.lineno, base, alias.name, lazy=lazy))
        elif isinstance(node, ast.Call) and (arg := _import_module_call(node)) is not None:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(Site(module, at, node.lineno, arg.value, lazy=lazy))
            else:
                found.append(Site(module, at, node.lineno, "", lazy=lazy, dynamic=True))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            visit(node, (*where, node.name), lazy or not isinstance(node, ast.ClassDef))
        elif isinstance(node, ast.Lambda):
            visit(node, where, True)
        else:
            visit(node, where, lazy)

    visit(ast.parse(path.read_text(), filename=str(path)), (), False)
    return tuple(found)


def _under(site: Site, key: str) -> bool:
    module, _, where = key.partition(":")
    return site.module == module and (site.where == where or site.where.startswith(where + "."))


@dataclass
class Walk:
    modules: set[str] = field(default_factory=set)
    lazy: list[Site] = field(default_factory=list)  # each lazy import the process may run, resolved
    unknown: list[Site] = field(default_factory=list)  # dynamic imports nobody said the names of
    exempted: set[str] = field(default_factory=set)  # the `elsewhere` keys some import fell under


def walk(process: Process) -> Walk:
    """The modules `process`'s code reaches from its entry and the lazy imports in them that it may run."""
    result = Walk()
    todo = [process.entry]
    while todo:
        name = todo.pop()
        if name in result.modules or module_file(name) is None:
            continue
        result.modules.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a module's packages load before it
        for site in sites(name):
            keys = [key for key in process.elsewhere if _under(site, key)]
            if keys:
                result.exempted.update(keys)
                continue
            targets = [site]
            if site.dynamic:
                key = next((k for k in process.dynamic if _under(site, k)), None)
                if key is None:
                    result.unknown.append(site)
                    continue
                targets = [Site(site.module, site.where, site.line, t, lazy=True) for t in process.dynamic[key]]
            for target in targets:
                if target.lazy and target.target.split(".")[0] not in (*sys.stdlib_module_names, "__future__"):
                    result.lazy.append(target)
                todo.append(target.target)
    return result


PROBE = """
import importlib.util, json, sys
{start}
missing = []
for module, attr in json.load(sys.stdin):
    name = module
    if attr is not None and f"{{module}}.{{attr}}" in sys.modules:
        name = f"{{module}}.{{attr}}"
    elif attr is not None and module in sys.modules:
        try:
            if importlib.util.find_spec(f"{{module}}.{{attr}}") is not None:
                name = f"{{module}}.{{attr}}"
        except ModuleNotFoundError:  # `module` is no package: `attr` is a name in it
            pass
    missing.append(name not in sys.modules)
print(json.dumps(missing))
"""


def not_loaded(process: Process, imports: list[Site]) -> list[Site]:
    """Those of `imports` whose module a fresh interpreter has not loaded once it ran `process.start`."""
    probe = PROBE.format(start=process.start)
    out = subprocess.run([sys.executable, "-c", probe], input=json.dumps([[s.target, s.attr] for s in imports]),
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, f"{process.name}'s start-up imports failed:\n{out.stderr}"
    return [site for site, missing in zip(imports, json.loads(out.stdout), strict=True) if missing]


LAUNCHER = "the launcher and the children it forks: forkserver.PRELOAD"
PULLER = "the puller: forkserver.PULL_PRELOAD"
IMAGE_CLI = "the `pyruntime image` CLI"


def processes() -> list[Process]:
    """Each long-running process, its start-up imports as its code makes them, and the code it reaches but
    never runs."""
    from cni_plugins import plugins
    from pykubelet import main as kubelet
    from pyruntime.cri import forkserver
    from pyruntime.cri import main as cri
    return [
        Process("pyruntime-cri", "from pyruntime.cri import main; main.preload()", "pyruntime.cri.main",
                "pyruntime.cri.main:serve",
                elsewhere={"pyruntime.cri.pause:_confine": LAUNCHER}
                | {f"pyruntime.runtime:Runtime.{f}": LAUNCHER for f in ("create", "exec", "_trace")}
                | {"pyruntime.cri.seccomp_default:precompile": LAUNCHER,
                   "pyruntime.images.unpack:decompressed": PULLER,
                   "pyruntime.images.store:ImageStore.puller": PULLER,
                   "pyruntime.images.store:ImageStore.import_archive": IMAGE_CLI,
                   "pyruntime.images.store:ImageStore.export": IMAGE_CLI},
                dynamic={"pyruntime.cri.main:preload": cri.PRELOAD}),
        Process("pyruntime-cri's launcher",
                "from pyruntime.cri import forkserver; forkserver.preload(forkserver.PRELOAD)",
                "pyruntime.cri.forkserver", "pyruntime.cri.forkserver:_Server.__init__",
                elsewhere={"pyruntime.cri.forkserver:_pull": PULLER},
                dynamic={"pyruntime.cri.forkserver:preload": forkserver.PRELOAD}),
        Process("pyruntime-cri's puller",  # forked from the launcher once it preloaded
                "from pyruntime.cri import forkserver; "
                "forkserver.preload(forkserver.PRELOAD + forkserver.PULL_PRELOAD)",
                "pyruntime.cri.forkserver", "pyruntime.cri.forkserver:_puller",
                elsewhere={"pyruntime.images.store:ImageStore.import_archive": IMAGE_CLI,
                           "pyruntime.images.store:ImageStore.export": IMAGE_CLI},
                dynamic={"pyruntime.cri.forkserver:preload": forkserver.PRELOAD + forkserver.PULL_PRELOAD}),
        Process("pykubelet", "from pykubelet import main; main.preload()", "pykubelet.main", "pykubelet.main:main",
                dynamic={"pykubelet.main:preload": kubelet.PRELOAD}),
        Process("the CNI plugins' helper", "from cni_plugins import plugins; plugins.preload()", "cni_plugins.helper",
                "cni_plugins.helper:main",
                elsewhere={"cni_plugins.launch:main": "a plugin's executable, serving a call in-process"},
                dynamic={"cni_plugins.plugins:run": tuple(plugins.MODULES.values()),
                         "cni_plugins.plugins:preload": tuple(plugins.MODULES.values())}),
    ]


@pytest.fixture(params=processes(), ids=lambda p: p.name)
def process(request: pytest.FixtureRequest) -> Process:
    return request.param


def test_every_lazy_import_is_loaded_at_start(process: Process) -> None:
    found = walk(process)
    assert not found.unknown, (f"{process.name}: importlib.import_module with a name this test can't read at "
                               f"{', '.join(map(str, found.unknown))}: list what it imports in `dynamic`")
    missing = not_loaded(process, found.lazy)
    assert not missing, (
        f"{process.name} imports these only when its code first runs them, from whatever code is installed by "
        "then; add them to its PRELOAD (or, for code another process runs, to `elsewhere` here):\n"
        + "\n".join(f"  {site}: {site.target}{'.' + site.attr if site.attr else ''}" for site in missing))


def test_the_process_preloads_when_it_starts(process: Process) -> None:
    module, _, where = process.preloads_in.partition(":")
    path = module_file(module)
    assert path is not None, module
    node: ast.AST = ast.parse(path.read_text())
    for name in where.split("."):
        node = next(n for n in ast.iter_child_nodes(node) if getattr(n, "name", None) == name)
    calls = [n.func for n in ast.walk(node) if isinstance(n, ast.Call)]
    assert any(getattr(f, "id", getattr(f, "attr", None)) == "preload" for f in calls), (
        f"{process.preloads_in} calls no preload()")


def test_every_exemption_names_code_the_process_reaches(process: Process) -> None:
    """An `elsewhere` key left by a rename would exempt nothing; it goes with its code."""
    assert set(process.elsewhere) <= walk(process).exempted, sorted(set(process.elsewhere) - walk(process).exempted)


def test_every_preloaded_module_is_imported_lazily_somewhere(process: Process) -> None:
    """A PRELOAD entry that no code of the process imports lazily any more is a module loaded for nothing."""
    found = walk(process)
    keys = [key for key in process.dynamic if key.endswith(":preload")]
    preloaded = {s.target for s in found.lazy if any(_under(s, key) for key in keys)}
    lazy = [s for s in found.lazy if not any(_under(s, key) for key in keys)]
    wanted = {s.target for s in lazy} | {f"{s.target}.{s.attr}" for s in lazy if s.attr}
    assert preloaded <= wanted, sorted(preloaded - wanted)


# The walker itself, on a tiny tree.

def test_walker_sees_lazy_imports_and_skips_type_checking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    sites.cache_clear()
    (tmp_path / "pyruntime").mkdir()
    (tmp_path / "pyruntime" / "__init__.py").write_text("")
    (tmp_path / "pyruntime" / "b.py").write_text("")
    (tmp_path / "pyruntime" / "a.py").write_text(
        "import os\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n    from pyruntime import b\n"
        "class C:\n    def f(self):\n        from . import b\n        import lightkube.core\n"
        "def g(name):\n    import importlib\n    importlib.import_module(name)\n")
    try:
        found = sites("pyruntime.a")
    finally:
        sites.cache_clear()
    assert [(s.where, s.target, s.lazy, s.dynamic) for s in found] == [
        ("", "os", False, False), ("C.f", "pyruntime.b", True, False), ("C.f", "lightkube.core", True, False),
        ("g", "importlib", True, False), ("g", "", True, True)]
