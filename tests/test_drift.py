"""corgipile_drift: a model's training profile (stored with its preprocessing) against a
block-sampled read of a relation; distances checked against values computed here with numpy
from the stored training bins and the exact rows of tables whose drift we control; label,
predictions (profiled after training: which rows, which trainings), array models, models
without a profile, params and privileges."""

import uuid

import numpy as np
import psycopg
import pytest
from psycopg import errors as E
from psycopg.types.json import Jsonb

from helpers import connect, drop_role, train

N = 20_000
EPS = 1e-4
ALL = {"rows": 1_000_000}  # more than any table here: the whole table is the sample
COLUMNS = {"features": ["x", "c"], "label": "y", "epochs": 2, "seed": 1}


def psi(p, q):
    p, q = np.maximum(p, EPS), np.maximum(q, EPS)
    return float(np.sum((q - p) * np.log(q / p)))


def js(p, q):
    p, q = np.asarray(p, float), np.asarray(q, float)
    m = (p + q) / 2

    def kl(a):
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))
    return 0.5 * kl(p) + 0.5 * kl(q)


def linf(p, q):
    return float(np.max(np.abs(np.asarray(p) - np.asarray(q))))


def load(c, name, x, cat, y):
    c.execute(f"DROP TABLE IF EXISTS {name}")
    c.execute(f"CREATE TABLE {name} (id int, x float8, c text, y int, features float8[])")
    with c.cursor().copy(f"COPY {name} (id, x, c, y, features) FROM STDIN") as cp:
        for i in range(len(x)):
            xi = None if np.isnan(x[i]) else float(x[i])
            arr = "{%r,%r,%r}" % (float(np.nan_to_num(x[i])), float(i % 7), float((i * 13) % 11))
            cp.write_row((i, xi, cat[i], int(y[i]), arr))


@pytest.fixture(scope="module")
def tables(dsn):
    """dr_train: x ~ N(0, 1), c 'a'/'b'/'c' at 0.5/0.3/0.2, y from x; dr_today: x + 0.5 with a
    tenth NULL, c at 0.15/0.3/0.5 and a new 'd', y flipped on a fifth of the rows."""
    rng = np.random.default_rng(56)
    x = rng.standard_normal(N)
    cat = rng.choice(["a", "b", "c"], size=N, p=[0.5, 0.3, 0.2])
    y = (x + rng.standard_normal(N) * 0.5 > 0).astype(int)
    x2 = x + 0.5
    x2[rng.random(N) < 0.1] = np.nan
    cat2 = rng.choice(["a", "b", "c", "d"], size=N, p=[0.15, 0.3, 0.5, 0.05])
    y2 = np.where(rng.random(N) < 0.2, 1 - y, y)
    with psycopg.connect(dsn, autocommit=True) as c:
        load(c, "dr_train", x, cat, y)
        load(c, "dr_today", x2, cat2, y2)
        # The training rows with x moved by 2 standard deviations: most predictions flip to 1.
        c.execute("DROP TABLE IF EXISTS dr_shift")
        c.execute("CREATE TABLE dr_shift AS SELECT id, x + 2 AS x, c, y FROM dr_train")
        # A regression target of x and c, and its rows with x moved by 1.5.
        c.execute("DROP TABLE IF EXISTS dr_reg, dr_reg_shift")
        c.execute("""CREATE TABLE dr_reg AS SELECT id, x, c, 2 * x + (c = 'a')::int
                     + ((id * 7919) % 1000) / 1000.0 - 0.5 AS r FROM dr_train""")
        c.execute("CREATE TABLE dr_reg_shift AS SELECT id, x + 1.5 AS x, c, r FROM dr_reg")
    return {"x": x, "x2": x2, "cat2": cat2, "y": y, "y2": y2}


def drift(conn, model, rel, params=None):
    rows = conn.execute("SELECT * FROM corgipile_drift(%s::bigint, %s::regclass, %s)",
                        (model, rel, Jsonb(params or {}))).fetchall()
    return {r[0]: dict(zip(["column", "role", "measure", "distance", "threshold", "l_infinity",
                            "passes", "training", "today"], r)) for r in rows}


@pytest.fixture(scope="module")
def model(dsn, tables):
    with psycopg.connect(dsn, autocommit=True) as c:
        return train(c, "dr_train", "logistic", COLUMNS)


def test_the_training_profile_holds_deciles_and_shares(conn, tables, model):
    p = conn.execute("SELECT preprocessing->'profile' FROM corgipile.models WHERE id = %s", (model,)).fetchone()[0]
    assert p["rows"] == N
    x = next(col for col in p["columns"] if col["name"] == "x")
    assert x["kind"] == "number" and x["missing"] == 0 and len(x["cuts"]) == 9
    # The cuts are deciles: their ranks within a t-digest's error.
    ranks = np.searchsorted(np.sort(tables["x"]), x["cuts"]) / N
    assert np.all(np.abs(ranks - np.arange(1, 10) / 10) < 0.01)
    assert abs(sum(x["shares"]) - 1) < 1e-9 and max(abs(s - 0.1) for s in x["shares"]) < 0.01
    assert abs(x["mean"] - tables["x"].mean()) < 1e-9
    c = next(col for col in p["columns"] if col["name"] == "c")
    assert c["categories"] == ["a", "b", "c"] and len(c["shares"]) == 5
    assert p["label"]["categories"] == ["0", "1"]
    assert p["label"]["shares"][1] == pytest.approx(tables["y"].mean(), abs=1e-12)


def test_no_drift_on_the_training_table(conn, tables, model):
    out = drift(conn, model, "dr_train", ALL)
    assert set(out) == {"x", "c", "y", "(prediction)"}
    for name in ("x", "c", "y"):
        assert out[name]["passes"] is True, out[name]
        assert out[name]["distance"] < 0.005  # the training shares are a t-digest's
    assert out["x"]["measure"] == "psi" and out["c"]["measure"] == "jensen_shannon"
    assert out["x"]["today"]["sampled_rows"] == N


def test_distances_match_a_hand_computed_reference(conn, tables, model):
    out = drift(conn, model, "dr_today", ALL)
    # x: today's rows counted in the stored training bins, NULL a bin of its own.
    tr = out["x"]["training"]
    cuts, shares = np.array(tr["cuts"]), np.array(tr["shares"])
    p = np.append(shares, 0.0)
    x2 = tables["x2"]
    known = x2[~np.isnan(x2)]
    counts = np.bincount(np.searchsorted(cuts, known, side="right"), minlength=len(shares))
    q = np.append(counts, np.isnan(x2).sum()) / N
    assert out["x"]["distance"] == pytest.approx(psi(p, q), rel=1e-9)
    assert out["x"]["l_infinity"] == pytest.approx(linf(p, q), rel=1e-9)
    assert out["x"]["passes"] is False and out["x"]["today"]["missing"] == np.isnan(x2).sum()
    assert out["x"]["today"]["mean"] == pytest.approx(known.mean(), rel=1e-9)
    # c: kept categories, "(other)" (today's 'd'), NULL.
    p = np.array(out["c"]["training"]["shares"])
    cat2 = tables["cat2"]
    q = np.array([(cat2 == k).sum() for k in ["a", "b", "c"]] + [(cat2 == "d").sum(), 0]) / N
    assert out["c"]["distance"] == pytest.approx(js(p, q), rel=1e-9)
    assert out["c"]["l_infinity"] == pytest.approx(linf(p, q), rel=1e-9)
    assert out["c"]["passes"] is False and out["c"]["l_infinity"] > 0.3  # L-infinity about 0.35
    # The label: class shares.
    p = np.array(out["y"]["training"]["shares"])
    y2 = tables["y2"]
    q = np.array([(y2 == 0).sum(), (y2 == 1).sum(), 0, 0]) / N
    assert out["y"]["distance"] == pytest.approx(js(p, q), rel=1e-9, abs=1e-15)


def test_thresholds_are_params(conn, tables, model):
    loose = drift(conn, model, "dr_today", {**ALL, "psi": 100, "jensen_shannon": 1, "l_infinity": 1})
    assert loose["x"]["passes"] is True and loose["x"]["threshold"] == 100
    strict = drift(conn, model, "dr_train", {**ALL, "psi": 0, "l_infinity": 0})
    assert strict["x"]["passes"] is False


def predictions_profile(conn, m):
    return conn.execute("SELECT preprocessing->'profile'->'predictions' FROM corgipile.models WHERE id = %s",
                        (m,)).fetchone()[0]


def class_shares(conn, m, rel, classes=("0", "1")):
    """Each class's share of corgipile_predict_class over every row of `rel`."""
    got = [r[0] for r in conn.execute(f"SELECT corgipile_predict_class(%s::bigint, t) FROM {rel} t", (m,))]
    return np.array([got.count(k) for k in classes] + [0, 0]) / len(got)


def test_the_predictions_are_profiled_after_training(conn, tables, model):
    """No validation rows: one buffer (10% of the table's bytes) of random blocks, read after the epochs
    and scored by the stored model."""
    p = predictions_profile(conn, model)
    assert p["name"] == "(prediction)" and p["kind"] == "categories" and p["categories"] == ["0", "1"]
    assert 0.05 * N < p["rows"] < 0.5 * N and p["missing"] == 0
    assert len(p["shares"]) == 4 and p["shares"][2:] == [0, 0] and abs(sum(p["shares"]) - 1) < 1e-12
    # About the whole table's share of predicted 1s (a sample of some 6,000 rows).
    assert abs(p["shares"][1] - class_shares(conn, model, "dr_train")[1]) < 0.05


def test_predictions_on_the_training_table_pass(conn, tables, model):
    out = drift(conn, model, "dr_train", ALL)["(prediction)"]
    assert out["role"] == "prediction" and out["measure"] == "jensen_shannon"
    assert out["passes"] is True and out["distance"] < 0.01 and out["l_infinity"] < 0.05
    assert out["training"] == {k: v for k, v in predictions_profile(conn, model).items() if k != "name"}
    assert out["today"]["categories"] == ["0", "1"] and abs(sum(out["today"]["shares"]) - 1) < 1e-12


def test_class_predictions_match_a_hand_computed_reference(conn, tables):
    """A buffer of the whole table: the training profile is the class shares of
    corgipile_predict_class over every training row; today's over the shifted rows fail."""
    m = train(conn, "dr_train", "logistic", {**COLUMNS, "buffer_size": "100%"})
    p = predictions_profile(conn, m)
    assert p["rows"] == N
    train_shares = class_shares(conn, m, "dr_train")
    assert np.allclose(p["shares"], train_shares, rtol=0, atol=1e-12)
    same = drift(conn, m, "dr_train", ALL)["(prediction)"]
    assert same["distance"] == pytest.approx(0, abs=1e-12) and same["passes"] is True
    out = drift(conn, m, "dr_shift", ALL)["(prediction)"]
    today = class_shares(conn, m, "dr_shift")
    assert today[1] > 0.9 > 0.6 > train_shares[1]
    assert out["distance"] == pytest.approx(js(train_shares, today), rel=1e-9)
    assert out["l_infinity"] == pytest.approx(linf(train_shares, today), rel=1e-9)
    assert out["l_infinity"] > 0.3 and out["passes"] is False


def test_regression_predictions_match_a_hand_computed_reference(conn, tables):
    """A regression's predictions: their deciles at training (the same t-digest as a number
    column's), today's counted in them; the PSI of the shifted rows from corgipile_predict."""
    params = {"features": ["x", "c"], "label": "r", "epochs": 3, "seed": 1, "buffer_size": "100%"}
    m = train(conn, "dr_reg", "linear", params)
    p = predictions_profile(conn, m)
    assert p["kind"] == "number" and p["rows"] == N and p["missing"] == 0 and len(p["cuts"]) == 9
    preds = np.array([r[0] for r in conn.execute("SELECT corgipile_predict(%s::bigint, t) FROM dr_reg t", (m,))])
    assert p["mean"] == pytest.approx(preds.mean(), rel=1e-9)
    assert (p["min"], p["max"]) == pytest.approx((preds.min(), preds.max()), rel=1e-12)
    ranks = np.searchsorted(np.sort(preds), p["cuts"]) / N
    assert np.all(np.abs(ranks - np.arange(1, 10) / 10) < 0.01)
    same = drift(conn, m, "dr_reg", ALL)["(prediction)"]
    assert same["measure"] == "psi" and same["passes"] is True and same["distance"] < 0.005
    out = drift(conn, m, "dr_reg_shift", ALL)["(prediction)"]
    today = np.array([r[0] for r in conn.execute("SELECT corgipile_predict(%s::bigint, t) FROM dr_reg_shift t", (m,))])
    counts = np.bincount(np.searchsorted(p["cuts"], today, side="right"), minlength=10)
    q, pp = np.append(counts / N, 0.0), np.append(p["shares"], 0.0)
    assert out["distance"] == pytest.approx(psi(pp, q), rel=1e-9)
    assert out["l_infinity"] == pytest.approx(linf(pp, q), rel=1e-9)
    assert out["distance"] > 0.25 and out["passes"] is False
    assert out["today"]["mean"] == pytest.approx(today.mean(), rel=1e-9)


def test_held_out_validation_rows_are_the_ones_scored(conn, tables):
    m = train(conn, "dr_train", "logistic", {**COLUMNS, "validation": {"fraction": 0.2}})
    p = predictions_profile(conn, m)
    held_out = conn.execute("SELECT (metrics->'validation'->>'rows')::int FROM corgipile.models WHERE id = %s",
                            (m,)).fetchone()[0]
    assert p["rows"] == held_out and abs(held_out - 0.2 * N) < 0.02 * N
    assert drift(conn, m, "dr_train", ALL)["(prediction)"]["passes"] is True


def test_workers_folds_and_each_configuration_of_a_search_are_profiled(conn, tables):
    m = train(conn, "dr_train", "logistic", {**COLUMNS, "workers": 1})
    assert predictions_profile(conn, m)["rows"] > 0
    assert drift(conn, m, "dr_train", ALL)["(prediction)"]["passes"] is True
    cv = train(conn, "dr_train", "logistic", {**COLUMNS, "folds": 3})
    assert predictions_profile(conn, cv)["rows"] > 0
    name = f"dr_search_{uuid.uuid4().hex[:8]}"
    train(conn, "dr_train", "logistic", {**COLUMNS, "name": name, "search": {"learning_rate": [0.001, 1.0]}})
    profiles = [r[0] for r in conn.execute(
        "SELECT preprocessing->'profile'->'predictions' FROM corgipile.models WHERE name = %s ORDER BY id", (name,))]
    assert len(profiles) == 2 and all(p and p["rows"] > 0 for p in profiles)


def test_per_group_models_are_not_profiled(conn, tables):
    name = f"dr_groups_{uuid.uuid4().hex[:8]}"
    train(conn, "dr_train", "logistic", {**COLUMNS, "features": ["x"], "group_by": "c", "name": name})
    kept = conn.execute("""SELECT count(*), count(*) FILTER (WHERE preprocessing->'profile' ? 'predictions')
                           FROM corgipile.models WHERE name = %s""", (name,)).fetchone()
    assert kept[0] >= 3 and kept[1] == 0


@pytest.mark.parametrize("shuffle", ["no_shuffle", "sliding_window"])
def test_storage_order_is_profiled_only_when_a_buffer_holds_every_row(conn, tables, shuffle):
    """A first buffer in storage order is no sample of the table: profiled only when whole."""
    part = train(conn, "dr_train", "logistic", {**COLUMNS, "shuffle": shuffle})
    assert predictions_profile(conn, part) is None
    assert drift(conn, part, "dr_train", ALL)["(prediction)"]["measure"] == "no training profile"
    if shuffle == "no_shuffle":
        whole = train(conn, "dr_train", "logistic", {**COLUMNS, "shuffle": shuffle, "buffer_size": "100%"})
        assert predictions_profile(conn, whole)["rows"] == N


def test_predictions_without_a_training_profile(conn, tables):
    """A model stored before predictions were profiled (the key stripped, as an older model
    has none): today's predictions only, no ERROR; the other rows are still compared."""
    m = train(conn, "dr_train", "logistic", COLUMNS)
    conn.execute("UPDATE corgipile.models SET preprocessing = preprocessing #- '{profile,predictions}' WHERE id = %s",
                 (m,))
    out = drift(conn, m, "dr_today", ALL)
    pred = out["(prediction)"]
    assert pred["role"] == "prediction" and pred["measure"] == "no training profile"
    assert pred["training"] is None and pred["distance"] is None and pred["passes"] is None
    assert pred["today"]["categories"] == ["0", "1"] and abs(sum(pred["today"]["shares"]) - 1) < 1e-12
    assert out["x"]["measure"] == "psi"


def test_a_sample_reads_about_rows(conn, tables, model):
    out = drift(conn, model, "dr_train", {"rows": 5000, "seed": 3})
    assert out["x"]["today"]["sampled_rows"] == 5000 and out["x"]["today"]["rows"] == 5000
    assert out["x"]["passes"] is True


def test_an_array_model_compares_element_means(conn, tables):
    m = train(conn, "dr_train", "logistic", {"features": "features", "label": "y", "epochs": 1})
    std = conn.execute("SELECT standardizer FROM corgipile.models WHERE id = %s", (m,)).fetchone()[0]
    out = drift(conn, m, "dr_today", ALL)
    assert set(out) == {"features", "y", "(prediction)"}
    f = out["features"]
    assert f["measure"] == "mean_shift"
    mean0 = np.array(std["mean"])
    sd0 = np.array([1 / s if s > 0 else 1 for s in std["scale"]])
    today = np.column_stack([np.nan_to_num(tables["x2"]), np.arange(N) % 7, (np.arange(N) * 13) % 11])
    shift = np.abs(today.mean(axis=0) - mean0) / sd0
    assert f["distance"] == pytest.approx(shift.max(), rel=1e-9)
    assert f["today"]["worst_element"] == int(shift.argmax()) + 1
    assert drift(conn, m, "dr_train", ALL)["features"]["distance"] < 1e-9
    # An array model has no profile: nor has its predictions.
    assert out["(prediction)"]["measure"] == "no training profile"


def test_a_model_without_a_profile_gets_an_answer(conn, tables):
    m = train(conn, "dr_train", "logistic", COLUMNS)
    conn.execute("UPDATE corgipile.models SET preprocessing = preprocessing - 'profile' WHERE id = %s", (m,))
    out = drift(conn, m, "dr_today", ALL)
    for name in ("x", "c", "y", "(prediction)"):
        assert out[name]["measure"] == "no training profile" and out[name]["training"] is None
        assert out[name]["passes"] is None and out[name]["today"]["rows"] == N
    assert out["c"]["today"]["categories"] == ["a", "b", "c"]


@pytest.mark.parametrize("params", [{"rows": 0}, {"rows": "many"}, {"psi": -1}, {"l_infinity": "x"},
                                    {"bogus": 1}, {"seed": -2}])
def test_bad_params_before_reading(conn, tables, model, params):
    with pytest.raises(E.InvalidParameterValue):
        drift(conn, model, "dr_train", params)
    with pytest.raises(E.InvalidParameterValue):
        conn.execute("SELECT * FROM corgipile_drift(%s::bigint, 'dr_train', '[]')", (model,))


def test_privileges_as_ordinary_roles(dsn, conn, tables, model):
    drop_role(conn, "dr_reader")
    conn.execute("CREATE ROLE dr_reader LOGIN")
    try:
        with connect(dsn, user="dr_reader") as reader:
            with pytest.raises(psycopg.Error) as predict_error:
                reader.execute("SELECT corgipile_predict(%s::bigint, ARRAY[0.0])", (model,))
        with connect(dsn, user="dr_reader") as reader:
            with pytest.raises(psycopg.Error) as drift_error:
                drift(reader, model, "dr_train")
        assert drift_error.value.sqlstate == predict_error.value.sqlstate
        conn.execute("SELECT corgipile_grant(%s::bigint, 'dr_reader', 'use')", (model,))
        with connect(dsn, user="dr_reader") as reader:
            with pytest.raises(E.InsufficientPrivilege):
                drift(reader, model, "dr_train")
        conn.execute("GRANT SELECT ON dr_train TO dr_reader")
        with connect(dsn, user="dr_reader") as reader:
            assert drift(reader, model, "dr_train", ALL)["x"]["passes"] is True
    finally:
        conn.execute("REVOKE ALL ON dr_train FROM dr_reader")
        drop_role(conn, "dr_reader")
