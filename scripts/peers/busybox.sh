#!/usr/bin/env bash
# Builds busybox as upstream releases it, into $PEERS_BIN/busybox/VERSION/busybox: the e2e suite's busybox
# image (tests/kit/e2e_images.py, `make conformance-k8s` only) is Docker's busybox:VERSION, upstream's build.
# Debian's busybox (the base of the other test images) is not: Debian reverts upstream's 9c143ce, so its ash
# drops an inherited variable whose name is no shell name (`data-1`) from what it passes on, and the
# ConfigMap and Secrets "consumable via the environment" [Conformance] specs look for it.
# The source is upstream's release tarball as Debian's archive keeps it (the busybox source package's
# orig.tar.bz2, the same bytes as busybox.net's), checked against the SHA-256 pinned here; built with
# upstream's defconfig, static. Skipped when the output exists.
set -euo pipefail
VERSION=1.37.0
SHA256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
URL="http://deb.debian.org/debian/pool/main/b/busybox/busybox_$VERSION.orig.tar.bz2"
out="${PEERS_BIN:-$HOME/.cache/pynode/bin}/busybox/$VERSION"
[ -x "$out/busybox" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building busybox $VERSION" >&2
curl -fsSL --retry 3 -o "$work/src.tar.bz2" "$URL"
echo "$SHA256  $work/src.tar.bz2" | sha256sum -c --quiet -
tar -xjf "$work/src.tar.bz2" -C "$work"
cd "$work/busybox-$VERSION"
make defconfig >/dev/null
sed -i 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/' .config
grep -qx 'CONFIG_STATIC=y' .config
if ! nice make -j"$(nproc)" busybox > build.log 2>&1; then
  tail -n 40 build.log >&2
  exit 1
fi
mkdir -p "$out"
install -m 755 busybox "$out/busybox.tmp"
mv "$out/busybox.tmp" "$out/busybox"
