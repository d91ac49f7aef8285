"""Hardening: the catalog is written only by corgipile's functions (no table, sequence or lock
privileges beyond SELECT / ACCESS SHARE for ordinary roles), per-role model ownership for drop
and deploy, prediction by name in parallel plans, a validation predicate that is one plain
boolean expression over the row, up-front errors (read-only transactions, a name held by an
uncommitted training), the corgipile.max_model_memory bound, hints that fit the situation, and
pg_dump by a non-superuser database owner.

Roles and tables created here are named hard_*, and dropped at the end of the module."""

import os
import re
import shutil
import subprocess
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from reliability_helpers import parallel_guc

ALICE, BOB, OWNER = "hard_alice", "hard_bob", "hard_owner"
ROLES = (ALICE, BOB)
SMALL_ROWS = 3000
PAR_ROWS = 300_000
BIG_ROWS = 1_000_000
DUMP_DB, RESTORE_DB = "hard_dumpdb", "hard_restoredb"
PG_BIN = os.environ.get("CORGIPILE_PG_BIN", "/usr/lib/postgresql/15/bin")  # the major under test (make sets it)
BIG_EPOCHS = 20  # the big table's trainings would run for many seconds if they got going


# ---------------------------------------------------------------------------------------------
# helpers

def connect(dsn, user=None, **kw):
    kw.setdefault("autocommit", True)
    if user is not None:
        kw["user"] = user
    return psycopg.connect(dsn, **kw)


def scalar(conn, query, params=None):
    return conn.execute(query, params).fetchone()[0]


def train(conn, table, model="svm", params=None):
    p = {"verbose": False}
    p.update(params or {})
    return scalar(conn, "SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(p)))


def error_of(conn, query, params=None):
    """The psycopg.Error a statement raises (None if it succeeds)."""
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e
    return None


def train_error(conn, table, model="svm", params=None):
    try:
        train(conn, table, model, params)
    except psycopg.Error as e:
        return e
    return None


def describe(e):
    if e is None:
        return "no error"
    detail = f" (detail {e.diag.message_detail!r})" if e.diag.message_detail else ""
    return f"{e.sqlstate} {type(e).__name__}: {e.diag.message_primary!r}{detail} (hint {e.diag.message_hint!r})"


def timed(fn, *args, **kw):
    started = time.monotonic()
    result = fn(*args, **kw)
    return result, time.monotonic() - started


def model_count(admin):
    return scalar(admin, "SELECT count(*) FROM corgipile.models")


def load_library(conn):
    """Make sure corgipile's shared library (and so its settings) is loaded in this session."""
    try:
        conn.execute("SELECT corgipile_drop_model(-1::bigint)")  # no such model: just loads the library
    except psycopg.Error:
        pass


def drop_role(admin, role):
    if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")


# ---------------------------------------------------------------------------------------------
# fixtures

@pytest.fixture(scope="module")
def env(dsn):
    """Roles hard_alice and hard_bob, and small tables they may read."""
    with connect(dsn) as admin:
        for r in ROLES:
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
            admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {r}")
        admin.execute(f"""CREATE TABLE hard_small AS SELECT i AS id,
                ARRAY[(i % 2) * 2 - 1 + ((i * 37) % 100) / 100.0, ((i * 53) % 100) / 100.0,
                      ((i * 71) % 100) / 100.0, (i % 7) / 7.0]::float8[] AS features,
                (i % 2) AS label, ARRAY[1, 3]::int4[] AS idx,
                ARRAY[(i % 2) * 2 - 1 + ((i * 37) % 100) / 100.0, ((i * 53) % 100) / 100.0]::float8[] AS val
            FROM generate_series(1, {SMALL_ROWS}) i""")
        admin.execute("CREATE TABLE hard_other AS SELECT 1 AS x")
        admin.execute(f"GRANT SELECT ON hard_small, hard_other TO {ALICE}, {BOB}")
    yield dsn
    with connect(dsn) as admin:
        admin.execute("DELETE FROM corgipile.models WHERE trained_by IN (%s, %s)", ROLES)
        for t in ("hard_small", "hard_other", "hard_par_t", "hard_big", "hard_nan", "hard_div",
                  "hard_sparse_huge", "hard_wide", "hard_sm_classes", "hard_sm_70k", "hard_nf_bad"):
            admin.execute(f"DROP TABLE IF EXISTS {t}")
        for r in ROLES:
            drop_role(admin, r)


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


@pytest.fixture(scope="module")
def big(env):
    """1,000,000 rows x 8 dense features (plus a 2-element sparse pair): a training of it runs
    for seconds, so an error raised after reading it cannot be fast."""
    with connect(env) as admin:
        admin.execute(f"""CREATE TABLE hard_big AS SELECT i AS id,
                ARRAY[random() + (i % 2), random(), random(), random(), random(), random(), random(), random()] AS features,
                (i % 2) AS label, ARRAY[1, 3]::int4[] AS idx, ARRAY[random() + (i % 2), random()] AS val
            FROM generate_series(1, {BIG_ROWS}) i""")
        admin.execute(f"GRANT SELECT ON hard_big TO {ALICE}, {BOB}")
    return env


# =============================================================================================
# 1. Catalog privileges

def test_catalog_writes_refused_for_ordinary_role(env, admin):
    with connect(env, ALICE) as alice:
        own = train(alice, "hard_small", "svm", {"epochs": 2, "seed": 1})
        epochs_before = scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,))
        statements = [
            """INSERT INTO corgipile.models (model_type, relation, label_column, features, n_features, label_mapping,
                   weights, bias, params, metrics, rows_trained, rows_skipped, training_seconds)
               VALUES ('svm', 'public.hard_small', 'label', '"features"', 1, '{"classes": [0, 1]}', '{1}', '{0}',
                       '{}', '{}', 1, 0, 0)""",
            "UPDATE corgipile.models SET pinned = pinned",
            f"UPDATE corgipile.models SET weights = weights WHERE id = {own}",
            f"UPDATE corgipile.models SET trained_by = '{BOB}' WHERE id = {own}",
            f"DELETE FROM corgipile.models WHERE id = {own}",
            "DELETE FROM corgipile.models",
            "TRUNCATE corgipile.models",
            "TRUNCATE corgipile.models CASCADE",
            f"""INSERT INTO corgipile.epochs (model_id, epoch, loss, tuples, seconds, learning_rate)
                VALUES ({own}, 99, 0, 0, 0, 0.01)""",
            "UPDATE corgipile.epochs SET loss = loss",
            f"DELETE FROM corgipile.epochs WHERE model_id = {own}",
            "DELETE FROM corgipile.epochs",
            "TRUNCATE corgipile.epochs",
        ]
        outcomes = {" ".join(s.split())[:80]: describe(error_of(alice, s)) for s in statements}
        bad = {s: o for s, o in outcomes.items() if not o.startswith("42501 ")}
        assert not bad, f"expected 42501 for every catalog write, got: {bad}"
        # SELECT works (its own model at least).
        assert scalar(alice, "SELECT count(*) FROM corgipile.models WHERE id = %s", (own,)) == 1
        assert scalar(alice, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,)) == epochs_before
    assert scalar(admin, "SELECT count(*) FROM corgipile.models WHERE id = %s", (own,)) == 1
    assert scalar(admin, "SELECT trained_by FROM corgipile.models WHERE id = %s", (own,)) == ALICE
    assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,)) == epochs_before


def test_catalog_select_shows_only_own_models(env, admin):
    su_model = train(admin, "hard_small", "svm", {"epochs": 1, "seed": 2})
    with connect(env, BOB) as bob:
        bob_model = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 3})
    with connect(env, ALICE) as alice:
        alice_model = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 4})
        seen = {r[0] for r in alice.execute("SELECT id FROM corgipile.models")}
        seen_epochs = {r[0] for r in alice.execute("SELECT DISTINCT model_id FROM corgipile.epochs")}
        summary = {r[0] for r in alice.execute("SELECT id FROM corgipile.model_summary")}
    alice_all = {r[0] for r in admin.execute("SELECT id FROM corgipile.models WHERE trained_by = %s", (ALICE,))}
    assert alice_model in seen and su_model not in seen and bob_model not in seen
    assert seen == alice_all
    assert seen_epochs == alice_all
    assert summary == alice_all


def test_models_id_sequence_refused(env):
    with connect(env, ALICE) as alice:
        outcomes = {q: describe(error_of(alice, q)) for q in (
            "SELECT nextval('corgipile.models_id_seq')",
            "SELECT setval('corgipile.models_id_seq', 1000000)",
            "SELECT setval('corgipile.models_id_seq', 5, false)",
        )}
    bad = {q: o for q, o in outcomes.items() if not o.startswith("42501 ")}
    assert not bad, f"expected 42501: {bad}"


LOCK_MODES = ["ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
              "EXCLUSIVE", "ACCESS EXCLUSIVE"]


def test_catalog_lock_modes_above_access_share_refused(env):
    bad = {}
    with connect(env, ALICE) as alice:
        for table in ("corgipile.models", "corgipile.epochs"):
            # ACCESS SHARE (what SELECT takes) is allowed.
            alice.execute("BEGIN")
            alice.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
            alice.execute("ROLLBACK")
            for mode in LOCK_MODES:
                alice.execute("BEGIN")
                e = error_of(alice, f"LOCK TABLE {table} IN {mode} MODE")
                alice.execute("ROLLBACK")
                if e is None or e.sqlstate != "42501":
                    bad[f"{table} {mode}"] = describe(e)
            # LOCK TABLE without a mode is ACCESS EXCLUSIVE.
            alice.execute("BEGIN")
            e = error_of(alice, f"LOCK TABLE {table}")
            alice.execute("ROLLBACK")
            if e is None or e.sqlstate != "42501":
                bad[f"{table} (default mode)"] = describe(e)
    assert not bad, f"expected 42501 for: {bad}"


def test_catalog_row_locks_refused(env):
    bad = {}
    with connect(env, ALICE) as alice:
        train(alice, "hard_small", "svm", {"epochs": 1, "seed": 5})  # at least one visible row
        queries = [f"SELECT id FROM corgipile.models FOR {s}" for s in ("UPDATE", "NO KEY UPDATE", "SHARE", "KEY SHARE")]
        queries += [f"SELECT model_id FROM corgipile.epochs FOR {s}" for s in ("UPDATE", "SHARE")]
        for q in queries:
            alice.execute("BEGIN")
            e = error_of(alice, q)
            alice.execute("ROLLBACK")
            if e is None or e.sqlstate != "42501":
                bad[q] = describe(e)
    assert not bad, f"expected 42501 for: {bad}"


@pytest.mark.parametrize("holder", ["lock access share", "open select"])
def test_access_share_holder_does_not_block_other_role(env, holder):
    with connect(env, ALICE) as alice, connect(env, BOB) as bob:
        alice.execute("BEGIN")
        if holder == "lock access share":
            alice.execute("LOCK TABLE corgipile.models IN ACCESS SHARE MODE")
            alice.execute("LOCK TABLE corgipile.epochs IN ACCESS SHARE MODE")
        else:
            alice.execute("SELECT * FROM corgipile.models").fetchall()
            alice.execute("SELECT * FROM corgipile.epochs").fetchall()
        try:
            bob.execute("SET statement_timeout = '5s'")  # a block is a failure (57014), not a hang
            name = "hard_lockb_" + holder.replace(" ", "_")
            unnamed, t1 = timed(train, bob, "hard_small", "svm", {"epochs": 1, "seed": 1})
            v1, t2 = timed(train, bob, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": name})
            v2, t3 = timed(train, bob, "hard_small", "svm", {"epochs": 1, "seed": 2, "name": name})
            p_id = scalar(bob, "SELECT corgipile_predict(%s::bigint, ARRAY[1, 0.5, 0.5, 0.5]::float8[])", (unnamed,))
            p_name = scalar(bob, "SELECT corgipile_predict(%s::text, ARRAY[1, 0.5, 0.5, 0.5]::float8[])", (name,))
            assert p_id in (0, 1) and p_name in (0, 1)
            assert scalar(bob, "SELECT corgipile_deploy(%s, %s)", (name, v1)) == v1
            assert scalar(bob, "SELECT corgipile_deploy(%s)", (name,)) == v2
            assert scalar(bob, "SELECT corgipile_drop_model(%s::bigint)", (unnamed,)) == 1
            assert scalar(bob, "SELECT corgipile_drop_model(%s::text)", (name,)) == 2
            assert max(t1, t2, t3) < 5
        finally:
            alice.execute("ROLLBACK")


# =============================================================================================
# 2. Models are written only by the extension's functions, with server-assigned ids

def test_ordinary_role_trains_with_server_assigned_id(env, admin):
    before = scalar(admin, "SELECT coalesce(max(id), 0) FROM corgipile.models")
    with connect(env, ALICE) as alice:
        model_id = train(alice, "hard_small", "logistic", {"epochs": 2, "seed": 1})
        assert isinstance(model_id, int) and model_id > before
        assert scalar(alice, "SELECT trained_by FROM corgipile.models WHERE id = %s", (model_id,)) == ALICE
    row = admin.execute("SELECT trained_by, model_type, rows_trained FROM corgipile.models WHERE id = %s",
                        (model_id,)).fetchone()
    assert row == (ALICE, "logistic", SMALL_ROWS)
    assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (model_id,)) == 2


def test_drop_own_model_and_not_another_roles(env, admin):
    with connect(env, BOB) as bob:
        bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1})
    with connect(env, ALICE) as alice:
        own = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 1})
        assert scalar(alice, "SELECT corgipile_drop_model(%s::bigint)", (own,)) == 1
        assert scalar(admin, "SELECT count(*) FROM corgipile.models WHERE id = %s", (own,)) == 0
        assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,)) == 0

        missing = scalar(admin, "SELECT max(id) FROM corgipile.models") + 1_000_000
        e_foreign = error_of(alice, "SELECT corgipile_drop_model(%s::bigint)", (bobs,))
        e_missing = error_of(alice, "SELECT corgipile_drop_model(%s::bigint)", (missing,))
        e_foreign_text = error_of(alice, "SELECT corgipile_drop_model(%s::text)", (str(bobs),))
        for e in (e_foreign, e_missing, e_foreign_text):
            assert isinstance(e, E.UndefinedObject), describe(e)
        assert e_foreign.diag.message_primary == f"corgipile model {bobs} does not exist"
        assert e_missing.diag.message_primary == f"corgipile model {missing} does not exist"
        assert e_foreign_text.diag.message_primary == f"corgipile model {bobs} does not exist"
        # Indistinguishable from a missing id (no existence oracle).
        assert e_foreign.diag.message_hint == e_missing.diag.message_hint
        assert e_foreign.diag.message_detail == e_missing.diag.message_detail
    assert scalar(admin, "SELECT trained_by FROM corgipile.models WHERE id = %s", (bobs,)) == BOB
    assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (bobs,)) == 1


def test_deploy_own_named_models(env, admin):
    with connect(env, BOB) as bob:
        bobs_named = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 9, "name": "hard_dep"})
    with connect(env, ALICE) as alice:
        v1 = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_dep"})
        v2 = train(alice, "hard_small", "logistic", {"epochs": 1, "seed": 2, "name": "hard_dep"})
        assert alice.execute("SELECT version FROM corgipile.models WHERE id IN (%s, %s) ORDER BY id",
                             (v1, v2)).fetchall() == [(1,), (2,)]
        x = "ARRAY[0.3, 0.2, 0.9, 0.1]::float8[]"
        assert scalar(alice, "SELECT corgipile_deploy('hard_dep', %s)", (v1,)) == v1
        assert scalar(alice, f"SELECT corgipile_decision_function('hard_dep', {x})") == \
            scalar(alice, f"SELECT corgipile_decision_function(%s::bigint, {x})", (v1,))
        assert scalar(alice, "SELECT corgipile_deploy('hard_dep')") == v2
        assert scalar(alice, f"SELECT corgipile_decision_function('hard_dep', {x})") == \
            scalar(alice, f"SELECT corgipile_decision_function(%s::bigint, {x})", (v2,))
        # Another role's version of the same name is not Alice's to deploy.
        e = error_of(alice, "SELECT corgipile_deploy('hard_dep', %s)", (bobs_named,))
        assert e is not None and e.sqlstate != "XX000", describe(e)
    assert scalar(admin, "SELECT pinned FROM corgipile.models WHERE id = %s", (bobs_named,)) is False


def test_superuser_can_drop_any_model(env, admin):
    with connect(env, BOB) as bob:
        bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1})
        bobs_named = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_sudrop"})
    assert scalar(admin, "SELECT corgipile_drop_model(%s::bigint)", (bobs,)) == 1
    assert scalar(admin, "SELECT corgipile_drop_model(%s::bigint)", (bobs_named,)) == 1
    assert scalar(admin, "SELECT count(*) FROM corgipile.models WHERE id IN (%s, %s)", (bobs, bobs_named)) == 0
    assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id IN (%s, %s)", (bobs, bobs_named)) == 0


# =============================================================================================
# 3. Prediction by name in a parallel plan

@pytest.fixture(scope="module")
def par_table(env):
    with connect(env) as admin:
        admin.execute(f"""CREATE TABLE hard_par_t AS SELECT i AS id,
                ARRAY[(i % 2) * 2 - 1 + random() * 1.5, random(), random() - 0.5, random()] AS features,
                (i % 2) AS label
            FROM generate_series(1, {PAR_ROWS}) i""")
        admin.execute(f"GRANT SELECT ON hard_par_t TO {ALICE}")
        admin.execute("VACUUM ANALYZE hard_par_t")
    return env


def prediction_counts_query(model):
    """Every prediction function, dense and sparse, counted in one scan (parallel: in the workers)."""
    m = model
    return sql.SQL("""SELECT
        count(*) FILTER (WHERE corgipile_predict({m}, features) > 0),
        count(*) FILTER (WHERE corgipile_predict_class({m}, features) = '1'),
        count(*) FILTER (WHERE (corgipile_predict_proba({m}, features))[1] > 0.5),
        count(*) FILTER (WHERE corgipile_decision_function({m}, features) > 0),
        count(*) FILTER (WHERE corgipile_predict({m}, ARRAY[1, 2, 3, 4], features) > 0),
        count(*) FILTER (WHERE corgipile_predict_class({m}, ARRAY[1, 2, 3, 4], features) = '1'),
        count(*) FILTER (WHERE (corgipile_predict_proba({m}, ARRAY[1, 2, 3, 4], features))[1] > 0.5),
        count(*) FILTER (WHERE corgipile_decision_function({m}, ARRAY[1, 2, 3, 4], features) > 0),
        sum(corgipile_decision_function({m}, features))
        FROM hard_par_t""").format(m=m)


def same_results(got, expected):
    """Counts equal; float sums equal up to the summation order."""
    *gc, gs = got
    *ec, es = expected
    return gc == ec and abs(gs - es) <= 1e-9 * max(1.0, abs(es))


def spec_query(model):
    return sql.SQL("SELECT count(*) FROM hard_par_t WHERE corgipile_predict({m}, features) > 0").format(m=model)


@pytest.mark.parametrize("role", ["superuser", ALICE])
def test_prediction_by_name_and_id_in_parallel_plan(par_table, role):
    user = None if role == "superuser" else role
    with connect(par_table, user) as serial, connect(par_table, user) as par:
        model_id = train(serial, "hard_par_t", "logistic", {"epochs": 2, "seed": 11, "name": "hard_par"})
        models = {"name": sql.SQL("{}::text").format(sql.Literal("hard_par")),
                  "id": sql.SQL("{}::bigint").format(sql.Literal(model_id))}
        serial.execute("SET max_parallel_workers_per_gather = 0")
        guc = parallel_guc(par)
        for s in (f"SET {guc} = on", "SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0",
                  "SET min_parallel_table_scan_size = 0", "SET max_parallel_workers_per_gather = 2",
                  "SET parallel_leader_participation = off"):
            par.execute(s)
        for how, m in models.items():
            for q in (spec_query(m), prediction_counts_query(m)):
                plan = "\n".join(r[0] for r in par.execute(sql.SQL("EXPLAIN (COSTS OFF) ") + q))
                assert "Gather" in plan, f"{how}: no parallel plan:\n{plan}"
                expected = serial.execute(q).fetchone()
                got = par.execute(q).fetchone()
                if len(expected) == 1:
                    assert got == expected, f"{how}: parallel {got} != serial {expected}"
                else:
                    assert same_results(got, expected), f"{how}: parallel {got} != serial {expected}"
            # Not every row on one side: the counts say something.
            n = serial.execute(spec_query(m)).fetchone()[0]
            assert 0 < n < PAR_ROWS
        # The workers really ran (unless the cluster has no parallel workers at all).
        if int(scalar(par, "SHOW max_parallel_workers")) > 0 and int(scalar(par, "SHOW max_worker_processes")) > 1:
            plan = "\n".join(r[0] for r in par.execute(
                sql.SQL("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ") + spec_query(models["name"])))
            launched = [int(x) for x in re.findall(r"Workers Launched: (\d+)", plan)]
            assert launched and max(launched) >= 1, plan


# =============================================================================================
# 4. Validation predicate

BAD_PREDICATES = [
    # (id, predicate, expected SQLSTATE or None for "any, but not XX000")
    ("injection", "false), false) FROM ONLY public.hard_small WHERE id <= 100 --", "42601"),
    ("second_statement", "true; DROP TABLE hard_small", "42601"),
    ("order_by", "id > 0 ORDER BY id", "42601"),
    ("limit", "id > 0 LIMIT 5", "42601"),
    ("subquery_in", "id IN (SELECT 1)", "0A000"),
    ("subquery_exists", "EXISTS (SELECT 1 FROM pg_class)", "0A000"),
    ("aggregate", "count(*) > 0", "42803"),
    ("window", "row_number() OVER () > 5", "42P20"),
    ("set_returning", "generate_series(1, 2) > 1", "0A000"),
    ("volatile", "random() < 0.2", "22023"),
    ("other_table", "hard_other.x > 0", "42P01"),
    ("empty", "", None),
    ("non_boolean", "id + 1", "42804"),
    ("parameter", "$1 > 0", None),
]


@pytest.mark.parametrize("predicate,code", [(p, c) for _, p, c in BAD_PREDICATES],
                         ids=[i for i, _, _ in BAD_PREDICATES])
def test_bad_validation_predicate_is_refused(env, admin, predicate, code):
    before = model_count(admin)
    e = train_error(admin, "hard_small", "svm", {"epochs": 1, "seed": 1, "validation": {"predicate": predicate}})
    assert e is not None, f"predicate {predicate!r} was accepted"
    assert e.sqlstate is not None and not e.sqlstate.startswith("XX"), describe(e)
    if code is not None:
        assert e.sqlstate == code, describe(e)
    assert scalar(admin, "SELECT 1") == 1
    assert model_count(admin) == before
    assert scalar(admin, "SELECT count(*) FROM hard_small") == SMALL_ROWS


@pytest.mark.parametrize("predicate", ["id % 5 = 0", "id < length(current_user) * 100"])
def test_valid_validation_predicate_trains(env, admin, predicate):
    expected_rows = scalar(admin, f"SELECT count(*) FROM hard_small WHERE {predicate}")
    assert 0 < expected_rows < SMALL_ROWS
    model_id = train(admin, "hard_small", "svm", {"epochs": 2, "seed": 1, "validation": {"predicate": predicate}})
    rows = scalar(admin, "SELECT (metrics->'validation'->>'rows')::bigint FROM corgipile.models WHERE id = %s",
                  (model_id,))
    assert rows == expected_rows
    assert scalar(admin, """SELECT count(*) FROM corgipile.epochs
                            WHERE model_id = %s AND validation_loss IS NOT NULL""", (model_id,)) == 2


# =============================================================================================
# 5. Up-front errors

@pytest.mark.parametrize("how", ["BEGIN READ ONLY", "default_transaction_read_only"])
def test_train_in_read_only_transaction_fails_fast(big, admin, how):
    before = model_count(admin)
    with connect(big, ALICE) as c:
        c.execute("SET statement_timeout = '10s'")
        if how == "BEGIN READ ONLY":
            c.execute("BEGIN READ ONLY")
        else:
            c.execute("SET default_transaction_read_only = on")
        e, elapsed = timed(train_error, c, "hard_big", "svm", {"epochs": BIG_EPOCHS, "seed": 1})
        if how == "BEGIN READ ONLY":
            c.execute("ROLLBACK")
    assert isinstance(e, E.ReadOnlySqlTransaction), describe(e)
    assert elapsed < 1.0, f"read-only refusal after {elapsed:.2f} s"
    assert model_count(admin) == before


def test_drop_and_deploy_in_read_only_transaction(env, admin):
    with connect(env, ALICE) as alice:
        v1 = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_ro"})
        v2 = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 2, "name": "hard_ro"})
        calls = [("SELECT corgipile_drop_model(%s::bigint)", (v1,)),
                 ("SELECT corgipile_drop_model(%s::text)", ("hard_ro",)),
                 ("SELECT corgipile_deploy(%s, %s)", ("hard_ro", v1)),
                 ("SELECT corgipile_deploy(%s)", ("hard_ro",))]
        bad = {}
        for q, p in calls:
            alice.execute("BEGIN READ ONLY")
            e = error_of(alice, q, p)
            alice.execute("ROLLBACK")
            if not isinstance(e, E.ReadOnlySqlTransaction):
                bad[q % tuple(map(repr, p))] = describe(e)
        alice.execute("SET default_transaction_read_only = on")
        for q, p in calls:
            e = error_of(alice, q, p)
            if not isinstance(e, E.ReadOnlySqlTransaction):
                bad["default_transaction_read_only: " + q % tuple(map(repr, p))] = describe(e)
        assert not bad, f"expected 25006: {bad}"
    assert admin.execute("SELECT id, pinned FROM corgipile.models WHERE id IN (%s, %s) ORDER BY id",
                         (v1, v2)).fetchall() == [(v1, False), (v2, False)]


def test_name_held_by_uncommitted_training(big, admin):
    with connect(big, ALICE) as s1, connect(big, ALICE) as s2, connect(big, BOB) as bob:
        s2.execute("SET statement_timeout = '10s'")
        bob.execute("SET statement_timeout = '5s'")
        s1.execute("BEGIN")
        first = train(s1, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
        try:
            before = model_count(admin)
            e, elapsed = timed(train_error, s2, "hard_big", "svm",
                               {"epochs": BIG_EPOCHS, "seed": 1, "name": "hard_held"})
            assert isinstance(e, E.LockNotAvailable), describe(e)
            assert elapsed < 1.0, f"55P03 after {elapsed:.2f} s"
            assert model_count(admin) == before
            # Names are per role: Bob's hard_held is not held.
            bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
            assert scalar(bob, "SELECT version FROM corgipile.models WHERE id = %s", (bobs,)) == 1
        finally:
            s1.execute("COMMIT")
        assert scalar(admin, "SELECT version FROM corgipile.models WHERE id = %s", (first,)) == 1
        retry = train(s2, "hard_big", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
        assert scalar(s2, "SELECT version FROM corgipile.models WHERE id = %s", (retry,)) == 2
    assert admin.execute("""SELECT trained_by, version FROM corgipile.models WHERE name = 'hard_held'
                            ORDER BY trained_by, version""").fetchall() == [(ALICE, 1), (ALICE, 2), (BOB, 1)]


# =============================================================================================
# 7. Hints

@pytest.fixture(scope="module")
def hint_tables(env):
    with connect(env) as admin:
        admin.execute("""CREATE TABLE hard_nan AS SELECT i AS id, ARRAY[i % 3, (i % 2) + 0.5]::float8[] AS features,
                         (CASE WHEN i = 500 THEN 'NaN'::float8 ELSE (i % 2)::float8 END) AS label
                         FROM generate_series(1, 1000) i""")
        admin.execute("""CREATE TABLE hard_div AS SELECT i AS id,
                         ARRAY[i * 1000.0, (i % 7) * 1e4, (i % 13) * 1e5]::float8[] AS features,
                         (i * 1e6 + (i % 11) * 1e7)::float8 AS label
                         FROM generate_series(1, 2000) i""")
    return env


@pytest.mark.parametrize("model", ["svm", "linear"])
def test_nan_label_hint_does_not_mention_views(hint_tables, admin, model):
    before = model_count(admin)
    e = train_error(admin, "hard_nan", model, {"epochs": 1, "seed": 1})
    assert e is not None and e.sqlstate is not None and e.sqlstate.startswith("22"), describe(e)
    hint = (e.diag.message_hint or "").lower()
    assert "view" not in hint and "where clause" not in hint, describe(e)
    assert model_count(admin) == before


def test_diverging_normalized_training_hint(hint_tables, admin):
    before = model_count(admin)
    e = train_error(admin, "hard_div", "linear",
                    {"epochs": 5, "seed": 1, "normalize": True, "learning_rate": 1e5,
                     "learning_rate_schedule": "constant"})
    assert isinstance(e, E.NumericValueOutOfRange), describe(e)
    hint = e.diag.message_hint or ""
    assert '"normalize": true' not in hint, describe(e)
    assert model_count(admin) == before


# =============================================================================================
# 8. pg_dump as a non-superuser database owner

def pg_tool(name):
    path = os.path.join(PG_BIN, name)
    return path if os.path.exists(path) else shutil.which(name)


def run_tool(args):
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return r


def copy_block_rows(dump_text, table):
    """The data lines of `COPY <table> (...) FROM stdin;` in a plain dump (None if absent)."""
    m = re.search(rf"^COPY {re.escape(table)} \(.*?\) FROM stdin;\n(.*?)^\\\.$", dump_text, re.S | re.M)
    return None if m is None else [line for line in m.group(1).split("\n") if line]


def test_pg_dump_as_non_superuser_database_owner(env, tmp_path):
    def cleanup():
        with connect("dbname=postgres") as su:
            for db in (DUMP_DB, RESTORE_DB):
                su.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            if scalar(su, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (OWNER,)):
                su.execute(f"DROP ROLE {OWNER}")

    cleanup()
    try:
        with connect("dbname=postgres") as su:
            su.execute(f"CREATE ROLE {OWNER} LOGIN")
            su.execute(f"CREATE DATABASE {DUMP_DB} OWNER {OWNER}")
        with connect(f"dbname={DUMP_DB}") as su:
            su.execute("CREATE EXTENSION corgipile")
        with connect(f"dbname={DUMP_DB}", OWNER) as owner:
            owner.execute("""CREATE TABLE pts AS SELECT i AS id,
                             ARRAY[(i % 2) * 2 - 1 + random(), random()] AS features, (i % 2) AS label
                             FROM generate_series(1, 2000) i""")
            unnamed = train(owner, "pts", "svm", {"epochs": 2, "seed": 1})
            named = train(owner, "pts", "logistic", {"epochs": 2, "seed": 2, "name": "hard_dumped"})
            ids = [unnamed, named]
            by_id = """SELECT m, id, corgipile_predict(m, features), corgipile_decision_function(m, features)
                       FROM pts, unnest(%s::bigint[]) m ORDER BY m, id"""
            by_name = "SELECT id, corgipile_predict('hard_dumped', features) FROM pts ORDER BY id"
            before = owner.execute(by_id, (ids,)).fetchall()
            before_name = owner.execute(by_name).fetchall()
            epochs_before = scalar(owner, "SELECT count(*) FROM corgipile.epochs")

        env_vars = dict(os.environ)
        host = ["-h", os.environ.get("PGHOST", "/tmp/corgipile-cluster"), "-p", os.environ.get("PGPORT", "28815")]
        dump = tmp_path / "owner.sql"
        r = run_tool([pg_tool("pg_dump"), "--enable-row-security", *host, "-U", OWNER, "-f", str(dump), DUMP_DB])
        assert r.returncode == 0, f"pg_dump as {OWNER} failed:\n{r.stderr}"
        text = dump.read_text()
        rows = copy_block_rows(text, "corgipile.models")
        assert rows is not None and len(rows) == 2, f"models in the dump: {rows}"
        assert any("hard_dumped" in line for line in rows)
        assert len(copy_block_rows(text, "corgipile.epochs") or []) == epochs_before

        with connect("dbname=postgres") as su:
            su.execute(f"CREATE DATABASE {RESTORE_DB}")
        r = run_tool([pg_tool("psql"), "-X", *host, "-U", env_vars.get("PGUSER", "postgres"), "-d", RESTORE_DB,
                      "-v", "ON_ERROR_STOP=1", "-1", "-q", "-f", str(dump)])
        assert r.returncode == 0, f"restore failed:\n{r.stderr}"

        with connect(f"dbname={RESTORE_DB}") as su:
            assert su.execute(by_id, (ids,)).fetchall() == before
            assert scalar(su, "SELECT count(*) FROM corgipile.epochs") == epochs_before
            assert su.execute("SELECT id, trained_by, name FROM corgipile.models ORDER BY id").fetchall() == \
                [(unnamed, OWNER, None), (named, OWNER, "hard_dumped")]
            new_id = train(su, "pts", "svm", {"epochs": 1, "seed": 3})
            assert new_id > max(ids)
        with connect(f"dbname={RESTORE_DB}", OWNER) as owner:
            # Names are per role: the name resolves for the role that trained it.
            assert owner.execute(by_id, (ids,)).fetchall() == before
            assert owner.execute(by_name).fetchall() == before_name
            new_owner_id = train(owner, "pts", "svm", {"epochs": 1, "seed": 4, "name": "hard_dumped"})
            assert new_owner_id > max(ids) and new_owner_id != new_id
            assert scalar(owner, "SELECT version FROM corgipile.models WHERE id = %s", (new_owner_id,)) == 2

        # A plain pg_dump as the superuser still works.
        su_dump = tmp_path / "su.sql"
        r = run_tool([pg_tool("pg_dump"), *host, "-U", env_vars.get("PGUSER", "postgres"), "-f", str(su_dump), DUMP_DB])
        assert r.returncode == 0, f"pg_dump as superuser failed:\n{r.stderr}"
        assert len(copy_block_rows(su_dump.read_text(), "corgipile.models") or []) == 2
    finally:
        cleanup()


# =============================================================================================
# 6. Memory bound (last: a missing bound would try to allocate a huge model)

def test_max_model_memory_is_superuser_only(env):
    with connect(env, ALICE) as alice:
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
    with connect(env) as su:
        load_library(su)
        assert scalar(su, "SHOW corgipile.max_model_memory") == "512MB"
        su.execute("SET corgipile.max_model_memory = '1MB'")
        assert scalar(su, "SHOW corgipile.max_model_memory") == "1MB"
        su.execute("RESET corgipile.max_model_memory")
        assert scalar(su, "SHOW corgipile.max_model_memory") == "512MB"


def assert_model_memory_error(e):
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert "corgipile.max_model_memory" in (e.diag.message_primary or ""), describe(e)


@pytest.fixture(scope="module")
def unsorted_sparse(env):
    """hard_nf_bad: 20,000 sparse rows whose indices are all out of order, so decoding any row is
    a data ERROR (22023 naming its ctid). Autovacuum is off for it: nothing but the tests reads
    its blocks, so its read counters move only when a training reads it."""
    with connect(env) as admin:
        admin.execute("""CREATE TABLE hard_nf_bad WITH (autovacuum_enabled = false) AS
                         SELECT i AS id, (i % 2) AS label, ARRAY[3, 1]::int4[] AS idx,
                                ARRAY[(i % 2) + 0.5, 1.0]::float8[] AS val
                         FROM generate_series(1, 20000) i""")
        admin.execute(f"GRANT SELECT ON hard_nf_bad TO {ALICE}")
    return env


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
def test_huge_sparse_n_features_refused_before_reading(unsorted_sparse, admin, role):
    """README: an explicit n_features over corgipile.max_model_memory is an ERROR before the table
    is read. Proven by what was read: every row of hard_nf_bad is a data error once decoded, so a
    54000 instead shows no row was decoded, and the table's block and tuple counters do not move
    (while a training that does read it moves them: the check is not vacuous)."""
    sparse = {"indices": "idx", "values": "val"}
    before = model_count(admin)
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
    assert model_count(admin) == before


def test_huge_inferred_sparse_dimension_refused(env, admin):
    admin.execute("""CREATE TABLE hard_sparse_huge AS SELECT i AS id, (i % 2) AS label,
                     (CASE WHEN i = 50 THEN ARRAY[1, 2000000000] ELSE ARRAY[1, 2] END)::int4[] AS idx,
                     ARRAY[(i % 2) + 0.5, 1.0]::float8[] AS val FROM generate_series(1, 100) i""")
    before = model_count(admin)
    admin.execute("SET statement_timeout = '10s'")
    try:
        e = train_error(admin, "hard_sparse_huge", "svm",
                        {"epochs": 1, "seed": 1, "features": {"indices": "idx", "values": "val"}})
    finally:
        admin.execute("RESET statement_timeout")
    assert_model_memory_error(e)
    assert model_count(admin) == before


def test_dense_model_over_small_limit_refused(env, admin):
    admin.execute("""CREATE TABLE hard_wide AS SELECT i AS id, (i % 2) AS label,
                     array_fill((i % 2)::float8, ARRAY[200000]) AS features FROM generate_series(1, 10) i""")
    before = model_count(admin)
    admin.execute("SET corgipile.max_model_memory = '1MB'")
    admin.execute("SET statement_timeout = '20s'")
    try:
        e = train_error(admin, "hard_wide", "svm", {"epochs": 1, "seed": 1, "buffer_size": 4})
    finally:
        admin.execute("RESET corgipile.max_model_memory")
        admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert model_count(admin) == before


def test_softmax_many_classes_over_small_limit_refused(env, admin):
    # 10,000 classes x 20 features x 8 bytes = 1.6 MB of weights > 1 MB.
    admin.execute("""CREATE TABLE hard_sm_classes AS SELECT i AS id, i AS label,
                     array_fill((i % 5)::float8, ARRAY[20]) AS features FROM generate_series(1, 10000) i""")
    before = model_count(admin)
    admin.execute("SET corgipile.max_model_memory = '1MB'")
    admin.execute("SET statement_timeout = '20s'")
    try:
        e = train_error(admin, "hard_sm_classes", "softmax", {"epochs": 1, "seed": 1})
    finally:
        admin.execute("RESET corgipile.max_model_memory")
        admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert model_count(admin) == before


def test_softmax_over_65536_classes_refused_in_first_pass(env, admin):
    admin.execute("""CREATE TABLE hard_sm_70k AS SELECT i AS id, i AS label,
                     ARRAY[random(), random()] AS features FROM generate_series(1, 70000) i""")
    before = model_count(admin)
    # 1000 epochs of ~65,000 classes would run for hours: an ERROR before the timeout means the
    # class count was refused during the first pass (as soon as the 65537th class appeared;
    # that pass trains as it reads, so it is not instant).
    admin.execute("SET statement_timeout = '60s'")
    try:
        e, elapsed = timed(train_error, admin, "hard_sm_70k", "softmax", {"epochs": 1000, "seed": 1})
    finally:
        admin.execute("RESET statement_timeout")
    assert isinstance(e, E.ProgramLimitExceeded), describe(e)
    assert "65536" in (e.diag.message_primary or ""), describe(e)
    assert model_count(admin) == before
