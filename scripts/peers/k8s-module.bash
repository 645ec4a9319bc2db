# Sourced by kubernetes.sh and e2e.sh (not a peer of its own: build-peers.sh runs only peers/*.sh): the
# release they build from, the scratch module that requires it and the version ldflags.
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod maps 33 k8s.io/* modules to
# ./staging/src/..., which a requiring module cannot see. So the scratch module replaces each of them by
# the published module of the same release (v0.37.2 for v1.37.2), the list taken from those replace
# lines themselves: a pattern on v0.0.0 would also catch k8s.io/utils and kube-openapi, whose
# pseudo-versions are real. Without the ldflags every binary says v0.0.0-master, which the kubelet
# reports to the API server and version skew checks read.
K8S_VERSION=v1.37.2
k8s_minor="${K8S_VERSION#v1.}" && k8s_minor="${k8s_minor%%.*}"
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$k8s_minor"

# k8s_scratch_module DIR MODULE: writes DIR/go.mod, module MODULE requiring k8s.io/kubernetes with the
# staging replaces.
k8s_scratch_module() {
  local dir=$1 module=$2 gomod count
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  mkdir -p "$dir"
  {
    echo "module $module"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/src/.*#replace \1 => \1 v0.'"${K8S_VERSION#v1.}"'#p' "$gomod"
  } > "$dir/go.mod"
  count=$(grep -c '^replace ' "$dir/go.mod")
  if [ "$count" -lt 30 ]; then
    echo "${0##*/}: found only $count staging replaces in $gomod; its go.mod layout changed" >&2
    return 1
  fi
}
