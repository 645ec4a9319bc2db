#!/usr/bin/env bash
# Builds the binaries of the images `kubeadm init` asks for (`kubeadm config images list`): kube-apiserver,
# kube-controller-manager, kube-scheduler and kube-proxy from the k8s.io/kubernetes module, and etcd at the
# release kubeadm's etcd tag names (3.7.0-0), into $PEERS_BIN/kubeadm-images. Static (CGO_ENABLED=0), as
# upstream builds its images' binaries: an image holds its one binary and no libc. The peers of
# kubernetes.sh are the host's own processes and stay cgo builds. tests/kit/kubeadm_images.py makes the images.
set -euo pipefail
. "$(dirname "$0")/k8s-module.bash"
ETCD_VERSION=v3.7.0  # registry.k8s.io/etcd:3.7.0-0 (kubeadm v1.37.2's constants.go)
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}/kubeadm-images"
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0
stamp="$bin/.version"
want="kubernetes $K8S_VERSION etcd $ETCD_VERSION static"
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && exit 0
commands=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

k8s_scratch_module "$work/k8s" pynode.local/k8simages
{
  echo "//go:build tools"
  echo "package tools"
  echo "import ("
  for c in "${commands[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c/app\""; done
  echo ")"
} > "$work/k8s/tools.go"
(
  cd "$work/k8s"
  go mod tidy >/dev/null
  echo "building ${commands[*]} $K8S_VERSION (static)" >&2
  # one go build for the four: they share most of their packages
  mkdir -p "$work/out"
  nice go build -trimpath -ldflags "$k8s_ldflags" -o "$work/out/" "${commands[@]/#/k8s.io/kubernetes/cmd/}"
)

mkdir -p "$work/etcd"
cat > "$work/etcd/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
(
  cd "$work/etcd"
  printf 'module pynode.local/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  go mod tidy >/dev/null
  echo "building etcd $ETCD_VERSION (static)" >&2
  nice go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" .
)
mv "$work"/out/* "$bin/"
echo "$want" > "$stamp"
