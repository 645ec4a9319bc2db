#!/bin/sh
# Provisions one lab VM, offline, from what `vagrant/provision/lab.py prepare` wrote beside this script (the
# Vagrantfile uploads it to /opt/pynode-lab): the Debian packages the VM lacks from debs/ (a local repository,
# no network), the project into /opt/pynode/venv from wheelhouse/, then `python -m pynode_cluster.lab apply`,
# which does the rest (peers, certificates, systemd units, routes, kernel knobs). A second run changes nothing.
#
#   sudo sh /opt/pynode-lab/provision.sh control-plane|node NAME
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 control-plane|node NAME" >&2
    exit 2
fi
ROLE=$1
NAME=$2
LAB=$(cd "$(dirname "$0")" && pwd)
VENV=/opt/pynode/venv
APT_DIR=/var/lib/pynode-lab/apt
export PEERS_BIN=/opt/pynode/bin  # where apply installs the peers (components.PEERS)
export DEBIAN_FRONTEND=noninteractive

# 1. the packages that are missing, from debs/ alone (its Packages index, made by prepare)
missing=""
for package in $(cat "$LAB/debs/wanted.txt"); do
    if ! dpkg-query -W -f '${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$'; then
        missing="$missing $package"
    fi
done
if [ -n "$missing" ]; then
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/sources.list.d"
    echo "deb [trusted=yes] file:$LAB/debs ./" > "$APT_DIR/sources.list"
    set -- -o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d" \
        -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache" -o "APT::Get::List-Cleanup=false"
    echo "installing from $LAB/debs:$missing"
    apt-get "$@" -q update
    # shellcheck disable=SC2086  # one word per package
    apt-get "$@" -q -y --no-install-recommends install $missing
fi

# 2. the project from the wheelhouse, reinstalled only when the wheel differs from the one installed
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
set -- "$LAB"/wheelhouse/pynode-*.whl
wheel=$1
sum=$(sha256sum "$wheel" | cut -d' ' -f1)
if [ "$(cat "$VENV/.pynode-wheel" 2>/dev/null || true)" != "$sum" ]; then
    echo "installing $(basename "$wheel")"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$LAB/wheelhouse" "$wheel"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --no-deps --force-reinstall "$wheel"
    echo "$sum" > "$VENV/.pynode-wheel.tmp"
    mv "$VENV/.pynode-wheel.tmp" "$VENV/.pynode-wheel"
fi

# 3. the rest, in Python
exec "$VENV/bin/python" -m pynode_cluster.lab apply "$ROLE" "$NAME" --config "$LAB/lab.json"
