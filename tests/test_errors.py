"""Errors: bad input never crashes the server. Every case is a clear ERROR with the right SQLSTATE
class, nothing is written to the catalog, and the next statement of the same session works (in a
database of the suite's own: relation kinds, params, data, predictions; the last test checks that
no backend died during the module). Errors that depend on the situation come up front (in the
shared database, as the roles_env roles): a training in a read-only transaction, drop and deploy
in one, a name held by an uncommitted training of the same role (55P03 at once; another role's
name is not held); and hints fit the situation (a NaN label does not suggest views, a diverging
normalized training does not suggest normalize)."""

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import (ROLES_ENV_ALICE, ROLES_ENV_BOB, catalog_counts, connect, describe, error_of,
                     models_count, require_extension, scalar, server_crashes, timed, train, train_error)
from tables import bad_label, points, raw_scale, uniform



ALICE, BOB = ROLES_ENV_ALICE, ROLES_ENV_BOB
BIG_ROWS = 1_000_000
BIG_EPOCHS = 20  # the big table's trainings would run for many seconds if they got going
CRASHES_AT_START = {}


@pytest.fixture(scope="module")
def tables(db):
    CRASHES_AT_START["n"] = server_crashes()
    with connect(db) as c:
        points(c, "t", 1000, features=uniform(4))
        c.execute("CREATE VIEW v AS SELECT * FROM t")
        c.execute("CREATE MATERIALIZED VIEW mv AS SELECT * FROM t")
        c.execute("CREATE SEQUENCE s")
        c.execute("CREATE INDEX t_id ON t (id)")
        c.execute("CREATE TABLE part (id int, features float8[], label int) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE part_1 PARTITION OF part FOR VALUES FROM (0) TO (100000)")
        c.execute("INSERT INTO part SELECT * FROM t")
        c.execute("CREATE TYPE comp AS (a int)")
        if scalar(c, "SELECT count(*) FROM pg_available_extensions WHERE name = 'file_fdw'"):
            c.execute("CREATE EXTENSION file_fdw")
            c.execute("CREATE SERVER files FOREIGN DATA WRAPPER file_fdw")
            c.execute("CREATE FOREIGN TABLE ft (features float8[], label int) SERVER files OPTIONS (filename '/dev/null')")

        def table(name, ftype, ltype, rows):
            c.execute(f"CREATE TABLE {name} (id serial, features {ftype}, label {ltype})")
            for f, l in rows:
                c.execute(f"INSERT INTO {name} (features, label) VALUES (%s::{ftype}, %s::{ltype})", (f, l))

        table("no_features", "float8", "int", [])
        c.execute("ALTER TABLE no_features RENAME COLUMN features TO x")
        table("f_int", "int[]", "int", [("{1,2}", 1), ("{3,4}", 0)])
        table("f_text", "text[]", "int", [("{1,2}", 1), ("{3,4}", 0)])
        table("f_scalar", "float8", "int", [(1.0, 1), (2.0, 0)])
        table("f_2d", "float8[]", "int", [("{{1,2},{3,4}}", 1), ("{{1,2},{3,4}}", 0)])
        table("f_null_elem", "float8[]", "int", [("{1,2}", 1), ("{1,NULL}", 0)])
        table("f_varlen", "float8[]", "int", [("{1,2}", 1), ("{1,2,3}", 0), ("{1,2}", 0)])
        table("f_nan", "float8[]", "int", [("{1,2}", 1), ("{NaN,2}", 0)])
        table("f_inf", "float8[]", "int", [("{1,2}", 1), ("{1,Infinity}", 0)])
        table("f4_inf", "float4[]", "int", [("{1,2}", 1), ("{1,-Infinity}", 0)])
        table("l_point", "float8[]", "point", [("{1,2}", "(1,1)"), ("{2,3}", "(0,0)")])
        table("l_array", "float8[]", "int[]", [("{1,2}", "{1}"), ("{2,3}", "{0}")])
        table("l_one_class", "float8[]", "int", [("{1,2}", 1), ("{2,3}", 1), ("{2,4}", None)])
        table("l_three", "float8[]", "int", [("{1,2}", 1), ("{2,3}", 2), ("{3,4}", 3)])
        table("empty", "float8[]", "int", [])
        table("all_skipped", "float8[]", "int", [("{1,2}", None), (None, 1), ("{}", 0)])
        table("some_skipped", "float8[]", "int",
              [("{1,2}", 1), ("{2,1}", 0), ("{1,3}", None), (None, 1), ("{}", 0), ("{3,1}", 0)])
        table("l_text", "float8[]", "text", [("{1,2}", "a"), ("{2,1}", "b")])
        # Stored 'dog' first, although 'cat' sorts first; the first feature tells the label.
        table("l_text_order", "float8[]", "text",
              [(f"{{{(-1 if i % 2 == 0 else 1) * (1 + i / 40)},1}}", "dog" if i % 2 == 0 else "cat") for i in range(40)])
        c.execute("VACUUM ANALYZE t")
    return db


@pytest.fixture
def db_conn(tables):
    with connect(tables) as c:
        yield c


def expect_error(db_conn, exc, sql, params=None):
    """`sql` raises `exc`; the catalog is unchanged; the session still works."""
    before = catalog_counts(db_conn)
    with pytest.raises(exc) as info:
        db_conn.execute(sql, params)
    assert catalog_counts(db_conn) == before, "a failed call wrote to the catalog"
    assert scalar(db_conn, "SELECT 1") == 1
    return info.value


def expect_train_error(db_conn, exc, relation, model="svm", params=None):
    p = {"epochs": 1, "verbose": False}
    p.update(params or {})
    return expect_error(db_conn, exc, "SELECT corgipile_train(%s, %s, %s)", (relation, model, Jsonb(p)))


RELATIONS = [
    ("does_not_exist", E.UndefinedTable),
    ("public.does_not_exist", E.UndefinedTable),
    ("s", E.WrongObjectType),
    ("t_id", E.WrongObjectType),
    ("comp", E.WrongObjectType),  # a composite type has a pg_class row (relkind c)
]


@pytest.mark.parametrize("relation,exc", RELATIONS, ids=[r for r, _ in RELATIONS])
def test_relation_kinds(db_conn, relation, exc):
    expect_train_error(db_conn, exc, relation)
    expect_error(db_conn, exc, "SELECT * FROM corgipile_explain(%s, 'svm')", (relation,))


def test_a_view_trains_since_0_5_0(db_conn):
    # Views were a WrongObjectType before 0.5.0; now read through their table (test_views).
    model = db_conn.execute("SELECT corgipile_train('v', 'svm', %s)",
                            (Jsonb({"epochs": 1, "verbose": False}),)).fetchone()[0]
    assert db_conn.execute("SELECT rows_trained FROM corgipile.models WHERE id = %s", (model,)).fetchone()[0] == \
        db_conn.execute("SELECT count(*) FROM v").fetchone()[0]


def test_foreign_table(db_conn):
    require_extension(db_conn, "file_fdw")  # the fixture made ft when it is available
    expect_train_error(db_conn, E.WrongObjectType, "ft")


def test_materialized_view_partitioned_table_and_partition_are_accepted(db_conn):
    for rel in ("mv", "part", "part_1"):
        model_id = train(db_conn, rel, "svm", {"epochs": 1, "seed": 1})
        assert scalar(db_conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 1000


@pytest.mark.parametrize("model", ["svmm", "SVM", "", "linear_svm", "svm; DROP TABLE t"])
def test_unknown_model(db_conn, model):
    expect_train_error(db_conn, E.InvalidParameterValue, "t", model)
    assert scalar(db_conn, "SELECT count(*) FROM t") == 1000


@pytest.mark.parametrize("key", ["epoch", "learningrate", "Epochs", "lr", "", "features ", "seed\u0000x"])
def test_unknown_param_key(db_conn, key):
    if "\u0000" in key:
        # jsonb cannot hold \u0000: the cast itself fails, before corgipile is called.
        expect_error(db_conn, E.UntranslatableCharacter, "SELECT corgipile_train('t', 'svm', %s::text::jsonb)",
                     ('{"seed\\u0000x": 1}',))
        return
    err = expect_train_error(db_conn, E.InvalidParameterValue, "t", "svm", {key: 1})
    # The message lists the valid keys, so a typo never silently falls back to a default.
    assert "epochs" in (err.diag.message_hint or "") + (err.diag.message_primary or "")


@pytest.mark.parametrize("params", ["[1]", '"epochs"', "1", "null", "true", "[]", '[{"epochs": 1}]'])
def test_params_not_an_object(db_conn, params):
    expect_error(db_conn, E.InvalidParameterValue, "SELECT corgipile_train('t', 'svm', %s::jsonb)", (params,))


def test_null_params_is_null_result(db_conn):
    # STRICT: SQL NULL params give NULL, and write nothing.
    before = catalog_counts(db_conn)
    assert scalar(db_conn, "SELECT corgipile_train('t', 'svm', NULL)") is None
    assert catalog_counts(db_conn) == before


WRONG_TYPES = ["abc", [1], {"a": 1}, True, None]
NUMERIC = {  # param: (negative, zero valid?, too large)
    "epochs": (-1, False, 10**9),
    "learning_rate": (-0.5, False, 1e300),
    "decay": (-0.5, False, 1.5),
    "l2": (-1, True, 1e300),
    "batch_size": (-3, False, 10**9),
    "tolerance": (-1e-9, True, None),
    "seed": (-1, True, 2**63),
}


def param_cases():
    cases = []
    for key, (neg, zero_ok, large) in NUMERIC.items():
        for v in WRONG_TYPES + ["NaN", "Infinity", "-Infinity", "1"]:
            if key == "seed" and v is None:
                continue  # null = random seed, documented
            cases.append((key, v))
        cases.append((key, neg))
        if not zero_ok:
            cases.append((key, 0))
        if large is not None:
            cases.append((key, large))
        if key in ("epochs", "batch_size", "seed"):
            cases.append((key, 1.5))
            cases.append((key, 1e300))
    for key in ("features", "label"):
        cases += [(key, v) for v in (1, None, True, [], {}, "")]
    cases += [("shuffle", v) for v in (1, None, True, "random", "", "CORGIPILE", ["corgipile"])]
    for key in ("block_size", "buffer_size"):
        cases += [(key, v) for v in (True, None, [], {}, -1, 0, "0MB", "-1MB", "NaN", "NaN%", "Infinity",
                                     "10XB", "MB", "1e3MB", "-5%", 1e300, "%")]
    cases += [("buffer_size", v) for v in ("0%", "101%", "1e400%")]
    cases.append(("block_size", 2**40))
    for key in ("double_buffer", "verbose"):
        cases += [(key, v) for v in ("true", "false", 1, 0, None, [], {})]
    return cases


@pytest.mark.parametrize("key,value", param_cases(), ids=lambda x: repr(x)[:20])
def test_bad_param_value(db_conn, key, value):
    err = expect_train_error(db_conn, E.InvalidParameterValue, "t", "svm", {key: value})
    assert key in err.diag.message_primary


@pytest.mark.parametrize("params", ['{"epochs": 1e400}', '{"learning_rate": 1e309}', '{"seed": -1e400}',
                                    '{"unknown": {"a": 1.7976931348623157e308}}'])
def test_param_number_beyond_float8_range(db_conn, params):
    expect_error(db_conn, E.InvalidParameterValue, "SELECT corgipile_train('t', 'svm', %s::jsonb)", (params,))


def test_absurd_sizes_refused(db_conn):
    # 10^9 epochs is refused up front (the documented maximum is 1,000,000; a long training at the
    # maximum is cancellable, see test_cancel.py).
    expect_train_error(db_conn, E.InvalidParameterValue, "t", "svm", {"epochs": 10**9})
    for size in ("1TB", 2**40):
        expect_train_error(db_conn, E.ProgramLimitExceeded, "t", "svm", {"buffer_size": size})
    expect_train_error(db_conn, E.ProgramLimitExceeded, "t", "svm", {"buffer_size": "1TB", "double_buffer": False})


def test_valid_boundaries_accepted(db_conn):
    # The documented edges of every range train fine (so the refusals above are not blanket ones).
    for params in ({"epochs": 1, "learning_rate": 1e6, "decay": 1, "l2": 0, "tolerance": 0, "seed": 0},
                   {"epochs": 1, "seed": 2**63 - 1, "batch_size": 1_000_000, "l2": 1e6},
                   {"epochs": 1, "block_size": "1TB", "buffer_size": "1B", "seed": None},
                   {"epochs": 1, "buffer_size": "100%", "block_size": 1, "shuffle": "block_only"}):
        # Every one trains: the hinge loss's steps are bounded (|step| <= learning_rate x |x| per
        # row, features in [0, 1)), so even learning_rate 1e6 cannot overflow on this table.
        model_id = train(db_conn, "t", "svm", params)
        assert scalar(db_conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 1000, params
        stored = scalar(db_conn, "SELECT params FROM corgipile.models WHERE id = %s", (model_id,))
        for key, value in params.items():
            if key in ("learning_rate", "decay", "l2", "tolerance", "batch_size", "shuffle") or (key == "seed" and value is not None):
                assert stored[key] == value, (key, value, stored)


def test_integer_array_features_are_accepted(db_conn):
    model_id = scalar(db_conn, "SELECT corgipile_train('f_int', 'svm', '{\"epochs\": 1, \"verbose\": false}')")
    assert scalar(db_conn, "SELECT n_features FROM corgipile.models WHERE id = %s", (model_id,)) == 2


# psycopg.DataError = any SQLSTATE of class 22 (data exception: 22000, 2202E array subscript, ...).
DATA_CASES = [
    ("no_features", E.UndefinedColumn),
    ("f_text", E.DatatypeMismatch),
    ("f_scalar", E.DatatypeMismatch),
    ("f_2d", psycopg.DataError),
    ("f_null_elem", psycopg.DataError),
    ("f_varlen", psycopg.DataError),
    ("f_nan", psycopg.DataError),
    ("f_inf", psycopg.DataError),
    ("f4_inf", psycopg.DataError),
    ("l_point", E.DatatypeMismatch),
    ("l_array", E.DatatypeMismatch),
    ("l_one_class", psycopg.DataError),
    ("l_three", psycopg.DataError),
    ("empty", (E.NoDataFound, psycopg.DataError)),  # NoDataFound (P0002) today; a class-22 error is fine too
    ("all_skipped", psycopg.DataError),
]


@pytest.mark.parametrize("double_buffer", [True, False])
@pytest.mark.parametrize("table,exc", DATA_CASES, ids=[t for t, _ in DATA_CASES])
def test_bad_data(db_conn, table, exc, double_buffer):
    for model in ("svm", "logistic"):
        try:
            expect_train_error(db_conn, exc, table, model, {"double_buffer": double_buffer, "epochs": 2})
        except AssertionError:
            raise
        except psycopg.Error as e:  # wrong class: report the class seen
            pytest.fail(f"{table}/{model}: expected {exc}, got {type(e).__name__} ({e.sqlstate}): {e}")


def test_empty_table_error_class(db_conn):
    # An empty table is reported as "no data" (SQLSTATE class 02/P0002 or 22): a DataException or a
    # NoDataFound, never an internal error.
    err = expect_train_error(db_conn, psycopg.Error, "empty")
    assert isinstance(err, (E.NoDataFound, psycopg.DataError)), type(err)


def test_ctid_named_in_row_errors(db_conn):
    err = expect_train_error(db_conn, psycopg.DataError, "f_nan")
    assert "(0,2)" in err.diag.message_primary


def test_null_label_and_features_skipped_and_counted(db_conn):
    for db_ in (True, False):
        model_id = train(db_conn, "some_skipped", "svm", {"epochs": 3, "seed": 1, "double_buffer": db_})
        trained, skipped = db_conn.execute(
            "SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()
        assert (trained, skipped) == (3, 3)
        tuples = [r[0] for r in db_conn.execute(
            "SELECT tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (model_id,))]
        assert tuples == [3, 3, 3]


def test_text_label(db_conn):
    """docs/reference.md (Models, docs/training.md): svm/logistic take any label column with
    exactly two distinct values, 'cat'/'dog' included, and the negative class of a text label is
    the first value read (label_mapping->'classes' is [negative, positive]); softmax takes text;
    predictions come back as the table's own labels through corgipile_predict_class."""
    for model in ("logistic", "svm", "softmax"):
        model_id = train(db_conn, "l_text", model, {"epochs": 1, "seed": 1})
        n_features, classes = db_conn.execute("""SELECT n_features, label_mapping->'classes' FROM corgipile.models
                                             WHERE id = %s""", (model_id,)).fetchone()
        assert n_features == 2, model
        assert sorted(classes) == ["a", "b"], (model, classes)
        predicted = [r[0] for r in db_conn.execute("SELECT corgipile_predict_class(%s, features) FROM l_text ORDER BY id",
                                                (model_id,))]
        assert set(predicted) <= {"a", "b"} and len(predicted) == 2, (model, predicted)
    # In storage order ("no_shuffle") the first value read is the first row's, 'dog': the
    # negative class, although 'cat' is the smaller value; a positive decision value is 'cat'.
    for model in ("logistic", "svm"):
        model_id = train(db_conn, "l_text_order", model, {"epochs": 5, "seed": 1, "shuffle": "no_shuffle"})
        classes = scalar(db_conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (model_id,))
        assert classes == ["dog", "cat"], (model, classes)
        rows = db_conn.execute("""SELECT label, corgipile_decision_function(%s, features),
                                         corgipile_predict_class(%s, features) FROM l_text_order ORDER BY id""",
                               (model_id, model_id)).fetchall()
        assert all(cls == ("cat" if d > 0 else "dog") for _, d, cls in rows), (model, rows)
        assert all(cls == label for label, _, cls in rows), (model, rows)


@pytest.mark.parametrize("label", ['label"; DROP TABLE t; --', "label'); DROP TABLE t; --", "t.label", "LABEL"])
def test_names_are_identifiers(db_conn, label):
    expect_train_error(db_conn, E.UndefinedColumn, "t", "svm", {"label": label})
    expect_train_error(db_conn, E.UndefinedColumn, "t", "svm", {"features": label})
    assert scalar(db_conn, "SELECT count(*) FROM t") == 1000


@pytest.fixture(scope="module")
def model(tables):
    with connect(tables) as c:
        return train(c, "t", "svm", {"epochs": 1, "seed": 5})


def test_predict_bad_input(db_conn, model):
    assert scalar(db_conn, "SELECT corgipile_predict(%s, NULL::float8[])", (model,)) is None
    assert scalar(db_conn, "SELECT corgipile_predict(NULL, ARRAY[1,2,3,4]::float8[])") is None
    ok = scalar(db_conn, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model,))
    assert ok in (0.0, 1.0)
    for arr, exc in [("ARRAY[1,2]::float8[]", psycopg.DataError),
                     ("ARRAY[1,2,3,4,5]::float8[]", psycopg.DataError),
                     ("'{}'::float8[]", psycopg.DataError),
                     ("ARRAY[1,NULL,3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[1,'NaN',3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[1,'-Infinity',3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[[1,2],[3,4]]::float8[]", psycopg.DataError),
                     ("ARRAY[[1,2,3,4]]::float8[]", psycopg.DataError)]:
        expect_error(db_conn, exc, f"SELECT corgipile_predict(%s, {arr})", (model,))
    for bad_id in (0, -1, 2**63 - 1, model + 1_000_000):
        expect_error(db_conn, E.UndefinedObject, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (bad_id,))


def test_predict_deleted_model(db_conn, tables):
    model_id = train(db_conn, "t", "svm", {"epochs": 1, "seed": 5})
    assert scalar(db_conn, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model_id,)) is not None
    db_conn.execute("DELETE FROM corgipile.models WHERE id = %s", (model_id,))
    assert scalar(db_conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (model_id,)) == 0
    expect_error(db_conn, E.UndefinedObject, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model_id,))


@pytest.mark.parametrize("call", [
    "SELECT corgipile_train(%s::oid::regclass, 'svm', '{\"epochs\": 1}')",
    "SELECT corgipile_explain(%s::oid::regclass, 'svm', '{\"epochs\": 1}')",
    "SELECT count(*) FROM corgipile_trace(%s::oid::regclass, '{}')",
])
@pytest.mark.parametrize("oid", [0, 4294967295])
def test_an_oid_that_names_no_relation_is_undefined_table(db_conn, call, oid):
    # Not an internal error (XX000) from opening the relation.
    err = expect_error(db_conn, E.UndefinedTable, call, (oid,))
    assert f"relation with OID {oid} does not exist" in err.diag.message_primary


def test_huge_params_document_is_refused_before_it_is_parsed(db_conn):
    # 4 MB of JSON numbers would be ~100 MB as parsed values: refused by size (54000), and a
    # document just under the limit is read (its unknown key is the error).
    big = "[" + ",".join(["0"] * 2_000_000) + "]"
    err = expect_error(db_conn, E.ProgramLimitExceeded,
                       "SELECT corgipile_train('t', 'svm', jsonb_build_object('x', %s::jsonb))", (big,))
    assert "at most 1048576" in err.diag.message_primary
    small = "[" + ",".join(["0"] * 100_000) + "]"
    err = expect_error(db_conn, E.InvalidParameterValue,
                       "SELECT corgipile_train('t', 'svm', jsonb_build_object('x', %s::jsonb))", (small,))
    assert '"x"' in err.diag.message_primary


@pytest.mark.parametrize("ltype", ["bigint", "numeric"])
@pytest.mark.parametrize("model", ["svm", "softmax"])
def test_classifier_labels_beyond_2_53_are_refused_not_merged(db_conn, ltype, model):
    # 2^53 and 2^53 + 1 are one float8: as classes they would silently become one.
    db_conn.execute(f"DROP TABLE IF EXISTS l_big; CREATE TABLE l_big (features float8[], label {ltype})")
    db_conn.execute("""INSERT INTO l_big SELECT ARRAY[random(), random()], 9007199254740992 + (i % 2)
                    FROM generate_series(1, 200) i""")
    err = expect_train_error(db_conn, E.NumericValueOutOfRange, "l_big", model)
    assert "2^53" in err.diag.message_primary
    # Below 2^53 every integer is its own float8: the same labels shifted down train.
    db_conn.execute("UPDATE l_big SET label = label - 2")
    model_id = train(db_conn, "l_big", model, {"epochs": 1, "verbose": False})
    classes = scalar(db_conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (model_id,))
    assert sorted(float(c) for c in classes) == [9007199254740990.0, 9007199254740991.0], classes
    # A regression label is a value, not a class: large values are fine.
    db_conn.execute("UPDATE l_big SET label = label + 1e6")
    assert train(db_conn, "l_big", "linear", {"epochs": 1, "verbose": False}) is not None
    db_conn.execute("DROP TABLE l_big")


def test_evaluate_on_no_rows_reports_null_metrics_not_zero(db_conn):
    model_id = train(db_conn, "t", "svm", {"epochs": 1, "verbose": False})
    report = scalar(db_conn, "SELECT corgipile_evaluate(%s, 'empty')", (model_id,))
    assert report["rows_scored"] == 0
    assert report["accuracy"] is None, report
    assert report["note"] == "no rows to score"
    full = scalar(db_conn, "SELECT corgipile_evaluate(%s, 't')", (model_id,))
    assert full["rows_scored"] == 1000 and 0 <= full["accuracy"] <= 1


# =============================================================================================
# Up-front errors and hints, in the shared database (roles_env: hard_alice, hard_bob)

@pytest.fixture(scope="module")
def big(roles_env):
    """1,000,000 rows x 8 dense features (plus a 2-element sparse pair): a training of it runs
    for seconds, so an error raised after reading it cannot be fast."""
    with connect(roles_env) as roles_admin:
        points(roles_admin, "hard_big", BIG_ROWS, features=uniform(8, signal=1),
               extra=["ARRAY[1, 3]::int4[] AS idx", "ARRAY[random() + (i % 2), random()] AS val"])
        roles_admin.execute(f"GRANT SELECT ON hard_big TO {ALICE}, {BOB}")
    return roles_env


# =============================================================================================
# Up-front errors

@pytest.mark.parametrize("how", ["BEGIN READ ONLY", "default_transaction_read_only"])
def test_train_in_read_only_transaction_fails_fast(big, roles_admin, how):
    before = models_count(roles_admin)
    with connect(big, ALICE) as c:
        c.execute("SET statement_timeout = '10s'")
        if how == "BEGIN READ ONLY":
            c.execute("BEGIN READ ONLY")
        else:
            c.execute("SET default_transaction_read_only = on")
        e, elapsed = timed(train_error, c, "hard_big", "svm", {"epochs": BIG_EPOCHS, "seed": 1})
        if how == "BEGIN READ ONLY":
            c.execute("ROLLBACK")
    assert isinstance(e, E.ReadOnlySqlTransaction), describe(e)
    assert elapsed < 1.0, f"read-only refusal after {elapsed:.2f} s"
    assert models_count(roles_admin) == before


def test_drop_and_deploy_in_read_only_transaction(roles_env, roles_admin):
    with connect(roles_env, ALICE) as alice:
        v1 = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_ro"})
        v2 = train(alice, "hard_small", "svm", {"epochs": 1, "seed": 2, "name": "hard_ro"})
        calls = [("SELECT corgipile_drop_model(%s::bigint)", (v1,)),
                 ("SELECT corgipile_drop_model(%s::text)", ("hard_ro",)),
                 ("SELECT corgipile_deploy(%s, %s)", ("hard_ro", v1)),
                 ("SELECT corgipile_deploy(%s)", ("hard_ro",))]
        bad = {}
        for q, p in calls:
            alice.execute("BEGIN READ ONLY")
            e = error_of(alice, q, p)
            alice.execute("ROLLBACK")
            if not isinstance(e, E.ReadOnlySqlTransaction):
                bad[q % tuple(map(repr, p))] = describe(e)
        alice.execute("SET default_transaction_read_only = on")
        for q, p in calls:
            e = error_of(alice, q, p)
            if not isinstance(e, E.ReadOnlySqlTransaction):
                bad["default_transaction_read_only: " + q % tuple(map(repr, p))] = describe(e)
        assert not bad, f"expected 25006: {bad}"
    assert roles_admin.execute("SELECT id, pinned FROM corgipile.models WHERE id IN (%s, %s) ORDER BY id",
                         (v1, v2)).fetchall() == [(v1, False), (v2, False)]


def test_name_held_by_uncommitted_training(big, roles_admin):
    with connect(big, ALICE) as s1, connect(big, ALICE) as s2, connect(big, BOB) as bob:
        s2.execute("SET statement_timeout = '10s'")
        bob.execute("SET statement_timeout = '5s'")
        s1.execute("BEGIN")
        first = train(s1, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
        try:
            before = models_count(roles_admin)
            e, elapsed = timed(train_error, s2, "hard_big", "svm",
                               {"epochs": BIG_EPOCHS, "seed": 1, "name": "hard_held"})
            assert isinstance(e, E.LockNotAvailable), describe(e)
            assert elapsed < 1.0, f"55P03 after {elapsed:.2f} s"
            assert models_count(roles_admin) == before
            # Names are per role: Bob's hard_held is not held.
            bobs = train(bob, "hard_small", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
            assert scalar(bob, "SELECT version FROM corgipile.models WHERE id = %s", (bobs,)) == 1
        finally:
            s1.execute("COMMIT")
        assert scalar(roles_admin, "SELECT version FROM corgipile.models WHERE id = %s", (first,)) == 1
        retry = train(s2, "hard_big", "svm", {"epochs": 1, "seed": 1, "name": "hard_held"})
        assert scalar(s2, "SELECT version FROM corgipile.models WHERE id = %s", (retry,)) == 2
    assert roles_admin.execute("""SELECT trained_by, version FROM corgipile.models WHERE name = 'hard_held'
                            ORDER BY trained_by, version""").fetchall() == [(ALICE, 1), (ALICE, 2), (BOB, 1)]


# =============================================================================================
# Hints

@pytest.fixture(scope="module")
def hint_tables(roles_env):
    with connect(roles_env) as roles_admin:
        bad_label(roles_admin, "hard_nan")
        raw_scale(roles_admin, "hard_div")
    return roles_env


@pytest.mark.parametrize("model", ["svm", "linear"])
def test_nan_label_hint_does_not_mention_views(hint_tables, roles_admin, model):
    before = models_count(roles_admin)
    e = train_error(roles_admin, "hard_nan", model, {"epochs": 1, "seed": 1})
    assert e is not None and e.sqlstate is not None and e.sqlstate.startswith("22"), describe(e)
    hint = (e.diag.message_hint or "").lower()
    assert "view" not in hint and "where clause" not in hint, describe(e)
    assert models_count(roles_admin) == before


def test_diverging_normalized_training_hint(hint_tables, roles_admin):
    before = models_count(roles_admin)
    e = train_error(roles_admin, "hard_div", "linear",
                    {"epochs": 5, "seed": 1, "normalize": True, "learning_rate": 1e5,
                     "learning_rate_schedule": "constant"})
    assert isinstance(e, E.NumericValueOutOfRange), describe(e)
    hint = e.diag.message_hint or ""
    assert '"normalize": true' not in hint, describe(e)
    assert models_count(roles_admin) == before


def test_trace_of_a_text_label_says_why(tables):
    """corgipile_trace returns labels as float8: a text label is refused with a hint about the
    trace itself, not about linear regression (found while checking the docs, #37)."""
    with connect(tables) as c:
        c.execute("CREATE TABLE trace_text AS SELECT i AS id, ARRAY[i::float8] AS features, "
                  "(ARRAY['a', 'b'])[1 + i % 2] AS label FROM generate_series(1, 100) i")
        e = error_of(c, "SELECT count(*) FROM corgipile_trace('trace_text')")
        assert isinstance(e, E.DatatypeMismatch), describe(e)
        assert "corgipile_trace" in (e.diag.message_hint or "") and "regression" not in (e.diag.message_hint or "")
        assert scalar(c, "SELECT count(*) FROM corgipile_trace('trace_text', '{\"label\": \"id\"}')") == 100


def test_category_dictionaries_over_model_memory_name_the_limit(tables):
    """When the kept categories use up corgipile.max_model_memory, the ERROR names the limit as
    set (4MB), not what the dictionaries left of it ("0 bytes"; found while checking the docs)."""
    with connect(tables) as c:
        c.execute("CREATE TABLE many_categories AS SELECT i AS id, 'category number ' || i AS cat, "
                  "(i % 2 = 0) AS label FROM generate_series(1, 30000) i")
        c.execute("SET corgipile.max_model_memory = '4MB'")
        before = models_count(c)
        e = train_error(c, "many_categories", "logistic",
                        {"features": ["cat"], "max_categories": 65536, "epochs": 1, "seed": 1})
        assert isinstance(e, E.ProgramLimitExceeded), describe(e)
        msg = e.diag.message_primary or ""
        assert "corgipile.max_model_memory (4096 kB)" in msg or "corgipile.max_model_memory (4 MB)" in msg, msg
        assert "category dictionaries" in msg and "0 bytes" not in msg, msg
        assert "max_categories" in (e.diag.message_hint or ""), describe(e)
        assert models_count(c) == before


# =============================================================================================
# Last (pytest runs tests in file order)

def test_no_crash_during_module(tables):
    # Checked last in this file (pytest runs tests in file order): no backend died on any of the above.
    with connect(tables) as c:
        assert scalar(c, "SELECT 1") == 1
    assert server_crashes() == CRASHES_AT_START["n"], "a backend died (see the server log)"
