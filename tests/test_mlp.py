"""Networks (0.5.0): `mlp` (softmax output over the label's classes) and `mlp_regression` (a
number, predicted in the label's units), trained by corgipile_train like the linear kinds.
Checked as a user sees them:

1. What they learn: on non-linear tables (XOR on a dense array, rings with text labels, a
   mixed-type column list stored ORDER BY label, a non-linear regression around 1000) a network
   clearly beats the linear kind; on a table clustered by label, CorgiPile's shuffle clearly
   beats no shuffle; the same seed gives the same weights bit for bit, another seed others.
2. Every input shape: sparse pairs (with and without n_features), column lists and "*" with
   text, boolean and NULL values, class_weight, validation (fraction, predicate, relation) and
   patience (early stopping keeps the best epoch's model).
3. Every prediction function, from arrays, sparse pairs and rows, by id and by name, in a
   parallel plan, against corgipile_evaluate and against a forward pass computed here from the
   catalog's layers, weights and bias.
4. The catalog (layers, sizes, params with the network's defaults; linear models unchanged),
   names, versions, deploy and drop; pg_dump / pg_restore.
5. Errors, as an ordinary role (roles_env's hard_alice): every refused param combination, a
   network beyond corgipile.max_model_memory, coefficients, non-finite labels,
   divergence; nothing is written to the catalog.
6. Cancel of a long training; corgipile_explain.

Tables are mlp_* in the shared database (dropped at the end of the module).
"""

import math
import subprocess
import time

import numpy as np
import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import (ROLES_ENV_ALICE, cancel_and_join, catalog_counts, connect, describe, evaluate,
                     models_count, scalar, start_training, stop_if_running, train, train_error, wait_active)
from tables import XY, bad_label, raw_scale

ALICE = ROLES_ENV_ALICE
DEFAULTS = {"verbose": False, "seed": 1}  # train()'s params unless a test overrides them
TABLES = ("mlp_xor", "mlp_xor_sorted", "mlp_rings", "mlp_mixed", "mlp_reg", "mlp_noisy", "mlp_noisy_val",
          "mlp_sparse", "mlp_imbalanced", "mlp_val", "mlp_cancel", "mlp_bad_label", "mlp_inf_label", "mlp_raw")
MIXED_FEATURES = ["color", "member", "amount", "age", "noise"]


@pytest.fixture(scope="module")
def tables(dsn):
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")
        # XOR of the signs: no linear model does better than chance.
        c.execute(f"""CREATE TABLE mlp_xor AS SELECT i AS id, ARRAY[x, y] AS features,
                        ((x > 0) <> (y > 0))::int AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s""")
        # The same, 20,000 rows stored by label: all 0s, then all 1s.
        c.execute(f"""CREATE TABLE mlp_xor_sorted AS SELECT i AS id, ARRAY[x, y] AS features,
                        ((x > 0) <> (y > 0))::int AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 20000) i) s ORDER BY 3, 1""")
        # Three concentric rings, text labels.
        c.execute(f"""CREATE TABLE mlp_rings AS SELECT i AS id, ARRAY[x, y] AS features,
                        CASE WHEN x * x + y * y < 0.9 THEN 'inner' WHEN x * x + y * y < 2.2 THEN 'middle'
                             ELSE 'outer' END AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s""")
        # Mixed types, raw scales, NULLs; the label a per-category threshold of amount (and an XOR
        # of it with the boolean); stored ORDER BY label.
        c.execute("""CREATE TABLE mlp_mixed AS
            WITH base AS (SELECT i,
              CASE WHEN i % 13 = 0 THEN NULL
                   ELSE (ARRAY['red','green','blue'])[1 + (hashint4(i * 3 + 1) & 1023) % 3] END AS color,
              (hashint4(i * 5 + 2) & 1) = 1 AS member,
              CASE WHEN i % 17 = 0 THEN NULL ELSE (hashint4(i * 7 + 3) & 16383) % 10000 END AS amount,
              18 + (hashint4(i * 11 + 4) & 1023) % 60 AS age,
              ((hashint4(i * 13 + 5) & 1023) / 1023.0)::float8 AS noise
              FROM generate_series(1, 4000) i)
            SELECT i AS id, color, member, amount, age, noise,
              CASE WHEN amount IS NULL THEN member
                   WHEN color = 'red' THEN amount > 7000
                   WHEN color = 'green' THEN amount < 3000
                   ELSE (amount > 5000) <> member END AS label
            FROM base ORDER BY 7, 1""")
        # A bowl with a twist around 1000: linear R^2 is about 0.
        c.execute(f"""CREATE TABLE mlp_reg AS SELECT i AS id, ARRAY[x, y] AS features,
                        1000 + 50 * (x * x + y * y) - 30 * x * y AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s""")
        # 600 rows whose label agrees with sign(x) 70% of the time: a wide network overfits.
        c.execute(f"""CREATE TABLE mlp_noisy AS SELECT i AS id,
                        ARRAY[x, y, (hashint4(i * 17) % 1000) / 500.0, (hashint4(i * 19) % 1000) / 500.0] AS features,
                        (CASE WHEN (hashint4(i * 23) & 1023) < 300 THEN (x > 0) ELSE NOT (x > 0) END)::int AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 600) i) s""")
        c.execute("CREATE TABLE mlp_noisy_val AS SELECT * FROM mlp_noisy WHERE id % 3 = 0")
        # XOR as sparse pairs (1-based), with an indicator at index 3 on every fifth row and
        # index 2 left out when y is 0.
        c.execute(f"""CREATE TABLE mlp_sparse AS SELECT i AS id,
                        CASE WHEN i % 5 = 0 THEN ARRAY[1, 2, 3] WHEN y = 0 THEN ARRAY[1] ELSE ARRAY[1, 2] END AS idx,
                        CASE WHEN i % 5 = 0 THEN ARRAY[x, y, 1]::float8[] WHEN y = 0 THEN ARRAY[x]::float8[] ELSE ARRAY[x, y]::float8[] END AS val,
                        ARRAY[x, y, (i % 5 = 0)::int]::float8[] AS dense,
                        ((x > 0) <> (y > 0))::int AS label
                      FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s""")
        # 10% positives, overlapping: unweighted, the minority is mostly missed.
        c.execute("""CREATE TABLE mlp_imbalanced AS SELECT i AS id, ARRAY[x, y] AS features,
                        (i % 10 = 0)::int AS label
                      FROM (SELECT i, (hashint4(i) % 1000) / 500.0 + (i % 10 = 0)::int * 0.8 AS x,
                                   (hashint4(i * 7 + 3) % 1000) / 500.0 AS y FROM generate_series(1, 4000) i) s""")
        # A validation relation for mlp_xor (other rows, same columns).
        c.execute(f"""CREATE TABLE mlp_val AS SELECT i AS id, ARRAY[x, y] AS features,
                        ((x > 0) <> (y > 0))::int AS label
                      FROM (SELECT i, {XY} FROM generate_series(100001, 101000) i) s""")
        bad_label(c, "mlp_bad_label")
        bad_label(c, "mlp_inf_label", row=700, value="-Infinity")
        # Raw scales in the millions (for divergence).
        raw_scale(c, "mlp_raw", extra=["i % 2 AS cls"])
        c.execute("VACUUM ANALYZE mlp_xor, mlp_mixed, mlp_reg, mlp_rings")
    yield dsn
    with connect(dsn) as c:
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


def forward(conn, model_id, x):
    """The network's outputs for the rows `x` (n x n_features), computed here from its catalog row:
    weights layer after layer, each layers[l] x layers[l+1] input-major; ReLU between layers."""
    layers, weights, bias, activation = model_row(conn, model_id, "layers, weights, bias, params->>'activation'")
    w, b = np.array(weights), np.array(bias)
    h = np.asarray(x, dtype=float)
    wo = bo = 0
    for l in range(len(layers) - 1):
        n_in, n_out = layers[l], layers[l + 1]
        W = w[wo:wo + n_in * n_out].reshape(n_in, n_out)
        h = h @ W + b[bo:bo + n_out]
        wo += n_in * n_out
        bo += n_out
        if l < len(layers) - 2:
            h = np.maximum(h, 0) if activation == "relu" else np.tanh(h)
    assert (wo, bo) == (len(w), len(b))
    return h


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# =============================================================================================
# 1. What networks learn


def test_mlp_learns_xor_where_logistic_cannot(tconn):
    lin = fit(tconn, "mlp_xor", "logistic", epochs=10)
    mlp = fit(tconn, "mlp_xor", "mlp", epochs=10, hidden=[16])
    r_lin, r_mlp = evaluate(tconn, lin, "mlp_xor"), evaluate(tconn, mlp, "mlp_xor")
    print(f"xor: logistic {r_lin['accuracy']:.4f}, mlp {r_mlp['accuracy']:.4f}")
    # Measured 0.63 / 0.99.
    assert r_lin["accuracy"] < 0.7
    assert r_mlp["accuracy"] > 0.95
    assert r_mlp["rows_scored"] == 4000 and r_mlp["rows_skipped"] == 0
    assert r_mlp["log_loss"] < 0.3 < r_lin["log_loss"]
    # The report has softmax's metrics (per class, macro averages, log loss).
    sm = fit(tconn, "mlp_xor", "softmax", epochs=1)
    assert set(r_mlp) == set(evaluate(tconn, sm, "mlp_xor"))
    assert len(r_mlp["per_class"]) == 2 and r_mlp["macro_f1"] > 0.95


def test_mlp_rings_with_text_labels_beat_softmax(tconn):
    sm = fit(tconn, "mlp_rings", "softmax", epochs=10)
    mlp = fit(tconn, "mlp_rings", "mlp", epochs=15, hidden=[32, 16], activation="tanh")
    r_sm, r_mlp = evaluate(tconn, sm, "mlp_rings"), evaluate(tconn, mlp, "mlp_rings")
    print(f"rings: softmax {r_sm['accuracy']:.4f}, mlp {r_mlp['accuracy']:.4f}")
    assert r_mlp["accuracy"] > 0.9
    assert r_mlp["accuracy"] > r_sm["accuracy"] + 0.2
    assert len(r_mlp["per_class"]) == 3
    n_outputs, layers, mapping = model_row(tconn, mlp, "n_outputs, layers, label_mapping")
    assert (n_outputs, layers) == (3, [2, 32, 16, 3])
    assert sorted(mapping["classes"]) == ["inner", "middle", "outer"]
    # The predicted labels are the table's text values.
    got = dict(tconn.execute("""SELECT corgipile_predict_class(%s, features), count(*) FROM mlp_rings GROUP BY 1""",
                             (mlp,)).fetchall())
    assert set(got) == {"inner", "middle", "outer"}
    # corgipile_predict returns numbers: refused for text labels, as for softmax.
    e = error_of_sql(tconn, "SELECT corgipile_predict(%s, ARRAY[0.1, 0.2])", (mlp,))
    assert e is not None and e.sqlstate == "42809", describe(e)


def test_mlp_on_mixed_columns_sorted_by_label_beats_logistic(tconn):
    common = {"features": MIXED_FEATURES, "epochs": 10}
    lin = fit(tconn, "mlp_mixed", "logistic", common)
    mlp = fit(tconn, "mlp_mixed", "mlp", common)
    star = fit(tconn, "mlp_mixed", "mlp", {"features": "*", "exclude": ["id"], "epochs": 10})
    r_lin, r_mlp, r_star = (evaluate(tconn, m, "mlp_mixed") for m in (lin, mlp, star))
    print(f"mixed: logistic {r_lin['accuracy']:.4f}/{r_lin['roc_auc']:.4f}, mlp {r_mlp['accuracy']:.4f}, "
          f"mlp * {r_star['accuracy']:.4f}")
    # Measured 0.72 / 0.91 / 0.96 (10 and 20 epochs).
    assert r_lin["accuracy"] < 0.8
    assert r_mlp["accuracy"] > r_lin["accuracy"] + 0.1
    assert r_star["accuracy"] > r_lin["accuracy"] + 0.1
    # The network's preprocessing is the column list's: one-hot colors (with NULL), numbers.
    n_features, layers, features, prep = model_row(tconn, mlp, "n_features, layers, features, preprocessing")
    assert features == MIXED_FEATURES
    sources = {c["name"]: c["source"] for c in prep["columns"]}
    assert sources == {"color": "text", "member": "number", "amount": "number", "age": "number", "noise": "number"}
    # Numbers in piecewise-linear bins (a network's default), as many as the quantiles give.
    numbers = [c for c in prep["columns"] if c["source"] == "number"]
    assert [c["encode"] for c in numbers] == ["ple"] * 4, prep
    assert n_features == 4 + sum(len(c["edges"]) - 1 for c in numbers) and layers == [n_features, 64, 2]
    assert model_row(tconn, star, "features")[0] == ["color", "member", "amount", "age", "noise"]


def test_mlp_regression_beats_linear_in_the_labels_units(tconn):
    lin = fit(tconn, "mlp_reg", "linear", epochs=10)
    net = fit(tconn, "mlp_reg", "mlp_regression", epochs=10, hidden=[32])
    r_lin, r_net = evaluate(tconn, lin, "mlp_reg"), evaluate(tconn, net, "mlp_reg")
    print(f"regression: linear R2 {r_lin['r2']:.4f}, mlp_regression R2 {r_net['r2']:.4f} rmse {r_net['rmse']:.2f}")
    # Measured 0.002 / 0.955.
    assert r_lin["r2"] < 0.1
    assert r_net["r2"] > 0.85
    # Predictions are in the label's units (the target is standardized only inside training).
    rows = tconn.execute("SELECT label::float8, corgipile_predict(%s, features) FROM mlp_reg ORDER BY id",
                         (net,)).fetchall()
    y, p = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    assert abs(p.mean() - y.mean()) < 10
    assert 950 < p.min() and p.max() < 1500
    assert np.sqrt(np.mean((p - y) ** 2)) == pytest.approx(r_net["rmse"], rel=1e-9)
    assert 1 - np.sum((p - y) ** 2) / np.sum((y - y.mean()) ** 2) == pytest.approx(r_net["r2"], rel=1e-9)
    assert model_row(tconn, net, "layers")[0] == [2, 32, 1]
    assert not (model_row(tconn, net, "label_mapping")[0] or {}).get("classes")
    # The report has the linear regression's metrics.
    assert set(r_net) == set(r_lin)


@pytest.mark.parametrize("seed", [1, 2])
def test_corgipile_shuffle_beats_no_shuffle_on_a_table_clustered_by_label(tconn, seed):
    acc = {}
    for shuffle in ("corgipile", "no_shuffle"):
        m = fit(tconn, "mlp_xor_sorted", "mlp", epochs=3, hidden=[16], learning_rate=0.01, shuffle=shuffle, seed=seed)
        acc[shuffle] = evaluate(tconn, m, "mlp_xor_sorted")["accuracy"]
    print(f"clustered by label, seed {seed}: {acc}")
    # Measured 0.996 / 0.62: without a shuffle the last rows of every epoch are all 1s.
    assert acc["corgipile"] > 0.95
    assert acc["no_shuffle"] < acc["corgipile"] - 0.15


def test_same_seed_same_weights_other_seed_other_weights(tconn):
    p = {"epochs": 3, "hidden": [8, 8]}
    a, b = fit(tconn, "mlp_xor", "mlp", p, seed=7), fit(tconn, "mlp_xor", "mlp", p, seed=7)
    c = fit(tconn, "mlp_xor", "mlp", p, seed=8)
    ra, rb, rc = (model_row(tconn, m, "weights::text, bias::text") for m in (a, b, c))
    assert ra == rb
    assert ra[0] != rc[0]
    # The same for a regression network and sgd.
    q = {"epochs": 2, "hidden": [8], "optimizer": "sgd"}
    d, e = fit(tconn, "mlp_reg", "mlp_regression", q, seed=3), fit(tconn, "mlp_reg", "mlp_regression", q, seed=3)
    assert model_row(tconn, d, "weights::text, bias::text") == model_row(tconn, e, "weights::text, bias::text")


# =============================================================================================
# 2. Input shapes


def test_sparse_pairs_with_n_features(tconn):
    params = {"features": {"indices": "idx", "values": "val"}, "n_features": 3, "epochs": 10, "hidden": [16]}
    m = fit(tconn, "mlp_sparse", "mlp", params)
    nf, layers = model_row(tconn, m, "n_features, layers")
    assert nf == 3 and layers == [3, 16, 2]
    r = evaluate(tconn, m, "mlp_sparse")
    print(f"sparse: {r['accuracy']:.4f}")
    assert r["accuracy"] > 0.93
    # Sparse and dense inputs of the same row predict alike.
    rows = tconn.execute("""SELECT corgipile_predict_proba(%s, idx, val), corgipile_predict_proba(%s, dense)
                            FROM mlp_sparse WHERE id <= 50""", (m, m)).fetchall()
    for sparse, dense in rows:
        assert sparse == pytest.approx(dense, rel=1e-12, abs=1e-15)
    reg = fit(tconn, "mlp_sparse", "mlp_regression", {**params, "label": "id", "epochs": 1})
    assert model_row(tconn, reg, "layers")[0] == [3, 16, 1]


@pytest.mark.parametrize("model", ["mlp", "mlp_regression"])
def test_sparse_pairs_without_n_features(tconn, model):
    # The first layer is as wide as the statistics pass found the rows (largest index + 1),
    # as a linear model over the same pairs grows to.
    params = {"features": {"indices": "idx", "values": "val"}, "epochs": 2, "hidden": [16]}
    lin = fit(tconn, "mlp_sparse", "softmax", features=params["features"], epochs=1)
    assert model_row(tconn, lin, "n_features")[0] == 3
    extra = {"label": "id"} if model == "mlp_regression" else {}
    m = fit(tconn, "mlp_sparse", model, {**params, **extra})
    assert model_row(tconn, m, "layers")[0] == [3, 16, 1 if model == "mlp_regression" else 2]
    assert model_row(tconn, m, "params->'n_features'")[0] is None


def test_class_weight_balanced_raises_minority_recall(tconn):
    p = {"epochs": 5, "hidden": [16]}
    plain = fit(tconn, "mlp_imbalanced", "mlp", p)
    balanced = fit(tconn, "mlp_imbalanced", "mlp", p, class_weight="balanced")
    r_plain, r_bal = evaluate(tconn, plain, "mlp_imbalanced"), evaluate(tconn, balanced, "mlp_imbalanced")
    # per_class follows the model's class order (as the statistics pass met the labels, which
    # the table's physical order decides): the minority is the class of least support.
    def minority_recall(report):
        per_class = report["per_class"]
        return min(per_class, key=lambda c: c["support"])["recall"]
    rec_plain, rec_bal = minority_recall(r_plain), minority_recall(r_bal)
    print(f"minority recall: plain {rec_plain:.3f}, balanced {rec_bal:.3f}")
    assert rec_bal > rec_plain + 0.2
    assert model_row(tconn, balanced, "params->'class_weight'")[0] == "balanced"


@pytest.mark.parametrize("validation", [{"fraction": 0.2}, {"predicate": "id % 5 = 0"}, {"relation": "mlp_val"}],
                         ids=["fraction", "predicate", "relation"])
def test_validation(tconn, validation):
    m = fit(tconn, "mlp_xor", "mlp", epochs=4, hidden=[16], validation=validation)
    rows = tconn.execute("""SELECT epoch, validation_loss, validation_accuracy FROM corgipile.epochs
                            WHERE model_id = %s ORDER BY epoch""", (m,)).fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert all(r[1] is not None and r[1] > 0 and 0 <= r[2] <= 1 for r in rows)
    assert rows[-1][2] > 0.85
    rows_trained = model_row(tconn, m, "rows_trained")[0]
    held = {"fraction": None, "predicate": 800, "relation": 0}[next(iter(validation))]
    if held is None:
        assert 3000 < rows_trained < 3400
    else:
        assert rows_trained == 4000 - held
    metrics = model_row(tconn, m, "metrics")[0]
    assert "best_epoch" not in metrics  # no patience
    if "relation" in validation:
        # The last epoch's validation loss is the stored model's log loss on that relation.
        assert evaluate(tconn, m, "mlp_val")["log_loss"] == pytest.approx(rows[-1][1], rel=1e-9)


def test_patience_stops_early_and_keeps_the_best_epoch(tconn):
    m = fit(tconn, "mlp_noisy", "mlp", epochs=200, hidden=[128, 128], learning_rate=0.01,
            validation={"predicate": "id % 3 = 0"}, patience=3)
    metrics, params = model_row(tconn, m, "metrics, params")
    epochs = tconn.execute("SELECT epoch, validation_loss FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch",
                           (m,)).fetchall()
    print(f"patience: {metrics['epochs_run']} epochs run, best {metrics['best_epoch']}: {epochs}")
    assert params["patience"] == 3
    assert metrics["epochs_run"] < 200 and len(epochs) == metrics["epochs_run"]
    losses = {e: v for e, v in epochs}
    best = min(losses, key=losses.get)
    assert metrics["best_epoch"] == best
    # Stopped 3 epochs without improvement after the best.
    assert metrics["epochs_run"] == best + 3
    # The stored model is the best epoch's: its loss on the validation rows is that epoch's.
    assert evaluate(tconn, m, "mlp_noisy_val")["log_loss"] == pytest.approx(losses[best], rel=1e-9)
    assert evaluate(tconn, m, "mlp_noisy_val")["log_loss"] != pytest.approx(losses[metrics["epochs_run"]], rel=1e-6)


def test_patience_on_mlp_regression_and_linear(tconn):
    # patience is for every kind; a training that keeps improving runs every epoch.
    net = fit(tconn, "mlp_reg", "mlp_regression", epochs=4, hidden=[16], validation={"fraction": 0.2}, patience=50)
    lin = fit(tconn, "mlp_xor", "logistic", epochs=3, validation={"fraction": 0.2}, patience=1)
    for m in (net, lin):
        metrics = model_row(tconn, m, "metrics")[0]
        assert 1 <= metrics["best_epoch"] <= metrics["epochs_run"]
    assert model_row(tconn, net, "metrics")[0]["epochs_run"] == 4


# =============================================================================================
# 3. Predictions


def error_of_sql(conn, sql, params=None):
    try:
        conn.execute(sql, params)
    except psycopg.Error as e:
        return e
    return None


def test_mlp_predictions_from_arrays_agree_with_each_other_and_a_forward_pass(tconn):
    m = fit(tconn, "mlp_xor", "mlp", epochs=5, hidden=[16, 8], name="mlp_xor_net")
    rows = tconn.execute("""SELECT features, label, corgipile_predict(%s, features), corgipile_predict_class(%s, features),
                                   corgipile_predict_proba(%s, features), corgipile_predict('mlp_xor_net', features),
                                   corgipile_predict_proba('mlp_xor_net', features)
                            FROM mlp_xor ORDER BY id""", (m, m, m)).fetchall()
    x = np.array([r[0] for r in rows])
    proba = np.array([r[4] for r in rows])
    classes = model_row(tconn, m, "label_mapping")[0]["classes"]
    assert classes == [0.0, 1.0]
    # The catalog row is the network: normalization folded into the first layer, softmax output.
    assert proba == pytest.approx(softmax(forward(tconn, m, x)), rel=1e-9, abs=1e-12)
    for feat, label, pred, cls, pr, pred_n, pr_n in rows:
        assert sum(pr) == pytest.approx(1.0)
        assert pred == classes[int(np.argmax(pr))]
        assert cls == str(int(pred))
        assert (pred_n, pr_n) == (pred, pr)
    accuracy = sum(r[2] == r[1] for r in rows) / len(rows)
    report = evaluate(tconn, m, "mlp_xor")
    assert accuracy == pytest.approx(report["accuracy"], abs=1e-12)
    log_loss = -np.mean([math.log(r[4][int(r[1])]) for r in rows])
    assert log_loss == pytest.approx(report["log_loss"], rel=1e-9)
    # A network has one score per class: no decision function (as softmax).
    e = error_of_sql(tconn, "SELECT corgipile_decision_function(%s, ARRAY[0.5, 0.5])", (m,))
    assert e is not None and e.sqlstate == "42809" and "one score per class" in e.diag.message_primary, describe(e)
    # Wrong widths are refused.
    e = error_of_sql(tconn, "SELECT corgipile_predict(%s, ARRAY[0.5, 0.5, 0.5])", (m,))
    assert e is not None and e.sqlstate.startswith("22"), describe(e)


def test_mlp_regression_predictions(tconn):
    m = fit(tconn, "mlp_reg", "mlp_regression", epochs=3, hidden=[16], name="mlp_reg_net")
    rows = tconn.execute("""SELECT corgipile_predict(%s, features), corgipile_decision_function(%s, features),
                                   corgipile_predict('mlp_reg_net', features), corgipile_decision_function('mlp_reg_net', features)
                            FROM mlp_reg ORDER BY id""", (m, m)).fetchall()
    for p, d, pn, dn in rows:
        assert p == d == pn == dn
    for fn, what in (("corgipile_predict_proba", "no probabilities"), ("corgipile_predict_class", "not classes")):
        e = error_of_sql(tconn, f"SELECT {fn}(%s, ARRAY[0.5, 0.5])", (m,))
        assert e is not None and e.sqlstate == "42809" and what in e.diag.message_primary, describe(e)


def test_row_predictions_of_column_list_networks(tconn):
    cls = fit(tconn, "mlp_mixed", "mlp", features=MIXED_FEATURES, epochs=3, name="mlp_mixed_net")
    reg = fit(tconn, "mlp_mixed", "mlp_regression", label="amount", features=["color", "member", "age", "noise"],
              epochs=2, name="mlp_mixed_reg")
    rows = tconn.execute("""SELECT label, corgipile_predict(%s, t), corgipile_predict_class(%s, t),
                                   corgipile_predict_proba(%s, t), corgipile_predict('mlp_mixed_net', t),
                                   corgipile_predict_class('mlp_mixed_net', t),
                                   corgipile_predict(%s, t), corgipile_decision_function('mlp_mixed_reg', t)
                            FROM mlp_mixed t ORDER BY id""", (cls, cls, cls, reg)).fetchall()
    # Probabilities come in the order of label_mapping's classes (the order first read).
    classes = scalar(tconn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (cls,))
    true_at = [i for i, v in enumerate(classes) if v in (1, 1.0, True, "true")][0]
    for label, pred, c, pr, pred_n, c_n, rp, rd in rows:
        assert c in ("true", "false") and c == c_n and pred == pred_n
        assert pred == (1.0 if c == "true" else 0.0)
        assert (pr[true_at] > pr[1 - true_at]) == (c == "true")
        assert rp == rd
    report = evaluate(tconn, cls, "mlp_mixed")
    assert sum((r[2] == "true") == r[0] for r in rows) / len(rows) == pytest.approx(report["accuracy"], abs=1e-12)
    # The regression's predictions are in amount's units (0 ... 10,000).
    mean_pred = np.mean([r[6] for r in rows])
    assert 3000 < mean_pred < 7000
    r_reg = evaluate(tconn, reg, "mlp_mixed")
    assert r_reg["rows_skipped"] == scalar(tconn, "SELECT count(*) FROM mlp_mixed WHERE amount IS NULL")
    # An array cannot stand for a row with a text column.
    e = error_of_sql(tconn, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3, 4, 5, 6, 7, 8]::float8[])", (cls,))
    assert e is not None and e.sqlstate == "42809", describe(e)


def test_predictions_in_a_parallel_plan_agree_with_serial(tconn):
    m = fit(tconn, "mlp_mixed", "mlp", features=MIXED_FEATURES, epochs=2)
    arr = fit(tconn, "mlp_xor", "mlp", epochs=2)
    reg = fit(tconn, "mlp_reg", "mlp_regression", epochs=2)
    queries = [
        (f"SELECT sum((corgipile_predict_proba({m}, t))[2]) FROM mlp_mixed t", "mlp_mixed"),
        (f"SELECT sum((corgipile_predict_proba({arr}, features))[2]), sum(corgipile_predict({arr}, features)) FROM mlp_xor", "mlp_xor"),
        (f"SELECT sum(corgipile_predict({reg}, features)) FROM mlp_reg", "mlp_reg"),
    ]
    serial = [tconn.execute(q).fetchone() for q, _ in queries]
    with tconn.transaction():
        for s in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0", "min_parallel_table_scan_size = 0",
                  "max_parallel_workers_per_gather = 2", "parallel_leader_participation = off"):
            tconn.execute(f"SET LOCAL {s}")
        for (q, _), before in zip(queries, serial):
            plan = "\n".join(r[0] for r in tconn.execute("EXPLAIN (COSTS OFF) " + q).fetchall())
            assert "Gather" in plan, plan
            after = tconn.execute(q).fetchone()
            assert after == pytest.approx(before, rel=1e-9)


# =============================================================================================
# 4. Catalog, names, dump/restore


def test_catalog_layers_sizes_and_params(tconn):
    m = fit(tconn, "mlp_rings", "mlp", epochs=1, hidden=[5, 4, 3])
    sgd = fit(tconn, "mlp_reg", "mlp_regression", epochs=1, optimizer="sgd")
    lin = fit(tconn, "mlp_xor", "logistic", epochs=1)
    n_features, n_outputs, layers, nw, nb, mapping, params = model_row(
        tconn, m, "n_features, n_outputs, layers, cardinality(weights), cardinality(bias), label_mapping, params")
    assert layers == [2, 5, 4, 3, 3] and n_features == 2 and n_outputs == 3 == len(mapping["classes"])
    assert nw == 2 * 5 + 5 * 4 + 4 * 3 + 3 * 3 and nb == 5 + 4 + 3 + 3
    # Defaults of a network filled in.
    assert params["hidden"] == [5, 4, 3] and params["activation"] == "relu" and params["optimizer"] == "adam"
    assert params["learning_rate"] == 0.001 and params["learning_rate_schedule"] == "constant"
    assert params["batch_size"] == 32 and params["average"] is False
    assert "momentum" not in params or params["momentum"] is None
    p_sgd, layers_sgd, n_out_sgd = model_row(tconn, sgd, "params, layers, n_outputs")
    assert p_sgd["hidden"] == [64] and p_sgd["optimizer"] == "sgd" and p_sgd["momentum"] == 0.9
    assert p_sgd["learning_rate"] == 0.01 and p_sgd["activation"] == "relu"
    assert layers_sgd == [2, 64, 1] and n_out_sgd == 1
    # A linear model: no network keys, no layers, its own defaults.
    p_lin, layers_lin = model_row(tconn, lin, "params, layers")
    assert layers_lin is None
    assert not {"hidden", "activation", "optimizer", "momentum"} & set(p_lin)
    assert "patience" in p_lin and p_lin["patience"] is None
    # The catalog's own check: a network's row is consistent (layers ends with n_outputs ...).
    assert scalar(tconn, """SELECT count(*) FROM corgipile.models WHERE layers IS NOT NULL AND
                            (layers[1] <> n_features OR layers[cardinality(layers)] <> n_outputs)""") == 0
    # Training the stored params again gives the same model.
    again = scalar(tconn, "SELECT corgipile_train('mlp_rings', 'mlp', params) FROM corgipile.models WHERE id = %s", (m,))
    assert model_row(tconn, again, "weights::text, bias::text, layers") == model_row(tconn, m, "weights::text, bias::text, layers")


def test_names_versions_deploy_and_drop(tconn):
    tconn.execute("DELETE FROM corgipile.models WHERE name = 'mlp_named'")  # of an earlier run
    v1 = fit(tconn, "mlp_xor", "mlp", epochs=1, hidden=[4], name="mlp_named")
    v2 = fit(tconn, "mlp_xor", "mlp", epochs=1, hidden=[8], name="mlp_named", seed=2)
    assert tconn.execute("SELECT version FROM corgipile.models WHERE name = 'mlp_named' ORDER BY id").fetchall() == [(1,), (2,)]
    q = "SELECT corgipile_predict_proba(%s, ARRAY[0.5, -0.5])"
    assert scalar(tconn, q, ("mlp_named",)) == scalar(tconn, q, (v2,))
    tconn.execute("SELECT corgipile_deploy('mlp_named', %s)", (v1,))
    assert scalar(tconn, q, ("mlp_named",)) == scalar(tconn, q, (v1,))
    assert scalar(tconn, q, (v1,)) != scalar(tconn, q, (v2,))
    assert scalar(tconn, "SELECT corgipile_drop_model(%s)", (v1,)) == 1
    assert scalar(tconn, "SELECT count(*) FROM corgipile.models WHERE id = %s", (v1,)) == 0
    assert scalar(tconn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (v1,)) == 0
    # The pinned version is gone: the name stands for the latest again.
    assert scalar(tconn, q, ("mlp_named",)) == scalar(tconn, q, (v2,))
    tconn.execute("SELECT corgipile_drop_model('mlp_named')")
    assert scalar(tconn, "SELECT count(*) FROM corgipile.models WHERE name = 'mlp_named'") == 0
    e = error_of_sql(tconn, q, ("mlp_named",))
    assert e is not None, "a dropped name still predicts"


DUMP_SRC, DUMP_DST = "corgipile_mlp_dump_src", "corgipile_mlp_dump_dst"


def test_networks_survive_dump_and_restore(tmp_path):
    def drop_dbs():
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            for db in (DUMP_SRC, DUMP_DST):
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    drop_dbs()
    try:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DUMP_SRC}")
        with psycopg.connect(dbname=DUMP_SRC, autocommit=True) as c:
            c.execute("CREATE EXTENSION corgipile")
            c.execute(f"""CREATE TABLE pts AS SELECT i AS id, ARRAY[x, y] AS features, ((x > 0) <> (y > 0))::int AS label,
                            CASE WHEN i % 7 = 0 THEN NULL ELSE (ARRAY['a','b','c'])[1 + i % 3] END AS cat,
                            1000 + 50 * x * y AS amount
                          FROM (SELECT i, {XY} FROM generate_series(1, 1500) i) s""")
            ids = [fit(c, "pts", "mlp", epochs=2, hidden=[8, 4], name="pts_net"),
                   fit(c, "pts", "mlp_regression", label="amount", epochs=2, activation="tanh", optimizer="sgd"),
                   fit(c, "pts", "mlp", features=["cat", "features"], epochs=2)]
            c.execute("SELECT corgipile_deploy('pts_net', %s)", (ids[0],))
            q = f"""SELECT id, corgipile_predict_proba({ids[0]}, p.features), corgipile_predict({ids[1]}, p.features),
                           corgipile_predict_proba({ids[2]}, r), corgipile_predict_proba('pts_net', p.features)
                    FROM pts p, LATERAL (SELECT p.cat, p.features) r ORDER BY id"""
            before = c.execute(q).fetchall()
            catalog = c.execute("SELECT id, layers, weights, bias, params FROM corgipile.models ORDER BY id").fetchall()
        dump = tmp_path / "mlp.dump"
        subprocess.run(["pg_dump", "-Fc", "-f", str(dump), DUMP_SRC], check=True)
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DUMP_DST}")
        subprocess.run(["pg_restore", "-d", DUMP_DST, str(dump)], check=True)
        with psycopg.connect(dbname=DUMP_DST, autocommit=True) as c:
            assert c.execute("SELECT id, layers, weights, bias, params FROM corgipile.models ORDER BY id").fetchall() == catalog
            assert c.execute(q).fetchall() == before
            assert scalar(c, "SELECT pinned FROM corgipile.models WHERE id = %s", (ids[0],)) is True
    finally:
        drop_dbs()


# =============================================================================================
# 5. Errors (as an ordinary role)


@pytest.fixture
def alice(roles_env, tables):
    with connect(tables) as admin:
        admin.execute(f"GRANT SELECT ON mlp_bad_label, mlp_inf_label, mlp_raw, mlp_xor TO {ALICE}")
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
    ("svm", {"hidden": [8]}, '"hidden" applies to mlp and mlp_regression only'),
    ("logistic", {"activation": "tanh"}, '"activation" applies to mlp and mlp_regression only'),
    ("linear", {"optimizer": "sgd"}, '"optimizer" applies to mlp, mlp_regression, fm and fm_regression only'),
    ("softmax", {"momentum": 0.5}, '"momentum" applies to mlp, mlp_regression, fm and fm_regression only'),
    ("mlp", {"momentum": 0.5}, '"momentum" applies to "optimizer": "sgd" only'),
    ("mlp_regression", {"optimizer": "adam", "momentum": 0.0}, '"momentum" applies to "optimizer": "sgd" only'),
    ("mlp", {"average": True}, '"average" cannot be used with mlp and mlp_regression'),
    ("mlp_regression", {"l1": 0.01}, '"l1" cannot be used with mlp and mlp_regression'),
    ("mlp", {"patience": 3}, '"patience" needs "validation"'),
    ("svm", {"patience": 3}, '"patience" needs "validation"'),
    ("mlp", {"hidden": []}, "hidden"),
    ("mlp", {"hidden": [0]}, "hidden"),
    ("mlp", {"hidden": [65537]}, "hidden"),
    ("mlp", {"hidden": [2] * 17}, "hidden"),
    ("mlp", {"hidden": 8}, "hidden"),
    ("mlp", {"hidden": [8.5]}, "hidden"),
    ("mlp", {"activation": "sigmoid"}, "activation"),
    ("mlp", {"optimizer": "rmsprop"}, "optimizer"),
    ("mlp", {"optimizer": "sgd", "momentum": 1.0}, "momentum"),
    ("mlp", {"optimizer": "sgd", "momentum": -0.1}, "momentum"),
    ("mlp", {"patience": 0, "validation": {"fraction": 0.1}}, "patience"),
]


@pytest.mark.parametrize("model,params,message", REFUSED, ids=[f"{m}-{'-'.join(p)}-{i}" for i, (m, p, _) in enumerate(REFUSED)])
def test_refused_params(alice, model, params, message):
    expect_train_error(alice, "hard_small", model, params, "22023", message)


def test_explicit_defaults_are_accepted(alice):
    # The defaults given explicitly are not refused (average false, l1 0, momentum with sgd).
    m = train(alice, "hard_small", "mlp", {"epochs": 1, "average": False, "l1": 0, "optimizer": "sgd",
                                           "momentum": 0.0, "hidden": [3], "activation": "tanh"})
    assert model_row(alice, m, "params->'momentum', layers") == (0.0, [4, 3, 2])


def test_network_beyond_max_model_memory(alice, tables):
    # Refused when the network is sized, before any of it is allocated or trained: at once.
    started = time.monotonic()
    e = expect_train_error(alice, "mlp_xor", "mlp", {"epochs": 1000, "hidden": [65536, 65536, 65536]}, "54000",
                           "corgipile.max_model_memory", "2 x 65536 x 65536 x 65536 x 2")
    assert time.monotonic() - started < 2
    assert "hidden" in e.diag.message_hint
    # An ordinary role cannot raise the limit.
    e = error_of_sql(alice, "SET corgipile.max_model_memory = '100GB'")
    assert e is not None and e.sqlstate == "42501", describe(e)
    # The setting is what decides: a small network fits the default, not 64 kB (superuser SET).
    with connect(tables) as su:
        su.execute("SET corgipile.max_model_memory = '64kB'")
        expect_train_error(su, "mlp_xor", "mlp", {"hidden": [256, 256]}, "54000", "corgipile.max_model_memory")
        su.execute("RESET corgipile.max_model_memory")
        assert fit(su, "mlp_xor", "mlp", epochs=1, hidden=[256, 256]) > 0


@pytest.mark.parametrize("model", ["mlp", "mlp_regression"])
def test_workers_train_a_network_as_an_ordinary_role(alice, model):
    # Accuracy with workers against one process: tests/test_parallel.py.
    m = train(alice, "hard_small", model, {"epochs": 1, "hidden": [4], "workers": 1})
    assert m is not None
    assert scalar(alice, "SELECT params->>'workers' FROM corgipile.models WHERE id = %s", (m,)) == "1"


def test_coefficients_refused_with_a_hint(alice):
    m = train(alice, "hard_small", "mlp", {"epochs": 1, "hidden": [4], "name": "mlp_alice"})
    for q, arg in (("SELECT * FROM corgipile_model_coefficients(%s)", m),
                   ("SELECT * FROM corgipile_model_coefficients(%s)", "mlp_alice")):
        e = error_of_sql(alice, q, (arg,))
        assert e is not None and e.sqlstate == "42809", describe(e)
        assert "corgipile_model_layers" in (e.diag.message_hint or ""), describe(e)


@pytest.mark.parametrize("model", ["mlp", "mlp_regression"])
@pytest.mark.parametrize("table,what", [("mlp_bad_label", "label is NaN"), ("mlp_inf_label", "label is -inf")])
def test_non_finite_labels_as_for_linear(alice, model, table, what):
    linear = {"mlp": "softmax", "mlp_regression": "linear"}[model]
    e_lin = train_error(alice, table, linear, {"epochs": 1})
    e = expect_train_error(alice, table, model, {}, e_lin.sqlstate, what)
    assert e.sqlstate.startswith("22")
    assert e.diag.message_primary == e_lin.diag.message_primary


def test_divergence_is_an_error_and_stores_nothing(alice):
    # (A softmax output's gradient is bounded: mlp's weights grow but stay finite.)
    params = {"epochs": 3, "optimizer": "sgd", "learning_rate": 1e5, "normalize": False}
    e = expect_train_error(alice, "mlp_raw", "mlp_regression", params, "22003", "diverged")
    assert "learning_rate" in (e.diag.message_hint or ""), describe(e)


# =============================================================================================
# 6. Cancel, EXPLAIN


def test_cancel_of_a_wide_network(tables):
    with connect(tables) as victim, connect(tables) as killer:
        before = catalog_counts(killer)
        pid = scalar(victim, "SELECT pg_backend_pid()")
        t, result = start_training(victim, "mlp_xor", "mlp", {"epochs": 1_000_000, "hidden": [1024, 1024], "batch_size": 1})
        try:
            wait_active(killer, pid)
            time.sleep(1.5)
            assert t.is_alive(), f"training ended: {result}"
            latency = cancel_and_join(killer, t, result, pid, timeout=30)
        finally:
            stop_if_running(killer, t, pid)
        print(f"\ncancel latency mlp [1024, 1024]: {latency:.3f} s")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < 1.0, f"cancel took {latency:.2f} s"
        assert catalog_counts(killer) == before
        assert scalar(victim, "SELECT 1") == 1


def test_explain_runs_and_names_the_model(tconn):
    for model, params in (("mlp", {"hidden": [8]}), ("mlp_regression", {})):
        lines = [r[0] for r in tconn.execute("SELECT * FROM corgipile_explain('mlp_xor', %s, %s)",
                                             (model, Jsonb(params))).fetchall()]
        assert lines and model in "\n".join(lines), lines
