# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# quixstreams pins confluent-kafka<2.13 and pydantic<2.14: its own venv, which also holds
# the lowest versions of both that this project supports (make test-lowest).
QUIX_VENV := .venv-quix
QUIX_STAMP := $(QUIX_VENV)/.installed
LOWEST_TESTS := tests/runtime/test_turn_end_to_end.py tests/durable/test_durability.py tests/agent/test_results.py \
	tests/wire/test_requests.py tests/wire/test_schemas.py tests/runtime/test_dead_letters.py \
	tests/client/test_status.py tests/context/test_tool_loop.py tests/kafka/test_topics.py

.PHONY: setup demo test test-fast test-lowest lint typecheck docs dist contracts image deploy-check chaos pipelines bench broker-jars s3-server browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench,ui,mcp,faust,s3]'
	touch $(STAMP)

$(QUIX_STAMP): pyproject.toml
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install -q --upgrade pip
	$(QUIX_VENV)/bin/python -m pip install -q -e '.[quix]' 'pytest>=9.2.0' \
	  'pytest-asyncio>=1.5.0' 'pytest-timeout>=2.4.0' 'pytest-xdist>=3.8.0' 'hypothesis>=6.170'
	touch $(QUIX_STAMP)

setup: $(STAMP) $(QUIX_STAMP) broker-jars s3-server

# Fetch the Kafka broker's jars once (Maven Central); skipped when a cluster is given.
broker-jars: $(STAMP)
	@if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then \
	  $(BIN)/python -c "from pyrula_stream.kafka.local.broker import check_java, fetch_jars; check_java(); print('kafka jars:', fetch_jars())"; \
	fi

# Build the local S3 server (versitygw) once from the Go module proxy into .tools/, for the
# tests, chaos and bench of the S3 object store (1 to 3 minutes on 2 cores; PYRULA_S3_SERVER skips it).
s3-server: $(STAMP)
	@$(BIN)/python -c "from pyrula_stream.objects.s3_server import server_binary; print('s3 server:', server_binary())"

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
	$(BIN)/ruff check pyrula_stream tests examples bench deploy
	$(BIN)/ruff format --check pyrula_stream tests examples bench deploy

typecheck: $(STAMP)
	$(BIN)/mypy

# The docs site (mkdocs.yml, docs/): broken links, anchors and missing pages fail the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The sdist and the wheel in dist/ (python -m build): `pip install 'dist/<wheel>[openai]'`
# installs the package anywhere, without a clone (README: Install).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# The container image (docker or podman, whichever is present): pyrula-stream:<version>.
image: $(STAMP)
	$(BIN)/python deploy/check.py --only image

# The image and the Helm chart checked here: containers against a local broker, a worker
# stopped mid-load; the chart rendered and validated (docs/kubernetes.md). Needs docker
# or podman, and Go to build helm when it is missing.
deploy-check: $(STAMP) broker-jars
	$(BIN)/python deploy/check.py

# Rewrites schemas/json/*.schema.json and schemas/asyncapi.yaml from the code (the suite
# fails while they differ: tests/wire/test_contracts.py).
contracts: $(STAMP)
	$(BIN)/python -m pyrula_stream.wire.contracts

# The suite on two pytest-xdist workers and one broker (most tests wait on Kafka, timers
# and subprocesses, not on a core), each test file on one worker; pytest prints the 20
# slowest tests, then one coverage figure (no gate).
TEST_WORKERS ?= 2
test: setup browser lint typecheck docs
	$(MAKE) test-lowest
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --cov --cov-report=
	@echo "coverage of pyrula_stream by the suite (test processes): $$($(BIN)/coverage report --format=total)%"

# The tests that need no broker, on their own (well under a minute).
test-fast: $(STAMP)
	$(BIN)/pytest -m "not broker"

# The core suite on the lowest confluent-kafka and pydantic we support (.venv-quix).
test-lowest: setup
	$(QUIX_VENV)/bin/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(LOWEST_TESTS)

chaos: setup
	$(BIN)/python -m pyrula_stream.chaos $(ARGS)

# The pipeline examples' exactly-once tests at the issue's size (1,000 orders each).
pipelines: setup
	PYRULA_PIPELINE_RECORDS=1000 $(BIN)/pytest tests/integrations/test_pipeline_faust.py \
	  tests/integrations/test_pipeline_quix.py -o timeout=900

bench: setup
	$(BIN)/python -m pyrula_stream.bench $(ARGS)

clean:
	rm -rf $(VENV) $(QUIX_VENV) .pytest_cache .mypy_cache .ruff_cache site .coverage
