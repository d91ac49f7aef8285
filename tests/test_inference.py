"""Standard errors and p-values ("inference": true, src/exec/sgd/inference.rs,
ml/src/inference.rs): after the epochs, Newton passes polish a logistic or linear model to the
maximum-likelihood estimate, and corgipile_model_coefficients reports each coefficient's
std_error, statistic (z or t), p_value, 95% interval and odds ratio (logistic).

Every number is checked against a reference computed here with numpy on the same rows: IRLS
for logistic (z tests, p from math.erfc), the OLS formulas for linear (t tests with n - p
degrees of freedom, p and quantile from scipy), to 1e-4 relative, as statsmodels' Logit and OLS
report them. Then what is refused, with its SQLSTATE: other kinds, l1, a model whose information
matrix exceeds corgipile.max_model_memory, collinear columns, search and workers; and a model
trained without inference has NULLs there."""

import math

import numpy as np
import psycopg
import psycopg.errors as E
import pytest
from scipy import stats

from helpers import train, train_error

TABLE = "inf_rows"
N = 3000
REL = 1e-4


@pytest.fixture(scope="module")
def rows(dsn):
    """N rows: numbers a, b, c (c has no effect), a category s, a linear target y and a 0/1
    label z drawn from a logistic model; the same arrays for the references."""
    rng = np.random.default_rng(36)
    a = rng.normal(0, 1, N)
    b = rng.uniform(-2, 2, N) * 10
    c = rng.normal(5, 2, N)
    s = rng.choice(["red", "green", "blue"], N)
    effect = {"red": 0.0, "green": 0.3, "blue": -0.2}
    y = 1.5 + 0.8 * a - 0.05 * b + np.array([effect[v] for v in s]) + rng.normal(0, 1.5, N)
    p = 1 / (1 + np.exp(-(-0.4 + 0.7 * a + 0.03 * b)))
    z = (rng.uniform(0, 1, N) < p).astype(int)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"""CREATE TABLE {TABLE} (id int, a float8, b float8, c float8, s text,
                         y float8, z int, arr float8[])""")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {TABLE} (id, a, b, c, s, y, z, arr) FROM STDIN") as copy:
                for i in range(N):
                    copy.write_row((i, float(a[i]), float(b[i]), float(c[i]), str(s[i]),
                                    float(y[i]), int(z[i]), [float(a[i]), float(b[i])]))
    return {"a": a, "b": b, "c": c, "s": s, "y": y, "z": z}


def coefficients(conn, model):
    """name -> (coefficient, std_error, statistic, p_value, ci_low, ci_high, odds_ratio)."""
    got = conn.execute("""SELECT feature, coefficient, std_error, statistic, p_value, ci_low,
                                 ci_high, odds_ratio
                          FROM corgipile_model_coefficients(%s)""", (model,)).fetchall()
    return {r[0]: r[1:] for r in got}


def close(got, want, what):
    assert got is not None, what
    assert abs(got - want) <= REL * abs(want) + 1e-12, f"{what}: {got} vs {want}"


def irls(X, y):
    """Logistic maximum likelihood by IRLS, and the covariance H^-1."""
    beta = np.zeros(X.shape[1])
    for _ in range(100):
        p = 1 / (1 + np.exp(-X @ beta))
        H = X.T @ (X * (p * (1 - p))[:, None])
        step = np.linalg.solve(H, X.T @ (y - p))
        beta += step
        if np.max(np.abs(step)) < 1e-13:
            break
    p = 1 / (1 + np.exp(-X @ beta))
    return beta, np.linalg.inv(X.T @ (X * (p * (1 - p))[:, None]))


def check(got, names, beta, se, test, df=None, logistic=False):
    if test == "z":
        q = stats.norm.ppf(0.975)
    else:
        q = stats.t.ppf(0.975, df)
    for name, b, e in zip(names, beta, se):
        coefficient, std_error, statistic, p_value, low, high, odds = got[name]
        close(coefficient, b, f"{name} coefficient")
        close(std_error, e, f"{name} std_error")
        close(statistic, b / e, f"{name} statistic")
        want_p = math.erfc(abs(b / e) / math.sqrt(2)) if test == "z" else 2 * stats.t.sf(abs(b / e), df)
        close(p_value, want_p, f"{name} p_value")
        close(low, b - q * e, f"{name} ci_low")
        close(high, b + q * e, f"{name} ci_high")
        if logistic:
            close(odds, math.exp(b), f"{name} odds_ratio")
        else:
            assert odds is None


def test_logistic_matches_irls(conn, rows):
    model = train(conn, TABLE, "logistic", features=["a", "b", "c"], label="z", inference=True,
                  epochs=3, seed=1)
    X = np.column_stack([rows["a"], rows["b"], rows["c"], np.ones(N)])
    beta, cov = irls(X, rows["z"].astype(float))
    names = ["a", "b", "c", "(intercept)"]
    check(coefficients(conn, model), names, beta, np.sqrt(np.diag(cov)), "z", logistic=True)
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    assert inference["test"] == "z" and inference["rows"] == N
    assert 2 <= inference["newton_passes"] <= 12


def test_linear_matches_ols(conn, rows):
    model = train(conn, TABLE, "linear", features=["a", "b", "c"], label="y", inference=True,
                  epochs=2, seed=1)
    X = np.column_stack([rows["a"], rows["b"], rows["c"], np.ones(N)])
    beta = np.linalg.lstsq(X, rows["y"], rcond=None)[0]
    df = N - X.shape[1]
    sigma2 = np.sum((rows["y"] - X @ beta) ** 2) / df
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(X.T @ X)))
    check(coefficients(conn, model), ["a", "b", "c", "(intercept)"], beta, se, "t", df=df)
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    assert inference["df"] == df and inference["newton_passes"] == 1
    close(inference["sigma2"], sigma2, "sigma2")


def test_one_hot_column_without_intercept(conn, rows):
    """A one-hot column's categories add up to an intercept: without one, each is a level."""
    model = train(conn, TABLE, "linear", features=["a", "s"], label="y", inference=True,
                  fit_intercept=False, epochs=2, seed=1)
    got = coefficients(conn, model)
    levels = sorted(name for name in got if name.startswith("s="))
    assert levels == ["s=blue", "s=green", "s=red"]
    X = np.column_stack([rows["a"]] + [(rows["s"] == name[2:]).astype(float) for name in levels])
    beta = np.linalg.lstsq(X, rows["y"], rcond=None)[0]
    df = N - X.shape[1]
    sigma2 = np.sum((rows["y"] - X @ beta) ** 2) / df
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(X.T @ X)))
    check(got, ["a"] + levels, beta, se, "t", df=df)
    assert got["(intercept)"][0] == 0 and got["(intercept)"][1:] == (None,) * 6


def test_l2_penalized_logistic(conn, rows):
    """With l2 the optimum is the penalized one (n·l2/2·|w|² on the weights, not the intercept)
    and its Hessian is part of H."""
    l2 = 0.01
    model = train(conn, TABLE, "logistic", features=["a", "b"], label="z", inference=True,
                  l2=l2, epochs=2, seed=1)
    X = np.column_stack([rows["a"], rows["b"], np.ones(N)])
    y = rows["z"].astype(float)
    penalty = np.diag([N * l2, N * l2, 0.0])
    beta = np.zeros(3)
    for _ in range(100):
        p = 1 / (1 + np.exp(-X @ beta))
        H = X.T @ (X * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(H, X.T @ (y - p) - penalty @ beta)
        beta += step
        if np.max(np.abs(step)) < 1e-13:
            break
    p = 1 / (1 + np.exp(-X @ beta))
    cov = np.linalg.inv(X.T @ (X * (p * (1 - p))[:, None]) + penalty)
    check(coefficients(conn, model), ["a", "b", "(intercept)"], beta, np.sqrt(np.diag(cov)), "z",
          logistic=True)
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    assert "l2 0.01" in inference["penalty"]


def test_array_column(conn, rows):
    model = train(conn, TABLE, "logistic", features="arr", label="z", inference=True, epochs=2,
                  seed=1)
    X = np.column_stack([rows["a"], rows["b"], np.ones(N)])
    beta, cov = irls(X, rows["z"].astype(float))
    check(coefficients(conn, model), ["arr[1]", "arr[2]", "(intercept)"], beta,
          np.sqrt(np.diag(cov)), "z", logistic=True)


def test_without_inference_the_columns_are_null(conn, rows):
    model = train(conn, TABLE, "logistic", features=["a", "b"], label="z", epochs=1, seed=1)
    for row in coefficients(conn, model).values():
        assert row[1:] == (None,) * 6


@pytest.mark.parametrize("model, params, sqlstate", [
    ("svm", {"label": "z"}, "22023"),
    ("softmax", {"label": "s"}, "22023"),
    ("logistic", {"label": "z", "l1": 0.01}, "22023"),
    ("logistic", {"label": "z", "class_weight": "balanced"}, "22023"),
    ("logistic", {"label": "z", "search": {"learning_rate": [0.1, 0.01]}, "name": "inf_s"}, "0A000"),
    ("linear", {"label": "y", "validation": {"fraction": 0.2}}, "0A000"),
    ("linear", {"label": "y", "workers": 2}, "0A000"),
    ("linear", {"label": "y", "shuffle": "mrs"}, "0A000"),
    # b10 is b times 10: collinear.
    ("linear", {"label": "y", "features": ["a", "b", "b10"]}, "22000"),
    # zz is the label: the classes are separated, no maximum-likelihood estimate.
    ("logistic", {"label": "z", "features": ["a", "zz"]}, "22000"),
])
def test_refused(conn, rows, model, params, sqlstate):
    conn.execute(f"DROP TABLE IF EXISTS {TABLE}_b10")
    conn.execute(f"CREATE TABLE {TABLE}_b10 AS SELECT *, b * 10 AS b10, z::float8 AS zz FROM {TABLE}")
    p = {"features": ["a", "b"], "inference": True, "epochs": 1, **params}
    e = train_error(conn, f"{TABLE}_b10", model, p)
    assert e is not None and e.sqlstate == sqlstate, e
    assert e.diag.message_hint


def test_information_matrix_over_the_memory_limit(conn):
    """200 features fit a model in 64 kB, not their 201 x 201 information matrix."""
    conn.execute("DROP TABLE IF EXISTS inf_wide")
    conn.execute("""CREATE TABLE inf_wide AS SELECT (i % 2) AS z,
                    ARRAY(SELECT random() FROM generate_series(1, 200) WHERE i > 0) AS features
                    FROM generate_series(1, 300) i""")
    conn.execute("SET corgipile.max_model_memory = '64kB'")
    try:
        e = train_error(conn, "inf_wide", "logistic", label="z", inference=True, epochs=1)
        assert isinstance(e, E.ProgramLimitExceeded), e
        assert "corgipile.max_model_memory (64 kB)" in str(e)
        assert train_error(conn, "inf_wide", "logistic", label="z", epochs=1) is None
    finally:
        conn.execute("RESET corgipile.max_model_memory")


def test_explain_names_the_passes(conn, rows):
    plan = [r[0] for r in conn.execute(
        "SELECT * FROM corgipile_explain(%s, 'linear', %s)",
        (TABLE, '{"features": ["a", "b"], "label": "y", "inference": true}')).fetchall()]
    assert any("Inference: Newton passes after the epochs" in line for line in plan), plan
