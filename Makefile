# Fresh machine:  make demo   (install the base package; train nanoGPT's shakespeare-char GPT on the shipped corpus)
#                 make test   (install the test extras too; run the test suite)
# Each install runs once: stamp files under .venv make it idempotent (redone when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
# CPU build of torch, installed before the project so that `torch>=...` in pyproject.toml is already satisfied
# (a bare `pip install torch` would pull the multi-GB CUDA build on Linux).
TORCH  ?= torch==2.13.0

BIN        := $(VENV)/bin
BASE_STAMP := $(VENV)/.modkit-base
TEST_STAMP := $(VENV)/.modkit-test

.PHONY: setup demo test clean

setup: $(BASE_STAMP)

$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e .
	touch $@

$(TEST_STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: $(BASE_STAMP)
	$(BIN)/modkit build specs/nanogpt-shakespeare-char.json --device meta
	$(BIN)/modkit train -c specs/train/shakespeare-char.json

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
