#!/usr/bin/env bash
# Builds the stock control plane and node binaries the cluster tests run beside ours: kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl and kubeadm from the k8s.io/kubernetes
# module, and etcd from go.etcd.io/etcd/server/v3, into $PEERS_BIN/kubernetes. Skipped when the outputs
# exist with the right version stamp. kubeadm came later than the others and has a stamp of its own, so a
# machine that has them builds kubeadm alone.
# The scratch module and the version ldflags: k8s-module.bash.
set -euo pipefail
. "$(dirname "$0")/k8s-module.bash"
ETCD_VERSION=v3.7.3
bin="${PEERS_BIN:-$HOME/.cache/pynode/bin}/kubernetes"
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="${GOFLAGS:--mod=mod}"
stamp="$bin/.version"
want="kubernetes $K8S_VERSION etcd $ETCD_VERSION"
kubeadm_stamp="$bin/.kubeadm-version"
commands=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && have_rest=1 || have_rest=
[ -x "$bin/kubeadm" ] && [ "$(cat "$kubeadm_stamp" 2>/dev/null)" = "$K8S_VERSION" ] && have_kubeadm=1 || have_kubeadm=
[ -n "$have_rest" ] && [ -n "$have_kubeadm" ] && exit 0
build=()
[ -n "$have_rest" ] || build+=("${commands[@]}")
[ -n "$have_kubeadm" ] || build+=(kubeadm)
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# kubernetes
k8s_scratch_module "$work/k8s" pynode.local/k8speers
{
  echo "//go:build tools"
  echo "package tools"
  echo "import ("
  for c in "${build[@]}"; do
    if [ "$c" = kubectl ]; then echo "	_ \"k8s.io/kubectl/pkg/cmd\""; else echo "	_ \"k8s.io/kubernetes/cmd/$c/app\""; fi
  done
  echo ")"
} > "$work/k8s/tools.go"
(
  cd "$work/k8s"
  go mod tidy >/dev/null
  for c in "${build[@]}"; do
    # kubeadm has no --version: `kubeadm version -o short`
    if [ "$c" = kubeadm ]; then version=(version -o short); else version=(--version); fi
    [ -x "$bin/$c" ] && "$bin/$c" "${version[@]}" 2>/dev/null | grep -q "$K8S_VERSION" && continue
    echo "building $c $K8S_VERSION" >&2
    nice go build -trimpath -ldflags "$k8s_ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$bin/$c.tmp" "$bin/$c"
  done
)
[ -n "$have_kubeadm" ] || echo "$K8S_VERSION" > "$kubeadm_stamp"
[ -n "$have_rest" ] && exit 0

# etcd: its own main is in a module that is not meant to be required either; etcdmain.Main is
mkdir -p "$work/etcd"
cat > "$work/etcd/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
(
  cd "$work/etcd"
  printf 'module pynode.local/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  go mod tidy >/dev/null
  echo "building etcd $ETCD_VERSION" >&2
  nice go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" .
  mv "$bin/etcd.tmp" "$bin/etcd"
)
echo "$want" > "$stamp"
