"""Predicting from a table's own row reads the model's columns only: the planner rewrites
corgipile_predict(model, t) (and the class, proba and decision_function row forms) into
corgipile_*_columns(model, '{a,b,...}', t.a, t.b, ...) (src/predict/simplify.rs).

Every rewritten prediction is compared, exactly, with the row form the planner cannot rewrite:
the row of a subquery (`FROM (SELECT * FROM t OFFSET 0) s`), which EXPLAIN shows unrewritten.
Cached plans (PREPARE, PL/pgSQL) follow a name deployed to a model with other columns, in the
same session and from another; the rewritten call checks the caller's privileges at execution
as the row form does; what cannot be rewritten is not."""

import psycopg
import psycopg.errors as E
import pytest

from helpers import describe, drop_role, error_of, parallel_guc, scalar, train

ALICE, BOB = "pc_alice", "pc_bob"
FEATURES = ["x", "n", "d", "b", "s", "v", "c", "e", "at"]
BASE = {"label": "label", "epochs": 2, "seed": 1, "verbose": False}
KINDS = {  # function -> the model (of the `world` fixture) it is asked of
    "corgipile_predict": "logistic",
    "corgipile_decision_function": "logistic",
    "corgipile_predict_class": "softmax",
    "corgipile_predict_proba": "softmax",
}


def explain(c, query, params=None):
    return "\n".join(r[0] for r in c.execute("EXPLAIN VERBOSE " + query, params).fetchall())


def rewritten(c, query, params=None):
    return "_columns(" in explain(c, query, params)


def arg(model):
    """The model argument's placeholder: an id is a bigint, a name text."""
    return "%s::bigint" if isinstance(model, int) else "%s::text"


def by_row_and_by_columns(c, fn, model, table="pc_score", order="id"):
    """(rows predicted through the rewrite, rows predicted from the row value): (id, value)."""
    fast = f"SELECT id, {fn}({arg(model)}, t) FROM {table} t ORDER BY {order}"
    slow = f"SELECT id, {fn}({arg(model)}, sub) FROM (SELECT * FROM {table} OFFSET 0) sub ORDER BY {order}"
    assert rewritten(c, fast, (model,)), explain(c, fast, (model,))
    assert not rewritten(c, slow, (model,)), explain(c, slow, (model,))
    return c.execute(fast, (model,)).fetchall(), c.execute(slow, (model,)).fetchall()


@pytest.fixture(scope="module")
def world(dsn):
    """pc_train (every column kind, NULLs), models on it, and pc_score: the same columns in
    another order with other types, extra and dropped columns, categories never seen."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in ("pc_score", "pc_train", "pc_other", "pc_groups", "pc_cols"):
            c.execute(f"DROP TABLE IF EXISTS {t}")
        c.execute("DROP TYPE IF EXISTS pc_plan")
        c.execute("CREATE TYPE pc_plan AS ENUM ('basic', 'plus', 'pro')")
        c.execute("""CREATE TABLE pc_train AS SELECT i AS id,
            CASE WHEN i % 17 = 0 THEN NULL ELSE (i % 11) * 0.7 - 2 END::float8 AS x,
            CASE WHEN i % 19 = 0 THEN NULL ELSE i % 9 END::int AS n,
            CASE WHEN i % 23 = 0 THEN NULL ELSE (i % 13) / 3.0 END::numeric(8,2) AS d,
            CASE WHEN i % 29 = 0 THEN NULL ELSE i % 3 = 0 END AS b,
            CASE WHEN i % 31 = 0 THEN NULL ELSE 's' || (i % 6) END AS s,
            ('v' || (i % 4))::varchar(10) AS v,
            ('c' || (i % 3))::char(4) AS c,
            (ARRAY['basic', 'plus', 'pro'])[1 + i % 3]::pc_plan AS e,
            DATE '2026-01-01' + (i % 40) AS at,
            (i % 11) * 0.7 - 2 + (i % 6) * 0.4 + (CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END) > 1.5 AS label,
            i % 3 AS klass,
            (i % 11) * 0.5 + (i % 9) * 0.25 AS target
            FROM generate_series(1, 3000) i""")
        # Scoring rows: columns reordered, n as bigint, v as text, a dropped column, extra
        # columns, unseen categories ('s9', 'v9') and NULLs everywhere.
        c.execute("""CREATE TABLE pc_score (junk text, s text, id int, dropme int, e pc_plan, x float8,
                     n bigint, at date, d numeric, v text, b bool, c char(4), label bool)""")
        c.execute("ALTER TABLE pc_score DROP COLUMN dropme")
        c.execute("""INSERT INTO pc_score (junk, s, id, e, x, n, at, d, v, b, c, label)
            SELECT 'j', CASE WHEN i % 7 = 0 THEN NULL WHEN i % 5 = 0 THEN 's9' ELSE 's' || (i % 6) END, i,
                   CASE WHEN i % 13 = 0 THEN NULL ELSE (ARRAY['basic', 'plus', 'pro'])[1 + i % 3]::pc_plan END,
                   CASE WHEN i % 11 = 0 THEN NULL ELSE (i % 10) * 0.9 - 3 END,
                   CASE WHEN i % 8 = 0 THEN NULL ELSE i % 12 END,
                   CASE WHEN i % 9 = 0 THEN NULL ELSE DATE '2026-02-01' + i % 70 END,
                   CASE WHEN i % 6 = 0 THEN NULL ELSE (i % 17) / 7.0 END,
                   CASE WHEN i % 4 = 0 THEN 'v9' ELSE 'v' || (i % 4) END,
                   CASE WHEN i % 10 = 0 THEN NULL ELSE i % 2 = 0 END,
                   CASE WHEN i % 12 = 0 THEN NULL ELSE ('c' || (i % 4))::char(4) END,
                   i % 2 = 0
            FROM generate_series(1, 400) i""")
        models = {
            "logistic": train(c, "pc_train", "logistic", defaults=BASE, features=FEATURES, name="pc_logistic"),
            "softmax": train(c, "pc_train", "softmax", defaults=BASE, features=FEATURES, label="klass",
                             name="pc_softmax"),
            "linear": train(c, "pc_train", "linear", defaults=BASE, features=FEATURES, label="target"),
            "mlp": train(c, "pc_train", "mlp", defaults=BASE, features=["x", "n", "d", "s", "e"]),
            "skip": train(c, "pc_train", "logistic", defaults=BASE, features=["x", "s", "b"],
                          preprocess={"x": {"impute": "skip"}}),
            "arrays": None,
        }
        c.execute("""CREATE TABLE pc_other AS SELECT i AS id, ARRAY[(i % 5) * 1.0, (i % 3) * 1.0]::float8[] AS f,
                     i % 2 = 0 AS label FROM generate_series(1, 500) i""")
        models["arrays"] = train(c, "pc_other", "logistic", defaults=BASE, features="f")
        c.execute("""CREATE TABLE pc_cols AS SELECT i AS id, (i % 7) * 1.0 AS a, (i % 5) * 1.0 AS b,
                     (i % 3) * 2.0 AS c, (i % 7) + (i % 3) > 4 AS label FROM generate_series(1, 1000) i""")
    yield models
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM corgipile.models WHERE name LIKE 'pc\\_%%' OR id = ANY(%s)",
                  ([v for v in models.values() if v],))
        for t in ("pc_score", "pc_train", "pc_other", "pc_groups", "pc_cols"):
            c.execute(f"DROP TABLE IF EXISTS {t}")
        c.execute("DROP TYPE IF EXISTS pc_plan")


@pytest.mark.parametrize("fn", list(KINDS))
@pytest.mark.parametrize("by", ["id", "name"])
def test_rewritten_predictions_equal_the_row_form(conn, world, fn, by):
    model = world[KINDS[fn]] if by == "id" else f"pc_{KINDS[fn]}"
    fast, slow = by_row_and_by_columns(conn, fn, model)
    assert len(fast) == 400
    assert fast == slow
    assert len({r[1] if not isinstance(r[1], list) else tuple(r[1]) for r in fast}) > 1  # not a constant


@pytest.mark.parametrize("kind", ["linear", "mlp", "skip"])
def test_other_kinds_and_skipped_rows(conn, world, kind):
    fast, slow = by_row_and_by_columns(conn, "corgipile_predict", world[kind])
    assert fast == slow
    nulls = sum(r[1] is None for r in fast)
    # "impute": "skip" on x: rows with a NULL x (every 11th) predict NULL, the same in both forms.
    assert nulls == (36 if kind == "skip" else 0)


def test_the_training_table_itself_and_a_parallel_plan(conn, world):
    fast, slow = by_row_and_by_columns(conn, "corgipile_predict_proba", world["logistic"], table="pc_train")
    assert fast == slow and len(fast) == 3000
    conn.execute(f"SET {parallel_guc(conn)} = on")
    conn.execute("SET parallel_setup_cost = 0")
    conn.execute("SET parallel_tuple_cost = 0")
    try:
        q = "SELECT sum(corgipile_decision_function(%s::bigint, t)) FROM pc_train t"
        plan = explain(conn, q, (world["logistic"],))
        assert "Gather" in plan and "_columns(" in plan, plan
        total = scalar(conn, q, (world["logistic"],))
    finally:
        conn.execute(f"RESET {parallel_guc(conn)}")
        conn.execute("RESET parallel_setup_cost")
        conn.execute("RESET parallel_tuple_cost")
    serial = scalar(conn, "SELECT sum(corgipile_decision_function(%s::bigint, sub)) FROM (SELECT * FROM pc_train OFFSET 0) sub",
                    (world["logistic"],))
    assert total == pytest.approx(serial, rel=1e-12)  # the sums of the workers' shares


def test_explain_verbose_shows_the_call_on_the_models_columns(conn, world):
    plan = explain(conn, "SELECT corgipile_predict('pc_logistic', t) FROM pc_score t")
    assert ("corgipile_predict_columns('pc_logistic'::text, '{x,n,d,b,s,v,c,e,at}'::text[], "
            "x, n, d, b, s, v, c, e, at)") in plan, plan
    assert "junk" not in plan and "t.*" not in plan


def test_what_is_not_rewritten_keeps_the_row_forms_behaviour(conn, world):
    m = world["logistic"]
    # A row built in the query, a subquery's row, a model that is not a constant.
    for q in ("SELECT corgipile_predict(%s::bigint, ROW(1.0::float8)) FROM pc_score t",
              "SELECT corgipile_predict(%s::bigint, sub) FROM (SELECT * FROM pc_score OFFSET 0) sub",
              "SELECT corgipile_predict(q.m, t) FROM pc_score t, (SELECT %s::bigint AS m OFFSET 0) q"):
        assert not rewritten(conn, q, (m,)), q
    # A model trained on arrays: the row form's ERROR, word for word.
    e_fast = error_of(conn, "SELECT corgipile_predict(%s::bigint, t) FROM pc_other t", (world["arrays"],))
    e_slow = error_of(conn, "SELECT corgipile_predict(%s::bigint, sub) FROM (SELECT * FROM pc_other OFFSET 0) sub",
                      (world["arrays"],))
    assert e_fast is not None and str(e_fast) == str(e_slow), describe(e_fast)
    # A table without one of the model's columns: the row form's ERROR.
    e_fast = error_of(conn, "SELECT corgipile_predict(%s::bigint, t) FROM pc_other t", (m,))
    assert isinstance(e_fast, E.UndefinedColumn) and 'the row has no column "x"' in str(e_fast), describe(e_fast)
    # Unknown ids and names: the row form's ERROR.
    for model in (987654321, "pc_no_such_name"):
        e = error_of(conn, f"SELECT corgipile_predict({arg(model)}, t) FROM pc_score t", (model,))
        assert isinstance(e, E.UndefinedObject), describe(e)
    # NULL model: NULL, as the strict row form.
    assert scalar(conn, "SELECT count(corgipile_predict(NULL::bigint, t)) FROM pc_score t") == 0


def test_partitions_arrays_and_a_column_of_another_type(conn, world):
    m = world["logistic"]
    # A partitioned table whose partitions order (and drop) columns differently.
    conn.execute("DROP TABLE IF EXISTS pc_parts")
    conn.execute("CREATE TABLE pc_parts (LIKE pc_score) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE pc_parts_1 PARTITION OF pc_parts FOR VALUES FROM (MINVALUE) TO (200)")
    conn.execute("""CREATE TABLE pc_parts_2 (gone int, at date, e pc_plan, label bool, c char(4), b bool, v text,
                    d numeric, n bigint, x float8, id int, s text, junk text)""")
    conn.execute("ALTER TABLE pc_parts_2 DROP COLUMN gone")
    conn.execute("ALTER TABLE pc_parts ATTACH PARTITION pc_parts_2 FOR VALUES FROM (200) TO (MAXVALUE)")
    conn.execute("INSERT INTO pc_parts SELECT * FROM pc_score")
    try:
        fast, slow = by_row_and_by_columns(conn, "corgipile_predict_proba", m, table="pc_parts")
        assert fast == slow and len(fast) == 400
        assert fast == by_row_and_by_columns(conn, "corgipile_predict_proba", m)[0]
    finally:
        conn.execute("DROP TABLE pc_parts")
    # An array column in a column list (read as the row form reads it).
    listed = train(conn, "pc_other", "logistic", defaults=BASE, features=["f"])
    fast, slow = by_row_and_by_columns(conn, "corgipile_decision_function", listed, table="pc_other")
    assert fast == slow and len(fast) == 500
    # A table whose column has a type the model cannot read: not rewritten, the row form's ERROR.
    conn.execute("DROP TABLE IF EXISTS pc_badtype")
    conn.execute("CREATE TABLE pc_badtype AS SELECT * FROM pc_score")
    conn.execute("ALTER TABLE pc_badtype ALTER COLUMN x TYPE text")
    try:
        q = "SELECT corgipile_predict(%s::bigint, t) FROM pc_badtype t"
        assert not rewritten(conn, q, (m,))
        e = error_of(conn, q, (m,))
        assert isinstance(e, E.DatatypeMismatch) and 'column "x" of the row has type text' in str(e), describe(e)
    finally:
        conn.execute("DROP TABLE pc_badtype")


def test_returning(conn, world):
    m = world["logistic"]
    expected_rows = by_row_and_by_columns(conn, "corgipile_predict_proba", m)[0][:5]
    with conn.transaction():
        q = "UPDATE pc_score t SET junk = 'k' WHERE id <= 5 RETURNING id, corgipile_predict_proba(%s::bigint, t)"
        assert rewritten(conn, q, (m,))
        assert sorted(conn.execute(q, (m,)).fetchall()) == expected_rows
        if int(scalar(conn, "SHOW server_version_num")) >= 180000:
            # RETURNING old of an inserted row is NULL as a whole (and new of a deleted one):
            # not rewritten, the row form's NULL.
            q = """INSERT INTO pc_score (id, x) VALUES (-1, 1.0)
                   RETURNING corgipile_predict(%s::bigint, old), corgipile_predict(%s::bigint, new)"""
            plan = explain(conn, q, (m, m))
            assert "_columns(" not in plan and "old.*" in plan, plan
            old, new = conn.execute(q, (m, m)).fetchone()
            assert old is None and new is not None
        raise psycopg.Rollback()
    assert scalar(conn, "SELECT count(*) FROM pc_score WHERE id < 0 OR junk = 'k'") == 0


def test_outer_joins_and_grouping_keep_null_rows_null(conn, world):
    m = world["logistic"]
    q = """SELECT g, corgipile_predict(%s::bigint, t) FROM generate_series(398, 402) g
           LEFT JOIN pc_score t ON t.id = g ORDER BY g"""
    assert not rewritten(conn, q, (m,))
    rows = conn.execute(q, (m,)).fetchall()
    assert [r[1] is None for r in rows] == [False, False, False, True, True]
    q = "SELECT corgipile_predict(%s::bigint, t) FROM pc_score t GROUP BY t ORDER BY 1 LIMIT 1"
    assert not rewritten(conn, q, (m,))
    assert conn.execute(q, (m,)).fetchone()[0] is not None
    # Grouped by another column, aggregated: rewritten, and the same sums.
    q = "SELECT b, sum(corgipile_decision_function(%s::bigint, t)) FROM pc_score t GROUP BY b ORDER BY b"
    assert rewritten(conn, q, (m,))
    slow = q.replace("pc_score t", "(SELECT * FROM pc_score OFFSET 0) t")
    assert conn.execute(q, (m,)).fetchall() == conn.execute(slow, (m,)).fetchall()


def test_per_group_models_are_not_rewritten(conn, world):
    conn.execute("""CREATE TABLE pc_groups AS SELECT i AS id, i % 4 AS store, (i % 7) * 1.5 AS price,
                    CASE WHEN i % 4 < 2 THEN (i % 7) > 3 ELSE (i % 7) <= 3 END AS label
                    FROM generate_series(1, 2000) i""")
    train(conn, "pc_groups", "logistic", defaults=BASE, features=["price"], group_by="store",
          name="pc_per_store")
    q = "SELECT id, corgipile_predict('pc_per_store', t) FROM pc_groups t ORDER BY id"
    assert not rewritten(conn, q)
    slow = q.replace("pc_groups t", "(SELECT * FROM pc_groups OFFSET 0) t")
    assert conn.execute(q).fetchall() == conn.execute(slow).fetchall()


def test_a_direct_call_matches_columns_by_name(conn, world):
    m = world["logistic"]
    base = scalar(conn, "SELECT corgipile_predict(%s::bigint, t) FROM pc_score t WHERE id = 3", (m,))
    names = ["at", "e", "c", "v", "s", "b", "d", "n", "x", "junk"]  # any order, extra ones
    direct = scalar(conn, f"""SELECT corgipile_predict_columns(%s::bigint, %s, {', '.join('t.' + n for n in names)})
                              FROM pc_score t WHERE id = 3""", (m, names))
    assert direct == base
    # A column of the model missing from the list (a plan made for another version): an ERROR
    # naming it, never a prediction.
    e = error_of(conn, "SELECT corgipile_predict_columns(%s::bigint, '{x,n}', t.x, t.n) FROM pc_score t", (m,))
    assert isinstance(e, E.UndefinedColumn) and '"d"' in str(e) and "run the statement again" in str(e.diag.message_hint), describe(e)
    e = error_of(conn, "SELECT corgipile_predict_columns(%s::bigint, '{x}', t.x, t.n) FROM pc_score t", (m,))
    assert isinstance(e, E.InvalidParameterValue), describe(e)
    e = error_of(conn, "SELECT corgipile_predict_columns(%s::bigint, %s, t.x, t.n, t.d, t.b, t.s, t.v, t.c, t.e, t.id)"
                       " FROM pc_score t", (m, FEATURES))
    assert isinstance(e, E.DatatypeMismatch) and '"at"' in str(e), describe(e)


# ---------------------------------------------------------------------------------------------
# Cached plans and a name deployed to a model with other columns

@pytest.fixture
def versions(conn, world):
    """On pc_cols: v1 of the name pc_swap reads a, b; v2 reads a, c (another column)."""
    conn.execute("DELETE FROM corgipile.models WHERE name = 'pc_swap'")
    v1 = train(conn, "pc_cols", "logistic", defaults=BASE, features=["a", "b"], name="pc_swap")
    v2 = train(conn, "pc_cols", "logistic", defaults=BASE, features=["a", "c"], name="pc_swap")
    conn.execute("SELECT corgipile_deploy('pc_swap', %s)", (v1,))
    yield v1, v2
    conn.execute("DELETE FROM corgipile.models WHERE name = 'pc_swap'")


SWAP = "SELECT sum(corgipile_decision_function('pc_swap', t)) FROM pc_cols t"


def expected(c, model):
    return scalar(c, "SELECT sum(corgipile_decision_function(%s::bigint, sub)) FROM (SELECT * FROM pc_cols OFFSET 0) sub",
                  (model,))


def test_a_prepared_statement_follows_a_deploy_in_the_same_session(conn, versions):
    v1, v2 = versions
    assert expected(conn, v1) != expected(conn, v2)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE pc_swap_q AS {SWAP}")
    try:
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
        assert "'{a,b}'::text[]" in explain(conn, "EXECUTE pc_swap_q")
        conn.execute("SELECT corgipile_deploy('pc_swap', %s)", (v2,))
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v2)
        assert "'{a,c}'::text[]" in explain(conn, "EXECUTE pc_swap_q")
        # Dropping the deployed version: the name stands for v1 again (pinned nothing, newest).
        conn.execute("SELECT corgipile_drop_model(%s::bigint)", (v2,))
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
        # A new version (a training) with the other column again.
        v3 = train(conn, "pc_cols", "logistic", defaults=BASE, features=["c", "a"], seed=3, name="pc_swap")
        conn.execute("SELECT corgipile_deploy('pc_swap')")  # unpin: the newest
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v3)
        # Inside one transaction, a deploy is seen by the next command.
        with conn.transaction():
            conn.execute("SELECT corgipile_deploy('pc_swap', %s)", (v1,))
            assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
    finally:
        conn.execute("DEALLOCATE pc_swap_q")
        conn.execute("RESET plan_cache_mode")


def test_cached_plans_follow_a_deploy_from_another_session(dsn, conn, versions):
    v1, v2 = versions
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE pc_swap_q AS {SWAP}")
    conn.execute(f"""CREATE OR REPLACE FUNCTION pc_swap_f() RETURNS float8 LANGUAGE plpgsql AS $$
                     BEGIN RETURN ({SWAP}); END $$""")
    try:
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
        assert scalar(conn, "SELECT pc_swap_f()") == expected(conn, v1)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT corgipile_deploy('pc_swap', %s)", (v2,))
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v2)
        assert scalar(conn, "SELECT pc_swap_f()") == expected(conn, v2)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT corgipile_drop_model(%s::bigint)", (v2,))
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
        assert scalar(conn, "SELECT pc_swap_f()") == expected(conn, v1)
    finally:
        conn.execute("DEALLOCATE pc_swap_q")
        conn.execute("DROP FUNCTION pc_swap_f()")
        conn.execute("RESET plan_cache_mode")


def test_a_deploy_inside_a_transaction_that_already_read_the_table(dsn, conn, versions):
    """PostgreSQL reads another session's invalidations when a transaction starts or takes a new
    lock: a READ COMMITTED transaction that already locked the table runs its cached plan once
    more after another session's deploy. The new version is used if the plan passed its columns;
    otherwise an ERROR says to run the statement again (never the old model's prediction)."""
    v1, v2 = versions
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE pc_swap_q AS {SWAP}")
    try:
        with conn.transaction():
            assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v1)
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("SELECT corgipile_deploy('pc_swap', %s)", (v2,))
            with pytest.raises(E.UndefinedColumn) as err:
                with conn.transaction():
                    conn.execute("EXECUTE pc_swap_q")
            assert "run the statement again" in err.value.diag.message_hint
        assert scalar(conn, "EXECUTE pc_swap_q") == expected(conn, v2)
    finally:
        conn.execute("DEALLOCATE pc_swap_q")
        conn.execute("RESET plan_cache_mode")


# ---------------------------------------------------------------------------------------------
# Privileges

@pytest.fixture(scope="module")
def roles(dsn, world):
    with psycopg.connect(dsn, autocommit=True) as admin:
        for r in (ALICE, BOB):
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
        admin.execute(f"GRANT SELECT ON pc_cols, pc_score TO {ALICE}, {BOB}")
        admin.execute(f"GRANT CREATE ON SCHEMA public TO {ALICE}")
    with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
        mid = train(alice, "pc_cols", "logistic", defaults=BASE, features=["a", "b"], name="secret")
    yield mid
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (ALICE,))
        admin.execute("DELETE FROM corgipile.model_grants WHERE owner = %s", (ALICE,))
        for r in (ALICE, BOB):
            drop_role(admin, r)


def errors_as(c, model):
    """(the rewritable statement's error, the row form's error) for `model`."""
    fast = error_of(c, f"SELECT sum(corgipile_predict({arg(model)}, t)) FROM pc_cols t", (model,))
    slow = error_of(c, f"SELECT sum(corgipile_predict({arg(model)}, sub)) FROM (SELECT * FROM pc_cols OFFSET 0) sub",
                    (model,))
    return fast, slow


def test_without_use_the_same_error_and_no_rewrite(dsn, roles):
    mid = roles
    with psycopg.connect(dsn, user=BOB, autocommit=True) as bob:
        for model in (mid, f"{ALICE}.secret"):
            fast, slow = errors_as(bob, model)
            assert isinstance(fast, E.UndefinedObject), describe(fast)
            assert str(fast) == str(slow)
            # Planning reveals nothing: no rewrite (the model's columns are not shown).
            assert not rewritten(bob, f"SELECT corgipile_predict({arg(model)}, t) FROM pc_cols t", (model,))
        with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
            alice.execute("SELECT corgipile_grant('secret', %s, 'use')", (BOB,))
        try:
            assert rewritten(bob, "SELECT corgipile_predict(%s::text, t) FROM pc_cols t", (f"{ALICE}.secret",))
            assert errors_as(bob, f"{ALICE}.secret") == (None, None)
            # A plan cached while the grant held checks again at execution once it is revoked.
            bob.execute("SET plan_cache_mode = force_generic_plan")
            bob.execute(f"PREPARE pc_priv AS SELECT sum(corgipile_predict('{ALICE}.secret', t)) FROM pc_cols t")
            assert scalar(bob, "EXECUTE pc_priv") is not None
            with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
                alice.execute("SELECT corgipile_revoke('secret', %s, 'use')", (BOB,))
            e = error_of(bob, "EXECUTE pc_priv")
            assert isinstance(e, E.UndefinedObject) and str(e) == str(errors_as(bob, f"{ALICE}.secret")[1]), describe(e)
        finally:
            bob.execute("DEALLOCATE ALL")
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("DELETE FROM corgipile.model_grants WHERE owner = %s", (ALICE,))


def test_a_plan_made_by_one_role_is_checked_for_the_role_that_runs_it(dsn, conn, roles):
    mid = roles
    with psycopg.connect(dsn, user=BOB, autocommit=True) as bob:
        row_error = str(errors_as(bob, mid)[1])
    # A cursor planned as alice (rewritten), fetched as bob: the rewritten call checks bob.
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {ALICE}")
        conn.execute("DECLARE pc_cur CURSOR FOR SELECT corgipile_predict(%s::bigint, t) FROM pc_cols t" % mid)
        assert "_columns(" in explain(conn, "SELECT corgipile_predict(%s::bigint, t) FROM pc_cols t" % mid)
        assert conn.execute("FETCH 1 FROM pc_cur").fetchone()[0] is not None
        conn.execute(f"SET LOCAL ROLE {BOB}")
        with pytest.raises(E.UndefinedObject) as err:
            with conn.transaction():  # a savepoint: the error must not end the outer block
                conn.execute("FETCH 1 FROM pc_cur")
        assert str(err.value) == row_error
    # A generic plan prepared as alice, executed as bob: planned again for bob (not rewritten),
    # the same error.
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"SET ROLE {ALICE}")
    try:
        conn.execute(f"PREPARE pc_roles AS SELECT sum(corgipile_predict({mid}::bigint, t)) FROM pc_cols t")
        assert scalar(conn, "EXECUTE pc_roles") is not None
        assert rewritten(conn, "EXECUTE pc_roles")
        conn.execute(f"SET ROLE {BOB}")
        assert not rewritten(conn, "EXECUTE pc_roles")  # planned again, for bob
        e = error_of(conn, "EXECUTE pc_roles")
        assert isinstance(e, E.UndefinedObject) and str(e) == row_error, describe(e)
    finally:
        conn.execute("RESET ROLE")
        conn.execute("DEALLOCATE pc_roles")
        conn.execute("RESET plan_cache_mode")


def test_security_definer_and_views(dsn, roles):
    mid = roles
    with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
        alice.execute(f"""CREATE OR REPLACE FUNCTION pc_definer() RETURNS float8 LANGUAGE plpgsql SECURITY DEFINER
                          AS $$ BEGIN RETURN (SELECT sum(corgipile_predict({mid}::bigint, t)) FROM pc_cols t); END $$""")
        alice.execute(f"CREATE OR REPLACE VIEW pc_view AS SELECT corgipile_predict({mid}::bigint, t) AS p FROM pc_cols t")
        alice.execute(f"GRANT EXECUTE ON FUNCTION pc_definer() TO {BOB}")
        alice.execute(f"GRANT SELECT ON pc_view TO {BOB}")
        own = scalar(alice, "SELECT pc_definer()")
        assert own == scalar(alice, "SELECT sum(p) FROM pc_view")
    try:
        with psycopg.connect(dsn, user=BOB, autocommit=True) as bob:
            # The definer's function runs as alice: her model.
            assert scalar(bob, "SELECT pc_definer()") == own
            # A view's functions run as the querying role: bob may not use the model.
            e = error_of(bob, "SELECT sum(p) FROM pc_view")
            assert isinstance(e, E.UndefinedObject), describe(e)
            assert str(e) == str(errors_as(bob, mid)[1])
    finally:
        with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
            alice.execute("DROP VIEW pc_view")
            alice.execute("DROP FUNCTION pc_definer()")


def test_column_privileges_still_cover_the_whole_row(dsn, conn, roles):
    """A whole-row reference needs SELECT on every column; the rewrite reads fewer columns but
    checks what the query asked for."""
    mid = roles
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"REVOKE SELECT ON pc_cols FROM {ALICE}")
        admin.execute(f"GRANT SELECT (id, a, b) ON pc_cols TO {ALICE}")
    try:
        with psycopg.connect(dsn, user=ALICE, autocommit=True) as alice:
            q = "SELECT sum(corgipile_predict(%s::bigint, t)) FROM pc_cols t"
            assert rewritten(conn, q, (mid,))  # the model reads a and b only
            e = error_of(alice, q, (mid,))
            assert isinstance(e, E.InsufficientPrivilege) and "pc_cols" in str(e), describe(e)
            # Naming the columns the role may read works.
            assert scalar(alice, "SELECT sum(corgipile_predict_columns(%s::bigint, '{a,b}', a, b)) FROM pc_cols",
                          (mid,)) is not None
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"REVOKE SELECT (id, a, b) ON pc_cols FROM {ALICE}")
            admin.execute(f"GRANT SELECT ON pc_cols TO {ALICE}")
