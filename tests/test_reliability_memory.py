"""corgipile.max_buffer_memory bounds a training's memory: an explicit buffer above it is refused,
the default buffer is clamped to it, and the backend's peak RSS stays within it plus a margin."""

import re

import psycopg.errors as E
import pytest

from reliability_helpers import catalog_counts, connect, database_fixture, proc_status, scalar, train

db = database_fixture("memory")
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
