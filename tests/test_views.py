"""Training on views. A view over one table that is a projection and a filter (one PostgreSQL
could update automatically) is read through its base table's block scan, with PostgreSQL's own
semantics: the rows are exactly `SELECT * FROM view`'s for the caller, privileges are the view
owner's on the base table (the caller's with security_invoker), and a security_barrier view's
qual runs before any filter from outside it that is not leakproof.

Checks: a view gives the bit-identical model of its base table with the view's qual as
`"where"`; nested views, column expressions, a security_barrier view, evaluate and workers over
views; a caller with SELECT on the view only trains through it, but not through a
security_invoker view; row-level security on the base table applies; joins, unions, DISTINCT
and LIMIT views are spilled into a temporary table first (test_queries) and train on exactly
their rows.
"""

import pytest
from psycopg.types.json import Jsonb

from helpers import (connect, describe, drop_role, models_count, rows_trained, scalar, train, train_error,
                     train_with_workers)
from tables import points, replicate

OWNER = "vw_owner"
CALLER = "vw_caller"
BASE = {"epochs": 2, "seed": 777, "verbose": False, "buffer_size": 300, "block_size": 2}
ROWS = 5000


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        for r in (OWNER, CALLER):
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
            admin.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {r}")
        points(admin, "vb", ROWS, extra=["(i * 13) % 100 AS x", "(ARRAY['a', 'b', 'c'])[1 + i % 3] AS region"])
        admin.execute("CREATE VIEW vb_south AS SELECT id, features, label FROM vb WHERE region = 'b'")
        admin.execute("CREATE VIEW vb_nested AS SELECT * FROM vb_south WHERE id > 1000")
        admin.execute("""CREATE VIEW vb_expr AS SELECT id, x / 10.0 AS x_scaled, x * x AS x_sq,
                                label = 1 AS positive FROM vb WHERE region <> 'c'""")
        admin.execute("""CREATE VIEW vb_barrier WITH (security_barrier) AS
                           SELECT id, features, label FROM vb WHERE region = 'b'""")
    yield db
    with connect(db) as admin:
        for r in (OWNER, CALLER):
            admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (r,))
            drop_role(admin, r)


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def models_equal(c, a, b):
    return scalar(c, """SELECT x.weights = y.weights AND x.bias = y.bias
                        FROM corgipile.models x, corgipile.models y WHERE x.id = %s AND y.id = %s""", (a, b))


def test_view_is_its_table_with_its_qual(env, admin):
    view = train(admin, "vb_south", "logistic", BASE)
    table = train(admin, "vb", "logistic", dict(BASE, where="region = 'b'"))
    assert rows_trained(admin, view) == scalar(admin, "SELECT count(*) FROM vb_south") == rows_trained(admin, table)
    assert models_equal(admin, view, table), "the view's model differs from its table's with the same filter"
    assert scalar(admin, "SELECT relation FROM corgipile.models WHERE id = %s", (view,)) == "public.vb_south"
    plan = "\n".join(r[0] for r in admin.execute(
        "SELECT * FROM corgipile_explain('vb_south', 'logistic', %s)", (Jsonb(BASE),)))
    assert "BlockShuffle) on vb" in plan and "Filter: (region = 'b'::text)" in plan, plan
    # A "where" over the view adds to its qual; evaluate reads the view's rows.
    both = train(admin, "vb_south", "logistic", dict(BASE, where="id > 2000"))
    assert rows_trained(admin, both) == scalar(admin, "SELECT count(*) FROM vb_south WHERE id > 2000")
    report = scalar(admin, "SELECT corgipile_evaluate(%s, 'vb_south')", (view,))
    assert report["rows_scored"] == scalar(admin, "SELECT count(*) FROM vb_south")


def test_nested_view_and_column_expressions(env, admin):
    nested = train(admin, "vb_nested", "logistic", BASE)
    assert rows_trained(admin, nested) == scalar(admin, "SELECT count(*) FROM vb_nested")
    expr = train(admin, "vb_expr", "logistic", dict(BASE, features=["x_scaled", "x_sq"], label="positive"))
    assert rows_trained(admin, expr) == scalar(admin, "SELECT count(*) FROM vb_expr")
    cols = scalar(admin, "SELECT features FROM corgipile.models WHERE id = %s", (expr,))
    assert cols == ["x_scaled", "x_sq"]
    # A row of the view predicts with the model's columns.
    assert scalar(admin, "SELECT count(corgipile_predict(%s, v)) FROM vb_expr v", (expr,)) == rows_trained(admin, expr)


def test_security_barrier_view(env, admin):
    plain = train(admin, "vb_south", "logistic", BASE)
    barrier = train(admin, "vb_barrier", "logistic", BASE)
    assert models_equal(admin, plain, barrier)
    # A leakproof filter (integer comparison) goes below the barrier: still one block scan.
    narrowed = train(admin, "vb_barrier", "logistic", dict(BASE, where="id > 2500"))
    assert rows_trained(admin, narrowed) == scalar(admin, "SELECT count(*) FROM vb_barrier WHERE id > 2500")
    # A filter with a function that is not leakproof would run above the barrier: refused.
    admin.execute("""CREATE OR REPLACE FUNCTION vb_peek(i int) RETURNS boolean LANGUAGE plpgsql STABLE AS
                     $$ BEGIN RAISE NOTICE 'peek %', i; RETURN true; END $$""")
    before = models_count(admin)
    e = train_error(admin, "vb_barrier", "logistic", dict(BASE, where="vb_peek(id)"))
    assert e is not None and e.sqlstate == "0A000", describe(e)
    assert "security_barrier" in (e.diag.message_hint or ""), describe(e)
    assert models_count(admin) == before


def test_view_owner_rights_and_security_invoker(env, admin):
    admin.execute("DROP VIEW IF EXISTS vb_owned, vb_invoker")
    admin.execute(f"GRANT SELECT ON vb TO {OWNER}")
    admin.execute("ALTER TABLE vb ENABLE ROW LEVEL SECURITY")
    admin.execute("DROP POLICY IF EXISTS vb_owner_half ON vb")
    admin.execute(f"CREATE POLICY vb_owner_half ON vb FOR SELECT TO {OWNER} USING (id % 2 = 0 OR id % 5 = 0)")
    try:
        with connect(env, user=OWNER) as owner:
            owner.execute("CREATE VIEW vb_owned AS SELECT id, features, label FROM vb WHERE x < 70")
            owner.execute("CREATE VIEW vb_invoker WITH (security_invoker) AS SELECT id, features, label FROM vb")
            owner.execute(f"GRANT SELECT ON vb_owned, vb_invoker TO {CALLER}")
        with connect(env, user=CALLER) as caller:
            expected = scalar(caller, "SELECT count(*) FROM vb_owned")
            # The view owner's policy applies (a superuser would see every row).
            assert 0 < expected < scalar(admin, "SELECT count(*) FROM vb WHERE x < 70")
            model = train(caller, "vb_owned", "logistic", BASE)
            assert rows_trained(caller, model) == expected
            for relation in ("vb", "vb_invoker"):
                e = train_error(caller, relation, "logistic", BASE)
                assert e is not None and e.sqlstate == "42501", f"{relation}: {describe(e)}"
    finally:
        admin.execute("DROP VIEW IF EXISTS vb_owned, vb_invoker")
        admin.execute("DROP POLICY IF EXISTS vb_owner_half ON vb")
        admin.execute("ALTER TABLE vb DISABLE ROW LEVEL SECURITY")
        admin.execute(f"REVOKE SELECT ON vb FROM {OWNER}")


def test_workers_over_a_view(env, admin):
    admin.execute("DROP TABLE IF EXISTS vb_big CASCADE")
    replicate(admin, "vb_big", "vb", 8)
    admin.execute("CREATE VIEW vb_big_ab AS SELECT id, features, label FROM vb_big WHERE region <> 'c'")
    model = train_with_workers(admin, "vb_big_ab", "logistic", {"epochs": 2, "seed": 3, "workers": 1})
    assert rows_trained(admin, model) == scalar(admin, "SELECT count(*) FROM vb_big_ab")


@pytest.mark.parametrize("body", [
    "SELECT a.id, a.features, b.label FROM vb a JOIN vb b USING (id)",
    "SELECT id, features, label FROM vb UNION ALL SELECT id, features, label FROM vb",
    "SELECT DISTINCT id, features, label FROM vb",
    "SELECT id, features, label FROM vb ORDER BY id LIMIT 1000",
], ids=["join", "union", "distinct", "limit"])
def test_other_views_are_spilled_first(env, admin, body):
    # Not a block scan of one table: the rows are spilled through the pile shuffle into a
    # temporary table first (see test_queries), exactly the view's rows.
    admin.execute("DROP VIEW IF EXISTS vb_complex")
    admin.execute(f"CREATE VIEW vb_complex AS {body}")
    model = train(admin, "vb_complex", "logistic", BASE)
    assert rows_trained(admin, model) == scalar(admin, "SELECT count(*) FROM vb_complex")
    # Evaluating on one is refused, saying what to do.
    e = None
    try:
        admin.execute("SELECT corgipile_evaluate(%s, 'vb_complex')", (model,))
    except Exception as err:
        e = err
    assert e is not None and e.sqlstate == "0A000" and "CREATE TABLE" in (e.diag.message_hint or ""), describe(e)
