# Two commands set everything up on a fresh machine: `make demo` (or `make demo-offline`) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

.PHONY: install demo demo-offline test test-all lint lint-js format docs docs-check bench clean shapes-model

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The lecture's photo with the lecture's checkpoint (timm downloads it once into the Hugging Face cache).
demo: $(STAMP)
	@echo "$(BIN)/vitcli predict examples/images/newfoundland_31.jpg"
	@$(BIN)/vitcli predict examples/images/newfoundland_31.jpg || { status=$$?; \
		echo "make demo: no weights (offline?): 'make demo-offline' runs the same with random weights" >&2; \
		exit $$status; }

# The same command on a machine without network: an untrained, seeded model, so the numbers mean nothing.
demo-offline: $(STAMP)
	@echo "demo-offline: random weights (no download); the tool works, the predictions are meaningless"
	$(BIN)/vitcli predict examples/images/newfoundland_31.jpg --weights random

# The shipped shapes model (vitcli/models/shapes.*), trained again from scratch on generated scenes: seeded and
# deterministic on a CPU (docs/models.md, "The shapes model"); about 17 minutes on 2 cores (shared with a second training when measured).
shapes-model: $(STAMP)
	nice -n 5 $(BIN)/python -m vitcli.shapes_training

# The fast suite (sizes and times: docs/architecture.md, Tests); CI runs everything.
test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)
	$(PYTEST)

lint: $(STAMP) lint-js
	$(BIN)/ruff format --check vitcli tests benchmarks
	$(BIN)/ruff check vitcli tests benchmarks

# The explorer page's script (vitcli/presentation/explorer.js) with ESLint, pinned in package-lock.json (node and npm
# from the system; node_modules/ is not committed).
lint-js:
	npm ci --no-audit --no-fund --loglevel=error
	npx --no-install eslint eslint.config.js vitcli

format: $(STAMP)
	$(BIN)/ruff format vitcli tests benchmarks
	$(BIN)/ruff check --fix vitcli tests benchmarks

# docs/cli.md is generated from the Typer app, docs/models.md's family table from the family adapters and what each
# command needs (vitcli/capture/support.py); CI fails when a checked-in copy is stale.
docs: $(STAMP)
	$(BIN)/typer vitcli.cli utils docs --name vitcli --title "vitcli command-line reference" --output docs/cli.md
	$(BIN)/python -m vitcli.capture.family_table docs/models.md

docs-check: $(STAMP)
	$(BIN)/typer vitcli.cli utils docs --name vitcli --title "vitcli command-line reference" --output $(VENV)/cli.md
	@diff -u docs/cli.md $(VENV)/cli.md || (echo "docs/cli.md is stale: run 'make docs' and commit it" && exit 1)
	$(BIN)/python -m vitcli.capture.family_table --check docs/models.md

bench: $(STAMP)
	$(BIN)/python benchmarks/occlusion.py
	$(BIN)/python benchmarks/run.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/explain.py

clean:
	rm -rf $(VENV) outputs/ .pytest_cache node_modules
