# The two Quick start commands. Each creates .venv and installs everything
# (torch pinned to the 2.13.0 CPU build through the dev extra) on first use.
VENV ?= .venv
STAMP := $(VENV)/.installed-dev

.PHONY: demo check bench

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tuiwatch demo

check: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

bench: $(STAMP)
	$(VENV)/bin/python bench/overhead.py
