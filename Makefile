# Two entry points: `make demo` (the main job) and `make test` (what CI runs); `make test-fast`
# is the edit loop: the tests not marked slow (under 2 minutes on 2 cores), no lint.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint bench clean

$(BIN)/tessel: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch,hf]'
	touch $(BIN)/tessel

demo: $(BIN)/tessel
	$(BIN)/python -m tessel.demo out

test: lint
	$(BIN)/python -m pytest

test-fast: $(BIN)/tessel
	$(BIN)/python -m pytest -m "not slow" -x

lint: $(BIN)/tessel
	$(BIN)/ruff check
	$(BIN)/mypy

bench: $(BIN)/tessel
	$(BIN)/python bench/search.py

clean:
	rm -rf $(VENV) out
