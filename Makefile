# The obvious targets. `make up` and `make test` are the two commands README.md gives.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install up test check lint typecheck deadcode protos protos-check unit e2e bench clean browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'

up: install
	$(BIN)/sluice up

protos: install
	$(BIN)/python scripts/gen_protos.py

protos-check:
	$(BIN)/python scripts/gen_protos.py --check

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check common broker proxy nameserver navigation deploy spark_jobs tests scripts

typecheck:
	$(BIN)/mypy

# Unused code (functions, classes, methods, attributes nobody reads) fails the check; tests count
# as users. Names used in ways vulture cannot see are listed, with the reason, in vulture_whitelist.py.
deadcode:
	$(BIN)/vulture common broker proxy nameserver navigation deploy spark_jobs scripts tests vulture_whitelist.py \
		--min-confidence 60 --exclude '*_pb2.py,*_pb2_grpc.py,common/codes.py' \
		--ignore-names 'pytest_*,pytestmark' \
		--ignore-decorators '@pytest.fixture,@rule,@initialize,@invariant,@precondition'

# pytest-xdist: two workers for the main process; the end-to-end tests mostly wait on processes
# and the network, so three workers, each taking whole modules (their clusters are module-scoped).
unit:
	$(BIN)/python -m pytest -n 2

# The official client and our generated apache.rocketmq.v2 modules register the same protobuf
# symbols, so end-to-end tests (which import the client) run in their own pytest process.
e2e:
	$(BIN)/python -m pytest tests/e2e -n 3 --dist loadfile || [ $$? -eq 5 ]

check: protos-check lint typecheck deadcode

# The console's browser tests need Debian's chromium (and its driver); as root on a fresh machine
# (CI) it is installed here, elsewhere the tests skip and say what is missing.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
		|| echo "chromium could not be installed: the console's browser tests will skip"; fi

test: install browser
	$(MAKE) check
	$(MAKE) unit
	$(MAKE) e2e

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
