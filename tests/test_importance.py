"""corgipile_feature_importance: permutation importance of a model's input columns on a sample
of a relation (read through the block shuffle), with linear models' standardized coefficients;
its params, errors and privileges."""

import psycopg
import pytest
from psycopg import errors as E
from psycopg.types.json import Jsonb

from helpers import connect, drop_role, train

ROWS = 4000


@pytest.fixture(scope="module")
def tables(dsn):
    """fi_cols: the label follows x_strong much, x_weak a little, color (text) somewhat, noise
    not at all; fi_arr: the same numbers in an array; fi_reg: a numeric label of x_strong."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS fi_cols, fi_arr, fi_reg, fi_sparse")
        c.execute("SELECT setseed(0.7)")
        c.execute(f"""CREATE TABLE fi_cols AS
                      SELECT i AS id, x_strong, x_weak, noise, color,
                             (2 * x_strong + 0.4 * x_weak + CASE color WHEN 'red' THEN 1 ELSE -0.5 END
                              + (random() - 0.5) > 0)::int AS label
                      FROM (SELECT i, random() * 2 - 1 AS x_strong, random() * 2 - 1 AS x_weak,
                                   random() * 2 - 1 AS noise,
                                   (ARRAY['red', 'blue', 'green'])[1 + i % 3] AS color
                            FROM generate_series(1, {ROWS}) i) g""")
        c.execute("""CREATE TABLE fi_arr AS
                     SELECT id, ARRAY[x_strong, x_weak, noise] AS features, label FROM fi_cols""")
        c.execute("""CREATE TABLE fi_reg AS
                     SELECT id, x_strong, noise, 3 * x_strong + 0.01 * (random() - 0.5) AS y FROM fi_cols""")
        c.execute("""CREATE TABLE fi_sparse AS
                     SELECT id, ARRAY[1, 3] AS idx, ARRAY[x_strong, x_weak] AS val, label FROM fi_cols""")
    return "fi_cols"


COLUMNS = {"features": ["x_strong", "x_weak", "noise", "color"], "label": "label"}


def importance(conn, model, rel, params=None):
    return conn.execute("SELECT * FROM corgipile_feature_importance(%s::bigint, %s::regclass, %s)",
                        (model, rel, Jsonb(params or {}))).fetchall()


def test_columns_rank_by_how_much_the_label_depends_on_them(conn, tables):
    m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 5, "seed": 1})
    rows = importance(conn, m, "fi_cols")
    names = [r[0] for r in rows]
    assert set(names) == {"x_strong", "x_weak", "noise", "color"}, "one entry per column (color: one, not three)"
    assert names[0] == "x_strong" and names[-1] in ("noise", "x_weak")
    by = {r[0]: r for r in rows}
    assert by["x_strong"][1] > by["color"][1] > 0
    assert by["x_strong"][1] > by["x_weak"][1] > by["noise"][1] - 0.01
    assert abs(by["noise"][1]) < 0.02
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert all(r[2] >= 0 for r in rows) and by["x_strong"][2] > 0
    assert {r[4] for r in rows} == {"accuracy"} and {r[6] for r in rows} == {ROWS}


def test_a_sample_of_the_whole_table_scores_as_corgipile_evaluate(conn, tables):
    m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 3, "seed": 1})
    rows = importance(conn, m, "fi_cols", {"rows": 10 * ROWS})
    accuracy = conn.execute("SELECT (corgipile_evaluate(%s::bigint, 'fi_cols')->>'accuracy')::float8",
                            (m,)).fetchone()[0]
    assert rows[0][5] == pytest.approx(accuracy, abs=1e-12)
    # The standardized coefficient: the weight in table units times the column's deviation.
    coefficients = dict(conn.execute("""SELECT feature, coefficient FROM corgipile_model_coefficients(%s::bigint)""",
                                     (m,)).fetchall())
    sd = conn.execute("SELECT stddev_pop(x_strong) FROM fi_cols").fetchone()[0]
    by = {r[0]: r for r in rows}
    assert by["x_strong"][3] == pytest.approx(coefficients["x_strong"] * sd, rel=1e-9)
    assert by["color"][3] is None, "a one-hot column has no single coefficient"


def test_a_smaller_sample_and_the_seed(conn, tables):
    m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 3, "seed": 1})
    small = importance(conn, m, "fi_cols", {"rows": 500, "repeats": 3, "seed": 5})
    assert {r[6] for r in small} == {500}
    assert small == importance(conn, m, "fi_cols", {"rows": 500, "repeats": 3, "seed": 5})
    other = importance(conn, m, "fi_cols", {"rows": 500, "repeats": 3, "seed": 6})
    assert other != small
    # A "where" samples only the rows it selects.
    few = importance(conn, m, "fi_cols", {"where": "id <= 300"})
    assert {r[6] for r in few} == {300}


def test_array_elements_and_regression_and_networks(conn, tables):
    m = train(conn, "fi_arr", "svm", {"epochs": 3, "seed": 1})
    rows = importance(conn, m, "fi_arr")
    assert rows[0][0] == "features[1]" and {r[0] for r in rows} == {"features[1]", "features[2]", "features[3]"}
    assert all(r[3] is not None for r in rows)
    reg = train(conn, "fi_reg", "linear", {"features": ["x_strong", "noise"], "label": "y", "epochs": 5, "seed": 1})
    rows = importance(conn, reg, "fi_reg")
    assert rows[0][0] == "x_strong" and rows[0][4] == "r2" and rows[0][1] > 1.0
    net = train(conn, "fi_cols", "mlp", {**COLUMNS, "epochs": 3, "seed": 1, "hidden": [8]})
    rows = importance(conn, net, "fi_cols")
    assert rows[0][0] == "x_strong" and all(r[3] is None for r in rows)


@pytest.mark.parametrize("params, sqlstate", [
    ({"rows": 0}, "22023"),
    ({"rows": 1_000_001}, "22023"),
    ({"repeats": 0}, "22023"),
    ({"repeats": 101}, "22023"),
    ({"seed": -1}, "22023"),
    ({"rows": "many"}, "22023"),
    ({"epochs": 3}, "22023"),
    ({"where": "no_such_column > 0"}, "42703"),
])
def test_bad_params(conn, tables, params, sqlstate):
    m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 1})
    with pytest.raises(psycopg.Error) as err:
        importance(conn, m, "fi_cols", params)
    assert err.value.sqlstate == sqlstate, str(err.value)


def test_what_it_does_not_take(conn, tables):
    m = train(conn, "fi_sparse", "logistic", {"features": {"indices": "idx", "values": "val"}, "epochs": 1})
    with pytest.raises(E.FeatureNotSupported):
        importance(conn, m, "fi_sparse")
    m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 1})
    conn.execute("SET corgipile.max_buffer_memory = '1MB'")
    try:
        with pytest.raises(E.ProgramLimitExceeded) as err:
            importance(conn, m, "fi_cols", {"rows": 1_000_000})
        assert "max_buffer_memory" in str(err.value)
    finally:
        conn.execute("RESET corgipile.max_buffer_memory")
    conn.execute("DROP TABLE IF EXISTS fi_empty")
    conn.execute("CREATE TABLE fi_empty AS SELECT * FROM fi_cols LIMIT 0")
    with pytest.raises(E.NoDataFound):
        importance(conn, m, "fi_empty")


def test_a_use_grant_and_the_callers_rows(dsn, conn, tables):
    drop_role(conn, "fi_reader")
    conn.execute("CREATE ROLE fi_reader LOGIN")
    try:
        m = train(conn, "fi_cols", "logistic", {**COLUMNS, "epochs": 1, "seed": 1})
        conn.execute("SELECT corgipile_grant(%s::bigint, 'fi_reader', 'use')", (m,))
        with connect(dsn, user="fi_reader") as reader:
            with pytest.raises(E.InsufficientPrivilege):
                importance(reader, m, "fi_cols")
        conn.execute("GRANT SELECT ON fi_cols TO fi_reader")
        with connect(dsn, user="fi_reader") as reader:
            assert importance(reader, m, "fi_cols") == importance(conn, m, "fi_cols")
    finally:
        conn.execute("REVOKE ALL ON fi_cols FROM fi_reader")
        drop_role(conn, "fi_reader")
