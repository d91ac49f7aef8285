"""Piecewise-linear encoding of number columns (`"preprocess": {"col": {"encode": "ple", "bins": N}}`,
or `"*"` for every number column): bin edges from the statistics pass's quantile sketch, stored
with the model, applied alike by every prediction path; what a user sees of it (coefficients
named by bins in the table's units, one explanation entry per column), and its errors.

The table: y = 1 when x lies in [30, 70) (a band a linear model on x cannot draw, but a linear
model on x's bins can), plus a plain number z and a text column."""

import bisect
import math

import pytest
from psycopg.types.json import Jsonb

from helpers import error_of, evaluate, scalar, train

ROWS = 20_000
PLE = {"encode": "ple"}


@pytest.fixture(scope="module")
def band(db):
    import psycopg
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT setseed(0.3)")
        # Stored clustered by label: every row with y = 0 first.
        c.execute(f"""CREATE TABLE band AS
            SELECT i AS id, x, round((random() * 10)::numeric, 1)::float8 AS z,
                   (ARRAY['a','b','c'])[1 + i % 3] AS t,
                   (x >= 30 AND x < 70) AS y
            FROM (SELECT i, random() * 100 AS x FROM generate_series(1, {ROWS}) i) s
            ORDER BY (x >= 30 AND x < 70), i""")
        c.execute("UPDATE band SET x = NULL WHERE id % 997 = 0")
    return db


@pytest.fixture
def conn(band):
    import psycopg
    with psycopg.connect(band, autocommit=True) as c:
        yield c


def model_of(conn, bins=16, kind="logistic", **params):
    p = {"label": "y", "features": ["x", "z", "t"], "preprocess": {"x": {**PLE, "bins": bins}},
         "epochs": 10, "seed": 1, **params}
    return train(conn, "band", kind, p)


def column(conn, model, name):
    p = scalar(conn, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (model,))
    return next(c for c in p["columns"] if c["name"] == name), p


def encode(edges, x):
    """The encoding, as the reference defines it."""
    out = []
    for t in range(len(edges) - 1):
        lo, hi = edges[t], edges[t + 1]
        if t > 0 and x < lo:
            out.append(0.0)
        elif t < len(edges) - 2 and x >= hi:
            out.append(1.0)
        else:
            out.append((x - lo) / (hi - lo))
    return out


def test_bins_let_a_linear_model_draw_a_band(conn):
    plain = train(conn, "band", "logistic", {"label": "y", "features": ["x", "z", "t"], "epochs": 10, "seed": 1})
    binned = model_of(conn)
    plain_acc = evaluate(conn, plain, "band")["accuracy"]
    binned_acc = evaluate(conn, binned, "band")["accuracy"]
    print(f"band: plain {plain_acc:.4f}, ple {binned_acc:.4f}")
    # A band: plain x is no better than the majority (0.6); its bins give measured 0.99.
    assert plain_acc < 0.65
    assert binned_acc > 0.95


def test_edges_are_the_columns_quantiles(conn):
    m = model_of(conn, bins=8)
    x, p = column(conn, m, "x")
    assert x["encode"] == "ple" and x["scaled"] is False and x["source"] == "number"
    edges = x["edges"]
    values = sorted(r[0] for r in conn.execute("SELECT x FROM band WHERE x IS NOT NULL"))
    assert len(edges) == 9
    assert edges[0] == values[0] and edges[-1] == values[-1]
    # Every inner edge's rank is within 0.005 of t / 8 (the documented error of the sketch).
    for t in range(1, 8):
        rank = bisect.bisect_left(values, edges[t]) / len(values)
        assert abs(rank - t / 8) < 0.005, (t, edges[t], rank)
    # NULLs are imputed by the mean before encoding; the other columns follow the 8 bins.
    assert x["fill"] == pytest.approx(sum(values) / len(values), rel=1e-9)
    assert x["offset"] == 0 and p["columns"][1]["offset"] == 8
    assert p["n_features"] == 8 + 1 + 3


def test_coefficients_name_bins_in_table_units_and_score_as_published(conn):
    m = model_of(conn, bins=4)
    x, _ = column(conn, m, "x")
    e = x["edges"]
    rows = conn.execute("SELECT feature, feature_index, coefficient FROM corgipile_model_coefficients(%s) "
                        "ORDER BY feature_index NULLS FIRST", (m,)).fetchall()
    names = [r[0] for r in rows]
    # Bin t is named "x:[lo, hi)" by its edges (6 significant digits), the last one closed.
    for t in range(4):
        lo, hi = names[1 + t].removeprefix("x:[").rstrip(")]").split(", ")
        assert float(lo) == pytest.approx(e[t], rel=1e-5) and float(hi) == pytest.approx(e[t + 1], rel=1e-5)
    assert names[4].endswith("]") and names[1].endswith(")")
    coef = {r[0]: r[2] for r in rows}
    intercept = coef.pop(names[0])
    # The published coefficients, applied to the documented encoding, are the decision value.
    for xv, zv, tv in [(12.5, 3.0, "a"), (50.0, 9.9, "b"), (71.0, 0.0, "c"), (-20.0, 5.0, "a"), (140.0, 1.0, "b")]:
        z = intercept + sum(w * v for w, v in zip([coef[n] for n in names[1:5]], encode(e, xv)))
        z += coef["z"] * zv + coef[f"t={tv}"]
        got = scalar(conn, "SELECT corgipile_decision_function(%s, r) FROM (SELECT %s::float8 AS x, %s::float8 AS z, %s AS t) r",
                     (m, xv, zv, tv))
        assert got == pytest.approx(z, rel=1e-9, abs=1e-9), (xv, zv, tv)


@pytest.mark.parametrize("kind", ["logistic", "mlp", "fm"])
def test_every_prediction_path_encodes_as_training(conn, kind):
    m = model_of(conn, kind=kind, epochs=5)
    report = evaluate(conn, m, "band")
    # Row forms: the table's own rows (rewritten to the columns form) and a row built by hand.
    rows = conn.execute("SELECT y, corgipile_predict(%s, b), corgipile_predict_proba(%s, b), x, z, t "
                        "FROM band b ORDER BY id", (m, m)).fetchall()
    accuracy = sum((r[1] == 1) == r[0] for r in rows) / len(rows)
    assert accuracy == pytest.approx(report["accuracy"], abs=1e-12)
    assert accuracy > 0.9, kind
    for y, pred, proba, x, z, t in rows[:: len(rows) // 50]:
        by_hand = conn.execute("SELECT corgipile_predict(%s, r), corgipile_predict_proba(%s, r) "
                               "FROM (SELECT %s::float8 AS x, %s::float8 AS z, %s AS t) r", (m, m, x, z, t)).fetchone()
        assert by_hand[0] == pred
        assert by_hand[1] == pytest.approx(proba, rel=1e-12, abs=1e-15)
    # A NULL x predicts as the training mean.
    x, _ = column(conn, m, "x")
    null, mean = (scalar(conn, "SELECT corgipile_decision_function(%s, r) FROM (SELECT %s::float8 AS x, 4.0::float8 AS z, 'a' AS t) r",
                         (m, v)) if kind == "logistic" else
                  scalar(conn, "SELECT corgipile_predict_proba(%s, r) FROM (SELECT %s::float8 AS x, 4.0::float8 AS z, 'a' AS t) r",
                         (m, v)) for v in (None, x["fill"]))
    assert null == mean
    # An array would skip the encoding: refused, with the way to predict.
    e = error_of(conn, "SELECT corgipile_predict(%s, ARRAY[50, 4, 1]::float8[])", (m,))
    assert e.sqlstate == "42809" and "predict from a row" in str(e)


def test_an_explanation_has_one_entry_per_column_with_its_value(conn):
    m = model_of(conn, kind="mlp", epochs=3)
    for xv in (12.25, 47.5, 88.0):
        rows = conn.execute("SELECT e.column_name, e.value, e.contribution "
                            "FROM (SELECT %s::float8 AS x, 2.5::float8 AS z, 'b' AS t) r, corgipile_explain_predict(%s, r) e",
                            (xv, m)).fetchall()
        by_name = {r[0]: r for r in rows}
        assert set(by_name) >= {"x", "z", "t"}, rows
        assert float(by_name["x"][1]) == pytest.approx(xv, rel=1e-9)
    # Out of the band (the baseline, x at its mean 50, is in it) x decides: its share is the largest.
    rows = conn.execute("SELECT e.column_name FROM (SELECT 10.0::float8 AS x, 2.5::float8 AS z, 'b' AS t) r, "
                        "corgipile_explain_predict(%s, r) e WHERE e.column_name NOT LIKE '(%%' "
                        "ORDER BY abs(e.contribution) DESC", (m,)).fetchall()
    assert rows[0][0] == "x"


def test_the_every_column_default_encodes_numbers_and_a_column_may_opt_out(conn):
    m = train(conn, "band", "logistic", {"label": "y", "features": "*", "exclude": ["id"], "epochs": 2, "seed": 1,
                                         "preprocess": {"*": {"encode": "ple", "bins": 6, "impute": "zero"},
                                                        "z": {"encode": "none"}}})
    p = scalar(conn, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (m,))
    enc = {c["name"]: (c["encode"], c["impute"]) for c in p["columns"]}
    assert enc == {"x": ("ple", "zero"), "z": ("number", "zero"), "t": ("one_hot", "category")}
    x = next(c for c in p["columns"] if c["name"] == "x")
    assert len(x["edges"]) == 7 and x["fill"] == 0


@pytest.mark.parametrize("preprocess,message", [
    ({"t": PLE}, 'column "t": "encode": "ple" applies to number and boolean columns'),
    ({"x": {"encode": "one_hot"}}, 'column "x": "encode": "one_hot" applies to text columns; numbers take ple or none'),
    ({"x": {"bins": 8}}, '"bins" needs "encode": "ple"'),
    ({"x": {**PLE, "bins": 1}}, '"bins" must be an integer from 2 to 1024'),
    ({"x": {**PLE, "scale": "standard"}}, '"scale" does not apply to a column encoded "ple"'),
    ({"*": {"encode": "pl"}}, 'unknown encode "pl"'),
    ({"w": PLE}, '"w" is not a feature column'),
])
def test_bad_options_are_refused_before_reading(conn, preprocess, message):
    e = error_of(conn, "SELECT corgipile_train('band', 'logistic', %s)",
                 (Jsonb({"label": "y", "features": ["x", "z", "t"], "preprocess": preprocess}),))
    assert e.sqlstate == "22023", e
    assert message in str(e), e


def test_sketches_count_against_the_buffer_memory(conn):
    conn.execute("SET corgipile.max_buffer_memory = '64kB'")
    try:
        e = error_of(conn, "SELECT corgipile_train('band', 'logistic', %s)",
                     (Jsonb({"label": "y", "features": ["x", "z", "id"], "preprocess": {"*": PLE}}),))
    finally:
        conn.execute("RESET corgipile.max_buffer_memory")
    assert e.sqlstate == "54000", e
    assert 'quantile sketches of 3 columns encoded "ple"' in str(e) and e.diag.message_hint, e


def test_a_warm_start_keeps_the_bins(conn):
    m = model_of(conn, bins=5, epochs=2)
    w = train(conn, "band", "logistic", {"warm_start": m, "epochs": 1, "seed": 2})
    a = scalar(conn, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (m,))
    b = scalar(conn, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (w,))
    assert a["columns"] == b["columns"]
    assert math.isfinite(evaluate(conn, w, "band")["accuracy"])
