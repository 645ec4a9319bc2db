#!/usr/bin/env bash
# Builds critest (cri-tools v1.37.0, the CRI conformance suite) and the ginkgo CLI into $PEERS_BIN for
# tests/conformance/critest.py (`make conformance`). critest is a Go test binary: cri-tools' own Makefile
# makes it with `go test -c` of cmd/critest, so it is built that way here, from the Go module proxy, in a
# scratch module that requires cri-tools. With --parallel critest runs itself under `ginkgo --nodes=N`,
# which it looks up on PATH, so ginkgo is built at the version cri-tools requires. crictl is built by
# cni-plugins.sh. go test -c stamps no version, so a file beside the binary records which one was built.
set -euo pipefail
VERSION=v1.37.0
MODULE=sigs.k8s.io/cri-tools
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
stamp="$bin/.critest-version"
[ -x "$bin/critest" ] && [ -x "$bin/ginkgo" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'module pynode.local/critest\n\ngo 1.26\n\nrequire %s %s\n' "$MODULE" "$VERSION" > go.mod
# cmd/critest holds only a _test.go file, so nothing can import it: -mod=mod lets `go test -c` complete
# go.sum (and the requirements of the suite's test imports) from cri-tools' own go.mod graph.
echo "building critest $VERSION" >&2
# as cri-tools' Makefile: CGO off, the version in its version package
CGO_ENABLED=0 nice go test -c -trimpath \
  -ldflags "-s -w -X $MODULE/pkg/version.Version=$VERSION" \
  -o "$bin/critest.tmp.$$" "$MODULE/cmd/critest"
ginkgo=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
CGO_ENABLED=0 GOBIN="$work/bin" nice go install "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo"
mv "$work/bin/ginkgo" "$bin/ginkgo"
mv "$bin/critest.tmp.$$" "$bin/critest"
echo "$VERSION" > "$stamp"
