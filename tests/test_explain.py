"""corgipile_explain_predict(model, row | features, for_class, top): one row per input column (a
one-hot column is one entry) with its share of the explained output, sorted by magnitude, then a
(baseline) row; the shares and the baseline add up to the output (src/predict/explain.rs,
ml/src/explain.rs).

Linear models are checked exactly against a reference computed here from
corgipile_model_coefficients and the stored preprocessing (weight × distance from the baseline
row: training means, most frequent category); networks by the sum rule (integrated gradients);
rows with NULLs and unseen categories; models trained on arrays; privileges; bad inputs."""

import math

import psycopg
import psycopg.errors as E
import pytest

from helpers import drop_role, scalar, train

TABLE = "ex_people"
BOB = "ex_bob"
COLUMNS = ["state", "plan", "income", "age", "has_app"]
BASE = {"features": COLUMNS, "max_categories": 3, "epochs": 3, "seed": 1, "verbose": False}
# A row of the model's columns built in the query: (state, plan, income, age, has_app).
ROW = "(SELECT %s::text AS state, %s::text AS plan, %s::float8 AS income, %s::int AS age, %s::boolean AS has_app) r"
ROWS = [  # the table's kinds of rows, a NULL income, an unseen state (pooled into (other)), a
    # NULL state ((null) slot), an unseen plan (no (other) slot: no category at all)
    ("CA", "basic", 52000.0, 40, True),
    ("TX", "pro", None, 25, False),
    ("ZZ", "pro", 81000.0, 61, True),
    (None, "basic", 12000.0, 33, False),
    ("NY", "gold", 30000.0, 50, None),
]


@pytest.fixture(scope="module")
def world(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        drop_role(c, BOB)
        c.execute(f"CREATE ROLE {BOB} LOGIN")
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        c.execute(f"""CREATE TABLE {TABLE} AS SELECT i AS id,
            CASE WHEN i % 20 = 0 THEN NULL
                 ELSE (ARRAY['CA','CA','CA','CA','CA','CA','CA','CA','TX','TX','TX','TX','TX',
                             'NY','NY','NY','WA','WA','OR'])[1 + i % 19] END AS state,
            (ARRAY['basic','pro'])[1 + i % 2] AS plan,
            CASE WHEN i % 11 = 0 THEN NULL ELSE 10000 + (i * 7919) % 90000 END::float8 AS income,
            (18 + (i * 31) % 60)::int AS age,
            (i % 3 = 0) AS has_app,
            ((i * 7919) % 90000 > 40000 OR i % 5 = 0) AS churn,
            (ARRAY['low','mid','high'])[1 + ((i * 7919) % 90000) / 30000] AS tier,
            ((i * 7919) % 90000) / 1000.0 + (i * 31) % 60 AS score,
            ARRAY[(i % 7) - 3, ((i * 13) % 10) / 10.0, 1.5]::float8[] AS features
            FROM generate_series(1, 3000) i""")
        ids = {}
        for name, kind, label, extra in [
            ("ex_logistic", "logistic", "churn", {}),
            ("ex_svm", "svm", "churn", {}),
            ("ex_linear", "linear", "score", {}),
            ("ex_softmax", "softmax", "tier", {}),
            ("ex_mlp", "mlp", "tier", {"hidden": [8, 6]}),
            ("ex_mlp_tanh", "mlp", "tier", {"hidden": [8], "activation": "tanh"}),
            ("ex_mlp_regression", "mlp_regression", "score", {"hidden": [6]}),
            ("ex_skip", "logistic", "churn", {"preprocess": {"income": {"impute": "skip"}}}),
        ]:
            ids[name] = train(c, TABLE, kind, {**BASE, "label": label, "name": name, **extra})
        ids["ex_array"] = train(c, TABLE, "logistic", {"features": "features", "label": "churn",
                                                       "seed": 1, "epochs": 2, "name": "ex_array"})
    yield ids
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM corgipile.models WHERE name LIKE 'ex\\_%'")
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        drop_role(c, BOB)


def explain(c, model, row, for_class=None, top=None):
    """[(column_name, value, contribution, class)] of a row built from `row`."""
    return c.execute(f"SELECT e.* FROM {ROW}, corgipile_explain_predict(%s::text, r, %s, %s) e",
                     (*row, model, for_class, top)).fetchall()


def on_row(c, function, model, row):
    return scalar(c, f"SELECT {function}(%s::text, r) FROM {ROW}", (model, *row))


def total(rows):
    return sum(r[2] for r in rows)


def assert_shape(rows, n_entries=len(COLUMNS)):
    assert len(rows) == n_entries + 1
    assert rows[-1][0] == "(baseline)" and rows[-1][1] is None
    shares = [abs(r[2]) for r in rows[:-1]]
    assert shares == sorted(shares, reverse=True)
    assert len({r[3] for r in rows}) == 1  # one class explained


def reference(c, model, row, cls=None):
    """Each column's share by hand: the weight times the distance from the baseline (training
    means, most frequent category), from the catalog's coefficients and preprocessing."""
    coef = {f: w for k, f, w in c.execute(
        "SELECT class, feature, coefficient FROM corgipile_model_coefficients(%s)", (model,))
        if cls is None or k == cls}
    pre = scalar(c, "SELECT preprocessing FROM corgipile.models WHERE id = %s",
                 (scalar(c, "SELECT id FROM corgipile.model_summary WHERE name = %s AND deployed", (model,)),))
    values = dict(zip(COLUMNS, row))
    out = {}
    for col in pre["columns"]:
        name, v = col["name"], values[col["name"]]
        if col["encode"] == "number":
            x = col["fill"] if v is None else float(v)
            out[name] = coef[name] * (x - col["mean"])
        else:
            cats = col["categories"]
            if v is None:
                slot = f"{name}=(null)" if col["null"] else None
            elif v in cats:
                slot = f"{name}={v}"
            else:
                slot = f"{name}=(other)" if col["other"] else None
            out[name] = (coef[slot] if slot else 0.0) - coef[f"{name}={cats[0]}"]
    return out


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * (1 + max(abs(a), abs(b)))


@pytest.mark.parametrize("model", ["ex_logistic", "ex_svm", "ex_linear"])
def test_linear_contributions_are_exact_and_sum_to_the_decision_value(conn, world, model):
    function = "corgipile_predict" if model == "ex_linear" else "corgipile_decision_function"
    for row in ROWS:
        rows = explain(conn, model, row)
        assert_shape(rows)
        assert close(total(rows), on_row(conn, function, model, row)), row
        ref = reference(conn, model, row)
        for name, _, share, _ in rows[:-1]:
            assert close(share, ref[name]), (row, name, share, ref[name])
    # The whole-row form on a table's rows gives the same.
    for pid in (1, 2, 20, 33):
        rows = conn.execute(f"SELECT e.* FROM {TABLE} p, corgipile_explain_predict(%s, p) e WHERE p.id = %s",
                            (model, pid)).fetchall()
        value = scalar(conn, f"SELECT {function}(%s, p) FROM {TABLE} p WHERE p.id = %s", (model, pid))
        assert close(total(rows), value)


def test_values_show_what_the_model_read(conn, world):
    pre = scalar(conn, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (world["ex_logistic"],))
    mean = {c["name"]: c.get("mean") for c in pre["columns"]}
    read = {r[0]: (r[1], r[2]) for r in explain(conn, "ex_logistic", ROWS[1])}
    assert read["state"][0] == "TX" and read["plan"][0] == "pro"
    # A NULL income is imputed by the training mean: the baseline's own value, no share.
    assert float(read["income"][0]) == pytest.approx(mean["income"], rel=1e-12)
    assert read["income"][1] == 0.0
    assert {r[0]: r[1] for r in explain(conn, "ex_logistic", ROWS[2])}["state"] == "(other)"
    assert {r[0]: r[1] for r in explain(conn, "ex_logistic", ROWS[3])}["state"] == "(null)"
    # An unseen plan, and the column has no (other) slot: nothing set, as corgipile_predict.
    assert {r[0]: r[1] for r in explain(conn, "ex_logistic", ROWS[4])}["plan"] == "(no category)"
    # The boolean NULL is imputed too.
    assert {r[0]: r[1] for r in explain(conn, "ex_logistic", ROWS[4])}["has_app"] != "NULL"


def test_two_classes_explain_the_positive_class_or_the_one_named(conn, world):
    row = ROWS[0]
    positive = explain(conn, "ex_logistic", row)
    assert positive[0][3] == "true"
    assert explain(conn, "ex_logistic", row, "true") == positive
    negative = explain(conn, "ex_logistic", row, "false")
    assert negative[0][3] == "false"
    assert sorted((n, -s) for n, _, s, _ in negative) == sorted((n, s) for n, _, s, _ in positive)


def test_softmax_explains_the_predicted_class_unless_told(conn, world):
    for row in ROWS:
        rows = explain(conn, "ex_softmax", row)
        assert_shape(rows)
        assert rows[0][3] == on_row(conn, "corgipile_predict_class", "ex_softmax", row)
        proba = on_row(conn, "corgipile_predict_proba", "ex_softmax", row)
        classes = scalar(conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s",
                         (world["ex_softmax"],))
        scores = {}
        for cls in classes:
            named = explain(conn, "ex_softmax", row, cls)
            assert named[0][3] == cls
            ref = reference(conn, "ex_softmax", row, cls)
            for name, _, share, _ in named[:-1]:
                assert close(share, ref[name]), (row, cls, name)
            scores[cls] = total(named)
        # Scores differ as the log-probabilities do.
        for a, b in zip(classes, classes[1:]):
            pa, pb = proba[classes.index(a)], proba[classes.index(b)]
            assert close(scores[a] - scores[b], math.log(pa / pb), 1e-9)


@pytest.mark.parametrize("model", ["ex_mlp", "ex_mlp_tanh"])
def test_network_shares_sum_to_the_class_score(conn, world, model):
    classes = scalar(conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (world[model],))
    for row in ROWS:
        rows = explain(conn, model, row)
        assert_shape(rows)
        assert rows[0][3] == on_row(conn, "corgipile_predict_class", model, row)
        proba = on_row(conn, "corgipile_predict_proba", model, row)
        scores = {cls: total(explain(conn, model, row, cls)) for cls in classes}
        for a, b in zip(classes, classes[1:]):
            expected = math.log(proba[classes.index(a)] / proba[classes.index(b)])
            assert close(scores[a] - scores[b], expected, 1e-6), (row, a, b)


def test_network_regression_shares_sum_to_the_prediction(conn, world):
    for row in ROWS:
        rows = explain(conn, "ex_mlp_regression", row)
        assert_shape(rows)
        assert rows[0][3] is None
        assert close(total(rows), on_row(conn, "corgipile_predict", "ex_mlp_regression", row), 1e-6)


def test_array_models_have_one_entry_per_element_or_the_top_k(conn, world):
    x = [2.0, 0.3, 1.5]
    rows = conn.execute("SELECT * FROM corgipile_explain_predict('ex_array', %s::float8[])", (x,)).fetchall()
    assert_shape(rows, 3)
    assert {r[0] for r in rows[:-1]} == {"features[1]", "features[2]", "features[3]"}
    value = scalar(conn, "SELECT corgipile_decision_function('ex_array', %s::float8[])", (x,))
    assert close(total(rows), value)
    coef = dict(conn.execute("SELECT feature, coefficient FROM corgipile_model_coefficients('ex_array')").fetchall())
    # Baseline: the training means (normalize stores them).
    means = conn.execute("""SELECT avg(features[1]), avg(features[2]), avg(features[3]) FROM ex_people""").fetchone()
    for name, shown, share, _ in rows[:-1]:
        j = int(name[len("features["):-1]) - 1
        assert float(shown) == x[j]
        assert abs(share - coef[name] * (x[j] - float(means[j]))) < 1e-6 * (1 + abs(share))
    top = conn.execute("SELECT * FROM corgipile_explain_predict('ex_array', %s::float8[], top => 1)", (x,)).fetchall()
    assert [r[0] for r in top] == [rows[0][0], "(the rest)", "(baseline)"]
    assert top[1][1] == "2 more"
    assert close(total(top), value)


def test_top_keeps_the_sum(conn, world):
    rows = explain(conn, "ex_logistic", ROWS[0], None, 2)
    assert [r[0] for r in rows][2:] == ["(the rest)", "(baseline)"]
    assert close(total(rows), on_row(conn, "corgipile_decision_function", "ex_logistic", ROWS[0]))


def test_a_row_the_model_skips_has_no_explanation(conn, world):
    assert on_row(conn, "corgipile_predict", "ex_skip", ROWS[1]) is None
    assert explain(conn, "ex_skip", ROWS[1]) == []
    assert len(explain(conn, "ex_skip", ROWS[0])) == len(COLUMNS) + 1
    # A NULL model or row: no rows, as the strict predictions give NULL.
    assert conn.execute("SELECT * FROM corgipile_explain_predict(NULL::text, NULL::record)").fetchall() == []


def test_use_on_the_model_is_enough_and_tables_stay_private(dsn, conn, world):
    with psycopg.connect(dsn, user=BOB, autocommit=True) as bob:
        # Without a grant the model does not exist for bob, word for word as corgipile_predict.
        with pytest.raises(E.UndefinedObject) as err:
            explain(bob, "postgres.ex_logistic", ROWS[0])
        with pytest.raises(E.UndefinedObject) as err_predict:
            on_row(bob, "corgipile_predict", "postgres.ex_logistic", ROWS[0])
        assert str(err.value) == str(err_predict.value)
        with pytest.raises(E.UndefinedObject):
            bob.execute("SELECT * FROM corgipile_explain_predict(%s::bigint, ARRAY[1,2,3]::float8[])",
                        (world["ex_array"],))
        conn.execute("SELECT corgipile_grant('ex_logistic', %s, 'use')", (BOB,))
        try:
            rows = explain(bob, "postgres.ex_logistic", ROWS[0])
            assert rows == explain(conn, "ex_logistic", ROWS[0])
            # Explaining reads no table: the rows of one bob may not read stay out of reach.
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute(f"SELECT e.* FROM {TABLE} p, corgipile_explain_predict('postgres.ex_logistic', p) e")
        finally:
            conn.execute("SELECT corgipile_revoke('ex_logistic', %s, 'use')", (BOB,))
        with pytest.raises(E.UndefinedObject):
            explain(bob, "postgres.ex_logistic", ROWS[0])


@pytest.mark.parametrize("query, params, error", [
    ("SELECT * FROM corgipile_explain_predict(987654321::bigint, ARRAY[1.0]::float8[])", (), E.UndefinedObject),
    ("SELECT * FROM corgipile_explain_predict('ex_no_such', ARRAY[1.0]::float8[])", (), E.UndefinedObject),
    # A row without a column of the model / with one of the wrong kind of type.
    ("SELECT e.* FROM (SELECT 'CA' AS state) r, corgipile_explain_predict('ex_logistic', r) e", (), E.UndefinedColumn),
    ("SELECT e.* FROM (SELECT 1 AS state, 'pro' AS plan, 1.0::float8 AS income, 1 AS age, true AS has_app) r, "
     "corgipile_explain_predict('ex_logistic', r) e", (), E.DatatypeMismatch),
    # An array for a model of text columns; a row for a model trained on arrays.
    ("SELECT * FROM corgipile_explain_predict('ex_logistic', ARRAY[1.0, 2.0]::float8[])", (), E.WrongObjectType),
    ("SELECT e.* FROM (SELECT ARRAY[1.0]::float8[] AS features) r, corgipile_explain_predict('ex_array', r) e",
     (), E.WrongObjectType),
    ("SELECT * FROM corgipile_explain_predict('ex_array', ARRAY[1.0, 2.0]::float8[])", (), E.ArraySubscriptError),
    ("SELECT * FROM corgipile_explain_predict('ex_array', ARRAY[1.0, 'NaN', 2.0]::float8[])", (), E.DataException),
    # No class to explain, an unknown class, a top below 1.
    ("SELECT e.* FROM (SELECT 'CA' AS state, 'pro' AS plan, 1.0::float8 AS income, 1 AS age, true AS has_app) r, "
     "corgipile_explain_predict('ex_linear', r, 'x') e", (), E.InvalidParameterValue),
    ("SELECT * FROM corgipile_explain_predict('ex_array', ARRAY[1.0, 2.0, 3.0]::float8[], 'maybe')", (),
     E.InvalidParameterValue),
    ("SELECT * FROM corgipile_explain_predict('ex_array', ARRAY[1.0, 2.0, 3.0]::float8[], top => 0)", (),
     E.InvalidParameterValue),
])
def test_bad_inputs_are_clear_errors(conn, world, query, params, error):
    with pytest.raises(error) as err:
        conn.execute(query, params)
    assert err.value.diag.message_primary
    if error in (E.UndefinedObject, E.UndefinedColumn, E.WrongObjectType, E.InvalidParameterValue):
        assert err.value.diag.message_hint
