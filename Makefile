# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck chaos pipelines bench broker-jars browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench,ui,faust]'
	touch $(STAMP)

setup: $(STAMP) broker-jars

# Fetch the Kafka broker's jars once (Maven Central); skipped when a cluster is given.
broker-jars: $(STAMP)
	@if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then \
	  $(BIN)/python -c "from pyrula_stream.kafka.local_broker import check_java, fetch_jars; check_java(); print('kafka jars:', fetch_jars())"; \
	fi

# The web UI's browser test drives Debian's Chromium (never a downloaded browser build).
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$PYRULA_CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (apt-get) for the web UI's browser test"; \
	  apt-get -o DPkg::Lock::Timeout=300 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium \
	  || { echo "error: apt-get install chromium failed; install Chromium, or set PYRULA_CHROMIUM=/path/to/chromium" >&2; exit 1; }; \
	else \
	  echo "error: the browser test needs Chromium: run 'apt-get install chromium' as root, or set PYRULA_CHROMIUM=/path/to/chromium" >&2; exit 1; \
	fi

demo: setup
	$(BIN)/python -m examples.support_triage.demo

lint: $(STAMP)
	$(BIN)/ruff check pyrula_stream tests examples bench
	$(BIN)/ruff format --check pyrula_stream tests examples bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: setup browser lint typecheck
	$(BIN)/pytest

chaos: setup
	$(BIN)/python -m pyrula_stream.chaos $(ARGS)

# The pipeline examples' exactly-once tests at the issue's size (1,000 orders each).
pipelines: setup
	PYRULA_PIPELINE_RECORDS=1000 $(BIN)/pytest tests/test_pipeline_faust.py -o timeout=900

bench: setup
	$(BIN)/python -m pyrula_stream.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
