#!/bin/sh
# A stand-in for vagrant/provision/lab.py's provision.sh while that is missing: it proves the upload and the
# shell provisioner path (ROLE NAME, the files under /opt/pynode-lab) and is idempotent.
set -eu
echo "$1 $2 $(ls /opt/pynode-lab | tr '\n' ' ')" >/var/lib/pynode-lab-stub
