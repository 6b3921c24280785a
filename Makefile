# The two commands of the README. Each makes its own virtualenv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo test test-all test-lowest lint docs venv clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11 or newer is needed (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# The documentation tools on top (the `docs` extra): `make docs`, and `make test`, whose
# tests/test_docs.py builds the site.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,docs]'
	@touch $(DOCS_STAMP)

venv: $(STAMP)

## make demo: the example app and a worker on the embedded SQLite default.
demo: $(STAMP)
	$(BIN)/python -m example_app.demo

## make test: linters, type checks, then the test suite without the tests marked slow
## (minutes of worker processes signalled, killed and paused; wheels built): the run a
## change needs, under ten minutes on two cores. `make test SLOW=1` (or `make test-all`)
## runs every test, as .ci/run does.
## PYTEST_ARGS overrides the defaults, e.g. PYTEST_ARGS="-n 0 -k worker". Four test
## processes on two cores: most tests wait on worker processes and database servers.
PYTEST_ARGS ?= -n 4
SLOW ?=
SLOW_MARKS := $(if $(SLOW),,-m "not slow")
test: lint $(DOCS_STAMP)
	$(BIN)/python -m pytest $(SLOW_MARKS) $(PYTEST_ARGS)

test-all:
	$(MAKE) test SLOW=1

## make test-lowest: the core of the suite with each direct dependency at the lowest
## version pyproject.toml claims (constraints-lowest.txt), in a virtualenv of its own.
LOWEST_VENV ?= .venv-lowest
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_TESTS ?= tests/test_schema.py tests/test_enqueue.py tests/test_worker.py tests/test_cli_runtime.py
$(LOWEST_STAMP): pyproject.toml constraints-lowest.txt
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c constraints-lowest.txt -e '.[test]'
	@touch $(LOWEST_STAMP)

test-lowest: $(LOWEST_STAMP)
	$(LOWEST_VENV)/bin/python -m pytest -n 4 -p no:cacheprovider $(LOWEST_TESTS)

## make lint: ruff, mypy, and the import contracts of pyproject.toml (docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## make docs: the documentation site, built into site/ with MkDocs; a warning fails it.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) $(LOWEST_VENV) site dist build .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
