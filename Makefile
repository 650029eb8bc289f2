# Quick start: `make demo` (the main job on the embedded default) and `make test` (the test suite).
# Both create or reuse the virtualenv in $(VENV) and install what they need (CPU torch per constraints-cpu.txt).

SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
HASH    := $(shell cat pyproject.toml constraints-cpu.txt | sha1sum | cut -c1-12)
STAMP   := $(VENV)/.installed-$(HASH)

.PHONY: demo test serve bench install clean

$(STAMP): pyproject.toml constraints-cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing Python dependencies into $(VENV) (first run: several minutes, CPU torch included)..."
	$(PY) -m pip install -q --disable-pip-version-check -c constraints-cpu.txt -e '.[test,bench]' 2>&1 \
	  | { grep -v "^WARNING: Location '.*' is ignored" || true; }
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/diarist demo $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest $(PYTEST_ARGS)

serve: $(STAMP)
	$(VENV)/bin/diarist serve --embedded $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_cpu.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
