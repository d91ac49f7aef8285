"""Security: what an ordinary role can reach through corgipile.

Two parts, on two databases:

- In a database of the suite's own (the db fixture), roles rel_sec_*: table and column privileges
  (no SELECT, features but not the label, features and label), row-level security (a training
  sees what the role's SELECT sees, single- and double-buffered), params as identifiers (no SQL
  injection through column names or the relation name), and the catalog's per-role isolation.
- In the shared database, the roles hard_alice / hard_bob of the roles_env fixture: the catalog
  is written only by corgipile's functions (no table, sequence or lock privileges beyond SELECT /
  ACCESS SHARE for ordinary roles; an ACCESS SHARE holder blocks no other role; server-assigned
  ids), per-role model ownership for drop and deploy (the superuser may drop any), a validation
  predicate that is one plain boolean expression over the row (injection, second statements,
  subqueries, aggregates, windows, set-returning and volatile functions, other tables refused;
  valid ones train), and pg_dump / restore by a non-superuser database owner (role hard_owner).

Models shared between roles (corgipile_grant) are in test_grants.py; sharded training's security
(a shard server of its own, with password authentication) in test_shard_security.py.
"""

import os
import re
import shutil
import subprocess

import psycopg
import psycopg.errors as E
import pytest

from helpers import (PG_BIN, ROLES_ENV_ALICE, ROLES_ENV_BOB, ROLES_ENV_SMALL_ROWS, catalog_counts, connect,
                     describe, error_of, models_count, scalar, suite_db, timed, train, train_error)
from tables import NOISY, points, uniform

ALICE, BOB, OWNER = ROLES_ENV_ALICE, ROLES_ENV_BOB, "hard_owner"
SMALL_ROWS = ROLES_ENV_SMALL_ROWS
DUMP_DB, RESTORE_DB = "hard_dumpdb", "hard_restoredb"
ROLES = ["rel_sec_none", "rel_sec_cols", "rel_sec_full", "rel_sec_rls", "rel_sec_a", "rel_sec_b"]


@pytest.fixture(scope="module")
def setup(db):
    with connect(db) as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")
            c.execute(f"CREATE ROLE {r}")
        points(c, "t", 30000, features=uniform(3, signal=2), extra=["(i % 3 = 0) AS mine"], order_by="i")
        c.execute("GRANT SELECT (features) ON t TO rel_sec_cols")
        c.execute("GRANT SELECT (features, label) ON t TO rel_sec_full")
        c.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY only_mine ON t FOR SELECT TO rel_sec_rls USING (mine)")
        c.execute("GRANT SELECT ON t TO rel_sec_rls, rel_sec_a, rel_sec_b")
        c.execute("CREATE POLICY all_rows ON t FOR SELECT TO rel_sec_full, rel_sec_a, rel_sec_b USING (true)")
        # The same visible rows, in the same physical order (t was loaded in id order).
        c.execute("CREATE TABLE only_mine AS SELECT * FROM t WHERE mine ORDER BY id")
        c.execute("GRANT SELECT ON only_mine TO rel_sec_rls")
    yield db
    # Roles are cluster-wide: drop the database (and with it every grant and policy) first.
    with connect("dbname=postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {suite_db(db)} WITH (FORCE)")
        for r in ROLES:
            admin.execute(f"DROP ROLE IF EXISTS {r}")


@pytest.fixture
def role_conn(setup):
    with connect(setup) as c:
        yield c
        c.execute("RESET ROLE")


def as_role(role_conn, role):
    role_conn.execute(f"SET ROLE {role}")


def test_no_select_privilege(role_conn):
    before = catalog_counts(role_conn)
    as_role(role_conn, "rel_sec_none")
    with pytest.raises(E.InsufficientPrivilege):
        train(role_conn, "t", "svm", {"epochs": 1})
    with pytest.raises(E.InsufficientPrivilege):
        role_conn.execute("SELECT * FROM corgipile_explain('t', 'svm')")
    with pytest.raises(E.InsufficientPrivilege):
        role_conn.execute("SELECT * FROM corgipile_explain('t', 'svm', '{}', true)")
    role_conn.execute("RESET ROLE")
    assert catalog_counts(role_conn) == before


def test_column_privileges(role_conn):
    as_role(role_conn, "rel_sec_cols")  # features only: the label is not readable
    with pytest.raises(E.InsufficientPrivilege):
        train(role_conn, "t", "svm", {"epochs": 1})
    with pytest.raises(E.InsufficientPrivilege):
        train(role_conn, "t", "svm", {"epochs": 1, "label": "id"})  # id not granted either
    role_conn.execute("RESET ROLE")


def test_column_privileges_on_features_and_label_suffice(role_conn):
    as_role(role_conn, "rel_sec_full")  # features and label: enough (id and mine are not needed)
    assert scalar(role_conn, "SELECT count(*) FROM (SELECT label, features FROM ONLY t) s") == 30000
    model_id = train(role_conn, "t", "svm", {"epochs": 1, "seed": 1})
    assert scalar(role_conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 30000
    with pytest.raises(E.InsufficientPrivilege):
        train(role_conn, "t", "svm", {"epochs": 1, "features": "features", "label": "mine"})


def weights(role_conn, model_id):
    return role_conn.execute("SELECT weights, bias, rows_trained FROM corgipile.models WHERE id = %s",
                        (model_id,)).fetchone()


@pytest.mark.parametrize("double_buffer", [True, False])
def test_row_level_security(role_conn, double_buffer):
    params = {"epochs": 3, "seed": 7, "shuffle": "no_shuffle", "double_buffer": double_buffer}
    policy_rows = scalar(role_conn, "SELECT count(*) FROM t WHERE mine")
    all_model = train(role_conn, "t", "svm", params)  # superuser: RLS bypassed, all rows
    as_role(role_conn, "rel_sec_rls")
    assert scalar(role_conn, "SELECT count(*) FROM t") == policy_rows
    rls_model = train(role_conn, "t", "svm", params)
    copy_model = train(role_conn, "only_mine", "svm", params)
    w_rls, w_copy = weights(role_conn, rls_model), weights(role_conn, copy_model)
    role_conn.execute("RESET ROLE")
    w_all = weights(role_conn, all_model)
    print(f"RLS: rows_trained {w_rls[2]} (policy rows {policy_rows}, all {w_all[2]})")
    assert w_rls[2] == policy_rows and w_all[2] == 30000
    assert w_rls[:2] != w_all[:2]
    # no_shuffle visits rows in storage order; only_mine holds the policy's rows in the same order
    # (both tables were loaded in id order and never updated), learning rate depends only on the
    # epoch, so the model is bit-identical.
    assert w_rls == w_copy


@pytest.mark.parametrize("name", ['label"; DROP TABLE t; --', "label); DROP TABLE t; --", "label' OR '1'='1"])
def test_param_names_are_identifiers(role_conn, name):
    for key in ("label", "features"):
        with pytest.raises(E.UndefinedColumn):
            train(role_conn, "t", "svm", {"epochs": 1, key: name})
        assert scalar(role_conn, "SELECT 1") == 1
    assert scalar(role_conn, "SELECT count(*) FROM t") == 30000


def test_relation_name_is_not_sql(role_conn):
    with pytest.raises(psycopg.Error):
        role_conn.execute("SELECT corgipile_train(%s, 'svm')", ("t; DROP TABLE t",))
    assert scalar(role_conn, "SELECT count(*) FROM t") == 30000


def test_catalog_isolation_between_roles(role_conn):
    as_role(role_conn, "rel_sec_a")
    a_model = train(role_conn, "t", "svm", {"epochs": 1, "seed": 1})
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.models WHERE id = %s", (a_model,)) == 1
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 1
    role_conn.execute("RESET ROLE")
    as_role(role_conn, "rel_sec_b")
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.models WHERE trained_by <> current_user") == 0
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.models WHERE id = %s", (a_model,)) == 0
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 0
    # Only corgipile's functions write the catalog; to them, A's model does not exist for B.
    for sql in ("DELETE FROM corgipile.models WHERE id = %s", "DELETE FROM corgipile.epochs WHERE model_id = %s"):
        with pytest.raises(E.InsufficientPrivilege):
            role_conn.execute(sql, (a_model,))
    with pytest.raises(E.UndefinedObject):
        role_conn.execute("SELECT corgipile_drop_model(%s::bigint)", (a_model,))
    with pytest.raises(E.UndefinedObject):
        role_conn.execute("SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,))
    assert scalar(role_conn, "SELECT 1") == 1
    # B cannot change A's model (no UPDATE privilege on the catalog).
    with pytest.raises(E.InsufficientPrivilege):
        role_conn.execute("UPDATE corgipile.models SET weights = weights WHERE id = %s", (a_model,))
    role_conn.execute("RESET ROLE")
    # The superuser sees all, and A's model is intact.
    assert scalar(role_conn, "SELECT trained_by FROM corgipile.models WHERE id = %s", (a_model,)) == "rel_sec_a"
    assert scalar(role_conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 1
    assert scalar(role_conn, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,)) in (0, 1)
    as_role(role_conn, "rel_sec_a")
    assert scalar(role_conn, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,)) in (0, 1)


# =============================================================================================
# Catalog privileges and ownership (roles_env: hard_alice, hard_bob)

def test_catalog_writes_refused_for_ordinary_role(roles_env, roles_admin):
    with connect(roles_env, ALICE) as alice:
        own = train(alice, "hard_small", "svm", {"epochs": 2, "seed": 1})
        epochs_before = scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,))
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
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.models WHERE id = %s", (own,)) == 1
    assert scalar(roles_admin, "SELECT trained_by FROM corgipile.models WHERE id = %s", (own,)) == ALICE
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,)) == epochs_before


def test_catalog_select_shows_only_own_models(roles_env, roles_admin):
    su_model = train(roles_admin, "hard_small", "svm", {"epochs": 1, "seed": 2})
    with connect(roles_env, BOB) as bob:
        bob_model = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 3})
    with connect(roles_env, ALICE) as alice:
        alice_model = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 4})
        seen = {r[0] for r in alice.execute("SELECT id FROM corgipile.models")}
        seen_epochs = {r[0] for r in alice.execute("SELECT DISTINCT model_id FROM corgipile.epochs")}
        summary = {r[0] for r in alice.execute("SELECT id FROM corgipile.model_summary")}
    alice_all = {r[0] for r in roles_admin.execute("SELECT id FROM corgipile.models WHERE trained_by = %s", (ALICE,))}
    assert alice_model in seen and su_model not in seen and bob_model not in seen
    assert seen == alice_all
    assert seen_epochs == alice_all
    assert summary == alice_all


def test_models_id_sequence_refused(roles_env):
    with connect(roles_env, ALICE) as alice:
        outcomes = {q: describe(error_of(alice, q)) for q in (
            "SELECT nextval('corgipile.models_id_seq')",
            "SELECT setval('corgipile.models_id_seq', 1000000)",
            "SELECT setval('corgipile.models_id_seq', 5, false)",
        )}
    bad = {q: o for q, o in outcomes.items() if not o.startswith("42501 ")}
    assert not bad, f"expected 42501: {bad}"


LOCK_MODES = ["ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
              "EXCLUSIVE", "ACCESS EXCLUSIVE"]


def test_catalog_lock_modes_above_access_share_refused(roles_env):
    bad = {}
    with connect(roles_env, ALICE) as alice:
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


def test_catalog_row_locks_refused(roles_env):
    bad = {}
    with connect(roles_env, ALICE) as alice:
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
def test_access_share_holder_does_not_block_other_role(roles_env, holder):
    with connect(roles_env, ALICE) as alice, connect(roles_env, BOB) as bob:
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
# Models are written only by the extension's functions, with server-assigned ids

def test_ordinary_role_trains_with_server_assigned_id(roles_env, roles_admin):
    before = scalar(roles_admin, "SELECT coalesce(max(id), 0) FROM corgipile.models")
    with connect(roles_env, ALICE) as alice:
        model_id = train(alice, "hard_small", "logistic", {"epochs": 2, "seed": 1})
        assert isinstance(model_id, int) and model_id > before
        assert scalar(alice, "SELECT trained_by FROM corgipile.models WHERE id = %s", (model_id,)) == ALICE
    row = roles_admin.execute("SELECT trained_by, model_type, rows_trained FROM corgipile.models WHERE id = %s",
                        (model_id,)).fetchone()
    assert row == (ALICE, "logistic", SMALL_ROWS)
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (model_id,)) == 2


def test_drop_own_model_and_not_another_roles(roles_env, roles_admin):
    with connect(roles_env, BOB) as bob:
        bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1})
    with connect(roles_env, ALICE) as alice:
        own = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 1})
        assert scalar(alice, "SELECT corgipile_drop_model(%s::bigint)", (own,)) == 1
        assert scalar(roles_admin, "SELECT count(*) FROM corgipile.models WHERE id = %s", (own,)) == 0
        assert scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (own,)) == 0

        missing = scalar(roles_admin, "SELECT max(id) FROM corgipile.models") + 1_000_000
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
    assert scalar(roles_admin, "SELECT trained_by FROM corgipile.models WHERE id = %s", (bobs,)) == BOB
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (bobs,)) == 1


def test_deploy_own_named_models(roles_env, roles_admin):
    with connect(roles_env, BOB) as bob:
        bobs_named = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 9, "name": "hard_dep"})
    with connect(roles_env, ALICE) as alice:
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
    assert scalar(roles_admin, "SELECT pinned FROM corgipile.models WHERE id = %s", (bobs_named,)) is False


def test_superuser_can_drop_any_model(roles_env, roles_admin):
    with connect(roles_env, BOB) as bob:
        bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1})
        bobs_named = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_sudrop"})
    assert scalar(roles_admin, "SELECT corgipile_drop_model(%s::bigint)", (bobs,)) == 1
    assert scalar(roles_admin, "SELECT corgipile_drop_model(%s::bigint)", (bobs_named,)) == 1
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.models WHERE id IN (%s, %s)", (bobs, bobs_named)) == 0
    assert scalar(roles_admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id IN (%s, %s)", (bobs, bobs_named)) == 0


# =============================================================================================
# Validation predicate

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
def test_bad_validation_predicate_is_refused(roles_env, roles_admin, predicate, code):
    before = models_count(roles_admin)
    e = train_error(roles_admin, "hard_small", "svm", {"epochs": 1, "seed": 1, "validation": {"predicate": predicate}})
    assert e is not None, f"predicate {predicate!r} was accepted"
    assert e.sqlstate is not None and not e.sqlstate.startswith("XX"), describe(e)
    if code is not None:
        assert e.sqlstate == code, describe(e)
    assert scalar(roles_admin, "SELECT 1") == 1
    assert models_count(roles_admin) == before
    assert scalar(roles_admin, "SELECT count(*) FROM hard_small") == SMALL_ROWS


@pytest.mark.parametrize("predicate", ["id % 5 = 0", "id < length(current_user) * 100"])
def test_valid_validation_predicate_trains(roles_env, roles_admin, predicate):
    expected_rows = scalar(roles_admin, f"SELECT count(*) FROM hard_small WHERE {predicate}")
    assert 0 < expected_rows < SMALL_ROWS
    model_id = train(roles_admin, "hard_small", "svm", {"epochs": 2, "seed": 1, "validation": {"predicate": predicate}})
    rows = scalar(roles_admin, "SELECT (metrics->'validation'->>'rows')::bigint FROM corgipile.models WHERE id = %s",
                  (model_id,))
    assert rows == expected_rows
    assert scalar(roles_admin, """SELECT count(*) FROM corgipile.epochs
                            WHERE model_id = %s AND validation_loss IS NOT NULL""", (model_id,)) == 2


# =============================================================================================
# pg_dump as a non-superuser database owner

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


def test_pg_dump_as_non_superuser_database_owner(roles_env, tmp_path):
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
            points(owner, "pts", 2000, features=NOISY)
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
