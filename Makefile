# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
SHELL := /bin/bash
# Debian's own python3 (built with PGO and LTO) starts the runtime and the CNI plugins faster than a
# locally built one (bench/README.md); any other python3 of 3.11 or later on PATH does where it is missing.
SYSTEM_PYTHON := $(shell /usr/bin/python3 -c 'import sys; print(sys.version_info >= (3, 11))' 2>/dev/null)
PYTHON ?= $(if $(filter True,$(SYSTEM_PYTHON)),/usr/bin/python3,python3)
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMPS := $(CURDIR)/.stamps
export PATH := $(VENV)/bin:$(PATH)

export PEERS_BIN := $(HOME)/.cache/pynode/bin

.PHONY: apt apt-test busybox peers base setup run stop lint test unit integration bench conformance conformance-runc \
	conformance-k8s test-conformance-k8s proto clean cluster cluster-down lab-setup lab-box lab-up lab-down test-lab test-lab-full \
	test-lab-kubeadm

# What a node needs (`make run`): the node's Debian packages, the venv with the package and the busybox of its
# sample pod's image.
base: apt $(STAMPS)/venv busybox

# And what the tests, `make cluster`, the conformance suites, the bench and the lab run with: their Debian
# packages, the venv's test extra and the Go-built peers (scripts/peers/*.sh into $(PEERS_BIN)); every target
# that runs a peer depends on `setup`.
setup: base apt-test $(STAMPS)/venv-test peers

# No stamps: a package removed since the last set-up must come back, and the check costs one dpkg-query.
apt:
	scripts/install-apt.sh scripts/node-packages.txt

# after `apt`: one apt at a time
apt-test: apt
	scripts/install-apt.sh scripts/test-packages.txt

# pip rewrites the package's console scripts at each `install -e`: the lean launchers go back over them.
# a comma inside $(call)'s argument, which would split it there
comma := ,
define pip-install
	$(PY) -m pip install -q --disable-pip-version-check -e '.$(1)'
	$(PY) scripts/install-launchers.py $(VENV)
	@mkdir -p $(STAMPS) && touch $@
endef

# One venv, a stamp per extra: the package alone (setup.cfg's install_requires) for `make run`, ...
$(STAMPS)/venv: setup.cfg pyproject.toml scripts/install-launchers.py | apt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call pip-install,)

# ... the test extra (pytest, ruff, mypy, grpcio-tools) added by the targets that test, lint or generate, so
# that `make test` after `make run` adds it and `make run` after `make test` changes nothing ...
$(STAMPS)/venv-test: $(STAMPS)/venv
	$(call pip-install,[test])

# runc's build is cgo with seccomp (gcc, libseccomp-dev: test-packages.txt)
peers: apt-test
	scripts/build-peers.sh

# The static busybox of `make run`'s image and the test images, from the busybox-static .deb (cached in
# ~/.cache/pynode), not the host's (pynode_cluster/busybox.py).
busybox: $(STAMPS)/venv
	$(PY) -m pynode_cluster.busybox

# ruff and mypy over the whole tree (configured in pyproject.toml), and a `# type: ignore` says why on its line.
lint: $(STAMPS)/venv-test
	$(PY) -m ruff check --quiet .
	$(PY) -m mypy
	@! git grep --untracked -nE '# type: ignore(\[[a-z, -]+\])? *$$' -- '*.py' || \
	  { echo 'a `# type: ignore` needs a reason after it on the same line'; exit 1; }

# A node in the background: pyruntime-cri + pykubelet (standalone) running the package's static-web.yaml;
# idempotent. It is the installed package's command (pynode_cluster/standalone.py), which a wheel has too.
run: base
	$(VENV)/bin/pynode run

# Removes what `make run` started: the pod, pykubelet, pyruntime-cri, the network and the state; idempotent.
stop: $(STAMPS)/venv
	$(VENV)/bin/pynode stop

test: setup lint
	$(PY) -m pytest -p no:cacheprovider -ra tests

unit: base $(STAMPS)/venv-test
	$(PY) -m pytest -p no:cacheprovider tests/unit

integration: setup
	$(PY) -m pytest -p no:cacheprovider tests/integration

# runc 1.3.6's bats suite against runc and pyruntime side by side (long; not part of `test`). It takes the
# integration lock per .bats file itself: run it without flock. FILES="run exec" runs only those files.
conformance-runc: setup
	$(PY) -m tests.conformance.runc_suite $(FILES)

# critest (cri-tools v1.37.0) against containerd 1.6 and pyruntime-cri (this checkout's, else one on PATH), side by side
# (long; not part of `test`). It takes the integration lock per endpoint itself: run it without flock.
# ENDPOINTS="containerd pyruntime-cri" picks the CRI servers; scores go to ~/.cache/pynode/critest-results.
conformance: setup
	$(PY) -m tests.conformance.critest $(ENDPOINTS)

# Kubernetes v1.37.2's own e2e [NodeConformance] specs against `make cluster`, one pair of kubelet and runtime after
# the other, side by side (long: more than an hour a pair; not part of `test`). e2e.test, its ginkgo, agnhost and
# sample-apiserver are built here, not by `setup` (scripts/peers/e2e.sh: e2e.test is the largest build of the peers).
# PAIRS="kubelet/containerd pykubelet/pyruntime-cri" picks the pairs (default: all four); SET=conformance runs every
# SIG's [Conformance] specs on two nodes instead; reports go to ~/.cache/pynode/conformance-k8s, the table into
# bench/README.md. It takes the integration lock per pair itself: run it without flock.
conformance-k8s: setup
	scripts/build-peers.sh e2e busybox
	$(PY) -m tests.conformance.k8s_suite --set $(or $(SET),node) $(PAIRS)

# The harness of conformance-k8s itself, on a few fast specs and two pairs (tests/e2e/test_conformance_k8s.py: the
# stock pair passes them all; about 25 minutes here, so not part of `test`).
test-conformance-k8s: setup
	scripts/build-peers.sh e2e busybox
	PYNODE_TEST_CONFORMANCE_K8S=1 $(PY) -m pytest -p no:cacheprovider -ra tests/e2e/test_conformance_k8s.py

# A stock control plane and NODES pynode nodes on this machine (vagrant/provision/cluster.py, network namespaces on
# a bridge of their own); KUBELET=pykubelet|kubelet, RUNTIME=pyruntime-cri|containerd pick the node's pair.
# KUBEADM=1: kubeadm init on the first node and kubeadm join of the others make the cluster instead, the control
# plane node-1's static pods (pynode_cluster/kubeadm_node.py); there KUBELET and RUNTIME may also be comma-separated
# lists, a pair per node (KUBELET=pykubelet,kubelet RUNTIME=pyruntime-cri,containerd: a mixed cluster).
# It prints the kubeconfig and the logs; `make cluster-down` removes every trace.
NODES ?= 1
KUBELET ?= pykubelet
RUNTIME ?= pyruntime-cri
cluster: setup
	$(PY) vagrant/provision/cluster.py up --nodes $(NODES) --kubelet $(KUBELET) --runtime $(RUNTIME) \
	  $(if $(filter-out 0,$(KUBEADM)),--kubeadm)

cluster-down: $(STAMPS)/venv
	$(PY) vagrant/provision/cluster.py down

# The Vagrant lab (vagrant/README.md), apart from `setup` and `test`: lab-setup installs the host's packages
# (scripts/lab-packages.txt) and readies libvirt (vagrant/host.py: its daemons started by hand when they do not run);
# lab-box builds and adds the libvirt box; lab-up brings up the VMs (LAB_NODES, LAB_MEMORY ... as the Vagrantfile
# says); lab-down destroys them and stops what lab-setup started.
lab-setup: $(STAMPS)/venv
	scripts/install-apt.sh scripts/lab-packages.txt
	$(PY) vagrant/host.py setup

lab-box: lab-setup
	vagrant/box/build.sh --add

# one VM after the other: the nodes join a control plane that is up (and 2 cores emulate one VM at a time best)
lab-up: setup lab-box
	cd vagrant && vagrant up --no-parallel

lab-down: $(STAMPS)/venv
	cd vagrant && vagrant destroy -f
	$(PY) vagrant/host.py teardown

# One node VM of the lab under QEMU software emulation joined to a control plane on this host, a deployment on
# it, then the runtime's and the CRI server's root tests run inside it on pure cgroup v2 with systemd
# (tests/lab/test_lab_v2.py), and nothing left (tests/lab; its time in vagrant/README.md: its own
# tier, `make test` does not collect it; .ci/run calls it after `make test` when CI's 90 minutes hold it).
test-lab: setup lab-setup
	PYNODE_TEST_LAB=1 $(PY) -m pytest -p no:cacheprovider -ra tests/lab

# The whole lab in VMs as `make lab-up` brings it up (the control-plane VM and two nodes; the memory they need:
# vagrant/README.md), the cross-node check on it, and nothing left (tests/lab/test_lab_full.py; not part of CI).
test-lab-full: setup lab-setup
	PYNODE_TEST_LAB=1 PYNODE_TEST_LAB_FULL=1 $(PY) -m pytest -p no:cacheprovider -ra tests/lab/test_lab_full.py

# The lab kubeadm makes (LAB_KUBEADM=1): the cp VM by kubeadm init, a node VM by kubeadm join, a deployment on it,
# and nothing left (tests/lab/test_lab_kubeadm.py; not part of CI: two VMs under emulation, vagrant/README.md).
test-lab-kubeadm: setup lab-setup
	PYNODE_TEST_LAB=1 PYNODE_TEST_LAB_KUBEADM=1 $(PY) -m pytest -p no:cacheprovider -ra tests/lab/test_lab_kubeadm.py

proto: $(STAMPS)/venv-test
	scripts/gen-proto.sh

bench: setup $(STAMPS)/bench
	$(PY) -m bench

# ... and the bench's own extra (matplotlib for bench.cluster's plot), each once per change of setup.cfg
$(STAMPS)/bench: $(STAMPS)/venv-test
	$(call pip-install,[test$(comma)bench])

clean:
	rm -rf $(VENV) $(STAMPS)
