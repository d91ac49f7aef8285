"""corgipile_drift: a model's training profile (stored with its preprocessing) against a
block-sampled read of a relation; distances checked against values computed here with numpy
from the stored training bins and the exact rows of tables whose drift we control; label,
predictions, array models, models without a profile, params and privileges."""

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


def test_predictions_today(conn, tables, model):
    out = drift(conn, model, "dr_today", ALL)["(prediction)"]
    assert out["role"] == "prediction" and out["measure"] == "no training profile"
    assert out["training"] is None and out["distance"] is None and out["passes"] is None
    assert out["today"]["categories"] == ["0", "1"] and abs(sum(out["today"]["shares"]) - 1) < 1e-12


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


def test_a_model_without_a_profile_gets_an_answer(conn, tables):
    m = train(conn, "dr_train", "logistic", COLUMNS)
    conn.execute("UPDATE corgipile.models SET preprocessing = preprocessing - 'profile' WHERE id = %s", (m,))
    out = drift(conn, m, "dr_today", ALL)
    for name in ("x", "c", "y"):
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
