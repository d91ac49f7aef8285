# corgipile developer entry points. `make` (or `make help`) lists them.
#
# Environment:
#   CORGIPILE_CLUSTER_DIR  throw-away test cluster directory (default /tmp/corgipile-cluster)
#   CORGIPILE_PORT         its port (default 28815)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PG_BIN     ?= $(or $(CORGIPILE_PG_BIN),/usr/lib/postgresql/15/bin)
PG_CONFIG  := $(PG_BIN)/pg_config
PG_REGRESS := /usr/lib/postgresql/15/lib/pgxs/src/test/regress/pg_regress

export CORGIPILE_CLUSTER_DIR ?= /tmp/corgipile-cluster
export CORGIPILE_PORT        ?= 28815
CLUSTER_DIR := $(CORGIPILE_CLUSTER_DIR)
PORT        := $(CORGIPILE_PORT)

# cargo from rustup may not be on PATH in a non-login shell.
export PATH := $(HOME)/.cargo/bin:$(PATH)

# `cargo pgrx install` writes into the system PostgreSQL directories.
PGRX_SUDO := $(if $(filter 0,$(shell id -u)),,--sudo)

CLUSTER  := scripts/cluster.sh
REGRESS_DIR ?= regress
VENV     := .venv
PG_ENV   := PGHOST=$(CLUSTER_DIR) PGPORT=$(PORT) PGUSER=postgres

.PHONY: help setup setup-python install demo test lint unit regress pytest bench-epochs bench-cancel bench-cold bench-shuffle bench-defaults bench-predict \
        cluster-start cluster-stop cluster-status clean-cluster

help:
	@echo "corgipile make targets:"
	@echo "  setup          install system packages, cargo-pgrx 0.18.0, run cargo pgrx init (scripts/setup.sh)"
	@echo "  setup-python   setup + Python venv .venv with tests/requirements.txt"
	@echo "  install        build (release) and install the extension into the system PostgreSQL 15"
	@echo "  demo           install, start the test cluster, run scripts/demo.sql in a fresh corgipile_demo db"
	@echo "  test           everything CI runs: lint + unit + install + regress + pytest"
	@echo "  lint           cargo fmt --check and cargo clippy -D warnings (both crates)"
	@echo "  unit           cargo test -p corgipile-ml (no PostgreSQL needed)"
	@echo "  regress        pg_regress suite regress/schedule against the running test cluster"
	@echo "  pytest         .venv/bin/pytest -q tests/ against the running test cluster"
	@echo "  bench-epochs   per-epoch time of every strategy vs a plain scan (4.5M x 18 table; a few minutes)"
	@echo "  bench-cancel   how fast a training stops on pg_cancel_backend / statement_timeout (bench/results/cancel_latency.md)"
	@echo "  bench-cold     epochs read from storage (server restarted, OS cache dropped) vs warm, per block size (bench/results/cold_epochs.md; run as root)"
	@echo "  bench-shuffle  shuffled copy of the 4.5M x 18 table: plain copy vs ORDER BY random() vs corgipile_shuffle, + accuracy (bench/results/shuffle_copy.md)"
	@echo "  bench-defaults default params vs scikit-learn on ijcnn1, a9a, w8a and mixed-type tables, clustered by label (bench/results/defaults_vs_sklearn.md)"
	@echo "  bench-predict  predicting from a whole row vs a plain scan of the same 20 columns (bench/results/predict_row.md)"
	@echo "  bench-quick    benchmark harness on small tables (bench/results/quick.md; a few minutes)"
	@echo "  bench          the paper-scale benchmark (bench/results/latest.md; ~15 min, an hour the first time)"
	@echo "  cluster-start | cluster-stop | cluster-status   manage the test cluster"
	@echo "  clean-cluster  stop the test cluster and delete $(CLUSTER_DIR)"
	@echo ""
	@echo "Test cluster: socket dir $(CLUSTER_DIR), port $(PORT), user postgres;"
	@echo "  connect with: scripts/cluster.sh psql   or   eval \"\$$(scripts/cluster.sh env)\"; psql"

setup:
	scripts/setup.sh

setup-python:
	scripts/setup.sh --python

# Install scripts of released versions (sql/released/) ship too, so `CREATE EXTENSION corgipile
# VERSION '0.1.0'` works and the upgrade test can start from it; pgrx copies only the current
# install script and the upgrade scripts (sql/corgipile--A--B.sql).
install: setup
	cargo pgrx install --release --pg-config $(PG_CONFIG) $(PGRX_SUDO)
	$(if $(filter 0,$(shell id -u)),,sudo) install -m 644 sql/released/*.sql "$$($(PG_CONFIG) --sharedir)/extension/"

unit:
	cargo test -p corgipile-ml

# Formatting and lints of both crates, as CI checks them.
lint:
	cargo fmt --all --check
	cargo clippy --all-targets --release -- -D warnings

cluster-start:
	$(CLUSTER) start

cluster-stop:
	$(CLUSTER) stop

cluster-status:
	$(CLUSTER) status

clean-cluster:
	$(CLUSTER) destroy

demo: install
	$(CLUSTER) start
	$(CLUSTER) psql -X -q -d postgres -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' \
		-c 'DROP DATABASE IF EXISTS corgipile_demo' -c 'CREATE DATABASE corgipile_demo'
	$(CLUSTER) psql -X -d corgipile_demo -v ON_ERROR_STOP=1 -f scripts/demo.sql

test: setup-python
	$(MAKE) lint
	$(MAKE) unit
	$(MAKE) install
	$(CLUSTER) start
	$(MAKE) regress
	$(MAKE) pytest

# The pg_regress suite: regress/sql/*.sql, expected output in regress/expected/, run in the
# order of regress/schedule. With --use-existing pg_regress does not create the database, so
# we (re)create it.
regress:
	@test -f $(REGRESS_DIR)/schedule || { echo "regress: $(REGRESS_DIR)/schedule is missing" >&2; exit 1; }
	rm -rf $(REGRESS_DIR)/results
	mkdir -p $(REGRESS_DIR)/results
	$(CLUSTER) psql -X -q -d postgres -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' \
		-c 'DROP DATABASE IF EXISTS corgipile_regress' -c 'CREATE DATABASE corgipile_regress TEMPLATE template0' \
		-c "ALTER DATABASE corgipile_regress SET lc_messages = 'C'"
	@if $(PG_REGRESS) --bindir=$(PG_BIN) --use-existing \
		--host=$(CLUSTER_DIR) --port=$(PORT) --user=postgres --dbname=corgipile_regress \
		--inputdir=$(REGRESS_DIR) --outputdir=$(REGRESS_DIR)/results --schedule=$(REGRESS_DIR)/schedule; then \
		echo "regress: all tests passed"; \
	else \
		echo "regress: FAILED; $(REGRESS_DIR)/results/regression.diffs:" >&2; \
		cat $(REGRESS_DIR)/results/regression.diffs >&2 || true; \
		exit 1; \
	fi

# pytest exits 5 when it collects nothing; that is only accepted while tests/
# has no test files at all.
pytest:
	@test -x $(VENV)/bin/pytest || { echo "pytest: $(VENV) missing; run make setup-python" >&2; exit 1; }
	@rc=0; $(PG_ENV) $(VENV)/bin/pytest -q tests/ || rc=$$?; \
	if [ $$rc -eq 5 ] && ! ls tests/test_*.py tests/*_test.py >/dev/null 2>&1; then \
		echo "pytest: no Python tests in tests/ yet"; rc=0; \
	fi; \
	exit $$rc

bench-epochs: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/epoch_times.py

bench-cancel: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/cancel_latency.py

bench-cold: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/cold_epochs.py

bench-shuffle: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/shuffle_copy.py

# Default params against scikit-learn on ijcnn1/a9a/w8a (../shared/datasets) and generated
# mixed-type tables, all stored clustered by label (about 2 minutes).
bench-defaults: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/defaults_vs_sklearn.py

# Predicting from a whole row against a plain scan of the same 20 columns.
bench-predict: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/predict_row.py

# Benchmark harness (bench/harness.py): every shuffle strategy, Shuffle Once and the scikit-learn export
# path side by side; writes bench/results/latest.md (bench) or quick.md (bench-quick) plus PNG plots.
# BENCH_SKIP_INSTALL=1 uses the extension already installed (no setup, no cargo build).
BENCH_DEPS := $(if $(BENCH_SKIP_INSTALL),,setup-python install)
.PHONY: bench bench-quick
bench: $(BENCH_DEPS)
	$(CLUSTER) start
	$(VENV)/bin/pip install -q -r bench/requirements.txt
	$(PG_ENV) $(VENV)/bin/python bench/harness.py

bench-quick: $(BENCH_DEPS)
	$(CLUSTER) start
	$(VENV)/bin/pip install -q -r bench/requirements.txt
	$(PG_ENV) $(VENV)/bin/python bench/harness.py --quick
