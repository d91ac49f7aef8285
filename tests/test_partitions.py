"""Partitioned tables are read as SELECT reads them: BlockShuffle pools the page-blocks of every
leaf table and visits them in one random order per epoch, converts the leaves' rows to the
parent's columns (column order, dropped columns), and takes privileges and row-level security
from the parent. Foreign partitions are an ERROR (0A000) naming the partition (but for
corgipile_train on a partitioned table, which trains on the shard servers: test_shards.py); "only": true on
a partitioned table is an ERROR (22023). EXPLAIN shows "Tables: N" on the BlockShuffle node.

Checked here: range and list partitioning with DEFAULT and empty partitions, partitions with
another column order and dropped columns (the model equals the one trained on a plain copy of
the same rows, where the row order or the page layout is the same), multi-level partitioning,
column lists with text columns, validation, corgipile_evaluate / _trace / _explain / _shuffle,
RLS and privileges, foreign partitions, "only", and the headline: a table partitioned by month
and clustered by label trains as well as a Shuffle Once copy.

System columns tableoid and ctid of converted rows are what SELECT sees, so an RLS policy or a
validation predicate on them agrees with SELECT."""

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from helpers import evaluate, explain, require_extension, scalar, train

QUIET = {"verbose": False}


# ----------------------------------------------------------------------------------------------
# helpers


def model(c, model_id):
    row = c.execute("""SELECT rows_trained, weights, bias, preprocessing, standardizer, metrics, features
                       FROM corgipile.models WHERE id = %s""", (model_id,)).fetchone()
    keys = ("rows_trained", "weights", "bias", "preprocessing", "standardizer", "metrics", "features")
    return dict(zip(keys, row))


def trace(c, rel, params):
    """(position, label, first feature) in the order SGD sees the rows in epoch 1."""
    return c.execute("SELECT position, label, first_feature FROM corgipile_trace(%s::regclass, %s) ORDER BY position",
                     (rel, Jsonb(params))).fetchall()


def field(lines, key):
    """The values of `key` in EXPLAIN text lines ("    Key: value")."""
    return [ln.split(": ", 1)[1] for ln in lines if ln.strip().startswith(key + ": ")]


def tree_pages(c, rel):
    """Pages of every table of a partition tree (partitioned tables have none)."""
    return scalar(c, """SELECT sum(pg_relation_size(relid) / current_setting('block_size')::int)::bigint
                        FROM pg_partition_tree(%s::regclass)""", (rel,))


def ids(c, query, params=None):
    return sorted(r[0] for r in c.execute(query, params))


def sql_accuracy(c, model_id, from_clause):
    """Accuracy of an array-feature model computed row by row with corgipile_predict."""
    return scalar(c, f"SELECT avg((corgipile_predict(%s::bigint, f) = y)::int::float8) FROM {from_clause}",
                  (model_id,))


# ----------------------------------------------------------------------------------------------
# range partitioning: a DEFAULT partition, an empty one, one with another column order and a
# dropped column


@pytest.fixture(scope="module")
def rng(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pt_rng, pt_rng_plain CASCADE")
        c.execute("CREATE TABLE pt_rng (id int, f float8[], y int) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE pt_rng_lo PARTITION OF pt_rng FOR VALUES FROM (1) TO (1001)")
        c.execute("CREATE TABLE pt_rng_mid (y int, junk text, f float8[], id int)")
        c.execute("ALTER TABLE pt_rng_mid DROP COLUMN junk")
        c.execute("ALTER TABLE pt_rng ATTACH PARTITION pt_rng_mid FOR VALUES FROM (1001) TO (2001)")
        c.execute("CREATE TABLE pt_rng_empty PARTITION OF pt_rng FOR VALUES FROM (10001) TO (20001)")
        c.execute("CREATE TABLE pt_rng_def PARTITION OF pt_rng DEFAULT")
        c.execute("SELECT setseed(0.25)")
        # f[1] is the id (for corgipile_trace), f[2] a noisy copy of the label.
        c.execute("""INSERT INTO pt_rng SELECT i, ARRAY[i, y + 0.8 * (random() - 0.5) * 2]::float8[], y
                     FROM (SELECT i, (random() < 0.5)::int AS y FROM generate_series(1, 3000) i) s""")
        # The same rows in the order the partitions are read (leaves by OID), stored plainly.
        c.execute("CREATE TABLE pt_rng_plain AS SELECT id, f, y FROM pt_rng ORDER BY tableoid::oid, ctid")
        c.execute("VACUUM ANALYZE pt_rng")
        c.execute("VACUUM ANALYZE pt_rng_plain")
        counts = dict(c.execute("SELECT tableoid::regclass::text, count(*) FROM pt_rng GROUP BY 1").fetchall())
        assert counts == {"pt_rng_lo": 1000, "pt_rng_mid": 1000, "pt_rng_def": 1000}, counts
    yield "pt_rng"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE pt_rng, pt_rng_plain CASCADE")


def test_range_partitions_every_row_once(conn, rng):
    m = train(conn, "pt_rng", "svm", {"features": "f", "label": "y", "epochs": 1, "seed": 3})
    assert model(conn, m)["rows_trained"] == 3000
    seen = trace(conn, "pt_rng", {"features": "f", "label": "y", "seed": 3})
    assert sorted(int(r[2]) for r in seen) == list(range(1, 3001))
    # Labels travel with their rows through the reordered partition (y is column 1 there).
    labels = dict(conn.execute("SELECT id, y FROM pt_rng").fetchall())
    assert all(labels[int(first)] == label for _, label, first in seen)


def test_range_no_shuffle_equals_a_plain_copy_in_the_same_order(conn, rng):
    params = {"features": "f", "label": "y", "epochs": 2, "seed": 4, "shuffle": "no_shuffle",
              "buffer_size": 400, "average": False}
    part, plain = model(conn, train(conn, "pt_rng", "logistic", params)), \
        model(conn, train(conn, "pt_rng_plain", "logistic", params))
    assert part["rows_trained"] == plain["rows_trained"] == 3000
    assert part["weights"] == plain["weights"] and part["bias"] == plain["bias"]
    assert part["standardizer"] == plain["standardizer"]
    # no_shuffle reads the leaves one after another, each in storage order.
    order = [int(r[2]) for r in trace(conn, "pt_rng", {"features": "f", "label": "y", "shuffle": "no_shuffle"})]
    assert order == [r[0] for r in conn.execute("SELECT id FROM pt_rng ORDER BY tableoid::oid, ctid")]


def test_range_explain_tables_and_pages(conn, rng):
    params = {"features": "f", "label": "y", "epochs": 2, "seed": 1}
    lines = explain(conn, "pt_rng", "svm", params)
    assert field(lines, "Tables") == ["4"]  # lo, mid, empty, default
    pages = tree_pages(conn, "pt_rng")
    assert pages > 0 and field(lines, "Table Pages") == [str(pages)]
    assert pages == sum(scalar(conn, "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (t,))
                        for t in ("pt_rng_lo", "pt_rng_mid", "pt_rng_empty", "pt_rng_def"))
    analyzed = explain(conn, "pt_rng", "svm", params, analyze=True)
    scanned = int(field(analyzed, "Epochs Scanned")[0])
    assert int(field(analyzed, "Pages Read")[0]) == pages * scanned
    assert field(analyzed, "Tuples Per Epoch") == ["3000"]
    # One table, the named one: no "Tables" line.
    for rel in ("pt_rng_plain", "pt_rng_mid"):
        assert field(explain(conn, rel, "svm", params), "Tables") == [], rel


def test_range_evaluate_reads_every_partition(conn, rng):
    m = train(conn, "pt_rng_plain", "logistic", {"features": "f", "label": "y", "epochs": 2, "seed": 2})
    r = evaluate(conn, m, "pt_rng")
    assert r["rows_scored"] == 3000
    assert r["accuracy"] == pytest.approx(sql_accuracy(conn, m, "pt_rng"), abs=1e-12)
    assert r["accuracy"] == pytest.approx(evaluate(conn, m, "pt_rng_plain")["accuracy"], abs=1e-12)
    assert evaluate(conn, m, "pt_rng_def")["rows_scored"] == 1000
    assert evaluate(conn, m, "pt_rng_empty")["rows_scored"] == 0


@pytest.mark.parametrize("call", [
    "SELECT corgipile_train('pt_rng', 'svm', %s)",
    "SELECT count(*) FROM corgipile_trace('pt_rng', %s)",
    "SELECT count(*) FROM corgipile_explain('pt_rng', 'svm', %s)",
])
def test_only_on_a_partitioned_table_is_an_error(conn, rng, call):
    with pytest.raises(E.InvalidParameterValue, match="partitioned table") as err:
        conn.execute(call, (Jsonb({**QUIET, "features": "f", "label": "y", "only": True}),))
    assert err.value.sqlstate == "22023"


def test_only_on_a_partitioned_table_is_an_error_in_evaluate(conn, rng):
    m = train(conn, "pt_rng_plain", "svm", {"features": "f", "label": "y", "epochs": 1, "seed": 1})
    with pytest.raises(E.InvalidParameterValue, match="partitioned table"):
        evaluate(conn, m, "pt_rng", {"only": True})
    # A leaf has no children: "only" reads it as usual.
    assert evaluate(conn, m, "pt_rng_mid", {"only": True})["rows_scored"] == 1000


# A leaf's row converted to the parent's columns keeps its tableoid and ctid (the virtual slot
# carries them), so quals and predicates on them select what SELECT selects.


@pytest.mark.parametrize("predicate", ["tableoid = 'pt_rng_mid'::regclass", "ctid < '(1,0)'::tid"])
def test_system_columns_in_a_validation_predicate(conn, rng, predicate):
    held = scalar(conn, f"SELECT count(*) FROM pt_rng WHERE {predicate}")
    assert 0 < held < 3000
    m = model(conn, train(conn, "pt_rng", "svm", {"features": "f", "label": "y", "epochs": 1, "seed": 1,
                                                  "validation": {"predicate": predicate}}))
    assert (m["rows_trained"], m["metrics"]["validation"]["rows"]) == (3000 - held, held)


# ----------------------------------------------------------------------------------------------
# list partitioning with text columns and a column list; partitions with reordered and dropped
# columns; DEFAULT and empty partitions


@pytest.fixture(scope="module")
def mix(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pt_mix, pt_mix_plain CASCADE")
        c.execute("CREATE TABLE pt_mix (id int, region text, a float8, b float8, c text, y int) PARTITION BY LIST (region)")
        c.execute("CREATE TABLE pt_mix_n PARTITION OF pt_mix FOR VALUES IN ('north')")
        c.execute("CREATE TABLE pt_mix_s (y int, junk1 bigint, c text, b float8, region text, junk2 text, a float8, id int)")
        c.execute("ALTER TABLE pt_mix_s DROP COLUMN junk1, DROP COLUMN junk2")
        c.execute("ALTER TABLE pt_mix ATTACH PARTITION pt_mix_s FOR VALUES IN ('south')")
        c.execute("CREATE TABLE pt_mix_e PARTITION OF pt_mix FOR VALUES IN ('east')")  # stays empty
        c.execute("CREATE TABLE pt_mix_d (c text, junk int, a float8, y int, id int, b float8, region text)")
        c.execute("ALTER TABLE pt_mix_d DROP COLUMN junk")
        c.execute("ALTER TABLE pt_mix ATTACH PARTITION pt_mix_d DEFAULT")
        c.execute("SELECT setseed(0.5)")
        c.execute("""INSERT INTO pt_mix
                     SELECT i, (ARRAY['north', 'south', 'west', 'up'])[1 + i % 4],
                            y * 1.0 + 1.2 * (random() - 0.5) * 2, 0.5 - y + 1.5 * (random() - 0.5) * 2,
                            CASE WHEN random() < 0.6 THEN (ARRAY['red', 'blue'])[1 + y]
                                 ELSE (ARRAY['red', 'green', 'blue'])[1 + (random() * 2.999)::int] END,
                            y
                     FROM (SELECT i, (random() < 0.5)::int AS y FROM generate_series(1, 4000) i) s""")
        c.execute("CREATE TABLE pt_mix_plain AS SELECT id, region, a, b, c, y FROM pt_mix ORDER BY tableoid::oid, ctid")
        c.execute("VACUUM ANALYZE pt_mix")
        c.execute("VACUUM ANALYZE pt_mix_plain")
        counts = dict(c.execute("SELECT tableoid::regclass::text, count(*) FROM pt_mix GROUP BY 1").fetchall())
        assert counts == {"pt_mix_n": 1000, "pt_mix_s": 1000, "pt_mix_d": 2000}, counts
    yield "pt_mix"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE pt_mix, pt_mix_plain CASCADE")


MIX = {"features": ["a", "b", "c"], "label": "y", "epochs": 2, "seed": 5}


def test_column_list_and_text_through_reordered_partitions(conn, mix):
    """With no_shuffle both tables are read in the same row order: every weight, the category
    list and the standardization must be the same, bit for bit."""
    params = {**MIX, "shuffle": "no_shuffle", "buffer_size": 500}
    part_id, plain_id = train(conn, "pt_mix", "logistic", params), train(conn, "pt_mix_plain", "logistic", params)
    part, plain = model(conn, part_id), model(conn, plain_id)
    assert part["rows_trained"] == plain["rows_trained"] == 4000
    assert part["weights"] == plain["weights"] and part["bias"] == plain["bias"]
    assert part["preprocessing"] == plain["preprocessing"]
    cats = next(col for col in part["preprocessing"]["columns"] if col["name"] == "c")["categories"]
    assert sorted(cats) == ["blue", "green", "red"]
    # Row predictions from the parent's rows agree with the plain copy's model, row for row.
    differ = scalar(conn, """SELECT count(*) FROM pt_mix r
                             WHERE corgipile_predict_proba(%s::bigint, r) <> corgipile_predict_proba(%s::bigint, r)""",
                    (part_id, plain_id))
    assert differ == 0
    assert evaluate(conn, part_id, "pt_mix") == {**evaluate(conn, plain_id, "pt_mix"), "model_id": part_id}


def test_column_list_corgipile_matches_the_plain_copy_in_accuracy(conn, mix):
    """The default strategy: other block layouts, so another (equally good) model."""
    part_id, plain_id = train(conn, "pt_mix", "logistic", MIX), train(conn, "pt_mix_plain", "logistic", MIX)
    assert model(conn, part_id)["rows_trained"] == 4000
    part_acc = evaluate(conn, part_id, "pt_mix_plain")["accuracy"]
    plain_acc = evaluate(conn, plain_id, "pt_mix_plain")["accuracy"]
    assert plain_acc > 0.8, plain_acc
    assert abs(part_acc - plain_acc) <= 0.01, (part_acc, plain_acc)


def test_star_features_are_the_parents_columns(conn, mix):
    m = train(conn, "pt_mix", "logistic", {"features": "*", "exclude": ["id", "region"], "label": "y",
                                          "epochs": 1, "seed": 1})
    row = model(conn, m)
    assert row["rows_trained"] == 4000
    assert [col["name"] for col in row["preprocessing"]["columns"]] == ["a", "b", "c"]


def test_validation_predicate_through_partitions(conn, mix):
    """The predicate names id, which sits elsewhere in two of the partitions."""
    held = scalar(conn, "SELECT count(*) FROM pt_mix WHERE id % 5 = 0")
    params = {**MIX, "shuffle": "no_shuffle", "buffer_size": 500, "validation": {"predicate": "id % 5 = 0"}}
    part_id, plain_id = train(conn, "pt_mix", "logistic", params), train(conn, "pt_mix_plain", "logistic", params)
    part, plain = model(conn, part_id), model(conn, plain_id)
    assert part["rows_trained"] == 4000 - held
    assert part["metrics"]["validation"]["rows"] == held
    assert part["weights"] == plain["weights"] and part["metrics"]["validation"] == plain["metrics"]["validation"]
    acc = [r[0] for r in conn.execute(
        "SELECT validation_accuracy FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (part_id,))]
    assert len(acc) == 2 and all(a is not None and a > 0.7 for a in acc), acc


def test_validation_fraction_through_partitions(conn, mix):
    m = model(conn, train(conn, "pt_mix", "logistic", {**MIX, "validation": {"fraction": 0.2}}))
    held = m["metrics"]["validation"]["rows"]
    assert m["rows_trained"] + held == 4000
    assert 500 <= held <= 1100, held


def test_shuffle_from_a_partitioned_source(conn, mix):
    conn.execute("DROP TABLE IF EXISTS pt_mix_shuffled")
    try:
        assert scalar(conn, "SELECT corgipile_shuffle('pt_mix'::regclass, 'pt_mix_shuffled', %s)",
                      (Jsonb({"seed": 9}),)) == 4000
        cols = [r[0] for r in conn.execute("""SELECT attname FROM pg_attribute WHERE attrelid = 'pt_mix_shuffled'::regclass
                                              AND attnum > 0 AND NOT attisdropped ORDER BY attnum""")]
        assert cols == ["id", "region", "a", "b", "c", "y"]
        assert scalar(conn, """SELECT count(*) FROM ((SELECT * FROM pt_mix EXCEPT ALL SELECT * FROM pt_mix_shuffled)
                               UNION ALL (SELECT * FROM pt_mix_shuffled EXCEPT ALL SELECT * FROM pt_mix)) d""") == 0
        # Shuffled across partitions: the first 400 rows stored come from every region.
        regions = scalar(conn, """SELECT count(DISTINCT region) FROM
                                  (SELECT region FROM pt_mix_shuffled ORDER BY ctid LIMIT 400) s""")
        assert regions == 4
    finally:
        conn.execute("DROP TABLE IF EXISTS pt_mix_shuffled")


# ----------------------------------------------------------------------------------------------
# the same page layout: a partitioned table whose only non-empty partition has the plain copy's
# pages (8-byte columns, so the reordered and dropped columns change no tuple's size) trains the
# very same model with the default strategy and a seed


def test_same_layout_same_model_with_the_default_strategy(conn):
    conn.execute("DROP TABLE IF EXISTS pt_lay, pt_lay_plain CASCADE")
    try:
        conn.execute("CREATE TABLE pt_lay (id bigint, a float8, b float8, y bigint) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE pt_lay_1 (b float8, junk bigint, y bigint, a float8, id bigint)")
        conn.execute("ALTER TABLE pt_lay_1 DROP COLUMN junk")
        conn.execute("ALTER TABLE pt_lay ATTACH PARTITION pt_lay_1 FOR VALUES FROM (0) TO (100000)")
        conn.execute("CREATE TABLE pt_lay_2 PARTITION OF pt_lay FOR VALUES FROM (100000) TO (200000)")
        conn.execute("CREATE TABLE pt_lay_plain (id bigint, a float8, b float8, y bigint)")
        conn.execute("SELECT setseed(0.3)")
        conn.execute("""INSERT INTO pt_lay SELECT i, (i / 2500) + 1.5 * random(), 1.5 * random() - (i / 2500), i / 2500
                        FROM generate_series(0, 4999) i""")  # clustered by label
        conn.execute("INSERT INTO pt_lay_plain SELECT id, a, b, y FROM pt_lay ORDER BY ctid")
        conn.execute("VACUUM pt_lay_1")
        conn.execute("VACUUM pt_lay_plain")
        pages = scalar(conn, "SELECT pg_relation_size('pt_lay_plain') / current_setting('block_size')::int")
        assert tree_pages(conn, "pt_lay") == pages > 10
        params = {"features": ["a", "b"], "label": "y", "epochs": 3, "seed": 11}
        part = model(conn, train(conn, "pt_lay", "svm", params))
        plain = model(conn, train(conn, "pt_lay_plain", "svm", params))
        assert part["rows_trained"] == plain["rows_trained"] == 5000
        assert part["weights"] == plain["weights"] and part["bias"] == plain["bias"]
        assert field(explain(conn, "pt_lay", "svm", params), "Tables") == ["2"]
    finally:
        conn.execute("DROP TABLE IF EXISTS pt_lay, pt_lay_plain CASCADE")


# ----------------------------------------------------------------------------------------------
# multi-level partitioning; a column dropped from the root after its first partition existed


@pytest.fixture(scope="module")
def multi(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pt_ml, pt_ml_plain CASCADE")
        c.execute("CREATE TABLE pt_ml (id int, legacy text, yr int, q int, f float8[], y int) PARTITION BY RANGE (yr)")
        c.execute("CREATE TABLE pt_ml_2023 PARTITION OF pt_ml FOR VALUES FROM (2023) TO (2024)")
        # The root and pt_ml_2023 keep a dropped attribute; partitions created later have none.
        c.execute("ALTER TABLE pt_ml DROP COLUMN legacy")
        c.execute("CREATE TABLE pt_ml_2024 PARTITION OF pt_ml FOR VALUES FROM (2024) TO (2025) PARTITION BY LIST (q)")
        c.execute("CREATE TABLE pt_ml_2024_q1 PARTITION OF pt_ml_2024 FOR VALUES IN (1)")
        c.execute("CREATE TABLE pt_ml_2024_q2 (f float8[], gone int, q int, y int, yr int, id int)")
        c.execute("ALTER TABLE pt_ml_2024_q2 DROP COLUMN gone")
        c.execute("ALTER TABLE pt_ml_2024 ATTACH PARTITION pt_ml_2024_q2 FOR VALUES IN (2)")
        c.execute("CREATE TABLE pt_ml_2024_rest PARTITION OF pt_ml_2024 DEFAULT")
        c.execute("SELECT setseed(0.125)")
        c.execute("""INSERT INTO pt_ml SELECT i, 2023 + (i > 1000)::int, 1 + i % 4,
                            ARRAY[i, y + 1.6 * (random() - 0.5) * 2, 1.6 * (random() - 0.5) * 2 - y]::float8[], y
                     FROM (SELECT i, (random() < 0.5)::int AS y FROM generate_series(1, 3000) i) s""")
        c.execute("CREATE TABLE pt_ml_plain AS SELECT * FROM pt_ml ORDER BY random()")
        c.execute("VACUUM ANALYZE pt_ml")
        counts = dict(c.execute("SELECT tableoid::regclass::text, count(*) FROM pt_ml GROUP BY 1").fetchall())
        assert counts == {"pt_ml_2023": 1000, "pt_ml_2024_q1": 500, "pt_ml_2024_q2": 500, "pt_ml_2024_rest": 1000}
    yield "pt_ml"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE pt_ml, pt_ml_plain CASCADE")


def test_multi_level_reads_every_leaf(conn, multi):
    params = {"features": "f", "label": "y", "epochs": 3, "seed": 8}
    m = train(conn, "pt_ml", "logistic", params)
    assert model(conn, m)["rows_trained"] == 3000
    assert sorted(int(r[2]) for r in trace(conn, "pt_ml", params)) == list(range(1, 3001))
    lines = explain(conn, "pt_ml", "logistic", params)
    assert field(lines, "Tables") == ["4"]
    assert field(lines, "Table Pages") == [str(tree_pages(conn, "pt_ml"))]
    ref = train(conn, "pt_ml_plain", "logistic", params)
    acc, ref_acc = evaluate(conn, m, "pt_ml")["accuracy"], evaluate(conn, ref, "pt_ml")["accuracy"]
    assert ref_acc > 0.75 and abs(acc - ref_acc) <= 0.015, (acc, ref_acc)
    assert evaluate(conn, m, "pt_ml")["rows_scored"] == 3000
    assert evaluate(conn, m, "pt_ml")["accuracy"] == pytest.approx(sql_accuracy(conn, m, "pt_ml"), abs=1e-12)


def test_a_sub_partitioned_partition_reads_its_own_leaves(conn, multi):
    params = {"features": "f", "label": "y", "epochs": 1, "seed": 8}
    m = train(conn, "pt_ml_2024", "logistic", params)
    assert model(conn, m)["rows_trained"] == 2000
    assert sorted(int(r[2]) for r in trace(conn, "pt_ml_2024", params)) == list(range(1001, 3001))
    lines = explain(conn, "pt_ml_2024", "logistic", params)
    assert field(lines, "Tables") == ["3"]
    assert field(lines, "Table Pages") == [str(tree_pages(conn, "pt_ml_2024"))]
    with pytest.raises(E.InvalidParameterValue):
        train(conn, "pt_ml_2024", "logistic", {**params, "only": True})


# ----------------------------------------------------------------------------------------------
# privileges and row-level security are the parent's


ROLES = ("cpp_reader", "cpp_nobody")


def drop_roles(admin):
    admin.execute("DELETE FROM corgipile.models WHERE trained_by = ANY(%s)", (list(ROLES),))
    for role in ROLES:
        if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def rls(dsn):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin)
        admin.execute("DROP TABLE IF EXISTS pt_rls CASCADE")
        for role in ROLES:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute("CREATE TABLE pt_rls (id int, grp text, f float8[], y int) PARTITION BY RANGE (id)")
        admin.execute("CREATE TABLE pt_rls_a PARTITION OF pt_rls FOR VALUES FROM (1) TO (1001)")
        admin.execute("CREATE TABLE pt_rls_b (f float8[], junk int, y int, grp text, id int)")
        admin.execute("ALTER TABLE pt_rls_b DROP COLUMN junk")
        admin.execute("ALTER TABLE pt_rls ATTACH PARTITION pt_rls_b FOR VALUES FROM (1001) TO (2001)")
        admin.execute("""INSERT INTO pt_rls SELECT i, CASE WHEN i % 4 = 0 THEN 'hidden' ELSE 'open' END,
                         ARRAY[i, i % 2 + (i % 7) / 7.0]::float8[], i % 2 FROM generate_series(1, 2000) i""")
        admin.execute("ALTER TABLE pt_rls ENABLE ROW LEVEL SECURITY")
        # grp is column 2 of the parent and column 4 of pt_rls_b: the policy sees converted rows.
        admin.execute("CREATE POLICY open_rows ON pt_rls FOR SELECT USING (grp = 'open')")
        # A partition's own RLS (no policy: a direct read sees nothing) plays no part through
        # the parent, as for SELECT.
        admin.execute("ALTER TABLE pt_rls_b ENABLE ROW LEVEL SECURITY")
        admin.execute("GRANT SELECT ON pt_rls TO cpp_reader")
        admin.execute("CREATE SCHEMA cpp_out AUTHORIZATION cpp_reader")
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS pt_rls CASCADE")
            drop_roles(admin)


def test_rls_and_privileges_come_from_the_parent(dsn, conn, rls):
    visible = [i for i in range(1, 2001) if i % 4 != 0]
    params = {"features": "f", "label": "y", "epochs": 1, "seed": 1}
    with psycopg.connect(dsn, user="cpp_reader", autocommit=True) as r:
        assert scalar(r, "SELECT count(*) FROM pt_rls") == len(visible) == 1500
        m = train(r, "pt_rls", "svm", params)
        assert model(r, m)["rows_trained"] == 1500
        assert sorted(int(t[2]) for t in trace(r, "pt_rls", params)) == visible
        assert evaluate(r, m, "pt_rls")["rows_scored"] == 1500
        assert field(explain(r, "pt_rls", "svm", params, analyze=True), "Tuples Per Epoch") == ["1500"]
        assert scalar(r, "SELECT corgipile_shuffle('pt_rls'::regclass, 'cpp_out.copy', %s)", (Jsonb({"seed": 1}),)) == 1500
        assert ids(r, "SELECT id FROM cpp_out.copy") == visible
        # No privilege on the partitions themselves: reading one directly fails, as SELECT does.
        with pytest.raises(E.InsufficientPrivilege):
            r.execute("SELECT count(*) FROM pt_rls_a")
        with pytest.raises(E.InsufficientPrivilege):
            train(r, "pt_rls_a", "svm", params)
    # The owner (a superuser here) is not subject to the policy.
    assert model(conn, train(conn, "pt_rls", "svm", params))["rows_trained"] == 2000


def test_rls_policy_on_tableoid(dsn, conn, rls):
    conn.execute("CREATE POLICY not_b ON pt_rls AS RESTRICTIVE FOR SELECT USING (tableoid <> 'pt_rls_b'::regclass)")
    with psycopg.connect(dsn, user="cpp_reader", autocommit=True) as r:
        visible = scalar(r, "SELECT count(*) FROM pt_rls")
        assert visible == 750  # the open rows of pt_rls_a
        m = train(r, "pt_rls", "svm", {"features": "f", "label": "y", "epochs": 1, "seed": 1})
        assert model(r, m)["rows_trained"] == visible


@pytest.mark.parametrize("call", [
    "SELECT corgipile_train('pt_rls', 'svm', %s)",
    "SELECT count(*) FROM corgipile_trace('pt_rls', %s)",
    "SELECT count(*) FROM corgipile_explain('pt_rls', 'svm', %s)",
    "SELECT corgipile_shuffle('pt_rls', 'cpp_nobody_copy', %s)",
])
def test_no_select_on_the_parent_is_insufficient_privilege(dsn, rls, call):
    params = Jsonb({"features": "f", "label": "y", "epochs": 1, "verbose": False})
    if "shuffle" in call:
        params = Jsonb({})
    with psycopg.connect(dsn, user="cpp_nobody", autocommit=True) as nobody:
        with pytest.raises(E.InsufficientPrivilege):
            nobody.execute(call, (params,))


# ----------------------------------------------------------------------------------------------
# foreign partitions / children


@pytest.fixture
def fdw(conn):
    require_extension(conn, "postgres_fdw")
    conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
    conn.execute("DROP SERVER IF EXISTS cpp_nowhere CASCADE")
    # Never connected to: the error is raised before anything is read.
    conn.execute("CREATE SERVER cpp_nowhere FOREIGN DATA WRAPPER postgres_fdw "
                 "OPTIONS (host '/nonexistent', dbname 'nowhere')")
    conn.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER cpp_nowhere")
    conn.execute("DROP TABLE IF EXISTS pt_far, pt_far_inh CASCADE")
    conn.execute("CREATE TABLE pt_far (id int, f float8[], y int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE pt_far_local PARTITION OF pt_far FOR VALUES FROM (1) TO (1001)")
    conn.execute("CREATE FOREIGN TABLE pt_far_remote PARTITION OF pt_far FOR VALUES FROM (1001) TO (2001) "
                 "SERVER cpp_nowhere OPTIONS (table_name 'far')")
    conn.execute("INSERT INTO pt_far_local SELECT i, ARRAY[i % 3, i % 5]::float8[], i % 2 FROM generate_series(1, 1000) i")
    conn.execute("CREATE TABLE pt_far_inh (id int, f float8[], y int)")
    conn.execute("CREATE FOREIGN TABLE pt_far_inh_child () INHERITS (pt_far_inh) SERVER cpp_nowhere OPTIONS (table_name 'far')")
    conn.execute("INSERT INTO pt_far_inh SELECT i, ARRAY[i % 3, i % 5]::float8[], i % 2 FROM generate_series(1, 500) i")
    try:
        yield
    finally:
        conn.execute("DROP TABLE IF EXISTS pt_far, pt_far_inh CASCADE")
        conn.execute("DROP SERVER IF EXISTS cpp_nowhere CASCADE")
        conn.execute("DROP EXTENSION IF EXISTS postgres_fdw")


@pytest.mark.parametrize("rel, leaf", [("pt_far", "pt_far_remote"), ("pt_far_inh", "pt_far_inh_child")])
@pytest.mark.parametrize("call", [
    "SELECT corgipile_train(%s::regclass, 'svm', %s)",
    "SELECT count(*) FROM corgipile_trace(%s::regclass, %s)",
    "SELECT count(*) FROM corgipile_explain(%s::regclass, 'svm', %s)",
])
def test_a_foreign_partition_is_an_error_naming_it(conn, fdw, rel, leaf, call):
    params = Jsonb({"features": "f", "label": "y", "epochs": 1, "verbose": False})
    if rel == "pt_far" and "corgipile_train" in call:
        # A partitioned table with postgres_fdw partitions is a sharded table: corgipile_train
        # trains on its servers (tests/test_shards.py), and this one cannot be reached.
        with pytest.raises(psycopg.OperationalError) as err:
            conn.execute(call, (rel, params))
        assert err.value.sqlstate == "08001"
        assert 'shard server "cpp_nowhere"' in err.value.diag.message_primary
        return
    if rel == "pt_far" and "corgipile_explain" in call:
        # EXPLAIN (without ANALYZE) of a sharded training lists the shards without connecting.
        lines = [r[0] for r in conn.execute(
            "SELECT * FROM corgipile_explain(%s::regclass, 'svm', %s)", (rel, params))]
        assert "Sharded Training: pt_far" in lines
        assert any("server cpp_nowhere" in line for line in lines)
        return
    with pytest.raises(E.FeatureNotSupported) as err:
        conn.execute(call, (rel, params))
    assert err.value.sqlstate == "0A000"
    assert leaf in err.value.diag.message_primary and "foreign table" in err.value.diag.message_primary


def test_evaluate_on_an_unreachable_shard_names_it_and_the_rest_is_readable(conn, fdw):
    params = {"features": "f", "label": "y", "epochs": 1, "seed": 1}
    m = train(conn, "pt_far_local", "svm", params)
    assert model(conn, m)["rows_trained"] == 1000
    # pt_far is a sharded table: evaluate scores on its servers (tests/test_shards.py), and
    # this one cannot be reached.
    with pytest.raises(psycopg.OperationalError) as err:
        evaluate(conn, m, "pt_far")
    assert err.value.sqlstate == "08001"
    assert 'shard server "cpp_nowhere"' in err.value.diag.message_primary
    # The inheritance parent alone ("only") has no foreign table to read.
    assert model(conn, train(conn, "pt_far_inh", "svm", {**params, "only": True}))["rows_trained"] == 500


# ----------------------------------------------------------------------------------------------
# the headline: a table partitioned by month, clustered by label (months 1-6 hold label 0 only,
# months 7-12 label 1 only). CorgiPile pools the blocks of all 12 partitions, so it trains as well
# as a Shuffle Once copy; no_shuffle reads the partitions one after another and its last iterate
# only remembers the last months.

MONTH_ROWS = 5000
HEADLINE = {"features": ["x1", "x2", "x3", "x4"], "label": "y", "epochs": 3, "seed": 1,
            # The last iterate, so that the order of the last rows matters (the average of the
            # iterates rescues no_shuffle on Gaussian data this easy), with a small enough step
            # that one buffer's mix of classes does not move it far.
            "average": False, "learning_rate": 0.002}


@pytest.fixture(scope="module")
def months(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pt_months, pt_months_once CASCADE")
        c.execute("""CREATE TABLE pt_months (month int, id int, x1 float8, x2 float8, x3 float8, x4 float8,
                                             y int, tag float8[]) PARTITION BY LIST (month)""")
        for m in range(1, 13):
            c.execute(f"CREATE TABLE pt_months_{m} PARTITION OF pt_months FOR VALUES IN ({m})")
        c.execute("SELECT setseed(0.42)")
        # Two Gaussian classes with means -0.6 and +0.6 on every axis (best accuracy ~0.885),
        # stored month by month; tag[1] is the month (for corgipile_trace).
        c.execute(f"""INSERT INTO pt_months
            SELECT month, id, mu + g1, mu + g2, mu + g3, mu + g4, y, ARRAY[month]::float8[] FROM (
              SELECT m AS month, (m - 1) * {MONTH_ROWS} + i AS id, (m > 6)::int AS y,
                     CASE WHEN m > 6 THEN 0.6 ELSE -0.6 END AS mu,
                     sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS g1,
                     sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS g2,
                     sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS g3,
                     sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) AS g4
              FROM generate_series(1, 12) m, generate_series(1, {MONTH_ROWS}) i) s
            ORDER BY month, id""")
        c.execute("SELECT setseed(0.7)")
        c.execute("CREATE TABLE pt_months_once AS SELECT * FROM pt_months ORDER BY random()")
        c.execute("VACUUM ANALYZE pt_months")
        c.execute("VACUUM ANALYZE pt_months_once")
    yield "pt_months"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE pt_months, pt_months_once CASCADE")


def test_headline_partitioned_by_month_trains_like_shuffle_once(conn, months):
    corgi = train(conn, "pt_months", "logistic", HEADLINE)
    no_shuffle = train(conn, "pt_months", "logistic", {**HEADLINE, "shuffle": "no_shuffle"})
    once = train(conn, "pt_months_once", "logistic", {**HEADLINE, "shuffle": "no_shuffle"})
    for m in (corgi, no_shuffle, once):
        assert model(conn, m)["rows_trained"] == 12 * MONTH_ROWS
    acc = {name: evaluate(conn, m, "pt_months")["accuracy"]
           for name, m in (("corgipile", corgi), ("no_shuffle", no_shuffle), ("shuffle_once", once))}
    msg = "accuracies on pt_months: " + ", ".join(f"{k} {v:.4f}" for k, v in acc.items())
    assert acc["shuffle_once"] > 0.87, msg
    assert abs(acc["corgipile"] - acc["shuffle_once"]) <= 0.005, msg
    assert acc["no_shuffle"] < acc["shuffle_once"] - 0.10, msg
    lines = explain(conn, "pt_months", "logistic", HEADLINE)
    assert field(lines, "Tables") == ["12"], lines
    assert field(lines, "Table Pages") == [str(tree_pages(conn, "pt_months"))], lines


def test_headline_blocks_are_pooled_across_months(conn, months):
    """One random order over the blocks of all partitions, not month after month."""
    params = {"features": "tag", "label": "y", "seed": 1}
    seen = [int(r[2]) for r in trace(conn, "pt_months", params)]
    assert len(seen) == 12 * MONTH_ROWS
    first_month_worth = seen[:MONTH_ROWS]
    assert len(set(first_month_worth)) >= 10, sorted(set(first_month_worth))
    in_order = [int(r[2]) for r in trace(conn, "pt_months", {**params, "shuffle": "no_shuffle"})]
    assert in_order == sorted(in_order) and in_order[0] == 1 and in_order[-1] == 12
