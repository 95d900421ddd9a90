# The obvious targets. `make up` and `make test` are the two commands README.md gives.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install extras up test check lint typecheck deadcode protos protos-check unit e2e bench clean promtool browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# pip runs again only when pyproject.toml changed since the last install (stamp files in the venv).
# `make up` installs what the server needs; `make extras` adds what README.md's walkthroughs need
# (the official Python client, moto's S3 server, PySpark: `.[demo]`); `make install` (and so
# `make test`) everything: Spark, the test tools and the official clients (`.[dev]`).
SERVER_STAMP := $(VENV)/.sluice-server-installed
DEMO_STAMP := $(VENV)/.sluice-demo-installed
DEV_STAMP := $(VENV)/.sluice-dev-installed

$(SERVER_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(SERVER_STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@ $(SERVER_STAMP)

install: $(DEV_STAMP)

extras: $(DEMO_STAMP)
	@echo "installed the walkthroughs' extras into $(VENV); put sluice on your PATH with: . $(BIN)/activate"

up: $(SERVER_STAMP)
	@echo "sluice is in $(BIN); in another terminal, put it on your PATH with: . $(BIN)/activate"
	$(BIN)/sluice up

protos: install
	$(BIN)/python scripts/gen_protos.py

protos-check:
	$(BIN)/python scripts/gen_protos.py --check

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check common broker proxy nameserver navigation spark_jobs sluice admin console bench cluster processes ops tests scripts

typecheck:
	$(BIN)/mypy

# Unused code (functions, classes, methods, attributes nobody reads) fails the check; tests count
# as users. Names used in ways vulture cannot see are listed, with the reason, in vulture_whitelist.py.
deadcode:
	$(BIN)/vulture common broker proxy nameserver navigation spark_jobs sluice admin console bench cluster processes ops scripts tests vulture_whitelist.py \
		--min-confidence 60 --exclude '*_pb2.py,*_pb2_grpc.py,common/codes.py' \
		--ignore-names 'pytest_*,pytestmark' \
		--ignore-decorators '@pytest.fixture,@rule,@initialize,@invariant,@precondition'

# pytest-xdist: two workers for the main process, handed 8 tests at a time in collection order
# (the slow integration tests first, pyproject.toml's testpaths); the end-to-end tests mostly wait
# on processes and the network, so four workers, each taking whole modules (their clusters are
# module-scoped).
unit:
	$(BIN)/python -m pytest -n 2 --maxschedchunk 8

# The official client and our generated apache.rocketmq.v2 modules register the same protobuf
# symbols, so end-to-end tests (which import the client) run in their own pytest process.
# --no-loadscope-reorder: modules go out in collection order, the longest first (tests/e2e/conftest.py).
e2e:
	$(BIN)/python -m pytest tests/e2e -n 4 --dist loadfile --no-loadscope-reorder --durations=15 || [ $$? -eq 5 ]

check: protos-check lint typecheck deadcode

# promtool (Debian's `prometheus` package, unpacked: no service installed or started) validates
# deploy/prometheus/alerts.yml in tests/unit/test_alert_rules.py, which skips where it is missing.
PROMTOOL := build/prometheus/usr/bin/promtool

promtool: $(PROMTOOL)

$(PROMTOOL):
	mkdir -p build/prometheus
	cd build && (apt-get download prometheus 2>/dev/null || (apt-get update -qq && apt-get download prometheus))
	dpkg-deb -x build/prometheus_*.deb build/prometheus
	rm -f build/prometheus_*.deb

# The console's browser tests need Debian's chromium (and its driver); as root on a fresh machine
# (CI) it is installed here, elsewhere the tests skip and say what is missing.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
		|| echo "chromium could not be installed: the console's browser tests will skip"; fi

test: install browser
	-$(MAKE) promtool || echo "promtool unavailable: the alert rule checks will skip"
	$(MAKE) check
	$(MAKE) unit
	$(MAKE) e2e

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
