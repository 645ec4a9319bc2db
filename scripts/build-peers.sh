#!/usr/bin/env bash
# Builds the stock test peers (reference CNI plugins, critest, kube-* ...) from their Go modules into
# ~/.cache/pynode/bin. Each scripts/peers/NAME.sh builds one peer and is skipped when its outputs exist,
# so only a fresh machine pays for the builds. None of their source is kept in this repository.
# With NAMEs, only those peers; without, every peer but those that one long target alone runs (ON_DEMAND).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# e2e.sh: Kubernetes' e2e suite, busybox.sh: its busybox image's, for `make conformance-k8s` only
ON_DEMAND=(e2e busybox)
export PEERS_BIN="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
export GOPATH="${GOPATH:-$HOME/.cache/pynode/go}" GOCACHE="${GOCACHE:-$HOME/.cache/pynode/go-build}"
export GOFLAGS="${GOFLAGS:--mod=mod}" PATH="/usr/local/go/bin:$PATH"
mkdir -p "$PEERS_BIN"
if [ $# -gt 0 ]; then
  names=("$@")
else
  names=()
  for script in "$here"/peers/*.sh; do
    [ -e "$script" ] || continue
    name=$(basename "$script" .sh)
    [[ " ${ON_DEMAND[*]} " == *" $name "* ]] || names+=("$name")
  done
fi
for name in "${names[@]}"; do
  bash "$here/peers/$name.sh"
done
