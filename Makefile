# Fresh machine:  make demo   (build the shipped tiny spec on CPU)
#                 make test   (run the test suite)
# Both create .venv once; the stamp file makes the setup idempotent (redone when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
# CPU build of torch, installed before the project so that `torch>=...` in pyproject.toml is already satisfied
# (a bare `pip install torch` would pull the multi-GB CUDA build on Linux).
TORCH  ?= torch==2.13.0

BIN   := $(VENV)/bin
STAMP := $(VENV)/.modkit-setup-done

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: $(STAMP)
	$(BIN)/modkit build specs/tiny-llama.json --device cpu

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
