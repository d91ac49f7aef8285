"""Memory bounds: corgipile.max_buffer_memory bounds a training's buffers (an explicit buffer
above it is refused, the default buffer is clamped to it, and the backend's peak RSS stays within it
plus a margin; in a database of the suite's own), and corgipile.max_model_memory bounds a model
(in the shared database, as the roles_env roles): both settings are superuser-only; an explicit
sparse n_features over it is an ERROR before the table is read, and so are a huge inferred sparse
dimension, a dense model or a softmax over a small limit, and more than 65,536 softmax classes
(refused during the first pass)."""

import json
import re

import psycopg

import psycopg.errors as E
import pytest

from helpers import (ROLES_ENV_ALICE, catalog_counts, connect, describe, error_of, models_count, proc_status,
                     scalar, timed, train, train_error)

ALICE = ROLES_ENV_ALICE
N_FEATURES = 100
ROWS = 140_000  # about 120 MB: the default buffer (10% of the table, x2) would be ~24 MB unclamped
MARGIN_MB = 12


@pytest.fixture(scope="module")
def big(db):
    with connect(db) as c:
        c.execute(f"""CREATE TABLE wide AS SELECT i AS id,
                          array_fill((i % 13)::float8 / 13 + (i % 2), ARRAY[{N_FEATURES}]) AS features,
                          (i % 2) AS label FROM generate_series(1, {ROWS}) i""")
        c.execute("VACUUM ANALYZE wide")
        assert scalar(c, "SELECT pg_relation_size('wide')") > 100 * 2**20
    return db


def test_explicit_buffer_above_limit_is_refused(big):
    with connect(big) as c:
        c.execute("SET corgipile.max_buffer_memory = '8MB'")
        before = catalog_counts(c)
        for params in ({"buffer_size": "64MB"}, {"buffer_size": "64MB", "double_buffer": False},
                       {"buffer_size": "50%"}, {"buffer_size": 1_000_000}):
            # Observed class: ProgramLimitExceeded (54000), a sensible "limit exceeded" class.
            with pytest.raises(E.ProgramLimitExceeded):
                train(c, "wide", "svm", {"epochs": 1, **params})
            assert scalar(c, "SELECT 1") == 1
        assert catalog_counts(c) == before
        # 4MB x 2 buffers = 8MB fits.
        train(c, "wide", "svm", {"epochs": 1, "buffer_size": "4MB", "seed": 1})


def test_explain_says_a_buffer_is_over_the_limit(big):
    """corgipile_explain (without analyze: nothing is trained) shows what training would refuse:
    an explicit buffer_size over corgipile.max_buffer_memory; a buffer that fits, or the
    default (shrunk to fit), has no such line."""
    def plan(c, params):
        return "\n".join(r[0] for r in c.execute("SELECT * FROM corgipile_explain('wide', 'svm', %s)",
                                                  (json.dumps(params),)))

    with connect(big) as c:
        c.execute("SET corgipile.max_buffer_memory = '8MB'")
        over = plan(c, {"buffer_size": "50%"})
        assert "Memory Limit: 2 buffers of" in over and "exceed corgipile.max_buffer_memory (8MB)" in over, over
        assert "set double_buffer to false" in over, over
        single = plan(c, {"buffer_size": "64MB", "double_buffer": False})
        assert "Memory Limit: 1 buffer of 64.0 MB exceeds" in single, single
        assert "double_buffer" not in single.split("Memory Limit")[1].splitlines()[0], single
        for fits in ({"buffer_size": "4MB"}, {}):
            assert "Memory Limit" not in plan(c, fits), fits


def test_max_buffer_memory_is_superuser_only(big):
    with connect(big) as c:
        c.execute("DROP ROLE IF EXISTS rel_mem_user")
        c.execute("CREATE ROLE rel_mem_user")
        c.execute("GRANT SELECT ON wide TO rel_mem_user")
        try:
            # Before the library is loaded, SET only creates a placeholder; loading the library must
            # discard a non-superuser's value (PostgreSQL warns), so the 512MB default still applies.
            c.execute("SET ROLE rel_mem_user")
            c.execute("SET corgipile.max_buffer_memory = '64GB'")
            with pytest.raises(E.ProgramLimitExceeded):
                train(c, "wide", "svm", {"epochs": 1, "buffer_size": "1GB"})
            # Once loaded, SET itself is refused.
            with pytest.raises(E.InsufficientPrivilege):
                c.execute("SET corgipile.max_buffer_memory = '64GB'")
        finally:
            c.execute("RESET ROLE")
            c.execute("DROP OWNED BY rel_mem_user")
            c.execute("DROP ROLE rel_mem_user")


def test_default_buffer_clamped_and_peak_rss_bounded(big):
    # A fresh connection, so that earlier activity of the session does not count in VmHWM.
    with connect(big) as c:
        pid = scalar(c, "SELECT pg_backend_pid()")
        c.execute("SET corgipile.max_buffer_memory = '8MB'")
        # Map every page of the table into this backend first: shared buffers count in RSS, and a
        # training scans the whole table. Then load the library (explain without analyze plans only).
        c.execute("SET max_parallel_workers_per_gather = 0")
        c.execute("SELECT sum(cardinality(features)) FROM wide")
        c.execute("SELECT * FROM corgipile_explain('wide', 'svm')")
        baseline = int(proc_status(pid)["VmHWM"].split()[0])
        model_id = train(c, "wide", "svm", {"epochs": 2, "seed": 1})
        peak = int(proc_status(pid)["VmHWM"].split()[0])
        model_kb = (N_FEATURES + 1) * 8 / 1024
        limit = baseline + 8 * 1024 + model_kb + MARGIN_MB * 1024
        print(f"peak RSS with max_buffer_memory=8MB: baseline VmHWM {baseline} kB, after training {peak} kB "
              f"(+{(peak - baseline) / 1024:.1f} MB; limit +{(limit - baseline) / 1024:.1f} MB incl. "
              f"{MARGIN_MB} MB margin)")
        # Margin: 12 MB. Measured overhead besides the buffers is ~4-5 MB (executor, decoding, the
        # worker thread's stack and malloc arena); 12 MB leaves room for that to double, yet an
        # unclamped default buffer on this table (2 x 10% of 120 MB = 24 MB) would exceed the limit.
        assert peak <= limit
        assert scalar(c, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == ROWS
        plan = "\n".join(r[0] for r in c.execute("SELECT * FROM corgipile_explain('wide', 'svm', "
                                                   "'{\"epochs\": 1, \"verbose\": false}', true)"))
        m = re.search(r"Buffer: (\d+) tuples", plan)
        if m:  # the buffer actually used: (n_features + 1) x 8 bytes per tuple, two buffers
            assert int(m.group(1)) * (N_FEATURES + 1) * 8 * 2 <= 8 * 2**20, plan


def test_a_filtered_training_holds_memory_for_the_rows_it_reads(big):
    """Buffers of half the table each (2 x ~60 MB reserved) for a `where` that keeps 1,000 rows:
    memory is touched only as rows arrive (no buffer's pages faulted in ahead of a filter)."""
    with connect(big) as c:
        pid = scalar(c, "SELECT pg_backend_pid()")
        c.execute("SET max_parallel_workers_per_gather = 0")
        c.execute("SELECT sum(cardinality(features)) FROM wide")
        c.execute("SELECT * FROM corgipile_explain('wide', 'svm')")
        baseline = int(proc_status(pid)["VmHWM"].split()[0])
        model_id = train(c, "wide", "svm", {"epochs": 2, "seed": 1, "buffer_size": "50%",
                                            "where": "id <= 1000"})
        peak = int(proc_status(pid)["VmHWM"].split()[0])
        print(f"peak RSS of a filtered training: baseline VmHWM {baseline} kB, after {peak} kB")
        assert scalar(c, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 1000
        # 1,000 rows of 808 bytes are under 1 MB; the margin is test_default_buffer_clamped_...'s.
        assert peak - baseline <= MARGIN_MB * 1024, f"+{(peak - baseline) / 1024:.1f} MB"


# =============================================================================================
# corgipile.max_model_memory (last: a missing bound would try to allocate a huge model)

def test_max_model_memory_is_superuser_only(roles_env):
    with connect(roles_env, ALICE) as alice:
        # A value set before the library is loaded is a placeholder; loading must not let an
        # ordinary role's value through.
        e = error_of(alice, "SET corgipile.max_model_memory = '1TB'")
        assert e is None or isinstance(e, E.InsufficientPrivilege), describe(e)  # refused if already loaded
        load_library(alice)
        assert scalar(alice, "SHOW corgipile.max_model_memory") == "512MB"
        e = error_of(alice, "SET corgipile.max_model_memory = '1GB'")
        assert isinstance(e, E.InsufficientPrivilege), describe(e)
        e = error_of(alice, "SELECT set_config('corgipile.max_model_memory', '1GB', false)")
        assert isinstance(e, E.InsufficientPrivilege), describe(e)
        assert scalar(alice, "SHOW corgipile.max_model_memory") == "512MB"
    with connect(roles_env) as su:
        load_library(su)
        assert scalar(su, "SHOW corgipile.max_model_memory") == "512MB"
        su.execute("SET corgipile.max_model_memory = '1MB'")
        assert scalar(su, "SHOW corgipile.max_model_memory") == "1MB"
        su.execute("RESET corgipile.max_model_memory")
        assert scalar(su, "SHOW corgipile.max_model_memory") == "512MB"


def load_library(conn):
    """Make sure corgipile's shared library (and so its settings) is loaded in this session."""
    try:
        conn.execute("SELECT corgipile_drop_model(-1::bigint)")  # no such model: just loads the library
    except psycopg.Error:
        pass


def assert_model_memory_error(e):
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert "corgipile.max_model_memory" in (e.diag.message_primary or ""), describe(e)


@pytest.fixture(scope="module")
def unsorted_sparse(roles_env):
    """hard_nf_bad: 20,000 sparse rows whose indices are all out of order, so decoding any row is
    a data ERROR (22023 naming its ctid). Autovacuum is off for it: nothing but the tests reads
    its blocks, so its read counters move only when a training reads it."""
    with connect(roles_env) as roles_admin:
        roles_admin.execute("""CREATE TABLE hard_nf_bad WITH (autovacuum_enabled = false) AS
                         SELECT i AS id, (i % 2) AS label, ARRAY[3, 1]::int4[] AS idx,
                                ARRAY[(i % 2) + 0.5, 1.0]::float8[] AS val
                         FROM generate_series(1, 20000) i""")
        roles_admin.execute(f"GRANT SELECT ON hard_nf_bad TO {ALICE}")
    return roles_env


def blocks_and_tuples_read(c, table):
    """What has been read of `table` so far, as the cumulative statistics count it: heap blocks
    read or found in shared buffers, and tuples returned by sequential scans. Pending counts of
    this session are flushed first (pg_stat_force_next_flush: they are written when the session
    goes idle, before the statement's result reaches us), and the snapshot cleared."""
    c.execute("SELECT pg_stat_force_next_flush()")
    c.execute("SELECT pg_stat_clear_snapshot()")
    return c.execute("""SELECT coalesce(io.heap_blks_read, 0) + coalesce(io.heap_blks_hit, 0), t.seq_tup_read
                        FROM pg_statio_all_tables io JOIN pg_stat_all_tables t USING (relid)
                        WHERE relid = %s::regclass""", (table,)).fetchone()


@pytest.mark.parametrize("role", ["superuser", ALICE])
def test_huge_sparse_n_features_refused_before_reading(unsorted_sparse, roles_admin, role):
    """README: an explicit n_features over corgipile.max_model_memory is an ERROR before the table
    is read. Proven by what was read: every row of hard_nf_bad is a data error once decoded, so a
    54000 instead shows no row was decoded, and the table's block and tuple counters do not move
    (while a training that does read it moves them: the check is not vacuous)."""
    sparse = {"indices": "idx", "values": "val"}
    before = models_count(roles_admin)
    with connect(unsorted_sparse, None if role == "superuser" else role) as c:
        c.execute("SET statement_timeout = '30s'")
        # Control: with a dimension that fits, the training reads the table and its first
        # decoded row stops it; the counters move.
        read0 = blocks_and_tuples_read(c, "hard_nf_bad")
        e = train_error(c, "hard_nf_bad", "svm", {"epochs": 1, "seed": 1, "features": sparse, "n_features": 8})
        assert isinstance(e, psycopg.DataError) and "ctid" in describe(e), describe(e)
        read1 = blocks_and_tuples_read(c, "hard_nf_bad")
        assert read1[0] > read0[0], f"a training that read hard_nf_bad did not move its counters: {read0} -> {read1}"
        # Over the limit: 54000, and nothing read.
        e = train_error(c, "hard_nf_bad", "svm", {"epochs": 1, "seed": 1, "features": sparse,
                                                  "n_features": 2147483647})
        read2 = blocks_and_tuples_read(c, "hard_nf_bad")
    assert_model_memory_error(e)
    assert read2 == read1, f"hard_nf_bad was read before the 54000: (blocks, seq tuples) {read1} -> {read2}"
    assert models_count(roles_admin) == before


def test_huge_inferred_sparse_dimension_refused(roles_env, roles_admin):
    roles_admin.execute("""CREATE TABLE hard_sparse_huge AS SELECT i AS id, (i % 2) AS label,
                     (CASE WHEN i = 50 THEN ARRAY[1, 2000000000] ELSE ARRAY[1, 2] END)::int4[] AS idx,
                     ARRAY[(i % 2) + 0.5, 1.0]::float8[] AS val FROM generate_series(1, 100) i""")
    before = models_count(roles_admin)
    roles_admin.execute("SET statement_timeout = '10s'")
    try:
        e = train_error(roles_admin, "hard_sparse_huge", "svm",
                        {"epochs": 1, "seed": 1, "features": {"indices": "idx", "values": "val"}})
    finally:
        roles_admin.execute("RESET statement_timeout")
    assert_model_memory_error(e)
    assert models_count(roles_admin) == before


def test_dense_model_over_small_limit_refused(roles_env, roles_admin):
    roles_admin.execute("""CREATE TABLE hard_wide AS SELECT i AS id, (i % 2) AS label,
                     array_fill((i % 2)::float8, ARRAY[200000]) AS features FROM generate_series(1, 10) i""")
    before = models_count(roles_admin)
    roles_admin.execute("SET corgipile.max_model_memory = '1MB'")
    roles_admin.execute("SET statement_timeout = '20s'")
    try:
        e = train_error(roles_admin, "hard_wide", "svm", {"epochs": 1, "seed": 1, "buffer_size": 4})
    finally:
        roles_admin.execute("RESET corgipile.max_model_memory")
        roles_admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert models_count(roles_admin) == before


def test_softmax_many_classes_over_small_limit_refused(roles_env, roles_admin):
    # 10,000 classes x 20 features x 8 bytes = 1.6 MB of weights > 1 MB.
    roles_admin.execute("""CREATE TABLE hard_sm_classes AS SELECT i AS id, i AS label,
                     array_fill((i % 5)::float8, ARRAY[20]) AS features FROM generate_series(1, 10000) i""")
    before = models_count(roles_admin)
    roles_admin.execute("SET corgipile.max_model_memory = '1MB'")
    roles_admin.execute("SET statement_timeout = '20s'")
    try:
        e = train_error(roles_admin, "hard_sm_classes", "softmax", {"epochs": 1, "seed": 1})
    finally:
        roles_admin.execute("RESET corgipile.max_model_memory")
        roles_admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert models_count(roles_admin) == before


def test_softmax_over_65536_classes_refused_in_first_pass(roles_env, roles_admin):
    roles_admin.execute("""CREATE TABLE hard_sm_70k AS SELECT i AS id, i AS label,
                     ARRAY[random(), random()] AS features FROM generate_series(1, 70000) i""")
    before = models_count(roles_admin)
    # 1000 epochs of ~65,000 classes would run for hours: an ERROR before the timeout means the
    # class count was refused during the first pass (as soon as the 65537th class appeared;
    # that pass trains as it reads, so it is not instant).
    roles_admin.execute("SET statement_timeout = '60s'")
    try:
        e, elapsed = timed(train_error, roles_admin, "hard_sm_70k", "softmax", {"epochs": 1000, "seed": 1})
    finally:
        roles_admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert "65536" in (e.diag.message_primary or ""), describe(e)
    assert models_count(roles_admin) == before
