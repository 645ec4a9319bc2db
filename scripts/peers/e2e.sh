#!/usr/bin/env bash
# Builds what `make conformance-k8s` (tests/conformance/k8s_suite.py) runs against `make cluster`, from the
# k8s.io/kubernetes module of the control plane (k8s-module.bash), into $PEERS_BIN/kubernetes/e2e:
# - e2e.test, Kubernetes' e2e suite: a Go test binary, so `go test -c` of test/e2e, with the version
#   ldflags (it prints and logs the version it was built as);
# - the ginkgo CLI at the version that module requires: cri-tools' (critest's, in $PEERS_BIN) may differ;
# - agnhost, the test image's one binary, CGO off and its VERSION in main.Version as its own Makefile does;
#   k8s_suite.py makes the image around it.
# e2e.test is by far the largest build of the peers, so build-peers.sh leaves it out unless named
# (`scripts/build-peers.sh e2e`, which the conformance-k8s target runs). go test -c stamps no version: a
# file beside the binaries records which release they were built from.
set -euo pipefail
. "$(dirname "$0")/k8s-module.bash"
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}/kubernetes/e2e"
stamp="$bin/.version"
outputs=(e2e.test ginkgo agnhost)
have=1
for o in "${outputs[@]}"; do [ -x "$bin/$o" ] || have=; done
[ -n "$have" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$K8S_VERSION" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
mkdir -p "$bin"
rm -f "$stamp"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
k8s_scratch_module "$work" pynode.local/k8se2e
cd "$work"
# No source in the scratch module (agnhost is a main package, which nothing can import, and test/e2e's
# suite is its _test.go files): -mod=mod lets each build complete go.mod and go.sum from the graph of
# k8s.io/kubernetes' own go.mod.
k8s_dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
agnhost_version=$(cat "$k8s_dir/test/images/agnhost/VERSION")
echo "building agnhost $agnhost_version" >&2
CGO_ENABLED=0 nice go build -trimpath -ldflags "-s -w -X main.Version=$agnhost_version" \
  -o "$bin/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost
mv "$bin/agnhost.tmp" "$bin/agnhost"
ginkgo=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
echo "building ginkgo $ginkgo" >&2
CGO_ENABLED=0 GOBIN="$work/bin" nice go install "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo"
mv "$work/bin/ginkgo" "$bin/ginkgo"
echo "building e2e.test $K8S_VERSION" >&2
nice go test -c -trimpath -ldflags "$k8s_ldflags" -o "$bin/e2e.test.tmp" k8s.io/kubernetes/test/e2e
mv "$bin/e2e.test.tmp" "$bin/e2e.test"
echo "$K8S_VERSION" > "$stamp"
