"""Factorization machines: `fm` (one score per class, softmax probabilities; labels as for mlp)
and `fm_regression` (a number, squared loss), scoring b_k + w_k.x + sum_{i<j} <v_ik, v_jk> x_i x_j
with `"factors"` latent dimensions. Checked as a user sees them:

1. What they learn where a linear model cannot: an XOR of two signs, y = 100 + 3 x0 x1 + x2 (the
   learned interaction is 3), a text column's interactions, text labels; the score is
   multilinear; the same seed gives the same model bit for bit.
2. Input shapes: arrays, column lists with text, "*", sparse pairs.
3. Predictions from arrays and rows (the _columns rewrite, a parallel plan), evaluation,
   explanations that add up, corgipile_model_layers that recompute the predictions.
4. The catalog; the params shared with mlp (optimizer, l2, normalize, validation and patience,
   search, folds, group_by, workers); pg_dump / pg_restore.
5. Errors as an ordinary role (nothing stored), grants, memory limits, divergence, cancel and
   statement_timeout, corgipile_explain (warm starts of fm kinds: test_warm_start.py).

Tables are fm_* in the shared database (dropped at the end of the module).
"""

import math
import subprocess
import time

import numpy as np
import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import (ROLES_ENV_ALICE, ROLES_ENV_BOB, cancel_and_join, catalog_counts, connect, describe, error_of,
                     evaluate, models_count, scalar, server_crashes, start_training, stop_if_running, train,
                     train_error, train_with_workers, wait_active)

ALICE, BOB = ROLES_ENV_ALICE, ROLES_ENV_BOB
DEFAULTS = {"verbose": False, "seed": 1}
TABLES = ("fm_xor", "fm_xor_test", "fm_reg", "fm_reg_test", "fm_mixed", "fm_text", "fm_sparse", "fm_wide")
MIXED = ["color", "member", "amount", "noise"]


def u(expr):
    """A number uniform in (-1, 1) from the hash of `expr`."""
    return f"((hashint4({expr}) % 1000) / 1000.0)::float8"


@pytest.fixture(scope="module")
def tables(dsn):
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")
        for t, lo, hi in (("fm_xor", 1, 2000), ("fm_xor_test", 100001, 101000)):
            # The label is the XOR of the signs of x0 and x1: no line separates it.
            c.execute(f"""CREATE TABLE {t} AS SELECT i AS id, ARRAY[x0, x1] AS features, x0, x1,
                            (x0 * x1 > 0)::int AS label, (ARRAY['a', 'b'])[1 + i % 2] AS half
                          FROM (SELECT i, {u('i')} AS x0, {u('i * 7 + 3')} AS x1
                                FROM generate_series({lo}, {hi}) i) s""")
        for t, lo, hi in (("fm_reg", 1, 2000), ("fm_reg_test", 100001, 101000)):
            c.execute(f"""CREATE TABLE {t} AS SELECT i AS id, ARRAY[x0, x1, x2] AS features,
                            100 + 3 * x0 * x1 + x2 + 0.05 * {u('i * 13 + 1')} AS label
                          FROM (SELECT i, {u('i')} AS x0, {u('i * 7 + 3')} AS x1, {u('i * 11 + 5')} AS x2
                                FROM generate_series({lo}, {hi}) i) s""")
        # Text, boolean, raw-scale columns and NULLs; the label an interaction of color with
        # amount and with member; stored ORDER BY label.
        c.execute(f"""CREATE TABLE fm_mixed AS
            WITH base AS (SELECT i,
              CASE WHEN i % 13 = 0 THEN NULL
                   ELSE (ARRAY['red', 'green', 'blue'])[1 + (hashint4(i * 3 + 1) & 1023) % 3] END AS color,
              (hashint4(i * 5 + 2) & 1) = 1 AS member,
              (hashint4(i * 7 + 3) & 16383) % 10000 AS amount,
              {u('i * 17 + 5')} AS noise
              FROM generate_series(1, 3000) i)
            SELECT i AS id, color, member, amount, noise,
              CASE WHEN color = 'red' THEN amount > 5000 WHEN color = 'blue' THEN amount < 5000
                   ELSE member END AS label
            FROM base ORDER BY 6, 1""")
        # Three text classes by the band of x0 * x1.
        c.execute(f"""CREATE TABLE fm_text AS SELECT i AS id, ARRAY[x0, x1] AS features,
                        CASE WHEN x0 * x1 > 0.15 THEN 'pos' WHEN x0 * x1 < -0.15 THEN 'neg' ELSE 'zero' END AS label
                      FROM (SELECT i, {u('i')} AS x0, {u('i * 7 + 3')} AS x1 FROM generate_series(1, 3000) i) s""")
        # The XOR as sparse pairs (1-based), an indicator at index 3 on every fifth row, index 2
        # left out when x1 is 0; the same rows dense.
        c.execute(f"""CREATE TABLE fm_sparse AS SELECT i AS id,
                        CASE WHEN i % 5 = 0 THEN ARRAY[1, 2, 3] WHEN x1 = 0 THEN ARRAY[1] ELSE ARRAY[1, 2] END AS idx,
                        CASE WHEN i % 5 = 0 THEN ARRAY[x0, x1, 1] WHEN x1 = 0 THEN ARRAY[x0] ELSE ARRAY[x0, x1] END AS val,
                        ARRAY[x0, x1, (i % 5 = 0)::int] AS dense, (x0 * x1 > 0)::int AS label
                      FROM (SELECT i, {u('i')} AS x0, {u('i * 7 + 3')} AS x1 FROM generate_series(1, 2000) i) s""")
        # 64 features: an expensive row for a wide factorization.
        c.execute(f"""CREATE TABLE fm_wide AS SELECT i AS id,
                        ARRAY(SELECT {u('i * 64 + j')} FROM generate_series(1, 64) j) AS features, i % 2 AS label
                      FROM generate_series(1, 5000) i""")
        c.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")
    yield dsn
    with connect(dsn) as c:
        c.execute("DELETE FROM corgipile.models WHERE name LIKE 'fm\\_%' OR relation LIKE 'public.fm\\_%'")
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")


@pytest.fixture
def tconn(tables):
    with connect(tables) as c:
        yield c


def fit(conn, rel, model, params=None, **extra):
    return train(conn, rel, model, params, defaults=DEFAULTS, **extra)


def model_row(conn, model_id, columns):
    return conn.execute(f"SELECT {columns} FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()


def predict(conn, model, x, fn="corgipile_predict"):
    return scalar(conn, f"SELECT {fn}(%s::bigint, %s::float8[])", (model, [float(v) for v in x]))


def log_odds(conn, model, x):
    p = predict(conn, model, x, "corgipile_predict_proba")
    return math.log(p[1] / p[0])


# =============================================================================================
# 1. What factorization machines learn


def test_fm_learns_xor_where_logistic_cannot(tconn):
    lin = fit(tconn, "fm_xor", "logistic", epochs=30)
    fm = fit(tconn, "fm_xor", "fm", epochs=30)
    acc = {(k, rel): evaluate(tconn, m, rel)["accuracy"] for k, m in (("logistic", lin), ("fm", fm))
           for rel in ("fm_xor", "fm_xor_test")}
    print(f"xor: {acc}")
    assert acc["logistic", "fm_xor"] < 0.65 and acc["logistic", "fm_xor_test"] < 0.65
    assert acc["fm", "fm_xor"] > 0.9 and acc["fm", "fm_xor_test"] > 0.9
    r = evaluate(tconn, fm, "fm_xor_test")
    assert r["rows_scored"] == 1000 and r["rows_skipped"] == 0
    assert r["log_loss"] < evaluate(tconn, lin, "fm_xor_test")["log_loss"]
    # The log-odds are a factorization machine's: affine in each feature, the other held fixed.
    for other in (-0.7, 0.4):
        for a, b in ((-0.9, 0.8), (0.2, 0.6)):
            ends = [log_odds(tconn, fm, (t, other)) for t in (a, b)]
            mid = log_odds(tconn, fm, ((a + b) / 2, other))
            assert mid == pytest.approx(sum(ends) / 2, abs=1e-6)
            mid = log_odds(tconn, fm, (other, (a + b) / 2))
            assert mid == pytest.approx((log_odds(tconn, fm, (other, a)) + log_odds(tconn, fm, (other, b))) / 2, abs=1e-6)


def test_fm_regression_learns_the_product_in_the_labels_units(tconn):
    lin = fit(tconn, "fm_reg", "linear", epochs=30)
    fm = fit(tconn, "fm_reg", "fm_regression", epochs=30)
    r2 = {(k, rel): evaluate(tconn, m, rel)["r2"] for k, m in (("linear", lin), ("fm", fm))
          for rel in ("fm_reg", "fm_reg_test")}
    print(f"regression: {r2}")
    assert r2["linear", "fm_reg"] < 0.5 and r2["linear", "fm_reg_test"] < 0.5
    assert r2["fm", "fm_reg"] > 0.9 and r2["fm", "fm_reg_test"] > 0.9
    # In the label's units (around 100); the interaction of x0 and x1 is 3, of x0 and x2 none;
    # x2's slope is 1; the prediction is affine in each feature.
    f = lambda *x: predict(tconn, fm, x)  # noqa: E731
    assert abs(f(0, 0, 0) - 100) < 0.3
    inter01 = f(0.8, 0.8, 0) - f(-0.8, 0.8, 0) - f(0.8, -0.8, 0) + f(-0.8, -0.8, 0)
    inter02 = f(0.8, 0, 0.8) - f(-0.8, 0, 0.8) - f(0.8, 0, -0.8) + f(-0.8, 0, -0.8)
    assert inter01 / (1.6 * 1.6) == pytest.approx(3, rel=0.15), inter01
    assert abs(inter02 / (1.6 * 1.6)) < 0.45, inter02
    assert (f(0, 0, 0.5) - f(0, 0, -0.5)) == pytest.approx(1, abs=0.2)
    for x in ((0.3, -0.6, 0.1), (-0.5, 0.9, -0.8)):
        for j in range(3):
            lo, hi, mid = list(x), list(x), list(x)
            lo[j], hi[j], mid[j] = -1.0, 1.0, 0.0
            assert f(*mid) == pytest.approx((f(*lo) + f(*hi)) / 2, abs=1e-7), (x, j)


def test_interactions_of_a_text_column_with_numbers_and_booleans(tconn):
    common = {"features": MIXED, "epochs": 30}
    lin = fit(tconn, "fm_mixed", "logistic", common)
    fm = fit(tconn, "fm_mixed", "fm", common)
    star = fit(tconn, "fm_mixed", "fm", {"features": "*", "exclude": ["id"], "epochs": 30})
    acc = {k: evaluate(tconn, m, "fm_mixed")["accuracy"] for k, m in (("logistic", lin), ("fm", fm), ("star", star))}
    print(f"mixed: {acc}")
    assert acc["fm"] > 0.88 and acc["fm"] > acc["logistic"] + 0.15
    assert acc["star"] > 0.88
    n_features, layers, features, prep = model_row(tconn, fm, "n_features, layers, features, preprocessing")
    assert features == MIXED and model_row(tconn, star, "features")[0] == MIXED
    # color one-hot with a (null) slot, then three numbers in piecewise-linear bins (an fm's
    # default); a boolean label: two outputs.
    bins = [len(c["edges"]) - 1 for c in prep["columns"] if c["source"] == "number"]
    assert [c["encode"] for c in prep["columns"] if c["source"] == "number"] == ["ple"] * 3, prep
    assert n_features == 4 + sum(bins) and layers == [n_features, 8, 2]
    # Predictions from the rows: the label's values, as true/false; probabilities in the order of
    # label_mapping's classes.
    t = model_row(tconn, fm, "label_mapping")[0]["classes"].index(1.0)
    got = tconn.execute("""SELECT corgipile_predict_class(%s, t), corgipile_predict(%s, t), label,
                                  corgipile_predict_proba(%s, t) FROM fm_mixed t ORDER BY id""", (fm, fm, fm)).fetchall()
    assert {r[0] for r in got} == {"true", "false"}
    for cls, pred, label, proba in got:
        assert pred == (1.0 if cls == "true" else 0.0) and (proba[t] > proba[1 - t]) == (cls == "true")
    assert sum((r[0] == "true") == r[2] for r in got) / len(got) == pytest.approx(acc["fm"], abs=1e-12)
    # Permutation importance: the columns the label depends on, not the noise.
    imp = {r[0]: r[1] for r in tconn.execute("SELECT * FROM corgipile_feature_importance(%s::bigint, 'fm_mixed')",
                                             (fm,)).fetchall()}
    assert min(imp["color"], imp["amount"], imp["member"]) > 0.1 > abs(imp["noise"]), imp


def test_text_labels(tconn):
    sm = fit(tconn, "fm_text", "softmax", epochs=30)
    fm = fit(tconn, "fm_text", "fm", epochs=30, factors=4)
    acc_sm, r_fm = evaluate(tconn, sm, "fm_text")["accuracy"], evaluate(tconn, fm, "fm_text")
    print(f"text labels: softmax {acc_sm:.4f}, fm {r_fm['accuracy']:.4f}")
    assert acc_sm < 0.6 and r_fm["accuracy"] > 0.8 and len(r_fm["per_class"]) == 3
    n_outputs, layers, mapping = model_row(tconn, fm, "n_outputs, layers, label_mapping")
    assert (n_outputs, layers) == (3, [2, 4, 3]) and sorted(mapping["classes"]) == ["neg", "pos", "zero"]
    got = dict(tconn.execute("SELECT corgipile_predict_class(%s, features), count(*) FROM fm_text GROUP BY 1",
                             (fm,)).fetchall())
    assert set(got) == {"neg", "pos", "zero"}
    e = error_of(tconn, "SELECT corgipile_predict(%s, ARRAY[0.1, 0.2])", (fm,))
    assert e is not None and e.sqlstate == "42809", describe(e)


def test_same_seed_same_model_other_seed_other_model(tconn):
    for rel, model in (("fm_xor", "fm"), ("fm_reg", "fm_regression")):
        p = {"epochs": 3, "factors": 4}
        a, b, c = (fit(tconn, rel, model, p, seed=s) for s in (7, 7, 8))
        ra, rb, rc = (model_row(tconn, m, "weights::text, bias::text") for m in (a, b, c))
        assert ra == rb, model
        assert ra[0] != rc[0], model


# =============================================================================================
# 2. Input shapes


def test_sparse_pairs(tconn):
    params = {"features": {"indices": "idx", "values": "val"}, "n_features": 3, "epochs": 30, "factors": 4}
    m = fit(tconn, "fm_sparse", "fm", params)
    assert model_row(tconn, m, "n_features, layers") == (3, [3, 4, 2])
    acc = evaluate(tconn, m, "fm_sparse")["accuracy"]
    print(f"sparse: {acc:.4f}")
    assert acc > 0.9
    rows = tconn.execute("""SELECT corgipile_predict_proba(%s, idx, val), corgipile_predict_proba(%s, dense)
                            FROM fm_sparse WHERE id <= 50""", (m, m)).fetchall()
    for sparse, dense in rows:
        assert sparse == pytest.approx(dense, rel=1e-12, abs=1e-15)
    # Without n_features: as wide as the largest index found.
    reg = fit(tconn, "fm_sparse", "fm_regression", features=params["features"], label="id", epochs=1)
    assert model_row(tconn, reg, "layers")[0] == [3, 8, 1]


# =============================================================================================
# 3. Predictions, evaluation, explanations


def test_array_predictions_agree_with_each_other_and_evaluate(tconn):
    m = fit(tconn, "fm_xor", "fm", epochs=5, name="fm_xor_named")
    rows = tconn.execute("""SELECT label, corgipile_predict(%s, features), corgipile_predict_class(%s, features),
                                   corgipile_predict_proba(%s, features), corgipile_predict('fm_xor_named', features),
                                   corgipile_predict_proba('fm_xor_named', features)
                            FROM fm_xor ORDER BY id""", (m, m, m)).fetchall()
    classes = model_row(tconn, m, "label_mapping")[0]["classes"]
    assert classes == [0.0, 1.0]
    for label, pred, cls, pr, pred_n, pr_n in rows:
        assert sum(pr) == pytest.approx(1.0) and all(0 < p < 1 for p in pr)
        assert pred == classes[int(np.argmax(pr))] and cls == str(int(pred))
        assert (pred_n, pr_n) == (pred, pr)
    report = evaluate(tconn, m, "fm_xor")
    assert sum(r[1] == r[0] for r in rows) / len(rows) == pytest.approx(report["accuracy"], abs=1e-12)
    confusion = {(a, p): k for a, p, k in tconn.execute(
        "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'fm_xor')", (m,)).fetchall()}
    assert sum(confusion.values()) == 2000
    assert confusion.get(("1", "1"), 0) + confusion.get(("0", "0"), 0) == sum(r[1] == r[0] for r in rows), confusion
    # One score per class: no decision function (as mlp and softmax).
    e = error_of(tconn, "SELECT corgipile_decision_function(%s, ARRAY[0.5, 0.5])", (m,))
    assert e is not None and e.sqlstate == "42809", describe(e)
    assert -np.mean([math.log(r[3][r[0]]) for r in rows]) == pytest.approx(report["log_loss"], rel=1e-9)
    e = error_of(tconn, "SELECT corgipile_predict(%s, ARRAY[0.5, 0.5, 0.5])", (m,))
    assert e is not None and e.sqlstate.startswith("22"), describe(e)


def test_regression_predictions_and_evaluate(tconn):
    m = fit(tconn, "fm_reg", "fm_regression", epochs=5, name="fm_reg_named")
    rows = tconn.execute("""SELECT label, corgipile_predict(%s, features), corgipile_predict('fm_reg_named', features)
                            FROM fm_reg_test ORDER BY id""", (m,)).fetchall()
    y, p = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    assert all(r[1] == r[2] for r in rows)
    report = evaluate(tconn, m, "fm_reg_test")
    assert np.sqrt(np.mean((p - y) ** 2)) == pytest.approx(report["rmse"], rel=1e-9)
    assert 1 - np.sum((p - y) ** 2) / np.sum((y - y.mean()) ** 2) == pytest.approx(report["r2"], rel=1e-9)
    assert scalar(tconn, "SELECT corgipile_decision_function(%s, ARRAY[0.5, 0.5, 0.5])", (m,)) == \
        predict(tconn, m, (0.5, 0.5, 0.5))
    for fn in ("corgipile_predict_proba", "corgipile_predict_class"):
        e = error_of(tconn, f"SELECT {fn}(%s, ARRAY[0.5, 0.5, 0.5])", (m,))
        assert e is not None and e.sqlstate == "42809", describe(e)


def test_row_predictions_are_rewritten_to_columns_and_agree(tconn):
    m = fit(tconn, "fm_mixed", "fm", features=MIXED, epochs=3)
    for fn in ("corgipile_predict", "corgipile_predict_proba", "corgipile_predict_class"):
        fast = f"SELECT id, {fn}(%s::bigint, t) FROM fm_mixed t ORDER BY id"
        slow = f"SELECT id, {fn}(%s::bigint, sub) FROM (SELECT * FROM fm_mixed OFFSET 0) sub ORDER BY id"
        plan = "\n".join(r[0] for r in tconn.execute("EXPLAIN VERBOSE " + fast, (m,)).fetchall())
        assert "_columns(" in plan, plan
        assert tconn.execute(fast, (m,)).fetchall() == tconn.execute(slow, (m,)).fetchall(), fn


def test_predictions_in_a_parallel_plan_agree_with_serial(tconn):
    cols = fit(tconn, "fm_mixed", "fm", features=MIXED, epochs=2)
    arr = fit(tconn, "fm_xor", "fm", epochs=2)
    reg = fit(tconn, "fm_reg", "fm_regression", epochs=2)
    queries = [f"SELECT sum((corgipile_predict_proba({cols}, t))[2]) FROM fm_mixed t",
               f"SELECT sum((corgipile_predict_proba({arr}, features))[2]) FROM fm_xor",
               f"SELECT sum(corgipile_predict({reg}, features)) FROM fm_reg"]
    serial = [tconn.execute(q).fetchone() for q in queries]
    with tconn.transaction():
        for s in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0", "min_parallel_table_scan_size = 0",
                  "max_parallel_workers_per_gather = 2", "parallel_leader_participation = off"):
            tconn.execute(f"SET LOCAL {s}")
        for q, before in zip(queries, serial):
            plan = "\n".join(r[0] for r in tconn.execute("EXPLAIN (COSTS OFF) " + q).fetchall())
            assert "Gather" in plan, plan
            assert tconn.execute(q).fetchone() == pytest.approx(before, rel=1e-9)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def explained(conn, model, x, for_class=None):
    return conn.execute("SELECT * FROM corgipile_explain_predict(%s::bigint, %s::float8[], %s)",
                        (model, [float(v) for v in x], for_class)).fetchall()


def test_explanations_add_up(tconn):
    reg = fit(tconn, "fm_reg", "fm_regression", epochs=10)
    for x in ((0.8, 0.7, -0.2), (-0.5, 0.9, 0.6), (0.0, 0.0, 0.0)):
        rows = explained(tconn, reg, x)
        assert rows[-1][0] == "(baseline)" and rows[-1][1] is None
        names = {r[0] for r in rows}
        assert {"features[1]", "features[2]", "features[3]"} <= names, rows
        # Shares (and any residual row) plus the baseline are the prediction.
        assert sum(r[2] for r in rows) == pytest.approx(predict(tconn, reg, x), rel=1e-6, abs=1e-6), rows
    # At x2 = 0 (about its mean, the baseline) the product of x0 and x1 makes the prediction.
    share = {r[0]: r[2] for r in explained(tconn, reg, (0.9, 0.9, 0.0))}
    assert abs(share["features[3]"]) < 0.25 * (abs(share["features[1]"]) + abs(share["features[2]"])), share
    assert share["features[1]"] + share["features[2]"] == pytest.approx(3 * 0.81, rel=0.25), share
    # Classes: the explained scores differ as the log-probabilities do.
    cls = fit(tconn, "fm_text", "fm", epochs=10)
    classes = model_row(tconn, cls, "label_mapping")[0]["classes"]
    for x in ((0.8, 0.7), (-0.6, 0.5), (0.1, -0.2)):
        proba = predict(tconn, cls, x, "corgipile_predict_proba")
        assert explained(tconn, cls, x)[0][3] == predict(tconn, cls, x, "corgipile_predict_class")
        scores = {k: sum(r[2] for r in explained(tconn, cls, x, k)) for k in classes}
        for a, b in zip(classes, classes[1:]):
            expected = math.log(proba[classes.index(a)] / proba[classes.index(b)])
            assert scores[a] - scores[b] == pytest.approx(expected, rel=1e-6, abs=1e-6), (x, a, b)
    # A column-list model (id 13: a NULL color): one row per column; the scores of true and
    # false differ as their log-probabilities do.
    mixed = fit(tconn, "fm_mixed", "fm", features=MIXED, epochs=3)
    t = model_row(tconn, mixed, "label_mapping")[0]["classes"].index(1.0)
    q = "SELECT e.* FROM fm_mixed t, corgipile_explain_predict(%s::bigint, t, %s) e WHERE t.id = %s"
    for pid in (1, 13, 100):
        rows = {k: tconn.execute(q, (mixed, k, pid)).fetchall() for k in ("true", "false")}
        for k, r in rows.items():
            assert set(MIXED) <= {e[0] for e in r} and r[-1][0] == "(baseline)" and r[0][3] == k, r
        pr = scalar(tconn, "SELECT corgipile_predict_proba(%s::bigint, t) FROM fm_mixed t WHERE id = %s", (mixed, pid))
        diff = sum(e[2] for e in rows["true"]) - sum(e[2] for e in rows["false"])
        assert diff == pytest.approx(math.log(pr[t] / pr[1 - t]), rel=1e-6, abs=1e-6)


def test_model_layers_are_the_model_in_table_units(tconn):
    """corgipile_model_layers of an fm: the linear layer (inputs x classes, input-major, and the
    biases) and the factors (inputs x (classes x factors), each class's factors together); the
    factorization machine computed here from them gives the predictions."""
    for rel, model, out, activation in (("fm_text", "fm", 3, "softmax"), ("fm_reg", "fm_regression", 1, "identity")):
        m = fit(tconn, rel, model, epochs=3, factors=3)
        rows = tconn.execute("SELECT layer, inputs, outputs, activation, weights, biases "
                             "FROM corgipile_model_layers(%s::bigint)", (m,)).fetchall()
        n = model_row(tconn, m, "n_features")[0]
        assert rows and all(r[1] == n for r in rows), rows
        assert [r[2] for r in rows if r[3] == activation] == [out], rows
        assert [r[2] for r in rows if r[3] == "factors"] == [3 * out], rows
        lin = next(r for r in rows if r[3] == activation)
        w, b = np.array(lin[4]).reshape(n, out), np.array(lin[5])
        v = np.array(next(r for r in rows if r[3] == "factors")[4]).reshape(n, out, 3)
        fn = "corgipile_predict_proba" if model == "fm" else "corgipile_predict"
        got = tconn.execute(f"SELECT features, {fn}(%s, features) FROM {rel} ORDER BY id LIMIT 50", (m,)).fetchall()
        x = np.array([r[0] for r in got], dtype=float)
        xv, x2v2 = np.einsum("nd,dkf->nkf", x, v), np.einsum("nd,dkf->nkf", x ** 2, v ** 2)
        score = x @ w + b + 0.5 * (xv ** 2 - x2v2).sum(axis=2)
        expected = softmax(score) if model == "fm" else score[:, 0]
        assert np.array([r[1] for r in got]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


# =============================================================================================
# 4. Catalog and params


def test_catalog_row_and_stored_params_retrain_the_same_model(tconn):
    m = fit(tconn, "fm_text", "fm", epochs=2)
    reg = fit(tconn, "fm_reg", "fm_regression", epochs=2, factors=5)
    for mid, kind, layers in ((m, "fm", [2, 8, 3]), (reg, "fm_regression", [3, 5, 1])):
        model_type, got, n_f, n_out, nw, nb, params = model_row(
            tconn, mid, "model_type, layers, n_features, n_outputs, cardinality(weights), cardinality(bias), params")
        assert (model_type, got) == (kind, layers)
        assert (n_f, n_out) == (layers[0], layers[-1])
        # Every output's linear weights and factor vectors, and its bias.
        assert nw + nb >= n_f * n_out * (layers[1] + 1) + n_out
        assert params["factors"] == layers[1] and params["optimizer"] == "adam"
        assert params.get("activation") is None and params.get("hidden") is None
        again = scalar(tconn, "SELECT corgipile_train(relation::regclass, model_type, params) FROM corgipile.models "
                              "WHERE id = %s", (mid,))
        assert model_row(tconn, again, "weights::text, bias::text, layers") == \
            model_row(tconn, mid, "weights::text, bias::text, layers")


def test_optimizer_sgd_l2_and_normalize(tconn):
    sgd = fit(tconn, "fm_xor", "fm", epochs=30, optimizer="sgd", momentum=0.5, batch_size=16)
    p = model_row(tconn, sgd, "params")[0]
    assert (p["optimizer"], p["momentum"], p["batch_size"]) == ("sgd", 0.5, 16)
    assert evaluate(tconn, sgd, "fm_xor_test")["accuracy"] > 0.85
    raw = fit(tconn, "fm_xor", "fm", epochs=30, normalize=False)
    assert evaluate(tconn, raw, "fm_xor_test")["accuracy"] > 0.85
    # A strong L2 keeps the weights small.
    plain, shrunk = fit(tconn, "fm_xor", "fm", epochs=10), fit(tconn, "fm_xor", "fm", epochs=10, l2=1.0)
    norm = lambda m: float(np.linalg.norm(model_row(tconn, m, "weights")[0]))  # noqa: E731
    assert norm(shrunk) < 0.5 * norm(plain), (norm(shrunk), norm(plain))


def test_validation_and_patience_keep_the_best_epoch(tconn):
    m = fit(tconn, "fm_xor", "fm", epochs=40, validation={"relation": "fm_xor_test"}, patience=2,
            learning_rate=0.05)
    metrics = model_row(tconn, m, "metrics")[0]
    epochs = dict(tconn.execute("SELECT epoch, validation_loss FROM corgipile.epochs WHERE model_id = %s",
                                (m,)).fetchall())
    assert len(epochs) == metrics["epochs_run"] and all(v is not None for v in epochs.values())
    best = min(epochs, key=epochs.get)
    assert metrics["best_epoch"] == best
    # Measured: stops after epoch 24, the best 22.
    assert metrics["epochs_run"] < 40 and metrics["epochs_run"] == best + 2
    assert evaluate(tconn, m, "fm_xor_test")["log_loss"] == pytest.approx(epochs[best], rel=1e-9)


def test_search_over_factors_and_learning_rate(tconn):
    tconn.execute("DELETE FROM corgipile.models WHERE name = 'fm_search'")  # of an earlier run
    best = fit(tconn, "fm_xor", "fm", epochs=5, name="fm_search",
               search={"factors": [2, 8], "learning_rate": [0.001, 0.01]})
    rows = tconn.execute("""SELECT model_id, params, score, selected FROM corgipile.search_trials
                            WHERE name = 'fm_search' ORDER BY version""").fetchall()
    assert len(rows) == 4 and rows[-1][0] == best and rows[-1][3]
    assert rows[-1][2] == max(r[2] for r in rows) > 0.85
    for mid, params, _, _ in rows:
        assert model_row(tconn, mid, "model_type, layers") == ("fm", [2, params["factors"], 2])
        stored = model_row(tconn, mid, "params")[0]
        alone = scalar(tconn, "SELECT corgipile_train('fm_xor', 'fm', %s)", (Jsonb({**stored, "name": None}),))
        assert model_row(tconn, alone, "weights, bias") == model_row(tconn, mid, "weights, bias"), params


def test_folds_and_groups(tconn):
    m = fit(tconn, "fm_xor", "fm", epochs=20, folds=3)
    cv = model_row(tconn, m, "metrics->'cv'")[0]
    assert sum(f["rows"] for f in cv["per_fold"]) == 2000 and cv["accuracy"] > 0.85, cv
    tconn.execute("DELETE FROM corgipile.models WHERE name = 'fm_groups'")  # of an earlier run
    family = fit(tconn, "fm_xor", "fm", features=["x0", "x1"], epochs=20, name="fm_groups", group_by="half")
    rows = tconn.execute("""SELECT model_id, group_key, group_rows FROM corgipile.group_models
                            WHERE name = 'fm_groups' ORDER BY group_key""").fetchall()
    assert [(r[1], r[2]) for r in rows] == [("a", 1000), ("b", 1000)]
    assert all(model_row(tconn, r[0], "model_type")[0] == "fm" for r in rows)
    picked = dict(tconn.execute("""SELECT s.half, p.model_id FROM fm_xor s, corgipile_predict_group('fm_groups', s) p
                                   WHERE s.id <= 4""").fetchall())
    assert picked == {r[1]: r[0] for r in rows}
    assert evaluate(tconn, family, "fm_xor_test")["accuracy"] > 0.85


@pytest.mark.parametrize("model", ["fm", "fm_regression"])
def test_workers(tconn, model):
    rel, test = ("fm_xor", "fm_xor_test") if model == "fm" else ("fm_reg", "fm_reg_test")
    m = train_with_workers(tconn, rel, model, {**DEFAULTS, "epochs": 30, "workers": 2})
    assert model_row(tconn, m, "model_type, params->>'workers'") == (model, "2")
    r = evaluate(tconn, m, test)
    print(f"{model} with 2 workers: {r}")
    assert (r["accuracy"] if model == "fm" else r["r2"]) > 0.85


DUMP_SRC, DUMP_DST = "corgipile_fm_dump_src", "corgipile_fm_dump_dst"


def dump_dbs(*create):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (DUMP_SRC, DUMP_DST):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        for db in create:
            admin.execute(f"CREATE DATABASE {db}")


def test_fm_models_survive_dump_and_restore(tmp_path):
    dump_dbs(DUMP_SRC, DUMP_DST)
    try:
        with psycopg.connect(dbname=DUMP_SRC, autocommit=True) as c:
            c.execute("CREATE EXTENSION corgipile")
            c.execute(f"""CREATE TABLE pts AS SELECT i AS id, ARRAY[x, y] AS features, (x * y > 0)::int AS label,
                            CASE WHEN i % 7 = 0 THEN NULL ELSE (ARRAY['a','b','c'])[1 + i % 3] END AS cat,
                            100 + 3 * x * y AS amount
                          FROM (SELECT i, {u('i')} AS x, {u('i * 7 + 3')} AS y FROM generate_series(1, 1500) i) s""")
            ids = [fit(c, "pts", "fm", epochs=2, factors=4, name="pts_fm"),
                   fit(c, "pts", "fm_regression", label="amount", epochs=2, optimizer="sgd"),
                   fit(c, "pts", "fm", features=["cat", "features"], epochs=2)]
            c.execute("SELECT corgipile_deploy('pts_fm', %s)", (ids[0],))
            q = f"""SELECT id, corgipile_predict_proba({ids[0]}, p.features), corgipile_predict({ids[1]}, p.features),
                           corgipile_predict_proba({ids[2]}, r), corgipile_predict_proba('pts_fm', p.features)
                    FROM pts p, LATERAL (SELECT p.cat, p.features) r ORDER BY id"""
            before = c.execute(q).fetchall()
            catalog = c.execute("SELECT id, model_type, layers, weights, bias, params FROM corgipile.models "
                                "ORDER BY id").fetchall()
        dump = tmp_path / "fm.dump"
        subprocess.run(["pg_dump", "-Fc", "-f", str(dump), DUMP_SRC], check=True)
        subprocess.run(["pg_restore", "-d", DUMP_DST, str(dump)], check=True)
        with psycopg.connect(dbname=DUMP_DST, autocommit=True) as c:
            assert c.execute("SELECT id, model_type, layers, weights, bias, params FROM corgipile.models "
                             "ORDER BY id").fetchall() == catalog
            assert c.execute(q).fetchall() == before
            assert scalar(c, "SELECT pinned FROM corgipile.models WHERE id = %s", (ids[0],)) is True
    finally:
        dump_dbs()


# =============================================================================================
# 5. Errors, grants, memory, cancel


@pytest.fixture
def alice(roles_env, tables):
    with connect(tables) as admin:
        admin.execute(f"GRANT SELECT ON fm_xor TO {ALICE}")
    with connect(roles_env, ALICE) as c:
        yield c


def expect_train_error(conn, rel, model, params, sqlstate, *needles):
    before = models_count(conn)
    epochs_before = scalar(conn, "SELECT count(*) FROM corgipile.epochs")
    e = train_error(conn, rel, model, {"epochs": 1, **params})
    assert e is not None and e.sqlstate == sqlstate, describe(e)
    text = (e.diag.message_primary or "") + " " + (e.diag.message_hint or "")
    for n in needles:
        assert n in text, describe(e)
    assert models_count(conn) == before and scalar(conn, "SELECT count(*) FROM corgipile.epochs") == epochs_before
    assert scalar(conn, "SELECT 1") == 1
    return e


REFUSED = [
    ("logistic", {"factors": 4}, '"factors" applies to fm and fm_regression only'),
    ("mlp", {"factors": 4}, '"factors" applies to fm and fm_regression only'),
    ("linear", {"factors": 8}, '"factors" applies to fm and fm_regression only'),
    ("fm", {"hidden": [8]}, "applies to mlp and mlp_regression only"),
    ("fm_regression", {"activation": "tanh"}, "applies to mlp and mlp_regression only"),
    ("fm", {"factors": 0}, "factors"),
    ("fm", {"factors": 257}, "factors"),
    ("fm_regression", {"factors": "x"}, "factors"),
    ("fm", {"factors": 1.5}, "factors"),
    ("fm", {"factors": -3}, "factors"),
    ("fm", {"optimizer": "rmsprop"}, "optimizer"),
    ("fm", {"momentum": 0.5}, "momentum"),
    ("fm", {"patience": 3}, '"patience" needs "validation"'),
]


@pytest.mark.parametrize("model,params,message", REFUSED, ids=[f"{m}-{'-'.join(p)}-{i}" for i, (m, p, _) in enumerate(REFUSED)])
def test_refused_params(alice, model, params, message):
    expect_train_error(alice, "hard_small", model, params, "22023", message)


@pytest.mark.parametrize("factors", [1, 256])
def test_factors_bounds_accepted(alice, factors):
    m = train(alice, "hard_small", "fm", {"epochs": 1, "factors": factors, "seed": 1})
    assert model_row(alice, m, "layers, params->'factors'") == ([4, factors, 2], factors)


def test_a_private_model_is_invisible_to_another_role_until_granted(roles_env, alice):
    m = train(alice, "hard_small", "fm", {"epochs": 2, "seed": 1, "name": "fm_private"})
    x = "ARRAY[0.5, 0.1, 0.2, 0.3]::float8[]"
    mine = scalar(alice, f"SELECT corgipile_predict_proba(%s::bigint, {x})", (m,))
    with connect(roles_env, BOB) as bob:
        for arg in ((m, "bigint"), (f"{ALICE}.fm_private", "text")):
            with pytest.raises(E.UndefinedObject):
                bob.execute(f"SELECT corgipile_predict_proba(%s::{arg[1]}, {x})", (arg[0],))
        assert scalar(bob, "SELECT count(*) FROM corgipile.models WHERE id = %s", (m,)) == 0
        alice.execute("SELECT corgipile_grant(%s::bigint, %s, 'use')", (m, BOB))
        try:
            assert scalar(bob, f"SELECT corgipile_predict_proba(%s::bigint, {x})", (m,)) == mine
        finally:
            alice.execute("SELECT corgipile_revoke(%s::bigint, %s, 'use')", (m, BOB))
        with pytest.raises(E.UndefinedObject):
            bob.execute(f"SELECT corgipile_predict_proba(%s::bigint, {x})", (m,))


def test_factorization_beyond_max_model_memory(alice, tables):
    crashes = server_crashes()
    started = time.monotonic()
    # 1,000,000 sparse features x 256 factors x 2 classes: GBs, over the 512MB default: refused
    # before the table is read.
    expect_train_error(alice, "hard_small", "fm", {"features": {"indices": "idx", "values": "val"},
                                                   "n_features": 1_000_000, "factors": 256, "epochs": 1000},
                       "54000", "corgipile.max_model_memory")
    assert time.monotonic() - started < 2
    with connect(tables) as su:
        su.execute("SET corgipile.max_model_memory = '64kB'")
        # 64 features x 128 factors x 2 classes: 128 kB of factors alone.
        expect_train_error(su, "fm_wide", "fm", {"factors": 128, "epochs": 1000}, "54000", "corgipile.max_model_memory")
        su.execute("RESET corgipile.max_model_memory")
        assert fit(su, "fm_wide", "fm", epochs=1, factors=128) > 0
    assert server_crashes() == crashes


def test_divergence_is_an_error_and_stores_nothing(alice, tables):
    with connect(tables) as admin:
        admin.execute(f"GRANT SELECT ON fm_reg TO {ALICE}")
    e = expect_train_error(alice, "fm_reg", "fm_regression", {"epochs": 3, "optimizer": "sgd", "learning_rate": 1e5,
                                                              "normalize": False}, "22003", "diverged")
    assert "learning_rate" in (e.diag.message_hint or ""), describe(e)


def test_cancel_and_statement_timeout_stop_a_long_training(tables):
    params = {"epochs": 1_000_000, "factors": 256, "batch_size": 1}
    with connect(tables) as victim, connect(tables) as killer:
        before = catalog_counts(killer)
        pid = scalar(victim, "SELECT pg_backend_pid()")
        t, result = start_training(victim, "fm_wide", "fm", params)
        try:
            wait_active(killer, pid)
            time.sleep(1.5)
            assert t.is_alive(), f"training ended: {result}"
            latency = cancel_and_join(killer, t, result, pid, timeout=30)
        finally:
            stop_if_running(killer, t, pid)
        print(f"\ncancel latency fm factors 256: {latency:.3f} s")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < 2.0, f"cancel took {latency:.2f} s"
        assert catalog_counts(killer) == before
        victim.execute("SET statement_timeout = '1500ms'")
        started = time.monotonic()
        with pytest.raises(E.QueryCanceled):
            train(victim, "fm_wide", "fm_regression", params)
        elapsed = time.monotonic() - started
        victim.execute("RESET statement_timeout")
        print(f"statement_timeout latency fm_regression: {elapsed - 1.5:.3f} s")
        assert elapsed - 1.5 < 2.0
        assert catalog_counts(killer) == before
        assert scalar(victim, "SELECT 1") == 1


def test_explain_plans_an_fm_training(tconn):
    for model in ("fm", "fm_regression"):
        lines = [r[0].strip() for r in tconn.execute("SELECT * FROM corgipile_explain('fm_xor', %s, %s)",
                                                     (model, Jsonb({"factors": 4}))).fetchall()]
        assert f"Model: {model}" in lines and "Factors: 4" in lines, lines
