"""Standard errors and p-values ("inference": true, src/exec/sgd/inference.rs,
ml/src/inference.rs): after the epochs, Newton passes polish a logistic or linear model to the
maximum-likelihood estimate, and corgipile_model_coefficients reports each coefficient's
std_error, statistic (z or t), p_value, 95% interval and odds ratio (logistic).

Every number is checked against a reference computed here with numpy on the same rows: IRLS
for logistic (z tests, p from math.erfc), the OLS formulas for linear (t tests with n - p
degrees of freedom, p and quantile from scipy), to 1e-4 relative, as statsmodels' Logit and OLS
report them. Then what is refused, with its SQLSTATE: other kinds, l1, a model whose information
matrix exceeds corgipile.max_model_memory, collinear columns, search and workers; and a model
trained without inference has NULLs there.

Categories: with an intercept, each one-hot column (and a date's day of the week and month)
drops its most frequent level from the design, as statsmodels and R do; those tests compare
with statsmodels' Logit and OLS fitted here on the same design (numbers in the table's units,
dummies with the same reference dropped)."""

import datetime
import math

import numpy as np
import psycopg
import psycopg.errors as E
import pytest
import statsmodels.api as sm
from scipy import stats

from helpers import evaluate, scalar, train, train_error

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


# ---------------------------------------------------------------------------------------------
# Categories: one reference level per categorical column, against statsmodels

CATS = "inf_cats"
M = 2000


@pytest.fixture(scope="module")
def cats(dsn):
    """M rows: numbers a, b; categories s (four levels, "blue" the most frequent), t (three
    levels and NULLs, "(null)" a level of its own; "x" the most frequent), r ("p" or "q", and
    "once" in one row), a date d (every day of the week and month); a linear target y and a 0/1
    label z drawn from a logistic model of a, b, s and t."""
    rng = np.random.default_rng(54)
    a = rng.normal(0, 1, M)
    b = rng.uniform(-2, 2, M) * 10
    s = rng.choice(["red", "green", "blue", "amber"], M, p=[0.25, 0.2, 0.4, 0.15])
    t = rng.choice(["x", "y", "w", None], M, p=[0.4, 0.3, 0.2, 0.1])
    r = rng.choice(["p", "q"], M).astype(object)
    r[17] = "once"
    start = datetime.date(2020, 1, 1)
    d = [start + datetime.timedelta(days=int(k)) for k in rng.integers(0, 900, M)]
    s_effect = {"red": 0.0, "green": 0.6, "blue": -0.4, "amber": 0.3}
    t_effect = {"x": 0.0, "y": -0.5, "w": 0.5, None: 0.2}
    effect = np.array([s_effect[v] for v in s]) + np.array([t_effect[v] for v in t])
    y = 1.5 + 0.8 * a - 0.05 * b + effect + 0.3 * (r == "q") + rng.normal(0, 1.5, M)
    y[17] += 2.0
    p = 1 / (1 + np.exp(-(-0.3 + 0.7 * a + 0.03 * b + effect)))
    z = (rng.uniform(0, 1, M) < p).astype(int)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {CATS}")
        conn.execute(f"""CREATE TABLE {CATS} (id int, a float8, b float8, s text, t text, r text,
                         d date, y float8, z int)""")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {CATS} (id, a, b, s, t, r, d, y, z) FROM STDIN") as copy:
                for i in range(M):
                    copy.write_row((i, float(a[i]), float(b[i]), str(s[i]), t[i], str(r[i]), d[i],
                                    float(y[i]), int(z[i])))
    return {"a": a, "b": b, "s": s, "t": t, "r": r, "d": d, "y": y, "z": z}


def most_frequent(values):
    """The level corgipile drops: the most frequent named one (ties: the first in byte order)."""
    counts = {}
    for v in values:
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v.encode()))


def dummies(name, values, reference, kept=None):
    """The columns of a categorical column with its reference dropped, by coefficient name:
    {"s=green": 0/1 array, ...}, "(null)" for None, "(other)" for a level not in `kept`."""
    def level(v):
        if v is None:
            return "(null)"
        return v if kept is None or v in kept else "(other)"
    levels = [level(v) for v in values]
    return {f"{name}={k}": np.array([v == k for v in levels], dtype=float)
            for k in sorted(set(levels)) if k != reference}


def compare(got, names, fit, logistic):
    """corgipile's rows against a statsmodels fit (columns in `names` order), 1e-4 relative."""
    low, high = np.asarray(fit.conf_int()).T
    worst = {}
    for k, name in enumerate(names):
        coefficient, std_error, statistic, p_value, ci_low, ci_high, odds = got[name]
        for what, g, w in [("coefficient", coefficient, fit.params[k]), ("std_error", std_error, fit.bse[k]),
                           ("statistic", statistic, fit.tvalues[k]), ("p_value", p_value, fit.pvalues[k]),
                           ("ci_low", ci_low, low[k]), ("ci_high", ci_high, high[k])]:
            close(g, w, f"{name} {what}")
            worst[what] = max(worst.get(what, 0.0), abs(g - w) / max(abs(w), 1e-300))
        if logistic:
            close(odds, math.exp(fit.params[k]), f"{name} odds_ratio")
    return ", ".join(f"{what} {v:.1e}" for what, v in worst.items())


def the_references(conn, model):
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    return {r["column"]: r for r in inference.get("reference", [])}


def assert_reference_rows(got, features, logistic):
    """Each reference is a row of coefficient 0 and no test."""
    for feature in features:
        assert got[feature] == (0.0, None, None, None, None, None, None), feature


def test_logistic_two_categorical_columns_match_statsmodels(conn, cats):
    model = train(conn, CATS, "logistic", features=["a", "b", "s", "t"], label="z", inference=True,
                  epochs=3, seed=1)
    ref_s, ref_t = most_frequent(cats["s"]), most_frequent(cats["t"])
    assert (ref_s, ref_t) == ("blue", "x")
    columns = {"a": cats["a"], "b": cats["b"], **dummies("s", cats["s"], ref_s),
               **dummies("t", cats["t"], ref_t)}
    names = list(columns) + ["(intercept)"]
    X = np.column_stack(list(columns.values()) + [np.ones(M)])
    fit = sm.Logit(cats["z"].astype(float), X).fit(disp=0, method="newton", tol=1e-12, maxiter=100)
    got = coefficients(conn, model)
    worst = compare(got, names, fit, logistic=True)
    print(f"logistic: largest relative differences from statsmodels: {worst}")
    assert_reference_rows(got, ["s=blue", "t=x"], logistic=True)
    assert "t=(null)" in names
    refs = the_references(conn, model)
    assert {k: (v["feature"], v["rows"]) for k, v in refs.items()} == {
        "s": ("s=blue", int(np.sum(cats["s"] == "blue"))),
        "t": ("t=x", sum(v == "x" for v in cats["t"]))}
    assert refs["s"]["feature_index"] == scalar(
        conn, "SELECT feature_index FROM corgipile_model_coefficients(%s) WHERE feature = 's=blue'", (model,))
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    # statsmodels' log-likelihood, on the design with the references dropped.
    close(inference["log_likelihood"], fit.llf, "log_likelihood")


def test_linear_with_a_category_seen_once_matches_statsmodels(conn, cats):
    """OLS on a, b and three categorical columns, one of whose levels ("r=once") is one row:
    its coefficient is that row's residual, its standard error as large as sigma."""
    model = train(conn, CATS, "linear", features=["a", "b", "s", "t", "r"], label="y",
                  inference=True, epochs=2, seed=1)
    ref_r = most_frequent(cats["r"])
    columns = {"a": cats["a"], "b": cats["b"], **dummies("s", cats["s"], "blue"),
               **dummies("t", cats["t"], "x"), **dummies("r", cats["r"], ref_r)}
    names = list(columns) + ["(intercept)"]
    X = np.column_stack(list(columns.values()) + [np.ones(M)])
    fit = sm.OLS(cats["y"], X).fit()
    got = coefficients(conn, model)
    worst = compare(got, names, fit, logistic=False)
    print(f"linear: largest relative differences from statsmodels: {worst}")
    assert "r=once" in names
    assert_reference_rows(got, ["s=blue", "t=x", f"r={ref_r}"], logistic=False)
    inference = conn.execute("SELECT metrics->'inference' FROM corgipile.models WHERE id = %s",
                             (model,)).fetchone()[0]
    assert inference["df"] == fit.df_resid == M - len(names)
    close(inference["sigma2"], fit.scale, "sigma2")
    assert set(the_references(conn, model)) == {"s", "t", "r"}


def test_pooled_categories_and_date_parts(conn, cats):
    """max_categories pools the rarest levels into "(other)", a level like the others; a date's
    day of the week and month each drop their most frequent level too."""
    model = train(conn, CATS, "linear", features=["a", "s", "d"], label="y", inference=True,
                  max_categories=2, epochs=2, seed=1)
    got = coefficients(conn, model)
    assert {"s=blue", "s=red", "s=(other)"} <= set(got) and "s=green" not in got
    days = np.array([(v - datetime.date(1970, 1, 1)).days for v in cats["d"]], dtype=float)
    dow = [["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][v.weekday()] for v in cats["d"]]
    month = [["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
             [v.month - 1] for v in cats["d"]]
    order = {k: i for i, k in enumerate(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Jan", "Feb",
                                         "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                         "Nov", "Dec"])}
    # Days and months have no byte order here: ties go to the first in calendar order.
    ref_dow = min(set(dow), key=lambda v: (-dow.count(v), order[v]))
    ref_month = min(set(month), key=lambda v: (-month.count(v), order[v]))
    columns = {"a": cats["a"], **dummies("s", cats["s"], "blue", kept={"blue", "red"}), "d": days,
               **dummies("d.dow", dow, ref_dow), **dummies("d.month", month, ref_month)}
    names = list(columns) + ["(intercept)"]
    X = np.column_stack(list(columns.values()) + [np.ones(M)])
    fit = sm.OLS(cats["y"], X).fit()
    worst = compare(got, names, fit, logistic=False)
    print(f"pooled categories and date parts: largest relative differences from statsmodels: {worst}")
    assert_reference_rows(got, ["s=blue", f"d.dow={ref_dow}", f"d.month={ref_month}"], logistic=False)
    assert set(the_references(conn, model)) == {"s", "d.dow", "d.month"}


def test_predictions_follow_the_reference_coding(conn, cats):
    """The stored model is the one tested: its predictions are the coefficients' sums (the
    reference contributes 0), and evaluation and explanations read it as any model."""
    model = train(conn, CATS, "linear", features=["a", "b", "s", "t"], label="y", inference=True,
                  epochs=2, seed=1)
    got = coefficients(conn, model)
    row = conn.execute(f"SELECT a, b, s, t, corgipile_predict({model}, {CATS}.*) FROM {CATS} WHERE id = 3"
                       ).fetchone()
    a, b, s, t, predicted = row
    want = (got["a"][0] * a + got["b"][0] * b + got[f"s={s}"][0] + got[f"t={t or '(null)'}"][0]
            + got["(intercept)"][0])
    assert abs(predicted - want) <= 1e-9 * max(1.0, abs(want))
    r2 = evaluate(conn, model, CATS)["r2"]
    fit = sm.OLS(cats["y"], np.column_stack(
        [cats["a"], cats["b"], *dummies("s", cats["s"], "blue").values(),
         *dummies("t", cats["t"], "x").values(), np.ones(M)])).fit()
    close(r2, fit.rsquared, "r2")


def test_no_reference_without_an_intercept(conn, cats):
    model = train(conn, CATS, "logistic", features=["a", "s"], label="z", inference=True,
                  fit_intercept=False, epochs=2, seed=1)
    got = coefficients(conn, model)
    assert all(got[f"s={v}"][1] is not None for v in ["red", "green", "blue", "amber"])
    assert the_references(conn, model) == {}


def test_without_inference_every_level_is_kept(conn, cats):
    """The coding is for "inference" only: a model trained without it has its SGD weights."""
    model = train(conn, CATS, "linear", features=["a", "s"], label="y", epochs=2, seed=1)
    got = coefficients(conn, model)
    assert all(got[f"s={v}"][0] != 0 for v in ["red", "green", "blue", "amber"])


def test_a_hashed_column_is_singular_with_a_hint(conn, cats):
    """Hashed buckets are no levels: nothing dropped, the singular matrix says why."""
    e = train_error(conn, CATS, "linear", {"features": ["a", "s"], "label": "y", "inference": True,
                                           "preprocess": {"s": {"encode": "hash", "buckets": 4}},
                                           "epochs": 1})
    assert isinstance(e, E.DataException), e
    assert "is singular at feature" in str(e) and "(s#" in str(e)
    assert 'Column "s" is hashed into buckets' in e.diag.message_hint
    assert '"encode": "one_hot"' in e.diag.message_hint


def test_logistic_with_a_category_seen_once_does_not_converge(conn, cats):
    """A level of one row separates its class: no maximum-likelihood estimate, and the hint
    says why (statsmodels' Logit warns of the same)."""
    e = train_error(conn, CATS, "logistic", {"features": ["a", "r"], "label": "z", "inference": True,
                                             "epochs": 1})
    assert isinstance(e, E.DataException), e
    assert "did not converge" in str(e)
    assert "a category seen once" in e.diag.message_hint
