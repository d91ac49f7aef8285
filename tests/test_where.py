"""The "where" param: train (and evaluate) on the rows a boolean SQL expression selects.

What a user depends on:
* the rows trained are exactly `SELECT ... WHERE <filter>`'s (with row-level security on top);
* the page reader evaluates the filter on the rows it decodes and gives the same model, bit for
  bit, as the executor path (forced here as in test_reader: a policy on `ctid`, a system column,
  sends the scan to ExecScan) — on a plain table, a partitioned one whose partitions order their
  columns differently, and rows older than a column the filter reads (PostgreSQL's slow deform);
* the filter is checked like the validation predicate (one expression, no subquery, aggregate,
  window, set-returning or volatile function) and refused before any work with a clear SQLSTATE;
* a filter cannot see rows row-level security hides: a leaky function in it only ever sees the
  rows the policy lets through (the planner orders the policy first; the page reader keeps that
  order);
* a filter that selects nothing, or fails on a row (division by zero), is an ERROR that stores
  nothing; it is stored with the model's params, and evaluate, explain and workers take it too.
"""

import psycopg
import pytest
from psycopg.types.json import Jsonb

from helpers import connect, describe, drop_role, models_count, scalar, train, train_error
from tables import points, replicate

ROLE = "wh_reader"
SPY = "wh_spy"
ALWAYS_TRUE = "ctid <> '(0,0)'::tid"  # see test_reader: keeps the scan on the executor path
BASE = {"epochs": 2, "seed": 31337, "verbose": False, "buffer_size": 300, "block_size": 2}
ROWS = 6000


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        for r in (ROLE, SPY):
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
            admin.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {r}")
        points(admin, "wh", ROWS, extra=["(ARRAY['north', 'south', 'east'])[1 + i % 3] AS region",
                                         "CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 7) % 100 END AS score"])
        admin.execute(f"GRANT SELECT ON wh TO {ROLE}")
        admin.execute("ALTER TABLE wh ENABLE ROW LEVEL SECURITY")
        admin.execute(f"CREATE POLICY wh_every_row ON wh FOR SELECT TO {ROLE} USING ({ALWAYS_TRUE})")
    yield db
    with connect(db) as admin:
        for r in (ROLE, SPY):
            admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (r,))
            drop_role(admin, r)


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def plan_filters(c, table, params):
    lines = [r[0] for r in c.execute("SELECT * FROM corgipile_explain(%s::regclass, 'logistic', %s)",
                                     (table, Jsonb(params)))]
    return [line.strip() for line in lines if line.strip().startswith("Filter:")]


def same_model_both_paths(dsn, table, where, expected_rows):
    """Trains `table` with the filter as the owner (page reader) and as wh_reader (executor path,
    the ctid policy), asserts both trained `expected_rows` rows into bit-identical models."""
    params = dict(BASE, where=where)
    with connect(dsn) as owner, connect(dsn, user=ROLE) as role:
        owner_filters = plan_filters(owner, table, params)
        assert len(owner_filters) == 1 and "ctid" not in owner_filters[0], owner_filters
        role_filters = plan_filters(role, table, params)
        assert len(role_filters) == 1 and "ctid" in role_filters[0], role_filters
        a = train(owner, table, "logistic", params, defaults={})
        b = train(role, table, "logistic", params, defaults={})
        same, rows_a, rows_b, nonzero = owner.execute(
            """SELECT a.weights = b.weights AND a.bias = b.bias, a.rows_trained, b.rows_trained,
                      (SELECT bool_or(w <> 0) FROM unnest(a.weights) w)
               FROM corgipile.models a, corgipile.models b WHERE a.id = %s AND b.id = %s""", (a, b)).fetchone()
    assert (rows_a, rows_b) == (expected_rows, expected_rows)
    assert same, f"where {where!r}: the page reader's model differs from the executor path's"
    assert nonzero
    return a


@pytest.mark.parametrize("where", [
    "region = 'south'",                       # a text column that is not a feature
    "region <> 'east' AND id % 7 <> 3",       # two columns, AND
    "score > 40",                             # NULLs: a NULL result excludes the row
    "features[2] > 0.5 OR label = 0",         # the feature array itself
    "lower(region) LIKE 'n%' AND id BETWEEN 100 AND 4000",
])
def test_trains_exactly_the_selected_rows_on_both_paths(env, admin, where):
    expected = scalar(admin, f"SELECT count(*) FROM wh WHERE {where}")
    assert 0 < expected < ROWS
    model = same_model_both_paths(env, "wh", where, expected)
    assert scalar(admin, "SELECT params->>'where' FROM corgipile.models WHERE id = %s", (model,)) == where


def test_partitioned_table_with_reordered_columns(env, admin):
    # Partitions order (and drop) columns differently: the filter's columns are mapped per leaf.
    admin.execute("DROP TABLE IF EXISTS wh_parts")
    admin.execute("CREATE TABLE wh_parts (id int, features float8[], label int, region text) PARTITION BY RANGE (id)")
    admin.execute("CREATE TABLE wh_parts_a PARTITION OF wh_parts FOR VALUES FROM (MINVALUE) TO (3000)")
    admin.execute("CREATE TABLE wh_parts_b (junk int, region text, label int, features float8[], id int)")
    admin.execute("ALTER TABLE wh_parts_b DROP COLUMN junk")
    admin.execute("ALTER TABLE wh_parts ATTACH PARTITION wh_parts_b FOR VALUES FROM (3000) TO (MAXVALUE)")
    admin.execute("INSERT INTO wh_parts SELECT id, features, label, region FROM wh")
    admin.execute(f"GRANT SELECT ON wh_parts TO {ROLE}")
    admin.execute("ALTER TABLE wh_parts ENABLE ROW LEVEL SECURITY")
    admin.execute(f"CREATE POLICY wh_parts_every_row ON wh_parts FOR SELECT TO {ROLE} USING ({ALWAYS_TRUE})")
    where = "region = 'north' AND id % 5 <> 0"
    expected = scalar(admin, f"SELECT count(*) FROM wh_parts WHERE {where}")
    assert scalar(admin, f"SELECT count(*) FROM wh_parts_b WHERE {where}") > 0
    same_model_both_paths(env, "wh_parts", where, expected)


def test_filter_on_a_column_added_later(env, admin):
    # Rows older than the column have it only as a stored default: PostgreSQL deforms them.
    admin.execute("DROP TABLE IF EXISTS wh_added")
    admin.execute("CREATE TABLE wh_added AS SELECT id, features, label FROM wh")
    admin.execute("ALTER TABLE wh_added ADD COLUMN batch int DEFAULT 1")
    admin.execute("INSERT INTO wh_added SELECT id + 100000, features, label, 2 FROM wh WHERE id % 3 = 0")
    admin.execute(f"GRANT SELECT ON wh_added TO {ROLE}")
    admin.execute("ALTER TABLE wh_added ENABLE ROW LEVEL SECURITY")
    admin.execute(f"CREATE POLICY wh_added_every_row ON wh_added FOR SELECT TO {ROLE} USING ({ALWAYS_TRUE})")
    for where in ("batch = 1 AND id % 3 = 0", "batch = 2"):
        expected = scalar(admin, f"SELECT count(*) FROM wh_added WHERE {where}")
        same_model_both_paths(env, "wh_added", where, expected)


BAD_FILTERS = [
    # (id, filter, expected SQLSTATE or None for "any, but not XX000")
    ("injection", "true) x FROM pg_authid --", "42601"),
    ("second_statement", "true; DROP TABLE wh", "42601"),
    ("order_by", "id > 0 ORDER BY id", "42601"),
    ("subquery", "id IN (SELECT 1)", "0A000"),
    ("exists", "EXISTS (SELECT 1 FROM pg_class)", "0A000"),
    ("aggregate", "count(*) > 0", "42803"),
    ("window", "row_number() OVER () > 5", "42P20"),
    ("set_returning", "generate_series(1, 2) > 1", "0A000"),
    ("volatile", "random() < 0.2", "22023"),
    ("other_table", "pg_class.oid > 0", "42P01"),
    ("unknown_column", "no_such_column > 1", "42703"),
    ("non_boolean", "id + 1", "42804"),
    ("blank", "   ", "22023"),
    ("not_a_string", 5, "22023"),
    ("too_long", "id > 0 AND " * 1000 + "true", "22023"),
    ("parameter", "$1 > 0", None),
]


@pytest.mark.parametrize("where,code", [(w, c) for _, w, c in BAD_FILTERS], ids=[i for i, _, _ in BAD_FILTERS])
def test_bad_filter_is_refused_before_any_work(env, admin, where, code):
    before = models_count(admin)
    e = train_error(admin, "wh", "svm", {"epochs": 1, "where": where})
    assert e is not None, f"filter {where!r} was accepted"
    assert e.sqlstate is not None and not e.sqlstate.startswith("XX"), describe(e)
    if code is not None:
        assert e.sqlstate == code, describe(e)
    assert "where" in e.diag.message_primary, describe(e)
    assert models_count(admin) == before
    assert scalar(admin, "SELECT count(*) FROM wh") == ROWS


def test_filter_that_selects_nothing(env, admin):
    before = models_count(admin)
    e = train_error(admin, "wh", "svm", {"epochs": 1, "where": "region = 'nowhere'"})
    assert e is not None and e.sqlstate == "P0002", describe(e)
    assert "where" in e.diag.message_primary and "region" in e.diag.message_primary, describe(e)
    assert models_count(admin) == before


def test_filter_that_fails_on_a_row_stores_nothing(env, admin):
    before = models_count(admin)
    e = train_error(admin, "wh", "svm", {"epochs": 1, "where": "100 / (id - 4321) > -1000"})
    assert e is not None and e.sqlstate == "22012", describe(e)
    assert models_count(admin) == before
    assert scalar(admin, "SELECT 1") == 1


def test_filter_and_row_level_security_together(env, admin):
    # The spy sees only the rows its policy lets through; its filter narrows them further, and
    # a leaky function in the filter never sees a hidden row.
    admin.execute("DROP TABLE IF EXISTS wh_secret")
    admin.execute(f"""CREATE TABLE wh_secret AS SELECT id, features, label, region,
                         CASE WHEN id % 3 = 0 THEN '{SPY}' ELSE 'someone_else' END AS owner,
                         'secret-' || id AS secret FROM wh""")
    admin.execute(f"GRANT SELECT ON wh_secret TO {SPY}")
    admin.execute("ALTER TABLE wh_secret ENABLE ROW LEVEL SECURITY")
    admin.execute("CREATE POLICY wh_own_rows ON wh_secret FOR SELECT USING (owner = current_user)")
    with connect(env, user=SPY) as spy:
        spy.execute("""CREATE FUNCTION wh_leak(t text) RETURNS boolean LANGUAGE plpgsql STABLE COST 0.0001 AS
                       $$ BEGIN RAISE NOTICE 'saw %', t; RETURN true; END $$""")
        seen = []
        spy.add_notice_handler(lambda d: seen.append(d.message_primary))
        where = "id < 4000 AND public.wh_leak(secret)"
        expected = scalar(spy, f"SELECT count(*) FROM wh_secret WHERE {where}")
        visible = {r[0] for r in spy.execute("SELECT secret FROM wh_secret")}
        assert 0 < expected < len(visible) < ROWS
        seen.clear()
        model = train(spy, "wh_secret", "logistic", dict(BASE, where=where))
        assert scalar(spy, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model,)) == expected
        leaked = {m.removeprefix("saw ") for m in seen if m.startswith("saw ")}
        assert leaked, "the filter's function was never called"
        assert leaked <= visible, f"the filter saw rows row-level security hides: {sorted(leaked - visible)[:5]}"


def test_evaluate_explain_and_validation_take_the_filter(env, admin):
    where = "region = 'east'"
    model = train(admin, "wh", "logistic", dict(BASE, where=where))
    report = scalar(admin, "SELECT corgipile_evaluate(%s, 'wh', %s)", (model, Jsonb({"where": where})))
    assert report["rows_scored"] == scalar(admin, f"SELECT count(*) FROM wh WHERE {where}")
    whole = scalar(admin, "SELECT corgipile_evaluate(%s, 'wh')", (model,))
    assert whole["rows_scored"] == ROWS
    assert plan_filters(admin, "wh", {"where": where}) == ["Filter: (region = 'east'::text)"]
    # With a validation predicate: held-out rows are those of the filter's rows it selects.
    v = train(admin, "wh", "logistic", dict(BASE, where=where, validation={"predicate": "id % 5 = 0"}))
    held_out, trained = admin.execute(
        "SELECT (metrics->'validation'->>'rows')::bigint, rows_trained FROM corgipile.models WHERE id = %s",
        (v,)).fetchone()
    assert held_out == scalar(admin, f"SELECT count(*) FROM wh WHERE {where} AND id % 5 = 0")
    assert held_out + trained == scalar(admin, f"SELECT count(*) FROM wh WHERE {where}")
    # A model trained without a filter stores no "where" key.
    plain = train(admin, "wh", "logistic", dict(BASE))
    assert scalar(admin, "SELECT params ? 'where' FROM corgipile.models WHERE id = %s", (plain,)) is False


def test_filter_with_parallel_workers(env, admin):
    admin.execute("DROP TABLE IF EXISTS wh_big")
    replicate(admin, "wh_big", "wh", 10)
    where = "region <> 'north' AND score IS NOT NULL"
    expected = scalar(admin, f"SELECT count(*) FROM wh_big WHERE {where}")
    model = train(admin, "wh_big", "logistic", {"epochs": 2, "seed": 5, "workers": 1, "where": where})
    assert scalar(admin, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model,)) == expected


def test_filter_refused_by_evaluate_when_malformed(env, admin):
    model = train(admin, "wh", "logistic", dict(BASE))
    with pytest.raises(psycopg.Error) as e:
        admin.execute("SELECT corgipile_evaluate(%s, 'wh', %s)", (model, Jsonb({"where": "random() < 1"})))
    assert e.value.sqlstate == "22023" and "where" in e.value.diag.message_primary
