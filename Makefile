# Fresh machine:  make demo        (install the base package; train nanoGPT's shakespeare-char GPT on the shipped corpus)
#                 make test        (install the test extras too; run the whole suite: about 8 min on 2 cores, install included)
#                 make test-fast   (the inner loop: everything but the tests marked slow, under 2 min)
#                 make test-latest (the suite against the newest releases on the index, in .venv-latest)
#                 make lock        (write constraints.txt from .venv-latest: how the lock is refreshed)
#                 make lint        (ruff check and ruff format --check: seconds; make format applies both)
# Each install runs once: stamp files under .venv make it idempotent (redone when pyproject.toml or
# constraints.txt changes).
#
# Every install into .venv is constrained by constraints.txt, the exact version of every package the suite runs
# against (torch included): the suite's outcome never depends on what the package index serves today. The package's
# own dependency ranges in pyproject.toml stay open for users; `make test-latest` is where upstream drift is found,
# on purpose.

PYTHON ?= python3
VENV   ?= .venv
# torch is installed first, on its own and pinned (the same version as in constraints.txt), so that `torch>=...`
# in pyproject.toml is already satisfied.
TORCH  ?= torch==2.13.0
# Optional wheel index for torch, e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` for the CPU-only
# build (~200 MB instead of the multi-GB CUDA build on Linux); when that index cannot be reached the install falls
# back to the default index. Empty: the default index.
TORCH_INDEX ?=
# Training threads of make demo (empty: torch's default, one per core; THREADS=1 on cores other processes share)
THREADS ?=
# Test processes (pytest-xdist): one per core by default; JOBS=0 runs the suite in this process alone.
JOBS   ?= auto
LOCK   := constraints.txt
LATEST ?= .venv-latest

BIN        := $(VENV)/bin
BASE_STAMP := $(VENV)/.modkit-base
TEST_STAMP := $(VENV)/.modkit-test
PIP_FLAGS  := --disable-pip-version-check

.PHONY: setup demo test test-fast test-latest lock lint format clean

setup: $(BASE_STAMP)

# $(1): the venv folder; $(2): extra pip arguments for torch (a constraint file or nothing)
define install_torch
	$(PYTHON) -m venv $(1)
	@if [ -n "$(TORCH_INDEX)" ]; then \
	  echo "$(1)/bin/python -m pip install $(TORCH) --index-url $(TORCH_INDEX)"; \
	  $(1)/bin/python -m pip install $(PIP_FLAGS) --retries 1 --timeout 20 $(TORCH) $(2) --index-url $(TORCH_INDEX) || { \
	    echo "make: could not install $(TORCH) from $(TORCH_INDEX); using the default index"; \
	    $(1)/bin/python -m pip install $(PIP_FLAGS) $(TORCH) $(2); }; \
	else \
	  echo "$(1)/bin/python -m pip install $(TORCH)"; \
	  $(1)/bin/python -m pip install $(PIP_FLAGS) $(TORCH) $(2); \
	fi
endef

$(BASE_STAMP): pyproject.toml $(LOCK)
	$(call install_torch,$(VENV),-c $(LOCK))
	$(BIN)/python -m pip install $(PIP_FLAGS) -c $(LOCK) -e .
	@# metadata left by an install from before the distribution was renamed modkit-lm: it would list the built-in
	@# plugins a second time under the old name
	rm -rf modkit.egg-info
	touch $@

$(TEST_STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install $(PIP_FLAGS) -c $(LOCK) -e '.[test]'
	touch $@

demo: $(BASE_STAMP)
	$(BIN)/modkit build specs/nanogpt-shakespeare-char.json --device meta
	$(BIN)/modkit train -c specs/train/shakespeare-char.json $(if $(THREADS),--threads $(THREADS))

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS)

# ruff (in the test extras; configured in pyproject.toml): lint, and check that the code is formatted
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(TEST_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) -m "not slow"

# The newest release of every dependency (torch stays $(TORCH): `make test-latest TORCH=torch` lifts it too), in a
# venv of its own, so .venv keeps the locked versions.
test-latest:
	rm -rf $(LATEST)
	$(call install_torch,$(LATEST),)
	$(LATEST)/bin/python -m pip install $(PIP_FLAGS) --upgrade --upgrade-strategy eager -e '.[test]' '$(TORCH)'
	rm -rf modkit.egg-info
	$(LATEST)/bin/python -m pip list --format=freeze | grep -iE '^(torch|transformers|lm.eval|datasets|mkdocs.material|pytest)=='
	$(LATEST)/bin/python -m pytest -q -n $(JOBS)

# Refresh the lock from the venv `make test-latest` made (run that first: the lock should be a set the suite passed
# on), then `make test` reinstalls .venv from it.
lock:
	@test -x $(LATEST)/bin/python || { echo "make lock: run make test-latest first (it builds $(LATEST))"; exit 1; }
	$(LATEST)/bin/python -m pip freeze --all --exclude-editable --disable-pip-version-check \
	  | grep -vE '^(pip|modkit-lm)==' | sed -E 's/^([A-Za-z0-9_.-]+==[^+ ]+)\+[A-Za-z0-9.]+$$/\1/' > $(LOCK).new
	{ sed -n '/^#/p' $(LOCK); cat $(LOCK).new; } > $(LOCK).tmp && rm $(LOCK).new && mv $(LOCK).tmp $(LOCK)
	@echo "wrote $(LOCK): $$(grep -vc '^#' $(LOCK)) pinned packages; commit it after make test passes"

clean:
	rm -rf $(VENV) $(LATEST) modkit.egg-info modkit_lm.egg-info
