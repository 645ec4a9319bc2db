#!/usr/bin/env bash
# Installs the Debian packages of the lists given (scripts/*-packages.txt) that are missing: `make run`'s
# node-packages.txt, `make setup`'s test-packages.txt, `make lab-setup`'s lab-packages.txt. The targets run it
# every time, so a package removed since the last set-up comes back; with everything installed it is one
# dpkg-query call and apt does not run.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 LIST..." >&2; exit 2; }
for list; do [ -r "$list" ] || { echo "$0: no package list $list" >&2; exit 2; }; done
mapfile -t pkgs < <(cat "$@" | grep -v '^\s*#' | grep -v '^\s*$')
mapfile -t installed < <(dpkg-query -W -f='${db:Status-Status} ${Package}\n' "${pkgs[@]}" 2>/dev/null \
  | awk '$1 == "installed" {print $2}')
missing=()
for p in "${pkgs[@]}"; do
  [[ " ${installed[*]} " == *" $p "* ]] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
