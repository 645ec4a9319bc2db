#!/usr/bin/env bash
# Builds metrics-server (sigs.k8s.io/metrics-server, on k8s.io/* v0.36) into $PEERS_BIN/kubernetes for
# `make cluster`, where it runs beside the control plane, scrapes the kubelets' /metrics/resource and serves
# metrics.k8s.io to `kubectl top`. Its module has no replace directives, so `go install MODULE/cmd/...@VERSION`
# builds it as its Makefile does (CGO off, the version in client-go's version package, which its Makefile
# sets). v0.9.0: v0.9.1 asks for Go 1.26.10, a toolchain download where the machine's Go is older. A file
# beside the binary records which version was built.
set -euo pipefail
VERSION=v0.9.0
MODULE=sigs.k8s.io/metrics-server
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}/kubernetes"
stamp="$bin/.metrics-server-version"
[ -x "$bin/metrics-server" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "building metrics-server $VERSION" >&2
CGO_ENABLED=0 GOBIN="$work/bin" nice go install -trimpath \
  -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$VERSION" "$MODULE/cmd/metrics-server@$VERSION"
mv "$work/bin/metrics-server" "$bin/metrics-server"
echo "$VERSION" > "$stamp"
