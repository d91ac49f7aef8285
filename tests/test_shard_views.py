"""Views over a sharded table (#55): a view of the sharded table's own columns (renamed or not)
and an optional WHERE trains on the shards, rewritten into the table's terms (its WHERE the
training's "where", AND the caller's); any other view is 0A000 before any shard is contacted.

Harness: test_shards.py's two shard servers (PGPORT+100, PGPORT+101, started and destroyed by its
`shards` fixture, imported here). shv_t is hash-partitioned by id over both (rows from a fixed
formula: x1, x2 in [-1, 1), a colour, label = x1 + x2 / 2 > 0 with some flipped, a `secret`
column the views leave out). shv_dead_t has a local partition and one on a server where nothing
listens: a training that contacted a shard would fail there with 08001.

Checked here:
- A view with renamed columns and a WHERE trains the model of the table with that "where" (same
  seed: the same weights to 1e-12, the same rows trained); a caller's "where" over the view's
  columns is added with AND; "features": "*" (with "exclude") reads the view's columns only and
  a per-column option names a view column; a validation predicate over the view's columns holds
  out the rows the table's predicate does.
- A "where" naming a column the view leaves out is an ERROR (42703), never a read of it.
- Refused before any shard is contacted (0A000, the capability row's message and hint, a
  detail naming what the view has): a join, an aggregate, a LIMIT, a computed column, a view of
  a view, a volatile WHERE. corgipile_evaluate on a simple view: 0A000 too (a stored model's
  functions read the sharded table itself).
- Privileges: a role with SELECT on the view but not on the table is refused (42501, a hint
  saying why: the shards read with the caller's rights on the table); without SELECT on the
  view, 42501 naming the view; with both, it trains. Nothing stored by a refused call."""

import psycopg
import pytest

from helpers import describe, error_of, evaluate, models_count, scalar, train, train_error
import test_shards
from test_shards import DEAD_PORT, S1, S2, SHARD_DB, on_shard, sharded_table, cluster_dir

pytestmark = pytest.mark.own_cluster  # test_shards.py's shard servers
shards = test_shards.shards  # its fixture: the two shard servers, foreign servers S1 and S2

ROWS = 8000
COLUMNS = "id int, x1 float8, x2 float8, color text, secret float8, label bool"
BASE = {"epochs": 3, "seed": 11, "verbose": False}
VIEW_WHERE = "x1 > -0.5 AND id % 7 <> 0"
ROW_MESSAGE = "this view over a sharded table cannot be read on its shards yet"
DEAD = "shv_dead"
ROLES = ("shv_viewer", "shv_reader", "shv_nobody")


def rows_sql(rows):
    return f"""SELECT i AS id, x1, x2, (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS color, i * 0.5 AS secret,
                      (x1 + x2 / 2 > 0) <> (i % 17 = 0) AS label
               FROM (SELECT i, ((i::bigint * 2654435761) % 100003) / 50001.5 - 1 AS x1,
                            ((i::bigint * 40503) % 9973) / 4986.5 - 1 AS x2
                     FROM generate_series(1, {rows}) i) g"""


def drop_roles(c):
    for role in ROLES:
        if scalar(c, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
            c.execute(f"DROP OWNED BY {role} CASCADE")
            c.execute(f"DROP ROLE {role}")


@pytest.fixture(scope="module")
def env(dsn, shards):
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS shv_part", f"CREATE TABLE shv_part ({COLUMNS})")
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "shv_t", [("FOR VALUES WITH (MODULUS 2, REMAINDER 0)", S1, "shv_part"),
                                   ("FOR VALUES WITH (MODULUS 2, REMAINDER 1)", S2, "shv_part")],
                      cols=COLUMNS, by="HASH (id)")
        c.execute(f"INSERT INTO shv_t {rows_sql(ROWS)}")
        c.execute(f"""CREATE VIEW shv_v AS SELECT id AS row_id, x1 AS a, x2 AS b, color AS c, label AS y
                      FROM shv_t WHERE {VIEW_WHERE}""")
        # A sharded table with a partition where nothing listens, and views of every refused shape.
        c.execute(f"DROP SERVER IF EXISTS {DEAD} CASCADE")
        c.execute(f"""CREATE SERVER {DEAD} FOREIGN DATA WRAPPER postgres_fdw
                      OPTIONS (host '{cluster_dir(DEAD_PORT)}', port '{DEAD_PORT}', dbname '{SHARD_DB}')""")
        c.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {DEAD} OPTIONS (user 'postgres')")
        sharded_table(c, "shv_dead_t", [("FOR VALUES WITH (MODULUS 2, REMAINDER 0)", DEAD, "shv_part"),
                                        ("FOR VALUES WITH (MODULUS 2, REMAINDER 1)", None, None)],
                      cols=COLUMNS, by="HASH (id)")
        c.execute("CREATE TABLE shv_colors AS SELECT 'red' AS color, 1.0 AS weight")
        drop_roles(c)
        for role in ROLES:
            c.execute(f"CREATE ROLE {role} LOGIN")
            for srv in (S1, S2):
                c.execute(f"GRANT USAGE ON FOREIGN SERVER {srv} TO {role}")
                c.execute(f"CREATE USER MAPPING FOR {role} SERVER {srv} "
                          "OPTIONS (user 'postgres', password_required 'false')")
        c.execute("GRANT SELECT ON shv_v TO shv_viewer, shv_reader")
        c.execute("GRANT SELECT ON shv_t TO shv_reader")
    for i in (0, 1):
        on_shard(i, "VACUUM ANALYZE shv_part")
    yield dsn
    with psycopg.connect(dsn, autocommit=True) as c:
        drop_roles(c)
        c.execute(f"DROP SERVER IF EXISTS {DEAD} CASCADE")
        c.execute("DROP TABLE IF EXISTS shv_t, shv_dead_t, shv_colors CASCADE")


@pytest.fixture
def c(env):
    with psycopg.connect(env, autocommit=True) as conn:
        yield conn


def model_row(c, model_id):
    return c.execute("SELECT weights, bias, rows_trained FROM corgipile.models WHERE id = %s",
                     (model_id,)).fetchone()


def assert_same_model(c, a, b):
    (wa, ba, ra), (wb, bb, rb) = model_row(c, a), model_row(c, b)
    assert ra == rb and ra > 0, (ra, rb)
    va, vb = wa + ba, wb + bb
    assert len(va) == len(vb) and max(map(abs, va)) > 0.05, (va, vb)
    assert all(abs(x - y) <= 1e-12 for x, y in zip(va, vb)), (va, vb)


def test_a_view_trains_the_table_with_its_where(c):
    view = train(c, "shv_v", "logistic", {**BASE, "features": ["a", "b"], "label": "y"})
    table = train(c, "shv_t", "logistic", {**BASE, "features": ["x1", "x2"], "label": "label", "where": VIEW_WHERE})
    assert_same_model(c, view, table)
    assert model_row(c, view)[2] == scalar(c, "SELECT count(*) FROM shv_v")
    # The model is the table's: its relation and columns, which the shards read.
    relation, features = c.execute("SELECT relation, params->'features' FROM corgipile.models WHERE id = %s",
                                   (view,)).fetchone()
    assert (relation, features) == ("public.shv_t", ["x1", "x2"])


def test_a_callers_where_over_the_view_is_added(c):
    view = train(c, "shv_v", "svm", {**BASE, "features": ["a", "b"], "label": "y", "where": "a < 0.8 AND c <> 'red'"})
    table = train(c, "shv_t", "svm", {**BASE, "features": ["x1", "x2"], "label": "label",
                                      "where": f"({VIEW_WHERE}) AND (x1 < 0.8 AND color <> 'red')"})
    assert_same_model(c, view, table)
    assert model_row(c, view)[2] == scalar(c, "SELECT count(*) FROM shv_v WHERE a < 0.8 AND c <> 'red'")


def test_every_column_of_the_view_with_options_and_a_validation_predicate(c):
    params = {**BASE, "validation": {"predicate": "row_id % 5 = 0"}}
    view = train(c, "shv_v", "logistic", {**params, "features": "*", "exclude": ["row_id"], "label": "y",
                                          "preprocess": {"c": {"encode": "hash", "buckets": 8}},
                                          "validation": {"predicate": "row_id % 5 = 0"}})
    table = train(c, "shv_t", "logistic", {**params, "features": ["x1", "x2", "color"], "label": "label",
                                           "preprocess": {"color": {"encode": "hash", "buckets": 8}},
                                           "where": VIEW_WHERE, "validation": {"predicate": "id % 5 = 0"}})
    assert_same_model(c, view, table)
    held_out = "SELECT metrics->'validation'->>'rows' FROM corgipile.models WHERE id = %s"
    assert scalar(c, held_out, (view,)) == scalar(c, held_out, (table,))


def test_a_where_cannot_name_a_column_the_view_leaves_out(c):
    before = models_count(c)
    e = train_error(c, "shv_v", "logistic", {**BASE, "features": ["a"], "label": "y", "where": "secret > 1"})
    assert e is not None and e.sqlstate == "42703", describe(e)
    assert "secret" in e.diag.message_primary, describe(e)
    e = train_error(c, "shv_v", "logistic", {**BASE, "features": ["secret"], "label": "y"})
    assert e is not None and e.sqlstate == "42703", describe(e)
    assert models_count(c) == before


REFUSED = {
    "a join": ("SELECT t.id, t.x1, t.label FROM shv_dead_t t JOIN shv_colors k USING (color)", "single table"),
    "an aggregate": ("SELECT color, avg(x1) AS x1, bool_or(label) AS label FROM shv_dead_t GROUP BY color", "GROUP BY"),
    "a limit": ("SELECT id, x1, label FROM shv_dead_t LIMIT 100", "LIMIT"),
    "a computed column": ("SELECT id, x1 * 2 AS x1, label FROM shv_dead_t", "computes its column \"x1\""),
    "a view of a view": ("SELECT * FROM shv_dead_simple", "reads shv_dead_simple, not the sharded table itself"),
    "a volatile where": ("SELECT id, x1, label FROM shv_dead_t WHERE random() < 0.5", "volatile"),
}


@pytest.mark.parametrize("shape", REFUSED)
def test_other_views_are_0A000_before_any_shard_is_contacted(c, shape):
    body, says = REFUSED[shape]
    c.execute("CREATE OR REPLACE VIEW shv_dead_simple AS SELECT id, x1, label FROM shv_dead_t")
    c.execute(f"CREATE VIEW shv_refused AS {body}")
    before = models_count(c)
    try:
        e = train_error(c, "shv_refused", "logistic", {**BASE, "features": ["x1"], "label": "label"})
        assert e is not None and e.sqlstate == "0A000", describe(e)
        assert e.diag.message_primary == ROW_MESSAGE, describe(e)
        assert says in e.diag.message_detail and "shv_refused" in e.diag.message_detail, describe(e)
        assert '"where"' in e.diag.message_hint, describe(e)
    finally:
        c.execute("DROP VIEW shv_refused")
    assert models_count(c) == before


def test_a_simple_view_contacts_the_shards(c):
    """The refusals above come before any connection: the simple view of the same table tries
    the dead server."""
    c.execute("CREATE OR REPLACE VIEW shv_dead_simple AS SELECT id, x1, label FROM shv_dead_t")
    e = train_error(c, "shv_dead_simple", "logistic", {**BASE, "features": ["x1"], "label": "label"})
    assert e is not None and e.sqlstate == "08001" and DEAD in e.diag.message_primary, describe(e)


def test_evaluate_on_a_view_names_the_table(c):
    m = train(c, "shv_t", "logistic", {**BASE, "features": ["x1", "x2"], "label": "label"})
    e = error_of(c, "SELECT corgipile_evaluate(%s, 'shv_v')", (m,))
    assert e is not None and e.sqlstate == "0A000", describe(e)
    assert e.diag.message_primary == ROW_MESSAGE and "stored model" in e.diag.message_detail, describe(e)
    # What to do instead: the table with the view's WHERE.
    assert evaluate(c, m, "shv_t", {"where": VIEW_WHERE})["rows_scored"] == scalar(c, "SELECT count(*) FROM shv_v")


def train_as(env, role, rel):
    with psycopg.connect(env, user=role, autocommit=True) as rc:
        return train_error(rc, rel, "logistic", {**BASE, "features": ["a", "b"], "label": "y"})


def test_a_role_needs_select_on_the_table_as_well_as_the_view(env, c):
    before = models_count(c)
    e = train_as(env, "shv_viewer", "shv_v")  # SELECT on the view only
    assert e is not None and e.sqlstate == "42501", describe(e)
    assert e.diag.message_primary == "permission denied for table shv_t", describe(e)
    assert "caller's rights on the table" in e.diag.message_hint, describe(e)
    e = train_as(env, "shv_nobody", "shv_v")  # no SELECT at all
    assert e is not None and e.sqlstate == "42501", describe(e)
    assert e.diag.message_primary == "permission denied for view shv_v", describe(e)
    assert models_count(c) == before
    assert train_as(env, "shv_reader", "shv_v") is None  # both: it trains
    assert models_count(c) == before + 1
