"""Import-layer contracts: which package may import which, checked over the AST of every module.

The layers are what lets each part be used on its own: the CNI plugins run without the runtime, the
kernel layer (pyruntime.linux) knows nothing of specs or containers, and the kubelet reaches a runtime
only through CRI (the generated stubs in proto/), so it drives containerd as well as pyruntime. Every
import counts, lazy ones inside functions, `if TYPE_CHECKING:` ones and importlib.import_module("...")
with a literal name included: an import that only runs on some path still ties the layers together.
"""
from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pyruntime", "cni_plugins", "pykubelet", "proto", "pynode_cluster", "pynode_os")


@dataclass(frozen=True)
class Contract:
    layer: str  # a package or module: the contract holds for it and everything below it
    forbidden: tuple[str, ...]  # packages or modules it must not import, nor anything below them
    why: str
    exempt: tuple[str, ...] = ()  # parts of `layer` the contract does not hold for (and everything below them)
    allowed: tuple[str, ...] = ()  # parts of `forbidden` that `layer` may import all the same

    def forbids(self, target: str) -> bool:
        return (any(_within(target, f) for f in self.forbidden)
                and not any(_within(target, a) for a in self.allowed))

    def binds(self, module: str) -> bool:
        return _within(module, self.layer) and not any(_within(module, e) for e in self.exempt)


CONTRACTS = (
    Contract("pynode_os", tuple(p for p in PACKAGES if p != "pynode_os"),
             "the OS floor is below every package, which may all import it (pynode_os/__init__.py)"),
    Contract("pyruntime.linux", ("pyruntime.container", "pyruntime.oci"),
             "the kernel layer sits below the OCI spec and the container life cycle"),
    Contract("pyruntime.oci", ("pyruntime.container",), "the OCI spec types sit below the container life cycle"),
    Contract("pyruntime.images", ("pyruntime.container",),
             "the image store hands out rootfs mounts and knows nothing of containers"),
    Contract("pyruntime.errors", ("pyruntime",), "the error kinds are the bottom of pyruntime"),
    Contract("pyruntime.linux.seccomp.profile", ("pyruntime.linux.seccomp.compiler", "pyruntime.linux.seccomp.loader"),
             "validating a profile, which every create does, loads neither libseccomp's binding nor the loader"),
    Contract("pyruntime.linux.seccomp.compiler", ("pyruntime.linux.seccomp.loader",),
             "compiling is apart from loading: a CRI launcher compiles the default profile and never loads it"),
    Contract("cni_plugins", ("pyruntime", "pykubelet"),
             "the CNI plugins are standalone executables that any CNI runtime calls"),
    Contract("pyruntime", ("pykubelet",), "the runtime serves any kubelet over CRI"),
    Contract("pyruntime", ("cni_plugins",), "the CRI server execs CNI plugins as any CNI runtime does, by the spec"),
    Contract("pykubelet", ("pyruntime", "cni_plugins"),
             "the kubelet reaches a runtime only through the generated CRI stubs in proto/"),
    Contract("pyruntime", ("pyruntime.cri",), "the CRI server is built on the runtime, never the other way round",
             exempt=("pyruntime.cri",)),
    Contract("pyruntime", ("grpc", "proto.api_pb2_grpc"),
             "only the CRI server's gRPC edge loads grpc: the CLI, the launcher and the supervisors fork "
             "without its threads and start without its import time",
             exempt=("pyruntime.cri.service", "pyruntime.cri.main")),
    Contract("pynode_cluster", ("tests",),
             "the cluster runs from an installed wheel on the lab's VMs, where there is no test code"),
    Contract("pyruntime", ("pynode_cluster",), "the cluster is built from the node's parts, never the other way round"),
    Contract("cni_plugins", ("pynode_cluster",), "the cluster is built from the node's parts"),
    Contract("pykubelet", ("pynode_cluster",), "the cluster is built from the node's parts"),
    Contract("pykubelet.pods.actions", ("pykubelet.runtime", "grpc", "pykubelet.pods.sync"),
             "compute_pod_actions decides and never acts: it holds no CRI client and calls no executor, so its "
             "table test is all of its behaviour"),
    Contract("pykubelet.pods.podspec", ("pykubelet",),
             "the pod-spec readers are below the rest of the kubelet: eviction's policy, which the settings read, "
             "reads them; they read the typed pod and its quantities",
             allowed=("pykubelet.api.podmodel", "pykubelet.api.quantity")),
    Contract("pykubelet.pods.podresources", ("pykubelet",),
             "a pod's requests are counted alike by the admission, the cgroups, the status and eviction's policy, "
             "which is below the rest of the kubelet; they are the typed pod's quantities summed",
             allowed=("pykubelet.api.podmodel", "pykubelet.api.quantity", "pykubelet.pods.podspec")),
    Contract("pykubelet.api.podmodel", ("pykubelet",),
             "the typed pod is the kubelet's bottom: every part reads it, and it reads only its fields' reader",
             allowed=("pykubelet.api.fields", "pykubelet.errors")),
    Contract("pykubelet.api.fields", ("pykubelet",), "the field reader is below the typed pod",
             allowed=("pykubelet.errors",)),
    Contract("pykubelet.errors", ("pykubelet",), "the error kinds are the bottom of pykubelet"),
    Contract("pykubelet.durations", ("pykubelet",), "the settings and eviction's policy both read durations"),
    Contract("pykubelet.api.quantity", ("pykubelet",),
             "the pod-spec readers, the settings and eviction's policy all read quantities, and each is below the "
             "rest of the kubelet"),
    Contract("pyruntime.channel", ("pyruntime.container", "pyruntime.cri", "pyruntime.linux", "pyruntime.oci"),
             "the channel to forked processes is below both protocols that use it: container init's and the CRI "
             "launcher's"),
    Contract("pyruntime.cri.jobs", ("pyruntime.cri", "pyruntime.container", "pyruntime.runtime"),
             "the jobs are the vocabulary the CRI daemon and its fork server share, and hold no code of either"),
    Contract("pyruntime.cri.pause", ("pyruntime.cri.launcher", "pyruntime.cri.forkserver"),
             "the fork server forks the pause: the pause speaks to it over pyruntime.channel, as the daemon's "
             "client does, and imports neither end"),
    Contract("pyruntime.cri.supervisor", ("pyruntime.cri.launcher", "pyruntime.cri.forkserver"),
             "the fork server forks the supervisor: it reports over pyruntime.channel and imports neither end"),
    Contract("pyruntime.cri.launcher", ("pyruntime.cri.forkserver", "pyruntime.cri.pause", "pyruntime.cri.supervisor"),
             "the daemon's client sends jobs; the code that runs them loads in the fork server only"),
    Contract("pyruntime.cri", ("pyruntime.cri.service",),
             "the CRI domain modules take protobuf messages and know nothing of the gRPC servicers over them",
             exempt=("pyruntime.cri.service", "pyruntime.cri.main")),
)

@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: Path
    line: int
    target: str  # the imported module (a `from X import name` counts both X and X.name)


@dataclass(frozen=True)
class Violation:
    imp: Import
    contract: Contract

    def __str__(self) -> str:
        c = self.contract
        return (f"{self.imp.path}:{self.imp.line}: {self.imp.module} imports {self.imp.target}, breaking "
                f"'{c.layer} imports nothing of {', '.join(c.forbidden)}' ({c.why})")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    """The dotted name of the module in `path` under `root`, and whether it is a package's __init__."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative `from .name import` in `module`."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    """Every module that the module in `path` imports, wherever in it the import stands."""
    module, is_package = module_name(root, path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module) if node.level else node.module or ""
            yield Import(module, path, node.lineno, base)
            for alias in node.names:
                if alias.name != "*":
                    yield Import(module, path, node.lineno, f"{base}.{alias.name}")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_dynamic_import(node.func)):
            yield Import(module, path, node.lineno, node.args[0].value)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def violations(root: Path, packages: tuple[str, ...] = PACKAGES,
               contracts: tuple[Contract, ...] = CONTRACTS) -> list[Violation]:
    """Each import statement that breaks a contract, once per contract (`from X import a, b` reports X,
    or X.a when only that is forbidden)."""
    found: dict[tuple[Path, int, Contract], Violation] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_of(root, path):
                for contract in contracts:
                    if contract.binds(imp.module) and contract.forbids(imp.target):
                        found.setdefault((path, imp.line, contract), Violation(imp, contract))
    return list(found.values())


def test_the_tree_keeps_every_contract() -> None:
    broken = violations(REPO)
    assert not broken, "import-layer contracts broken:\n" + "\n".join(map(str, broken))


def test_every_contract_names_real_code() -> None:
    """A contract over a renamed package would pass for nothing; a third-party name must be installed."""
    for contract in CONTRACTS:
        for name in (contract.layer, *contract.forbidden, *contract.exempt, *contract.allowed):
            if name.split(".")[0] not in PACKAGES:
                assert importlib.util.find_spec(name) is not None, f"contract names {name}, which is not installed"
                continue
            path = REPO / name.replace(".", "/")
            assert path.is_dir() or path.with_suffix(".py").is_file(), f"contract names {name}, which does not exist"


# The packages whose modules import one another without a circle: a module in a cycle cannot be loaded,
# read or tested without the others, and which of them runs first depends on who imported whom.
ACYCLIC = ("pykubelet", "pyruntime")


def import_graph(root: Path, package: str) -> dict[str, dict[str, Import]]:
    """Each module of `package` -> the modules of `package` it imports, each with its first import of it
    (a `from X import name` counts X, and X.name when that is a module)."""
    paths = {module_name(root, path)[0]: path for path in sorted((root / package).rglob("*.py"))}
    graph: dict[str, dict[str, Import]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, {})
        for imp in imports_of(root, path):
            target = imp.target
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, imp)
    return graph


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The modules of each import cycle, sorted: every strongly connected set of more than one module
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(members) > 1:
                found.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def describe(graph: dict[str, dict[str, Import]], cycle: list[str]) -> str:
    return "\n".join(f"  {imp.path}:{imp.line}: {module} imports {target}"
                     for module in cycle for target, imp in graph[module].items() if target in cycle)


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(REPO, package)
    found = cycles(graph)
    assert not found, f"import cycles in {package}:\n" + "\n\n".join(describe(graph, c) for c in found)


# The checker itself, on a tiny tree made to break each kind of import.

def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def broken_in(root: Path) -> list[str]:
    return [f"{v.imp.path.relative_to(root)}:{v.imp.line} {v.imp.target} / {v.contract.layer}"
            for v in violations(root)]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write(tmp_path, {f"{p}/__init__.py": "" for p in
                            ("pyruntime", "pyruntime/linux", "pyruntime/oci", "pyruntime/container", "pyruntime/images",
                             "pyruntime/cri", "pyruntime/cri/service", "cni_plugins", "pykubelet", "proto",
                             "pynode_os")}
                 | {"pyruntime/errors.py": ""})


def test_clean_tree_passes(tree: Path) -> None:
    write(tree, {
        "pyruntime/linux/mounts.py": "import os\nfrom pyruntime.errors import NotFoundError\nfrom . import caps\n",
        "pyruntime/oci/spec.py": "from ..linux import mounts\nfrom pyruntime import errors\n",
        "pyruntime/container/create.py": "from pyruntime.oci import spec\nfrom pyruntime.linux.mounts import x\n",
        "cni_plugins/bridge.py": "import pyroute2\nfrom cni_plugins import skel\n",
        "pykubelet/runtime.py": "from proto import api_pb2_grpc\nfrom pynode_os.files import atomic_write\n",
        "pynode_os/files.py": "import os\n",
        "pyruntime/cri/sandbox.py": "from proto import api_pb2\nfrom pyruntime.cri import model\n"
                                    "import pyruntime.runtime\n",
        "pyruntime/cri/main.py": "import grpc\nfrom pyruntime.cri.service.runtime import Servicer\n",
        "pyruntime/cri/service/runtime.py": "import grpc\nfrom proto import api_pb2_grpc\n"
                                            "from pyruntime.cri import sandbox\n",
    })
    assert broken_in(tree) == []


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("pyruntime/linux/mounts.py", "\n\nimport pyruntime.container.init\n",
     "pyruntime/linux/mounts.py:3 pyruntime.container.init / pyruntime.linux"),
    ("pyruntime/linux/mounts.py", "def f():\n    from pyruntime.oci.spec import Spec\n",
     "pyruntime/linux/mounts.py:2 pyruntime.oci.spec / pyruntime.linux"),
    ("pyruntime/linux/cgroups/v2.py", "from ...oci import spec\n",
     "pyruntime/linux/cgroups/v2.py:1 pyruntime.oci / pyruntime.linux"),
    ("pyruntime/linux/__init__.py", "from ..container import create\n",
     "pyruntime/linux/__init__.py:1 pyruntime.container / pyruntime.linux"),
    ("pyruntime/oci/spec.py", "from pyruntime import container\n",
     "pyruntime/oci/spec.py:1 pyruntime.container / pyruntime.oci"),
    ("pyruntime/images/store.py", "if TYPE_CHECKING:\n    from pyruntime.container.store import State\n",
     "pyruntime/images/store.py:2 pyruntime.container.store / pyruntime.images"),
    ("pyruntime/errors.py", "from pyruntime.linux import syscalls\n",
     "pyruntime/errors.py:1 pyruntime.linux / pyruntime.errors"),
    ("cni_plugins/ns.py", "import importlib\nm = importlib.import_module('pyruntime.linux.syscalls')\n",
     "cni_plugins/ns.py:2 pyruntime.linux.syscalls / cni_plugins"),
    ("pyruntime/cli/main.py", "import pykubelet.config as c\n", "pyruntime/cli/main.py:1 pykubelet.config / pyruntime"),
    ("pynode_os/files.py", "from pyruntime.errors import InternalError\n",
     "pynode_os/files.py:1 pyruntime.errors / pynode_os"),
    ("pynode_os/mounts.py", "def f():\n    import pykubelet.config\n",
     "pynode_os/mounts.py:2 pykubelet.config / pynode_os"),
    ("pykubelet/runtime.py", "from cni_plugins.skel import execute\n",
     "pykubelet/runtime.py:1 cni_plugins.skel / pykubelet"),
    ("pyruntime/cli/main.py", "def f():\n    from pyruntime.cri.model import Layout\n",
     "pyruntime/cli/main.py:2 pyruntime.cri.model / pyruntime"),
    ("pyruntime/cri/containers.py", "import grpc\n", "pyruntime/cri/containers.py:1 grpc / pyruntime"),
    ("pyruntime/cri/stats.py", "from grpc import StatusCode\n", "pyruntime/cri/stats.py:1 grpc / pyruntime"),
    ("pyruntime/cri/images.py", "from proto import api_pb2_grpc\n",
     "pyruntime/cri/images.py:1 proto.api_pb2_grpc / pyruntime"),
    ("pyruntime/container/exec.py", "import grpc.aio\n", "pyruntime/container/exec.py:1 grpc.aio / pyruntime"),
    ("pyruntime/cri/sandbox.py", "from pyruntime.cri.service import instrument\n",
     "pyruntime/cri/sandbox.py:1 pyruntime.cri.service / pyruntime.cri"),
    ("pykubelet/pods/actions.py", "def f():\n    from pykubelet.pods.sync import PodSyncer\n",
     "pykubelet/pods/actions.py:2 pykubelet.pods.sync / pykubelet.pods.actions"),
])
def test_checker_catches(tree: Path, name: str, text: str, expected: str) -> None:
    write(tree, {name: text})
    assert expected in broken_in(tree)


def test_failure_message_names_module_line_and_contract(tree: Path) -> None:
    write(tree, {"pykubelet/pods.py": "import json\n\nfrom pyruntime.container import create\n"})
    (message,) = {str(v) for v in violations(tree) if v.imp.target == "pyruntime.container"}
    assert message == (f"{tree}/pykubelet/pods.py:3: pykubelet.pods imports pyruntime.container, breaking "
                       "'pykubelet imports nothing of pyruntime, cni_plugins' "
                       "(the kubelet reaches a runtime only through the generated CRI stubs in proto/)")


def test_cycle_checker_sees_lazy_and_type_checking_imports(tree: Path) -> None:
    write(tree, {"pykubelet/a.py": "from pykubelet import b\n",
                 "pykubelet/b.py": "import json\n\ndef f():\n    from pykubelet.c import x\n",
                 "pykubelet/c.py": "if TYPE_CHECKING:\n    from .a import A\n",
                 "pykubelet/d.py": "from pykubelet.a import thing\n",
                 "pykubelet/sub/__init__.py": "",
                 "pykubelet/sub/e.py": "from pykubelet.sub import f\n",
                 "pykubelet/sub/f.py": "from pykubelet import d\n"})
    graph = import_graph(tree, "pykubelet")
    assert cycles(graph) == [["pykubelet.a", "pykubelet.b", "pykubelet.c"]]
    assert describe(graph, ["pykubelet.a", "pykubelet.b", "pykubelet.c"]).splitlines() == [
        f"  {tree}/pykubelet/a.py:1: pykubelet.a imports pykubelet.b",
        f"  {tree}/pykubelet/b.py:4: pykubelet.b imports pykubelet.c",
        f"  {tree}/pykubelet/c.py:2: pykubelet.c imports pykubelet.a"]
