#!/usr/bin/env bash
# Builds CoreDNS v1.14.6 (the version kubeadm v1.37.2 deploys: its constants.CoreDNSVersion) into $PEERS_BIN/coredns
# for `make cluster`'s cluster DNS (pynode_cluster/coredns.py) and its image in the test registry
# (tests/kit/coredns.py), from the Go module proxy. As CoreDNS's Makefile builds it: CGO off (a static binary,
# the image holds nothing else), the grpcnotrace tag, the version in coremain.GitCommit (`git describe` of a
# module zip has no git metadata). Skipped when the binary says it is that version.
set -euo pipefail
VERSION=v1.14.6
MODULE=github.com/coredns/coredns
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
[ -x "$bin/coredns" ] && "$bin/coredns" -version 2>/dev/null | grep -qx "CoreDNS-${VERSION#v}" && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building coredns $VERSION" >&2
CGO_ENABLED=0 GOBIN="$work" nice go install -trimpath -tags grpcnotrace \
  -ldflags "-s -w -X $MODULE/coremain.GitCommit=$VERSION" "$MODULE@$VERSION"
mv "$work/coredns" "$bin/coredns"
