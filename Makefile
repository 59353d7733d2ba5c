# Hop: the two commands the README promises, plus their parts.
#   make demo   - install what is needed, build, and run the demo on the built-in emulated mesh
#   make test   - install what is needed and run every test (what CI runs)
SHELL := /bin/bash

.PHONY: demo test setup build clean-lab

setup:
	bash scripts/setup.sh

build: setup
	cargo build --release --workspace --locked

demo: build
	sudo -n true 2>/dev/null || [ "$$(id -u)" = 0 ] || { echo "the demo needs root (network namespaces)"; exit 1; }
	.venv/bin/hoplab demo

test:
	bash scripts/test.sh

clean-lab:
	.venv/bin/hoplab clean
