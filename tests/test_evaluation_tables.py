"""corgipile_confusion_matrix, corgipile_roc_curve and corgipile_calibration: a classifier's
tables on a relation, checked against the same tables computed here from each row's
corgipile_decision_function / corgipile_predict_proba / corgipile_predict_class; the errors
(regressions, an svm's calibration, bad params, privileges). Sharded tables equal to one
server's: tests/test_shards.py."""

import math

import psycopg
import pytest
from psycopg import errors as E

from helpers import connect, drop_role, train

ROWS = 3000


@pytest.fixture(scope="module")
def tables(dsn):
    """et_bin: two numeric features and a 0/1 label (noisy, so every bin and cell has rows);
    et_cls: text labels a/b/c, a number and a text column; et_reg: a numeric label."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS et_bin, et_cls, et_reg")
        c.execute("SELECT setseed(0.42)")
        c.execute(f"""CREATE TABLE et_bin AS
                      SELECT i AS id, ARRAY[x1, x2] AS features,
                             (x1 + 0.5 * x2 + (random() - 0.5) * 2 > 0)::int AS label
                      FROM (SELECT i, random() * 4 - 2 AS x1, random() * 4 - 2 AS x2
                            FROM generate_series(1, {ROWS}) i) g""")
        c.execute(f"""CREATE TABLE et_cls AS
                      SELECT i AS id, (ARRAY['a','b','c'])[1 + i % 3] AS label,
                             (i % 3) + (random() - 0.5) * 3 AS x,
                             (ARRAY['red','green','blue'])[1 + (i + (random() < 0.4)::int) % 3] AS color
                      FROM generate_series(1, {ROWS}) i""")
        c.execute("""CREATE TABLE et_reg AS SELECT i AS id, ARRAY[i * 0.001] AS features,
                      i * 0.002 AS label FROM generate_series(1, 500) i""")
    return {"bin": "et_bin", "cls": "et_cls", "reg": "et_reg"}


def rows_of(conn, sql, params=()):
    return conn.execute(sql, params).fetchall()


def test_binary_confusion_matrix_counts_every_row(conn, tables):
    m = train(conn, "et_bin", "svm", {"epochs": 3, "seed": 1})
    got = {(a, p): n for a, p, n in rows_of(conn, "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin')", (m,))}
    want = {}
    for label, cls in rows_of(conn, "SELECT label, corgipile_predict_class(%s::bigint, features) FROM et_bin", (m,)):
        want[(str(label), cls)] = want.get((str(label), cls), 0) + 1
    assert set(got) == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}
    assert {k: v for k, v in got.items() if v} == want
    assert sum(got.values()) == ROWS


def test_a_boolean_labels_classes_are_named_as_predict_class_names_them(conn, tables):
    """false / true in every table, as corgipile_predict_class says them (not 0 / 1)."""
    conn.execute("DROP TABLE IF EXISTS et_bool")
    conn.execute("CREATE TABLE et_bool AS SELECT id, features, label = 1 AS label FROM et_bin")
    m = train(conn, "et_bool", "logistic", {"epochs": 3, "seed": 1})
    got = {(a, p): n for a, p, n in rows_of(conn, "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bool')", (m,))}
    want = {}
    for label, cls in rows_of(conn, "SELECT label::text, corgipile_predict_class(%s::bigint, features) FROM et_bool", (m,)):
        want[(label, cls)] = want.get((label, cls), 0) + 1
    assert set(got) == {("false", "false"), ("false", "true"), ("true", "false"), ("true", "true")}
    assert {k: v for k, v in got.items() if v} == want
    assert {r[0] for r in rows_of(conn, "SELECT class FROM corgipile_roc_curve(%s::bigint, 'et_bool')", (m,))} == {"true"}
    assert {r[0] for r in rows_of(conn, "SELECT class FROM corgipile_calibration(%s::bigint, 'et_bool')", (m,))} == {"true"}


@pytest.mark.parametrize("kind", ["svm", "logistic"])
def test_roc_curve_matches_the_rows_scores(conn, tables, kind):
    m = train(conn, "et_bin", kind, {"epochs": 3, "seed": 1})
    curve = rows_of(conn, "SELECT * FROM corgipile_roc_curve(%s::bigint, 'et_bin')", (m,))
    if kind == "logistic":
        scored = rows_of(conn, """SELECT (corgipile_predict_proba(%s::bigint, features))[2], label
                                  FROM et_bin""", (m,))
    else:
        scored = rows_of(conn, "SELECT corgipile_decision_function(%s::bigint, features), label FROM et_bin", (m,))
    positives = sum(1 for _, y in scored if y == 1)
    negatives = len(scored) - positives
    assert curve[0][1] == math.inf and curve[0][2:4] == (0, 0)
    assert curve[-1][2:4] == (positives, negatives)
    assert all(r[0] == "1" for r in curve)
    thresholds = [r[1] for r in curve]
    assert thresholds == sorted(thresholds, reverse=True) and len(set(thresholds)) == len(thresholds)
    # Every point counts the rows scored at or above its threshold, up to the rows within the
    # bin's width (0.6% of a score) of it.
    for cls, threshold, tp, fp, tpr, fpr, precision, recall, f1 in curve[1:]:
        near = sum(1 for s, _ in scored if abs(s - threshold) <= 0.01 * abs(threshold) + 1e-9)
        exact_tp = sum(1 for s, y in scored if y == 1 and s >= threshold)
        exact_fp = sum(1 for s, y in scored if y == 0 and s >= threshold)
        assert abs(tp - exact_tp) + abs(fp - exact_fp) <= near, (threshold, tp, exact_tp, fp, exact_fp)
        assert tpr == pytest.approx(tp / positives) and recall == tpr
        assert fpr == pytest.approx(fp / negatives)
        assert precision == pytest.approx(tp / (tp + fp))
        assert f1 == pytest.approx(2 * precision * recall / (precision + recall) if tp else 0.0)
    # The area under these points is corgipile_evaluate's ROC AUC.
    auc = sum((b[5] - a[5]) * (a[4] + b[4]) / 2 for a, b in zip(curve, curve[1:]))
    evaluated = conn.execute("SELECT (corgipile_evaluate(%s::bigint, 'et_bin')->>'roc_auc')::float8", (m,)).fetchone()[0]
    assert auc == pytest.approx(evaluated, abs=2e-3)


def test_calibration_bins_match_the_rows_probabilities(conn, tables):
    m = train(conn, "et_bin", "logistic", {"epochs": 3, "seed": 1})
    table = rows_of(conn, """SELECT * FROM corgipile_calibration(%s::bigint, 'et_bin', '{"bins": 5}')""", (m,))
    probs = rows_of(conn, "SELECT (corgipile_predict_proba(%s::bigint, features))[2], label FROM et_bin", (m,))
    assert [r[1] for r in table] == [1, 2, 3, 4, 5]
    for cls, b, lower, upper, n, mean_predicted, observed in table:
        assert cls == "1" and (lower, upper) == pytest.approx(((b - 1) / 5, b / 5))
        inside = [(p, y) for p, y in probs if min(int(p * 5), 4) == b - 1]
        assert n == len(inside)
        if n:
            assert mean_predicted == pytest.approx(sum(p for p, _ in inside) / n, rel=1e-9)
            assert observed == pytest.approx(sum(y for _, y in inside) / n)
        else:
            assert mean_predicted is None and observed is None
    assert sum(r[4] for r in table) == ROWS


def test_classes_get_a_matrix_and_one_curve_per_class(conn, tables):
    m = train(conn, "et_cls", "softmax", {"epochs": 3, "seed": 1, "label": "label", "features": ["x", "color"],
                                          "name": "et_softmax"})
    matrix = rows_of(conn, "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_cls')", (m,))
    assert len(matrix) == 9 and {r[0] for r in matrix} == {"a", "b", "c"}
    want = {}
    for label, cls in rows_of(conn, "SELECT label, corgipile_predict_class(%s::bigint, t) FROM et_cls t", (m,)):
        want[(label, cls)] = want.get((label, cls), 0) + 1
    assert {(a, p): n for a, p, n in matrix if n} == want
    curves = rows_of(conn, "SELECT * FROM corgipile_roc_curve(%s::bigint, 'et_cls')", (m,))
    for cls in "abc":
        last = [r for r in curves if r[0] == cls][-1]
        assert last[2:4] == (ROWS // 3, ROWS - ROWS // 3)
    calibration = rows_of(conn, "SELECT * FROM corgipile_calibration(%s::bigint, 'et_cls')", (m,))
    assert len(calibration) == 30
    assert all(sum(r[4] for r in calibration if r[0] == cls) == ROWS for cls in "abc")
    # By name (its newest version, this one): the same table.
    assert rows_of(conn, "SELECT * FROM corgipile_confusion_matrix('et_softmax', 'et_cls')") == matrix


def test_rows_the_reader_skips_and_unknown_labels_are_not_counted(conn, tables):
    m = train(conn, "et_bin", "logistic", {"epochs": 1, "seed": 1})
    conn.execute("DROP TABLE IF EXISTS et_bin_odd")
    conn.execute("""CREATE TABLE et_bin_odd AS SELECT * FROM et_bin
                    UNION ALL SELECT 0, ARRAY[1.0, 1.0], NULL
                    UNION ALL SELECT 0, ARRAY[1.0, 1.0], 7""")
    matrix = rows_of(conn, "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin_odd')", (m,))
    assert sum(r[2] for r in matrix) == ROWS
    where = rows_of(conn, """SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin', '{"where": "id <= 100"}')""", (m,))
    assert sum(r[2] for r in where) == 100


@pytest.mark.parametrize("call, sqlstate", [
    ("corgipile_confusion_matrix({reg}, 'et_reg')", "0A000"),
    ("corgipile_roc_curve({reg}, 'et_reg')", "0A000"),
    ("corgipile_calibration({svm}, 'et_bin')", "0A000"),
    ("""corgipile_calibration({log}, 'et_bin', '{{"bins": 0}}')""", "22023"),
    ("""corgipile_calibration({log}, 'et_bin', '{{"bins": 1001}}')""", "22023"),
    ("""corgipile_calibration({log}, 'et_bin', '{{"bins": "ten"}}')""", "22023"),
    ("""corgipile_roc_curve({log}, 'et_bin', '{{"bins": 5}}')""", "22023"),
    ("""corgipile_roc_curve({log}, 'et_bin', '{{"epochs": 5}}')""", "22023"),
    ("""corgipile_roc_curve({log}, 'et_bin', '[]')""", "22023"),
    ("corgipile_roc_curve(999999::bigint, 'et_bin')", "42704"),
    ("corgipile_roc_curve('no_such_model', 'et_bin')", "42704"),
    ("corgipile_confusion_matrix({log}, 'et_cls')", "42703"),
])
def test_errors_come_before_the_scan(conn, tables, call, sqlstate):
    ids = {"reg": train(conn, "et_reg", "linear", {"epochs": 1}),
           "svm": train(conn, "et_bin", "svm", {"epochs": 1}),
           "log": train(conn, "et_bin", "logistic", {"epochs": 1})}
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM " + call.format(**{k: f"{v}::bigint" for k, v in ids.items()}))
    assert err.value.sqlstate == sqlstate, (err.value.sqlstate, str(err.value))
    assert err.value.diag.message_hint or sqlstate in ("42704", "42703"), str(err.value)


def test_memory_limit_of_the_tables(conn, tables):
    m = train(conn, "et_cls", "softmax", {"epochs": 1, "seed": 1, "label": "label", "features": ["x", "color"]})
    conn.execute("SET corgipile.max_buffer_memory = '256kB'")
    try:
        with pytest.raises(E.ProgramLimitExceeded) as err:
            conn.execute("SELECT * FROM corgipile_roc_curve(%s::bigint, 'et_cls')", (m,))
        assert "max_buffer_memory" in str(err.value)
    finally:
        conn.execute("RESET corgipile.max_buffer_memory")


def test_a_use_grant_is_enough_but_the_rows_stay_the_callers(dsn, conn, tables):
    drop_role(conn, "et_reader")
    conn.execute("CREATE ROLE et_reader LOGIN")
    try:
        m = train(conn, "et_bin", "logistic", {"epochs": 1, "seed": 1})
        with connect(dsn, user="et_reader") as reader:
            # No grant on the model: it does not exist for this role.
            with pytest.raises(psycopg.Error) as err:
                reader.execute("SELECT * FROM corgipile_roc_curve(%s::bigint, 'et_bin')", (m,))
            assert err.value.sqlstate in ("42704", "42501"), str(err.value)
        conn.execute("SELECT corgipile_grant(%s::bigint, 'et_reader', 'use')", (m,))
        with connect(dsn, user="et_reader") as reader:
            # The model, but not the table's rows.
            with pytest.raises(E.InsufficientPrivilege):
                reader.execute("SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin')", (m,))
        conn.execute("GRANT SELECT ON et_bin TO et_reader")
        with connect(dsn, user="et_reader") as reader:
            got = reader.execute("SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin')", (m,)).fetchall()
        assert got == rows_of(conn, "SELECT * FROM corgipile_confusion_matrix(%s::bigint, 'et_bin')", (m,))
    finally:
        conn.execute("REVOKE ALL ON et_bin FROM et_reader")
        drop_role(conn, "et_reader")
