#!/usr/bin/env bash
# Builds the stock test peers (reference CNI plugins, critest, kube-* ...) from their Go modules into
# ~/.cache/pynode/bin. Each scripts/peers/NAME.sh builds one peer and is skipped when its outputs exist,
# so only a fresh machine pays for the builds. None of their source is kept in this repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PEERS_BIN="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
export GOPATH="${GOPATH:-$HOME/.cache/pynode/go}" GOCACHE="${GOCACHE:-$HOME/.cache/pynode/go-build}"
export GOFLAGS="${GOFLAGS:--mod=mod}" PATH="/usr/local/go/bin:$PATH"
mkdir -p "$PEERS_BIN"
for script in "$here"/peers/*.sh; do
  [ -e "$script" ] || continue
  bash "$script"
done
