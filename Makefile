# Two entry points: `make demo` (the main job over a real demo store) and `make test`; `make bench` runs every
# benchmark, writing benchmarks/RESULTS.md, and fails when one missed its target or a section is older than the code
# it measures (`make bench-check` says which); `make docs` regenerates
# docs/cli.md from the commands' --help, `make schema` regenerates docs/schema.sql from a migrated database and
# `make face` writes MemoryStore's methods into emelex_memory/store.py from its services (scripts/store_face.py).
# `make mutants` applies each breaking change of scripts/mutants.toml to a temporary copy of the tree and fails
# when the linked tests still pass.
# Both create .venv and install the project with its extras on first use (scripts/setup-venv: llama-cpp-python is
# built once with portable CPU flags and kept in ~/.cache/emelex-memory/wheels; `make rebuild-llama` builds it anew).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME := $(CURDIR)/.demo/home

WHEEL_CACHE := $(or $(EMELEX_WHEEL_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/emelex-memory/wheels)

.PHONY: test demo bench bench-check mutants docs schema face clean rebuild-llama

$(STAMP): pyproject.toml scripts/setup-venv
	PYTHON=$(PYTHON) scripts/setup-venv $(VENV)

test: $(STAMP)
	$(BIN)/python -m pytest -q

mutants: $(STAMP)
	$(BIN)/python scripts/mutants.py

demo: $(STAMP)
	rm -rf .demo
	mkdir -p .demo/workspace
	EMELEX_HOME=$(DEMO_HOME) $(BIN)/python -m emelex_workers.demo .demo/workspace

bench: $(STAMP)
	status=0; for script in benchmarks/bench_*.py; do $(BIN)/python $$script || status=1; done; \
	$(BIN)/python benchmarks/results.py --check || status=1; exit $$status

bench-check: $(STAMP)
	$(BIN)/python benchmarks/results.py --check

docs: $(STAMP)
	$(BIN)/python -m emelex_workers.cli.reference docs/cli.md

schema: $(STAMP)
	$(BIN)/python -m emelex_memory.core.schema docs/schema.sql

face: $(STAMP)
	$(BIN)/python scripts/store_face.py

clean:
	rm -rf $(VENV) .demo

rebuild-llama:
	rm -rf $(WHEEL_CACHE)/llama-cpp-python-* $(VENV)
	PYTHON=$(PYTHON) scripts/setup-venv $(VENV)
