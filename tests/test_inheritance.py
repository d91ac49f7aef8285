"""A table with inheritance children is read as SELECT reads it: the parent's own rows and every
child's (and grandchild's), their page-blocks pooled into one shuffle, the children's rows
converted to the parent's columns (extra columns left out, another column order mapped by name).
"only": true reads the named table's own rows (as FROM ONLY)."""

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from helpers import evaluate, rows_trained, scalar, train

TRAIN = {"features": "f", "label": "y", "verbose": False, "epochs": 1, "seed": 1}


def params(**extra):
    return Jsonb({**TRAIN, **extra})


def traced_ids(c, rel, **extra):
    """f[1] of every row corgipile_trace visits (f[1] is the row's id in these tables)."""
    return sorted(int(r[0]) for r in c.execute("SELECT first_feature FROM corgipile_trace(%s::regclass, %s)",
                                               (rel, params(**extra))))


def explain_field(c, rel, key, **extra):
    lines = [r[0] for r in c.execute("SELECT * FROM corgipile_explain(%s::regclass, 'svm', %s)",
                                     (rel, params(**extra)))]
    return [ln.split(": ", 1)[1] for ln in lines if ln.strip().startswith(key + ": ")]


def pages(c, *rels):
    return sum(scalar(c, "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (r,))
               for r in rels)


@pytest.fixture(scope="module")
def family(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS inh_parent CASCADE")
        c.execute("CREATE TABLE inh_parent (id int, f float8[], y int)")
        c.execute("CREATE TABLE inh_child () INHERITS (inh_parent)")
        # f[1] is the id; ids 1-300 in the parent, 301-1000 in the child.
        c.execute("INSERT INTO inh_parent SELECT i, ARRAY[i, i % 3, i % 5]::float8[], i % 2 FROM generate_series(1, 300) i")
        c.execute("INSERT INTO inh_child SELECT i, ARRAY[i, i % 3, i % 5]::float8[], (i % 3 = 0)::int FROM generate_series(301, 1000) i")
    yield "inh_parent"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE inh_parent CASCADE")


def test_parent_reads_its_children_too(conn, family):
    assert rows_trained(conn, train(conn, "inh_parent", defaults=TRAIN)) == 1000
    assert traced_ids(conn, "inh_parent") == list(range(1, 1001))
    assert explain_field(conn, "inh_parent", "Tables") == ["2"]
    assert explain_field(conn, "inh_parent", "Table Pages") == [str(pages(conn, "inh_parent", "inh_child"))]


def test_only_reads_the_parents_own_rows(conn, family):
    assert rows_trained(conn, train(conn, "inh_parent", only=True, defaults=TRAIN)) == 300
    assert traced_ids(conn, "inh_parent", only=True) == list(range(1, 301))
    assert explain_field(conn, "inh_parent", "Tables", only=True) == []
    assert explain_field(conn, "inh_parent", "Table Pages", only=True) == [str(pages(conn, "inh_parent"))]


def test_a_child_alone_is_read_as_usual(conn, family):
    assert rows_trained(conn, train(conn, "inh_child", defaults=TRAIN)) == 700
    assert traced_ids(conn, "inh_child") == list(range(301, 1001))
    assert explain_field(conn, "inh_child", "Tables") == []


def test_evaluate_with_and_without_only(conn, family):
    model = train(conn, "inh_parent", "logistic", epochs=3, defaults=TRAIN)
    everything, own = evaluate(conn, model, "inh_parent"), evaluate(conn, model, "inh_parent", {"only": True})
    assert everything["rows_scored"] == 1000 and own["rows_scored"] == 300
    # The same rows as SELECT ... FROM inh_parent and FROM ONLY inh_parent, scored row by row.
    for result, from_clause in ((everything, "inh_parent"), (own, "ONLY inh_parent")):
        expected = scalar(conn, f"SELECT avg((corgipile_predict(%s::bigint, f) = y)::int::float8) FROM {from_clause}",
                          (model,))
        assert result["accuracy"] == pytest.approx(expected, abs=1e-12), from_clause
    assert everything["accuracy"] != own["accuracy"]  # the child's labels follow another rule


def test_select_on_the_parent_reads_the_children(dsn, conn, family):
    """As SELECT ... FROM parent: no privilege on the child is needed."""
    role = "cpi_reader"
    try:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON inh_parent TO {role}")
        with psycopg.connect(dsn, user=role, autocommit=True) as r:
            assert rows_trained(r, train(r, "inh_parent", defaults=TRAIN)) == 1000
            with pytest.raises(E.InsufficientPrivilege):
                train(r, "inh_child", defaults=TRAIN)
    finally:
        conn.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (role,))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def extra_columns(conn):
    """A child with an extra column, and one created apart (another column order, a dropped
    column, an extra one) that joined the family with ALTER TABLE ... INHERIT."""
    conn.execute("DROP TABLE IF EXISTS inh_wide, inh_wide_plain CASCADE")
    conn.execute("CREATE TABLE inh_wide (id int, x float8, c text, y int)")
    conn.execute("CREATE TABLE inh_wide_extra (extra text) INHERITS (inh_wide)")
    conn.execute("CREATE TABLE inh_wide_apart (y int, note text, junk int, c text, x float8, id int)")
    conn.execute("ALTER TABLE inh_wide_apart DROP COLUMN junk")
    conn.execute("ALTER TABLE inh_wide_apart INHERIT inh_wide")
    conn.execute("SELECT setseed(0.6)")
    rows = """SELECT i, y + 1.5 * (random() - 0.5) * 2,
                     CASE WHEN random() < 0.6 THEN (ARRAY['cat', 'dog'])[1 + y] ELSE 'bird' END, y
              FROM (SELECT i, (random() < 0.5)::int AS y FROM generate_series(%s::int, %s::int) i) s"""
    conn.execute(f"INSERT INTO inh_wide (id, x, c, y) {rows}", (1, 500))
    conn.execute(f"INSERT INTO inh_wide_extra (id, x, c, y) {rows}", (501, 1500))
    conn.execute(f"INSERT INTO inh_wide_apart (id, x, c, y) {rows}", (1501, 2000))
    conn.execute("UPDATE inh_wide_extra SET extra = 'e' || id")
    conn.execute("UPDATE inh_wide_apart SET note = 'n' || id")
    conn.execute("VACUUM FULL inh_wide_extra")
    conn.execute("VACUUM FULL inh_wide_apart")
    # The same rows as one plain table, in the order the tables are read (parent, then the
    # children by OID), each in storage order.
    conn.execute("CREATE TABLE inh_wide_plain AS SELECT id, x, c, y FROM inh_wide ORDER BY tableoid::oid, ctid")
    try:
        yield
    finally:
        conn.execute("DROP TABLE IF EXISTS inh_wide, inh_wide_plain CASCADE")


def test_children_with_extra_columns_and_another_order(conn, extra_columns):
    p = {"features": "*", "exclude": ["id"], "label": "y", "verbose": False, "epochs": 2, "seed": 3,
         "shuffle": "no_shuffle", "buffer_size": 300}
    fam = scalar(conn, "SELECT corgipile_train('inh_wide', 'logistic', %s)", (Jsonb(p),))
    plain = scalar(conn, "SELECT corgipile_train('inh_wide_plain', 'logistic', %s)", (Jsonb(p),))
    got = conn.execute("""SELECT rows_trained, weights, bias, preprocessing FROM corgipile.models
                          WHERE id = ANY(%s) ORDER BY id""", ([fam, plain],)).fetchall()
    assert got[0][0] == got[1][0] == 2000
    # The parent's columns only (not extra, not note), and read in the same order: the same model.
    assert [col["name"] for col in got[0][3]["columns"]] == ["x", "c"]
    assert got[0][1:] == got[1][1:]
    assert evaluate(conn, fam, "inh_wide")["rows_scored"] == 2000
    assert evaluate(conn, fam, "inh_wide", {"only": True})["rows_scored"] == 500
    assert scalar(conn, "SELECT count(*) FROM corgipile_explain('inh_wide', 'svm', %s) e WHERE e ~ 'Tables: 3'",
                  (Jsonb(p),)) == 1
    # The default strategy on the family: as good as on the plain copy.
    del p["shuffle"], p["buffer_size"]
    fam_acc = evaluate(conn, scalar(conn, "SELECT corgipile_train('inh_wide', 'logistic', %s)", (Jsonb(p),)),
                       "inh_wide_plain")["accuracy"]
    plain_acc = evaluate(conn, plain, "inh_wide_plain")["accuracy"]
    assert plain_acc > 0.8 and abs(fam_acc - plain_acc) <= 0.02, (fam_acc, plain_acc)


@pytest.fixture
def three_generations(conn):
    conn.execute("DROP TABLE IF EXISTS inh_gp CASCADE")
    conn.execute("CREATE TABLE inh_gp (id int, f float8[], y int)")
    conn.execute("CREATE TABLE inh_p (born date) INHERITS (inh_gp)")
    conn.execute("CREATE TABLE inh_c (nick text) INHERITS (inh_p)")
    for table, lo, hi in (("inh_gp", 1, 100), ("inh_p", 101, 400), ("inh_c", 401, 1000)):
        conn.execute(f"INSERT INTO {table} (id, f, y) SELECT i, ARRAY[i, i %% 7]::float8[], i %% 2 "
                     "FROM generate_series(%s::int, %s::int) i", (lo, hi))
    try:
        yield
    finally:
        conn.execute("DROP TABLE IF EXISTS inh_gp CASCADE")


def test_grandchildren(conn, three_generations):
    assert rows_trained(conn, train(conn, "inh_gp", defaults=TRAIN)) == 1000
    assert traced_ids(conn, "inh_gp") == list(range(1, 1001))
    assert explain_field(conn, "inh_gp", "Tables") == ["3"]
    assert explain_field(conn, "inh_gp", "Table Pages") == [str(pages(conn, "inh_gp", "inh_p", "inh_c"))]
    # The middle generation: its rows and its child's; "only" its own.
    assert rows_trained(conn, train(conn, "inh_p", defaults=TRAIN)) == 900
    assert traced_ids(conn, "inh_p") == list(range(101, 1001))
    assert explain_field(conn, "inh_p", "Tables") == ["2"]
    assert rows_trained(conn, train(conn, "inh_p", only=True, defaults=TRAIN)) == 300
    assert rows_trained(conn, train(conn, "inh_gp", only=True, defaults=TRAIN)) == 100
    model = train(conn, "inh_gp", "logistic", defaults=TRAIN)
    assert evaluate(conn, model, "inh_gp")["rows_scored"] == 1000
    assert evaluate(conn, model, "inh_p", {"only": True})["rows_scored"] == 300


def test_another_sessions_temporary_child_is_skipped_as_select_skips_it(dsn, conn, family):
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("CREATE TEMP TABLE inh_temp_child () INHERITS (inh_parent)")
        other.execute("INSERT INTO inh_temp_child SELECT i, ARRAY[i, 0, 0]::float8[], i % 2 FROM generate_series(2001, 2100) i")
        assert scalar(other, "SELECT count(*) FROM inh_parent") == 1100  # its own session reads it
        assert scalar(conn, "SELECT count(*) FROM inh_parent") == 1000  # another session does not
        assert rows_trained(conn, train(conn, "inh_parent", defaults=TRAIN)) == 1000
