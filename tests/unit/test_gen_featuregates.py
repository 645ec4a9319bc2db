"""scripts/gen-featuregates.py on Go sources written here in the shapes of the real feature gate files, and its
output format against the committed pykubelet/featuregates.py: none of it needs the Go module cache."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pykubelet import featuregates

REPO = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_featuregates", REPO / "scripts" / "gen-featuregates.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


gen = load()

KUBE = '''package features

import (
	otherfeatures "k8s.io/other/pkg/features"
	"k8s.io/component-base/featuregate"
)

const (
	// MyFeature featuregate.Feature = "MyFeature"
	Typed featuregate.Feature = "Typed"
	Untyped = "Untyped"
	Converted = featuregate.Feature("Converted")
	RenamedAPI featuregate.Feature = "RenamedApi"
)

var defaultVersionedKubernetesFeatureGates = map[featuregate.Feature]featuregate.VersionedSpecs{
	Typed: {
		{Version: version.MustParse("1.30"), Default: false, PreRelease: featuregate.Beta},
		// a comment between specs
		{Version: version.MustParse("1.40"), Default: true, LockToDefault: true, PreRelease: featuregate.GA},
	},

	Untyped: {
		{Version: version.MustParse("1.0"), Default: true, PreRelease: featuregate.GA},
		{Version: version.MustParse("1.39"), PreRelease: featuregate.Deprecated, LockToDefault: true}, // gone in 1.42
	},

	Converted: {
		{Version: version.MustParse("1.41"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},

	RenamedAPI: {
		{Version: version.MustParse("1.40"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.40"), LockToDefault: true, MinCompatibilityVersion: version.MustParse("1.40")},
	},

	otherfeatures.Shared: {
		{Version: version.MustParse("1.20"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
}

var defaultKubernetesFeatureGateDependencies = map[featuregate.Feature][]featuregate.Feature{
	Typed: {},

	Converted: {Typed, otherfeatures.Shared},
}
'''

OTHER = '''package features

const (
	Shared featuregate.Feature = "Shared"
	NotListed featuregate.Feature = "NotListed"
)

var defaultVersionedKubernetesFeatureGates = map[featuregate.Feature]featuregate.VersionedSpecs{
	Shared: {
		{Version: version.MustParse("1.20"), Default: true, LockToDefault: true, PreRelease: featuregate.GA},
	},
}
'''


def test_a_registry_is_read_whatever_the_order_of_its_fields():
    registry = gen.parse_registry(KUBE, "kube_features.go")
    assert list(registry) == ["Typed", "Untyped", "Converted", "RenamedAPI", "otherfeatures.Shared"]
    assert registry["Typed"] == [gen.Spec((1, 30), False, False, None), gen.Spec((1, 40), True, True, None)]
    assert registry["Untyped"][1] == gen.Spec((1, 39), False, True, None)
    assert registry["RenamedAPI"][1] == gen.Spec((1, 40), False, True, (1, 40))
    assert gen.parse_consts(KUBE) == {"Typed": "Typed", "Untyped": "Untyped", "Converted": "Converted",
                                      "RenamedAPI": "RenamedApi"}


def modules(root: Path, minor: int, apiserver: str = ""):
    """A module cache of release v1.MINOR.2 holding KUBE and OTHER, and the other registries as given or empty."""
    sources = {
        "kubernetes@v1.{}.2/pkg/features/kube_features.go": KUBE,
        "other@v0.{}.2/pkg/features/kube_features.go": OTHER,
        "apiserver@v0.{}.2/pkg/features/kube_features.go": apiserver,
        "apiextensions-apiserver@v0.{}.2/pkg/features/kube_features.go": "",
        "component-base@v0.{}.2/zpages/features/kube_features.go": "",
        "client-go@v0.{}.2/features/known_features.go": "",
        "component-base@v0.{}.2/logs/api/v1/kube_features.go": "",
        "component-base@v0.{}.2/featuregate/feature_gate.go":
            'const (\n\tallAlphaGate Feature = "AllAlpha"\n\tallBetaGate Feature = "AllBeta"\n)\n',
    }
    for name, text in sources.items():
        path = root / "k8s.io" / name.format(minor)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return gen.Modules(root, f"v1.{minor}.2")


@pytest.mark.parametrize(("minor", "locked"), [
    (39, {"Shared": True, "Untyped": False}),
    # Converted locks at 1.41 only; RenamedAPI's lock (to Go's zero value, no Default written) needs a minimum
    # compatibility of 1.40, one minor below
    (40, {"Shared": True, "Typed": True, "Untyped": False}),
    (41, {"Converted": True, "RenamedApi": False, "Shared": True, "Typed": True, "Untyped": False}),
])
def test_gates_are_named_by_their_value_and_locked_by_the_spec_in_force(tmp_path, minor, locked):
    known, got = gen.gates(modules(tmp_path, minor))
    assert known == ["AllAlpha", "AllBeta", "Converted", "RenamedApi", "Shared", "Typed", "Untyped"]
    assert got == locked


def test_a_gate_registered_twice_takes_the_same_specs(tmp_path):
    """as AddVersioned requires: the apiserver registers its own gates, which kubernetes' map lists again"""
    assert gen.gates(modules(tmp_path, 40, apiserver=OTHER))[1]["Shared"] is True
    with pytest.raises(SystemExit, match="Shared has other specs"):
        gen.gates(modules(tmp_path, 40, apiserver=OTHER.replace("LockToDefault: true, ", "")))


def test_the_committed_lists_are_in_the_scripts_format():
    text = (REPO / "pykubelet" / "featuregates.py").read_text()
    lists = gen.generated(sorted(featuregates.KNOWN), featuregates.LOCKED, (1, 37))
    assert gen.REGION.sub(lambda _: lists, text) == text
