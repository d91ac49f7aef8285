"""corgipile_export_sql: a model as the text of a plain PL/pgSQL function. Every exported
function is created in a database WITHOUT corgipile and scores every test row there; its
answers are compared with corgipile_predict (corgipile_predict_class for text classes,
_predict_proba, _decision_function) on the same rows in the corgipile database: classes equal,
numbers to 1e-12 relative for linear models and 1e-9 for factorization machines and networks.

Tables: `mix` (a column list: numbers with NULLs, a text column one-hot encoded with NULLs, a
boolean, a date, a timestamptz and a number encoded "ple"), `arr` (one float8[] column); each
with a two-class, a three-class (text) and a numeric label. The test rows (`*_test`) hold
categories never seen in training and NULLs."""

import math

import psycopg
import psycopg.sql
import pytest

from helpers import describe, error_of, scalar, train
from tables import export_arrays_sql

LINEAR = {"svm", "logistic", "softmax", "linear"}
KINDS = {
    # kind: (label column, predicted as text)
    "svm": ("y2", False),
    "logistic": ("y2", False),
    "softmax": ("yk", True),
    "linear": ("yr", False),
    "fm": ("yk", True),
    "fm_regression": ("yr", False),
    "mlp": ("yk", True),
    "mlp_regression": ("yr", False),
}
MIX_COLUMNS = "x float8, n int4, c text, b boolean, d date, ts timestamptz, p float8"
MIX_FEATURES = ["x", "n", "c", "b", "d", "ts", "p"]
# The exported function's arguments from a row of mix (booleans as corgipile reads them).
MIX_ARGS = "x, n, c, b::int::float8, d, ts, p"
LABELS = "y2 boolean, yk text, yr float8"


def mix_rows(lo, hi, unseen):
    """Rows lo..hi of mix: `unseen` adds categories training never saw."""
    cats = "ARRAY['red', 'green', 'blue', 'it''s', 'x$$y']"
    c = f"CASE WHEN i % 11 = 0 THEN NULL ELSE ({cats})[1 + i % 5] END"
    if unseen:
        c = f"CASE WHEN i % 4 = 0 THEN 'never seen ' || i ELSE {c} END"
    return f"""
        SELECT i AS id,
               CASE WHEN i % 9 = 0 THEN NULL ELSE sin(i) * 10 END AS x,
               CASE WHEN i % 7 = 0 THEN NULL ELSE i % 13 END AS n,
               {c} AS c,
               i % 3 = 0 AS b,
               date '2023-12-25' + (i * 5) % 400 AS d,
               timestamptz '2024-03-30 22:00+00' + i * interval '97 minutes 13.25 seconds' AS ts,
               (i * 37 % 100)::float8 + 0.5 AS p,
               (sin(i) * 10 + (i % 13) * 0.3 + CASE WHEN i % 3 = 0 THEN 2 ELSE 0 END) > 2 AS y2,
               (ARRAY['low', 'mid', 'high'])[1 + (i * 7 + (i % 13)) % 3] AS yk,
               sin(i) * 10 + (i % 13) * 0.5 + (i * 37 % 100) * 0.01 AS yr
        FROM generate_series({lo}, {hi}) i"""


PLAIN = "corgipile_export_plain"


@pytest.fixture(scope="module")
def env(db):
    """The corgipile database (with the tables and one model per kind and table) and a plain
    database without corgipile (with the test rows)."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f"CREATE TABLE mix AS {mix_rows(1, 600, False)}")
        c.execute(f"CREATE TABLE mix_test AS {mix_rows(601, 760, True)}")
        c.execute(f"CREATE TABLE arr AS {export_arrays_sql(1, 600)}")
        c.execute(f"CREATE TABLE arr_test AS {export_arrays_sql(601, 700)}")
        models = {}
        for kind, (label, _) in KINDS.items():
            extra = {"epochs": 4, "label": label}
            if kind.startswith("mlp"):
                extra["hidden"] = [6, 4] if kind == "mlp" else [5]
            mix = dict(extra, features=MIX_FEATURES, preprocess={"p": {"encode": "ple"}})
            models[("mix", kind)] = train(c, "mix", kind, mix)
            models[("arr", kind)] = train(c, "arr", kind, dict(extra, features="f"))
        tables = {}
        for t in ("mix_test", "arr_test"):
            tables[t] = c.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PLAIN} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {PLAIN}")
    with psycopg.connect(dbname=PLAIN, autocommit=True) as p:
        assert scalar(p, "SELECT count(*) FROM pg_extension WHERE extname = 'corgipile'") == 0
        p.execute(f"CREATE TABLE mix_test (id int4, {MIX_COLUMNS}, {LABELS})")
        p.execute(f"CREATE TABLE arr_test (id int4, f float8[], {LABELS})")
        with p.cursor() as cur:
            cur.executemany("INSERT INTO mix_test VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            tables["mix_test"])
            cur.executemany("INSERT INTO arr_test VALUES (%s, %s, %s, %s, %s)", tables["arr_test"])
    yield db, models
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PLAIN} WITH (FORCE)")


@pytest.fixture
def conn(env):
    with psycopg.connect(env[0], autocommit=True) as c:
        yield c


@pytest.fixture
def plain(env):
    with psycopg.connect(dbname=PLAIN, autocommit=True) as p:
        yield p


def exported(conn, plain, model, name, output="predict"):
    """Creates the export of `model` in the plain database; returns its text."""
    sql = scalar(conn, "SELECT corgipile_export_sql(%s::bigint, %s, %s)", (model, name, output))
    plain.execute(f'DROP FUNCTION IF EXISTS "{name}"')
    plain.execute(sql)
    return sql


def close(a, b, rel):
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel * 1e-3)


def compare(got, want, rel, what):
    assert len(got) == len(want) and len(got) > 50, what
    for (i, g), (j, w) in zip(got, want):
        assert i == j
        if w is None or isinstance(w, str):
            assert g == w, f"{what}: row {i}: {g!r} != {w!r}"
        else:
            assert g is not None and close(g, w, rel), f"{what}: row {i}: {g!r} != {w!r}"


@pytest.mark.parametrize("table", ["mix", "arr"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_scores_as_corgipile_predict_without_corgipile(env, conn, plain, table, kind):
    model = env[1][(table, kind)]
    text = KINDS[kind][1]
    rel = 1e-12 if kind in LINEAR else 1e-9
    predict = "corgipile_predict_class" if text else "corgipile_predict"
    arg = "t" if table == "mix" else "f"
    want = conn.execute(f"SELECT id, {predict}(%s::bigint, {arg}) FROM {table}_test t ORDER BY id",
                        (model,)).fetchall()
    name = f"score_{table}_{kind}"
    exported(conn, plain, model, name)
    args = MIX_ARGS if table == "mix" else "f"
    got = plain.execute(f'SELECT id, "{name}"({args}) FROM {table}_test ORDER BY id').fetchall()
    compare(got, want, rel, f"{kind} on {table}")
    if not text and kind in ("svm", "logistic"):
        assert {g for _, g in got} == {0.0, 1.0}, "both classes are predicted"
    # The other outputs: the decision value and the probabilities where the kind has them.
    outputs = []
    if kind in ("svm", "logistic", "linear", "fm_regression", "mlp_regression"):
        outputs.append(("decision", "corgipile_decision_function"))
    if kind in ("logistic", "softmax", "fm", "mlp"):
        outputs.append(("proba", "corgipile_predict_proba"))
    for output, function in outputs:
        want = conn.execute(f"SELECT id, {function}(%s::bigint, {arg}) FROM {table}_test t ORDER BY id",
                            (model,)).fetchall()
        exported(conn, plain, model, f"{name}_{output}", output)
        got = plain.execute(f'SELECT id, "{name}_{output}"({args}) FROM {table}_test ORDER BY id').fetchall()
        compare(got, want, rel, f"{kind} on {table}, {output}")


def test_the_by_name_overload_and_the_default_name(env, conn, plain):
    model = env[1][("arr", "linear")]
    by_id = scalar(conn, "SELECT corgipile_export_sql(%s::bigint)", (model,))
    assert by_id.startswith(f'CREATE FUNCTION "corgipile_model_{model}"("f" float8[]) RETURNS float8')
    assert scalar(conn, "SELECT corgipile_export_sql(%s::text)", (str(model),)) == by_id
    # The text creates its function, and only it, in a database without corgipile.
    before = scalar(plain, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
    plain.execute(f'DROP FUNCTION IF EXISTS "corgipile_model_{model}"')
    plain.execute(by_id)
    after = scalar(plain, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
    assert after in (before, before + 1)
    assert scalar(plain, f'SELECT "corgipile_model_{model}"(NULL::float8[])') is None
    e = error_of(plain, f"SELECT \"corgipile_model_{model}\"(ARRAY[1, 2]::float8[])")
    assert e is not None and e.sqlstate == "2202E", describe(e)
    e = error_of(plain, f"SELECT \"corgipile_model_{model}\"(ARRAY[1, 2, 'NaN', 4, 5]::float8[])")
    assert e is not None and e.sqlstate == "22000", describe(e)


HOSTILE_COLUMNS = ['it\'s "q"', "a$$b", "back\\slash", "new\nline", "select", "_x"]
HOSTILE_VALUES = ["o'neil", "$$; DROP TABLE victim; --", "back\\slash\\", "two\nlines", "$corgipile$", "ünï ☃"]


def test_hostile_names_and_categories_create_and_score_and_inject_nothing(conn, plain):
    cols = [psycopg.sql.Identifier(n) for n in HOSTILE_COLUMNS]
    vals = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(v) for v in HOSTILE_VALUES)
    q = psycopg.sql.SQL("""CREATE TABLE hostile AS
        SELECT i AS id, (ARRAY[{vals}])[1 + i % 6] AS {c0}, sin(i) AS {c1},
               (ARRAY[{vals}])[1 + (i * 5) % 6] AS {c2}, (i % 4)::float8 AS {c3},
               cos(i) AS {c4}, (i % 3)::float8 AS {c5},
               (i % 6 < 3) <> (sin(i) > 0.5) AS y
        FROM generate_series(1, 400) i""").format(
        vals=vals, c0=cols[0], c1=cols[1], c2=cols[2], c3=cols[3], c4=cols[4], c5=cols[5])
    conn.execute("DROP TABLE IF EXISTS hostile")
    conn.execute(q)
    model = train(conn, "hostile", "logistic", {"features": HOSTILE_COLUMNS, "label": "y", "epochs": 5})
    name = "f\"$$'x\\"
    sql = scalar(conn, "SELECT corgipile_export_sql(%s::bigint, %s)", (model, name))
    plain.execute("CREATE TABLE IF NOT EXISTS victim (x int)")
    rows = conn.execute("SELECT * FROM hostile ORDER BY id").fetchall()
    plain.execute("DROP TABLE IF EXISTS hostile")
    plain.execute(psycopg.sql.SQL("CREATE TABLE hostile (id int, {} text, {} float8, {} text, {} float8, {} float8, {} float8, y boolean)")
                  .format(*cols))
    with plain.cursor() as cur:
        cur.executemany("INSERT INTO hostile VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
    plain.execute(psycopg.sql.SQL("DROP FUNCTION IF EXISTS {}").format(psycopg.sql.Identifier(name)))
    plain.execute(sql)
    assert scalar(plain, "SELECT count(*) FROM pg_class WHERE relname = 'victim'") == 1
    assert scalar(plain, "SELECT count(*) FROM pg_proc WHERE proname = %s", (name,)) == 1
    want = conn.execute("SELECT id, corgipile_predict(%s::bigint, h) FROM hostile h ORDER BY id", (model,)).fetchall()
    args = psycopg.sql.SQL(", ").join(cols)
    got = plain.execute(psycopg.sql.SQL("SELECT id, {}({}) FROM hostile ORDER BY id")
                        .format(psycopg.sql.Identifier(name), args)).fetchall()
    compare(got, want, 1e-12, "hostile")
    # A column named like an internal variable: the arguments are unnamed.
    assert '"_x"' not in sql.split("\n", 1)[0]


def test_another_role_gets_the_error_corgipile_predict_gives(env, conn):
    model = env[1][("arr", "logistic")]
    conn.execute("DROP ROLE IF EXISTS export_stranger")
    conn.execute("CREATE ROLE export_stranger")
    try:
        conn.execute("SET ROLE export_stranger")
        predict = error_of(conn, "SELECT corgipile_predict(%s::bigint, ARRAY[1,2,3,4,5]::float8[])", (model,))
        export = error_of(conn, "SELECT corgipile_export_sql(%s::bigint)", (model,))
        conn.execute("RESET ROLE")
        assert predict is not None and export is not None, describe(export)
        assert (export.sqlstate, export.diag.message_primary) == (predict.sqlstate, predict.diag.message_primary)
        # With a grant of use, the export works as prediction does.
        conn.execute("SELECT corgipile_grant(%s::bigint, 'export_stranger', 'use')", (model,))
        conn.execute("SET ROLE export_stranger")
        assert scalar(conn, "SELECT corgipile_export_sql(%s::bigint)", (model,)).startswith("CREATE FUNCTION")
    finally:
        conn.execute("RESET ROLE")
        conn.execute("DROP OWNED BY export_stranger")
        conn.execute("DROP ROLE export_stranger")


def test_what_cannot_be_exported_is_a_clear_error(env, conn):
    hashed = train(conn, "mix", "logistic", {"label": "y2", "features": ["x", "c"], "epochs": 1,
                                             "preprocess": {"c": {"encode": "hash"}}})
    e = error_of(conn, "SELECT corgipile_export_sql(%s::bigint)", (hashed,))
    assert e is not None and e.sqlstate == "0A000", describe(e)
    assert '"c"' in e.diag.message_primary and "one_hot" in e.diag.message_hint, describe(e)
    # Too large for the setting: 54000 before the text is built.
    model = env[1][("mix", "mlp")]
    conn.execute("SET corgipile.max_export_size = '8kB'")
    try:
        e = error_of(conn, "SELECT corgipile_export_sql(%s::bigint)", (model,))
        assert e is not None and e.sqlstate == "54000", describe(e)
        assert "corgipile.max_export_size" in e.diag.message_hint
    finally:
        conn.execute("RESET corgipile.max_export_size")
    # Outputs a kind does not have, an unknown output, an empty name.
    svm = env[1][("arr", "svm")]
    for args, state in [((svm, None, "proba"), "42809"), ((env[1][("arr", "softmax")], None, "decision"), "42809"),
                        ((svm, None, "score"), "22023"), ((svm, "", "predict"), "22023")]:
        e = error_of(conn, "SELECT corgipile_export_sql(%s::bigint, %s, %s)", args)
        assert e is not None and e.sqlstate == state, describe(e)
