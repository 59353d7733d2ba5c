# Hop: the two commands the README promises, plus their parts.
#   make demo   - install what is needed, build, and run the demo on the built-in emulated mesh
#   make test   - install what is needed and run every test (what CI runs)
SHELL := /bin/bash

.PHONY: demo test setup build clean-lab deb-test

setup:
	bash scripts/setup.sh

build: setup
	cargo build --release --workspace --locked

demo: build
	@[ "$$(id -u)" = 0 ] || { echo "make demo needs root (it creates network namespaces): run it as root"; exit 1; }
	.venv/bin/hoplab demo

test:
	bash scripts/test.sh

clean-lab:
	.venv/bin/hoplab clean

# The Debian package, built and tested in a clean Debian chroot (root; scripts/test-deb-install.sh).
deb-test:
	bash scripts/test-deb-install.sh
