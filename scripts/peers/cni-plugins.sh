#!/usr/bin/env bash
# Builds the reference CNI plugins (bridge, host-local, loopback, portmap) at v1.10.0 into $PEERS_BIN/cni for the
# differential tests and the benchmark, and crictl into $PEERS_BIN for the containerd interop test, all
# from the Go module proxy. Each is skipped when its output exists.
set -euo pipefail
VERSION=v1.10.0
CRICTL_VERSION=v1.37.0
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
out="$bin/cni"
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p "$out"
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  [ -x "$out/$(basename "$p")" ] && continue
  GOBIN="$out" go install "github.com/containernetworking/plugins/plugins/$p@$VERSION"
done
# go install stamps no version into crictl, so a file beside it records which one was built
if [ "$(cat "$bin/.crictl-version" 2>/dev/null)" != "$CRICTL_VERSION" ]; then
  GOBIN="$bin" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  echo "$CRICTL_VERSION" > "$bin/.crictl-version"
fi
