#!/usr/bin/env bash
# Builds runc 1.3.6 and the tree its bats integration suite runs from into $PEERS_BIN/runc-1.3.6, for
# tests/conformance/runc_suite.py (`make conformance-runc`), all from the Go module proxy:
#   runc                        the reference runtime, built as runc's Makefile builds it (seccomp, PIE, gitCommit)
#   go.mod, tests/              a writable copy of the module's tests/ (the suite writes testdata/ and reads
#                               ../../go.mod; the module cache is read-only)
#   tests/cmd/_bin/*            the suite's Go helpers (recvtty, seccompagent, pidfd-kill ...), where its
#                               helpers.bash looks for them
# The test images go into tests/integration/testdata when the runner starts (they need the venv's test kit).
# Skipped when the outputs exist.
set -euo pipefail
VERSION=v1.3.6
MODULE=github.com/opencontainers/runc
out="${PEERS_BIN:-$HOME/.cache/pynode/bin}/runc-${VERSION#v}"
helpers=(recvtty sd-helper seccompagent fs-idmap pidfd-kill remap-rootfs)
done_marker="$out/.complete"
[ -f "$done_marker" ] && [ -x "$out/runc" ] && exit 0
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
src=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src/tests/integration" ] || { echo "runc.sh: $MODULE@$VERSION has no tests/integration in $src" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
cp -r "$src/tests" "$src/go.mod" "$out/"
chmod -R u+w "$out"
# module zips keep no file modes: the suite runs its get-images.sh and seccompagent's config generator
find "$out/tests" -name '*.sh' -exec chmod +x {} +
# As runc's Makefile: `git describe --long` would give v1.3.6-0-g<hash>; the module zip has no git metadata.
ldflags="-X main.gitCommit=${VERSION}-0-gmodule"
build() { (cd "$src" && CGO_ENABLED=1 go build -mod=readonly -trimpath -buildmode=pie \
  -tags "seccomp urfave_cli_no_docs" -ldflags "$ldflags" "$@"); }
build -o "$out/runc" .
mkdir -p "$out/tests/cmd/_bin"
for h in "${helpers[@]}"; do
  build -o "$out/tests/cmd/_bin/$h" "./tests/cmd/$h"
done
touch "$done_marker"
