# mavjet — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-secure test lint typecheck check bench clean venv

# The stamp is rebuilt whenever pyproject.toml changes, so a pull that adds a
# dependency is picked up by the next `make` without anyone remembering to.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# Ship compiled bytecode: the 2.3 MB MAVLink dialect costs ~600 ms to compile on first import.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/mavjet demo

# The same demo with per-identity NATS credentials and the permission matrix (docs/security.md).
demo-secure: $(STAMP)
	$(BIN)/mavjet demo --secure

test: $(STAMP)
	$(BIN)/ruff check gateway drivers sim analytics tests
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10

lint: $(STAMP)
	$(BIN)/ruff check gateway drivers sim analytics tests

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/mavjet bench ingest --vehicles 10 --duration 10

clean:
	rm -rf $(VENV) .mavjet build *.egg-info
