# The two commands of the README. Each makes its own virtualenv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint venv clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11 or newer is needed (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## make demo: the example app and a worker on the embedded SQLite default.
demo: $(STAMP)
	$(BIN)/python -m example_app.demo

## make test: linters, type checks, then the test suite.
## PYTEST_ARGS overrides the defaults, e.g. PYTEST_ARGS="-n 0 -k worker". Four test
## processes on two cores: most tests wait on worker processes and database servers.
PYTEST_ARGS ?= -n 4
test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## make lint: ruff, mypy, and the import contracts of pyproject.toml (docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
