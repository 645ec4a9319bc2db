#!/usr/bin/env bash
# Builds what `make conformance-k8s` (tests/conformance/k8s_suite.py) runs against `make cluster`, from the
# k8s.io/kubernetes module of the control plane (k8s-module.bash), into $PEERS_BIN/kubernetes/e2e:
# - e2e.test, Kubernetes' e2e suite: a Go test binary, so `go test -c` of test/e2e, with the version
#   ldflags (it prints and logs the version it was built as);
# - the ginkgo CLI at the version that module requires: cri-tools' (critest's, in $PEERS_BIN) may differ;
# - agnhost, the test image's one binary, CGO off and its VERSION in main.Version as its own Makefile does;
# - sample-apiserver, the Aggregator spec's API server: the k8s.io/sample-apiserver module of the same release
#   (v0.37.2 for v1.37.2, the scratch module's replace), CGO off as its image's Makefile builds it;
#   tests/kit/e2e_images.py makes the images around those two.
# e2e.test is by far the largest build of the peers, so build-peers.sh leaves it out unless named
# (`scripts/build-peers.sh e2e`, which the conformance-k8s target runs). go test -c stamps no version: a
# file beside the binaries records which release they were built from. With that file current, only the
# outputs missing are built (a binary added here does not rebuild e2e.test).
set -euo pipefail
. "$(dirname "$0")/k8s-module.bash"
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}/kubernetes/e2e"
stamp="$bin/.version"
outputs=(e2e.test ginkgo agnhost sample-apiserver)
[ "$(cat "$stamp" 2>/dev/null)" = "$K8S_VERSION" ] && current=1 || current=
build=()
for o in "${outputs[@]}"; do [ -n "$current" ] && [ -x "$bin/$o" ] || build+=("$o"); done
[ ${#build[@]} -eq 0 ] && exit 0
wanted() { [[ " ${build[*]} " == *" $1 "* ]]; }
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
mkdir -p "$bin"
[ -n "$current" ] || rm -f "$stamp"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
k8s_scratch_module "$work" pynode.local/k8se2e
cd "$work"
# No source in the scratch module (agnhost is a main package, which nothing can import, and test/e2e's
# suite is its _test.go files): -mod=mod lets each build complete go.mod and go.sum from the graph of
# k8s.io/kubernetes' own go.mod.
k8s_dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
if wanted agnhost; then
  agnhost_version=$(cat "$k8s_dir/test/images/agnhost/VERSION")
  echo "building agnhost $agnhost_version" >&2
  CGO_ENABLED=0 nice go build -trimpath -ldflags "-s -w -X main.Version=$agnhost_version" \
    -o "$bin/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost
  mv "$bin/agnhost.tmp" "$bin/agnhost"
fi
if wanted sample-apiserver; then
  echo "building sample-apiserver v0.${K8S_VERSION#v1.}" >&2
  CGO_ENABLED=0 nice go build -trimpath -ldflags "$k8s_ldflags" -o "$bin/sample-apiserver.tmp" k8s.io/sample-apiserver
  mv "$bin/sample-apiserver.tmp" "$bin/sample-apiserver"
fi
if wanted ginkgo; then
  ginkgo=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
  echo "building ginkgo $ginkgo" >&2
  CGO_ENABLED=0 GOBIN="$work/bin" nice go install "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo"
  mv "$work/bin/ginkgo" "$bin/ginkgo"
fi
if wanted e2e.test; then
  echo "building e2e.test $K8S_VERSION" >&2
  nice go test -c -trimpath -ldflags "$k8s_ldflags" -o "$bin/e2e.test.tmp" k8s.io/kubernetes/test/e2e
  mv "$bin/e2e.test.tmp" "$bin/e2e.test"
fi
echo "$K8S_VERSION" > "$stamp"
