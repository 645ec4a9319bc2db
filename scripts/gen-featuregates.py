"""Regenerates pykubelet/featuregates.py's gate lists (KNOWN and LOCKED) from the Go module sources of a
Kubernetes release, so that they follow the stock kubelet's feature gate as it is at that release.

    .venv/bin/python scripts/gen-featuregates.py [--k8s v1.37.2]

The release defaults to the one the peers are built at (K8S_VERSION in scripts/peers/kubernetes.sh), whose
build (scripts/build-peers.sh) fills the Go module cache this reads, ~/.cache/pynode/go/pkg/mod:
k8s.io/kubernetes@vX.Y.Z and the staging modules of the same release, k8s.io/*@v0.Y.Z. Only the part of
featuregates.py from `KNOWN = frozenset((` to the end of LOCKED is rewritten; its docstring, which names the
release, is edited by hand.

The Go sources are read by line-wise regular expressions, not parsed: the feature gate files are kept in
gofmt's shape (one key per line, one spec per line), and what does not fit the shapes below is left out
or stops the script, so a new shape shows up as a diff or an error to read, not as a silent guess.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "pykubelet" / "featuregates.py"
MOD = Path.home() / ".cache" / "pynode" / "go" / "pkg" / "mod"
PEERS = REPO / "scripts" / "peers" / "kubernetes.sh"
# the lines' width the lists were first written at (under the 120 of the code), kept so that a regeneration
# differs by its gates alone
WIDTH = 117

# A gate's name: `Name featuregate.Feature = "Value"` in a const block (client-go has its own type, so
# `Name Feature = "Value"`; a few are written `Name = "Value"` or `Name = featuregate.Feature("Value")`).
# The Go identifier is not always the name the flag takes (RuntimeClassInImageCriAPI is
# "RuntimeClassInImageCriApi"), so keys are resolved through these. A commented-out line starts with `//`
# and does not match.
CONST = re.compile(r'^\s*(\w+)\s+(?:(?:featuregate\.)?Feature\s+)?=\s*(?:featuregate\.Feature\()?"([^"]+)"', re.M)
# A registry entry opens with its key alone on a line, `Name: {` or `pkg.Name: {` (a key of another package,
# by its import alias); a dependency entry (`Name: {Other},`) closes on its own line and does not match.
KEY = re.compile(r"^\s*([\w.]+):\s*\{\s*$")
# One versioned spec per line: `{Version: version.MustParse("1.33"), Default: true, PreRelease: ..., ...},`.
# Its fields come in any order (`LockToDefault: true` before or after PreRelease), so they are read one by
# one rather than by one pattern over the line.
SPEC = re.compile(r"^\s*\{([^{}]*\bVersion:[^{}]*)\},")
FIELD = re.compile(r'(\w+):\s*(version\.MustParse\("[^"]*"\)|[\w.]+)')
MUST_PARSE = re.compile(r'version\.MustParse\("(\d+)\.(\d+)"\)')
# `alias "k8s.io/module/sub/path"` in the import block: where a key `alias.Name` is declared.
IMPORT = re.compile(r'^\s*(\w+)\s+"(k8s\.io/[^"]+)"', re.M)
# The two toggles every feature gate has, declared in component-base/featuregate (allAlphaGate, allBetaGate).
TOGGLE = re.compile(r'^\s*all\w+Gate\s+Feature\s*=\s*"([^"]+)"', re.M)


@dataclass(frozen=True)
class Spec:
    version: tuple[int, int]
    default: bool
    lock_to_default: bool
    min_compatibility: tuple[int, int] | None


def parse_version(text: str, where: str) -> tuple[int, int]:
    match = MUST_PARSE.fullmatch(text)
    if match is None:
        raise SystemExit(f"{where}: a version.MustParse(\"X.Y\"), got {text}")
    return int(match[1]), int(match[2])


def parse_spec(line: str, where: str) -> Spec:
    fields = dict(FIELD.findall(line))
    bools = {name: fields.get(name, "false") for name in ("Default", "LockToDefault")}
    for name, value in bools.items():
        if value not in ("true", "false"):
            raise SystemExit(f"{where}: {name} true or false, got {value}")
    return Spec(parse_version(fields.get("Version", ""), where), bools["Default"] == "true",
                bools["LockToDefault"] == "true",
                parse_version(fields["MinCompatibilityVersion"], where) if "MinCompatibilityVersion" in fields
                else None)


def parse_registry(source: str, where: str) -> dict[str, list[Spec]]:
    """Every `Key: {` followed by spec lines in a Go file: key expression -> its specs, in order."""
    registry: dict[str, list[Spec]] = {}
    key = None
    for number, line in enumerate(source.splitlines(), 1):
        if opened := KEY.match(line):
            key = opened[1]
        elif key is not None and (spec := SPEC.match(line)):
            registry.setdefault(key, []).append(parse_spec(spec[1], f"{where}:{number}"))
        elif line.strip() not in ("", "},") and not line.strip().startswith("//"):
            key = None
    return registry


def parse_consts(source: str) -> dict[str, str]:
    return dict(CONST.findall(source))


def effective(specs: list[Spec], minor: tuple[int, int]) -> Spec | None:
    """The spec in force at `minor`, as featureSpecAtEmulationAndMinCompatVersion picks it: the last listed
    (AddVersioned refuses specs out of order) not newer than the version, skipping one whose
    MinCompatibilityVersion is above the default (one minor less)."""
    min_compat = (minor[0], minor[1] - 1)
    for spec in reversed(specs):
        if spec.version <= minor and (spec.min_compatibility is None or spec.min_compatibility <= min_compat):
            return spec
    return None


class Modules:
    """The Go module cache of one Kubernetes release: k8s.io/kubernetes@vX.Y.Z, the rest @v0.Y.Z."""

    def __init__(self, root: Path, release: str) -> None:
        match = re.fullmatch(r"v1\.(\d+)\.(\d+)", release)
        if match is None:
            raise SystemExit(f"--k8s: a version vX.Y.Z, got {release}")
        self.root = root
        self.release = release
        self.staging = f"v0.{match[1]}.{match[2]}"
        self.minor = (1, int(match[1]))

    def path(self, import_path: str) -> Path:
        module, _, sub = import_path.removeprefix("k8s.io/").partition("/")
        at = self.release if module == "kubernetes" else self.staging
        path = self.root / "k8s.io" / f"{module}@{at}" / sub
        if not path.exists():
            raise SystemExit(f"{path}: not in the Go module cache (the Go peers' build fills it)")
        return path

    def read(self, import_path: str, file: str) -> str:
        return (self.path(import_path) / file).read_text()

    def consts(self, import_path: str) -> dict[str, str]:
        """The gate names declared in a package, over its non-test Go files."""
        names: dict[str, str] = {}
        for path in sorted(self.path(import_path).glob("*.go")):
            if not path.name.endswith("_test.go"):
                names.update(parse_consts(path.read_text()))
        return names


# The registries the kubelet's gate is built from, as (import path, file): each package's map is added to
# utilfeature.DefaultMutableFeatureGate, by the package's init (kubernetes', apiserver's, apiextensions'),
# by kubernetes' init (zpages', and client-go's through its adapter) or by the kubelet's start
# (cmd/kubelet/app/server.go: logs/api/v1). The controller-manager's map is not among them: only the gates
# kubernetes' map lists of it are registered.
REGISTRIES = (
    ("k8s.io/kubernetes/pkg/features", "kube_features.go"),
    ("k8s.io/apiserver/pkg/features", "kube_features.go"),
    ("k8s.io/apiextensions-apiserver/pkg/features", "kube_features.go"),
    ("k8s.io/component-base/zpages/features", "kube_features.go"),
    ("k8s.io/client-go/features", "known_features.go"),
    ("k8s.io/component-base/logs/api/v1", "kube_features.go"),
)


def gates(modules: Modules) -> tuple[list[str], dict[str, bool]]:
    """The known gate names, sorted, and those locked to their default at the release: name -> the default."""
    known: dict[str, tuple[list[Spec], str]] = {}
    for import_path, file in REGISTRIES:
        source = modules.read(import_path, file)
        where = f"{import_path}/{file}"
        local = modules.consts(import_path)
        aliases = dict(IMPORT.findall(source))
        for key, specs in parse_registry(source, where).items():
            alias, _, ident = key.rpartition(".")
            consts = modules.consts(aliases[alias]) if alias else local
            if ident not in consts:
                raise SystemExit(f"{where}: {key} is declared nowhere")
            name = consts[ident]
            # AddVersioned refuses a name added twice with different specs: then these lists would be wrong
            if name in known and known[name][0] != specs:
                raise SystemExit(f"{where}: {name} has other specs in {known[name][1]}")
            known[name] = (specs, where)
    if not known:
        raise SystemExit("no feature gate found: the Go sources' shape changed")
    locked = {}
    for name, (specs, _) in known.items():
        spec = effective(specs, modules.minor)
        if spec is not None and spec.lock_to_default:
            locked[name] = spec.default
    toggles = TOGGLE.findall(modules.read("k8s.io/component-base/featuregate", "feature_gate.go"))
    if len(toggles) != 2:
        raise SystemExit(f"component-base/featuregate: AllAlpha and AllBeta, got {toggles}")
    return sorted([*known, *toggles]), dict(sorted(locked.items()))


def fill(items: list[str]) -> str:
    """Items on as few lines as fit WIDTH, each line indented and ending in a comma."""
    lines: list[str] = []
    line = ""
    for item in items:
        if line and len(f"{line} {item},") > WIDTH:
            lines.append(line)
            line = ""
        line = f"{line} {item}," if line else f"    {item},"
    return "\n".join([*lines, line]) + "\n"


def generated(known: list[str], locked: dict[str, bool], minor: tuple[int, int]) -> str:
    return ("KNOWN = frozenset((\n" + fill([f'"{name}"' for name in known]) + "))\n\n"
            f"# the gates locked to their default in {minor[0]}.{minor[1]} (GA ones, and deprecated ones on their way"
            " out): another value is\n# refused, as by the stock kubelet\n"
            "LOCKED = {\n" + fill([f'"{name}": {value}' for name, value in locked.items()]) + "}\n")


# From KNOWN's first line to LOCKED's closing brace, the first line that is `}` alone.
REGION = re.compile(r"^KNOWN = frozenset\(\(\n.*?^\}\n", re.M | re.S)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    release = re.search(r"^K8S_VERSION=(\S+)$", PEERS.read_text(), re.M)
    parser.add_argument("--k8s", default=release[1] if release else None, required=release is None,
                        help="the Kubernetes release (default %(default)s, the peers')")
    parser.add_argument("--mod", type=Path, default=MOD, help="the Go module cache (default %(default)s)")
    args = parser.parse_args(argv)
    modules = Modules(args.mod, args.k8s)
    known, locked = gates(modules)
    text = TARGET.read_text()
    if len(REGION.findall(text)) != 1:
        raise SystemExit(f"{TARGET}: one KNOWN = frozenset(( ... LOCKED = {{ ... }} region to rewrite")
    new = REGION.sub(lambda _: generated(known, locked, modules.minor), text)
    tmp = TARGET.with_name(TARGET.name + ".tmp")
    tmp.write_text(new)
    tmp.chmod(0o644)
    tmp.replace(TARGET)
    print(f"{TARGET.relative_to(REPO)}: {len(known)} gates, {len(locked)} locked at {args.k8s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
