# Fresh machine:  make demo   (install the base package; train nanoGPT's shakespeare-char GPT on the shipped corpus)
#                 make test   (install the test extras too; run the test suite)
# Each install runs once: stamp files under .venv make it idempotent (redone when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
# torch is installed first, on its own and pinned, so that `torch>=...` in pyproject.toml is already satisfied.
TORCH  ?= torch==2.13.0
# Optional wheel index for torch, e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` for the CPU-only
# build (~200 MB instead of the multi-GB CUDA build on Linux); when that index cannot be reached the install falls
# back to the default index. Empty: the default index.
TORCH_INDEX ?=

BIN        := $(VENV)/bin
BASE_STAMP := $(VENV)/.modkit-base
TEST_STAMP := $(VENV)/.modkit-test

.PHONY: setup demo test clean

setup: $(BASE_STAMP)

$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH_INDEX)" ]; then \
	  echo "$(BIN)/python -m pip install $(TORCH) --index-url $(TORCH_INDEX)"; \
	  $(BIN)/python -m pip install --retries 1 --timeout 20 $(TORCH) --index-url $(TORCH_INDEX) || { \
	    echo "make: could not install $(TORCH) from $(TORCH_INDEX); using the default index"; \
	    $(BIN)/python -m pip install $(TORCH); }; \
	else \
	  echo "$(BIN)/python -m pip install $(TORCH)"; \
	  $(BIN)/python -m pip install $(TORCH); \
	fi
	$(BIN)/python -m pip install -e .
	@# metadata left by an install from before the distribution was renamed modkit-lm: it would list the built-in
	@# plugins a second time under the old name
	rm -rf modkit.egg-info
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
	rm -rf $(VENV) modkit.egg-info modkit_lm.egg-info
