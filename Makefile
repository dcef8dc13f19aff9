# Two entry points: `make demo` (the main job) and `make test` (what CI runs).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/tessel: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch,hf]'
	touch $(BIN)/tessel

demo: $(BIN)/tessel
	$(BIN)/python -m tessel.demo out

test: lint
	$(BIN)/python -m pytest

lint: $(BIN)/tessel
	$(BIN)/ruff check
	$(BIN)/mypy

bench: $(BIN)/tessel
	$(BIN)/python bench/search.py

clean:
	rm -rf $(VENV) out
