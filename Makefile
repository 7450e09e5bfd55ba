# Two entry points (README quick start): `make repro` runs the pipeline, `make test` runs the tests.
# Both create .venv and install the project the first time (and again when pyproject.toml or constraints.txt changes).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help repro test test-fast lint bench mlflow-ui lock smoke profile readme
.DEFAULT_GOAL := help

help:  ## this list (every target installs .venv first when needed)
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# After a dependency change in pyproject.toml: install what it asks for (keeping what still satisfies it) and pin
# the result in constraints.txt, which every install then uses (numbers are bit-identical only on the same
# libraries: pipeline/environment.py).
lock:  ## install what pyproject.toml asks for and pin it in constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	{ echo "# pip constraints written by \`make lock\`: every package at the version installed then (run \`make test\`"; \
	  echo "# before committing it). Every install (the Makefile's) uses them, so a fresh clone computes with the same"; \
	  echo "# libraries. Pins only: it installs nothing by itself."; \
	  $(BIN)/pip freeze --exclude-editable; } > constraints.txt
	touch $(STAMP)

repro: $(STAMP)  ## the whole study: dvc repro on params.yaml (the committed study's time: README; yours: python -m bench.estimate)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro

# Two workers: the CI machine has two cores. Work stealing: a worker that runs out takes queued tests from the
# other, so the long tests on the shared repro, queued last, do not all end on one worker (~60 s less here).
test: $(STAMP)  ## every test, the ten slowest listed at the end
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=10

# Between edits: everything that neither runs dvc nor trains (those are marked `slow`; tests/conftest.py).
test-fast: $(STAMP)  ## the tests that neither train nor run dvc nor start subprocesses
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow"

# After a study or a profile run: README's numbers are generated (tests/test_readme_block.py fails while stale).
readme: $(STAMP)  ## rewrite README.md's generated block from reports/ (python -m pipeline.readme)
	$(BIN)/python -m pipeline.readme

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check pipeline tests bench

bench: $(STAMP)  ## benchmarks: what the pipeline costs on this machine (reports/performance.md)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench

# The MLflow UI on http://127.0.0.1:$(PORT) (localhost only), after each experiment's link on that address.
PORT ?= 5000
mlflow-ui: $(STAMP)  ## the MLflow UI on http://127.0.0.1:$(PORT) (make mlflow-ui PORT=5123), links printed first
	$(BIN)/bias ui --port $(PORT)

profile: $(STAMP)  ## NAME=quick|large|...: params.yaml + profiles/NAME.yaml beside the default, report in reports/NAME/ (no NAME: the list)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/bias profile $(NAME)

smoke: $(STAMP)  ## the whole DAG on a tiny config in a throwaway copy (about 100 s of CPU: 1.5-3 min)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/bias smoke
