# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Runs predict on the sample photo with the lecture's checkpoint (timm downloads it once into the HF cache).
demo: $(STAMP)
	$(BIN)/vitcli predict

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/occlusion.py

clean:
	rm -rf $(VENV) outputs/*/ .pytest_cache
