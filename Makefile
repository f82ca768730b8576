# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck chaos bench broker-jars clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench,mcp]'
	touch $(STAMP)

setup: $(STAMP) broker-jars

# Fetch the Kafka broker's jars once (Maven Central); skipped when a cluster is given.
broker-jars: $(STAMP)
	@if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then \
	  $(BIN)/python -c "from pyrula_stream.kafka.local_broker import check_java, fetch_jars; check_java(); print('kafka jars:', fetch_jars())"; \
	fi

demo: setup
	$(BIN)/python -m examples.support_triage.demo

lint: $(STAMP)
	$(BIN)/ruff check pyrula_stream tests examples bench
	$(BIN)/ruff format --check pyrula_stream tests examples bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/pytest

chaos: setup
	$(BIN)/python -m pyrula_stream.chaos $(ARGS)

bench: setup
	$(BIN)/python -m pyrula_stream.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
