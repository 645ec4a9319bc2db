#!/usr/bin/env bash
# Installs the Debian packages listed in apt-packages.txt (or in the list given) that are missing. `make setup`
# runs it every time, so a package removed since the last set-up comes back; with everything installed it is
# one dpkg-query call and apt does not run. `make lab-setup` gives it lab-packages.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${1:-$here/apt-packages.txt}
mapfile -t pkgs < <(grep -v '^\s*#' "$list" | grep -v '^\s*$')
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
