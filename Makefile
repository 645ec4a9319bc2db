# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMPS := $(CURDIR)/.stamps
export PATH := $(VENV)/bin:$(PATH)

export PEERS_BIN := $(HOME)/.cache/pynode/bin

.PHONY: peers setup run test unit integration bench proto clean

setup: $(STAMPS)/apt $(STAMPS)/venv peers

$(STAMPS)/apt: scripts/apt-packages.txt scripts/install-apt.sh
	scripts/install-apt.sh
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/venv: setup.cfg pyproject.toml scripts/install-launchers.py $(STAMPS)/apt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	$(PY) scripts/install-launchers.py $(VENV)
	@mkdir -p $(STAMPS) && touch $@

peers: $(STAMPS)/apt
	scripts/build-peers.sh

run: setup
	$(PY) -m tests.kit.demo

test: setup
	$(PY) -m pytest -p no:cacheprovider -ra tests

unit: setup
	$(PY) -m pytest -p no:cacheprovider tests/unit

integration: setup
	$(PY) -m pytest -p no:cacheprovider tests/integration

proto: $(STAMPS)/venv
	scripts/gen-proto.sh

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(STAMPS)
