#!/usr/bin/env bash
# Builds the OCI runtime-tools validation suite into $PEERS_BIN/runtime-tools for bench/runtime_tools.py:
# one binary per validation/ test under validation/, plus the static `runtimetest` and the rootfs tarball
# that every test copies from its working directory into each bundle. Pinned to a master snapshot because
# the only tag (v0.9.0, 2019) predates go.mod and runtime-spec 1.1. Skipped when the outputs exist.
set -euo pipefail
VERSION=v0.9.1-0.20260316125833-8a4db579f5c8
MODULE=github.com/opencontainers/runtime-tools
out="${PEERS_BIN:-$HOME/.cache/pynode/bin}/runtime-tools"
[ -x "$out/runtimetest" ] && [ -f "$out/rootfs-amd64.tar.gz" ] && [ -x "$out/validation/state" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p "$out/validation"
# runtimetest runs inside the busybox rootfs, so it must not need the host's libc.
CGO_ENABLED=0 GOBIN="$out" go install -tags "netgo osusergo" "$MODULE/cmd/runtimetest@$VERSION"
GOBIN="$out/validation" go install "$MODULE/validation/...@$VERSION"
src=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
install -m 644 "$src/rootfs-amd64.tar.gz" "$out/rootfs-amd64.tar.gz"
