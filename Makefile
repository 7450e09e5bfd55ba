# Two entry points (README quick start): `make repro` runs the pipeline, `make test` runs the tests.
# Both create .venv and install the project the first time (and again when pyproject.toml changes).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: repro test test-fast lint bench mlflow-ui

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

repro: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro

test: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q

# Between edits: everything except the tests that run dvc or train (marked `slow`).
test-fast: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench

bench: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench

# The MLflow UI on http://127.0.0.1:5000 (localhost only).
mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///$(CURDIR)/mlflow.db
