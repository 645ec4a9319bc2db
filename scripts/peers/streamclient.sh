#!/usr/bin/env bash
# Builds scripts/peers/streamclient (client-go's exec/attach executors and port forwarder, as crictl and
# kubectl use them) into $PEERS_BIN/streamclient for the streaming server's tests. Rebuilt when its
# source changes: a file beside the binary records the source's hash. The module is assembled in a scratch
# directory so go.sum never lands in the repository.
set -euo pipefail
CLIENT_GO=v0.37.2
here=$(cd "$(dirname "$0")" && pwd)
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}"
stamp=$( (cat "$here/streamclient/main.go"; echo "$CLIENT_GO") | sha256sum | cut -d' ' -f1)
[ -x "$bin/streamclient" ] && [ "$(cat "$bin/.streamclient-source" 2>/dev/null)" = "$stamp" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/streamclient/main.go" "$work/"
cd "$work"
go mod init pynode.test/streamclient >/dev/null 2>&1
go get "k8s.io/client-go@$CLIENT_GO" >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
nice go build -o "$bin/streamclient" .
echo "$stamp" > "$bin/.streamclient-source"
