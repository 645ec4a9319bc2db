#!/usr/bin/env bash
# Builds the stock control plane and node binaries the cluster tests run beside ours: kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl and kubeadm from the k8s.io/kubernetes
# module, and etcd from go.etcd.io/etcd/server/v3, into $PEERS_BIN/kubernetes. Skipped when the outputs
# exist with the right version stamp. kubeadm came later than the others and has a stamp of its own, so a
# machine that has them builds kubeadm alone.
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod maps 33 k8s.io/* modules to
# ./staging/src/..., which a requiring module cannot see. So the scratch module replaces each of them by
# the published module of the same release (v0.37.2 for v1.37.2), the list taken from those replace
# lines themselves: a pattern on v0.0.0 would also catch k8s.io/utils and kube-openapi, whose
# pseudo-versions are real. Without the ldflags every binary says v0.0.0-master, which the kubelet
# reports to the API server and version skew checks read.
set -euo pipefail
K8S_VERSION=v1.37.2
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
staging_version="v0.${K8S_VERSION#v1.}"
gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
mkdir -p "$work/k8s"
{
  echo "module pynode.local/k8speers"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$gomod"
} > "$work/k8s/go.mod"
count=$(grep -c '^replace ' "$work/k8s/go.mod")
if [ "$count" -lt 30 ]; then
  echo "kubernetes.sh: found only $count staging replaces in $gomod; its go.mod layout changed" >&2
  exit 1
fi
{
  echo "//go:build tools"
  echo "package tools"
  echo "import ("
  for c in "${build[@]}"; do
    if [ "$c" = kubectl ]; then echo "	_ \"k8s.io/kubectl/pkg/cmd\""; else echo "	_ \"k8s.io/kubernetes/cmd/$c/app\""; fi
  done
  echo ")"
} > "$work/k8s/tools.go"
minor="${K8S_VERSION#v1.}" && minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
(
  cd "$work/k8s"
  go mod tidy >/dev/null
  for c in "${build[@]}"; do
    # kubeadm has no --version: `kubeadm version -o short`
    if [ "$c" = kubeadm ]; then version=(version -o short); else version=(--version); fi
    [ -x "$bin/$c" ] && "$bin/$c" "${version[@]}" 2>/dev/null | grep -q "$K8S_VERSION" && continue
    echo "building $c $K8S_VERSION" >&2
    nice go build -trimpath -ldflags "$ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
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
