"""Bad input never crashes the server: every case is a clear ERROR with the right SQLSTATE class,
nothing is written to the catalog, and the next statement of the same session works."""

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from conftest import require_extension
from reliability_helpers import (catalog_counts, connect, database_fixture, scalar, server_crashes,
                                 train)

db = database_fixture("inputs")


CRASHES_AT_START = {}


@pytest.fixture(scope="module")
def tables(db):
    CRASHES_AT_START["n"] = server_crashes()
    with connect(db) as c:
        c.execute("""CREATE TABLE t AS SELECT i AS id, ARRAY[random(), random(), random(), random()] AS features,
                     (i % 2) AS label FROM generate_series(1, 1000) i""")
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
        c.execute("VACUUM ANALYZE t")
    return db


@pytest.fixture
def conn(tables):
    with connect(tables) as c:
        yield c


def expect_error(conn, exc, sql, params=None):
    """`sql` raises `exc`; the catalog is unchanged; the session still works."""
    before = catalog_counts(conn)
    with pytest.raises(exc) as info:
        conn.execute(sql, params)
    assert catalog_counts(conn) == before, "a failed call wrote to the catalog"
    assert scalar(conn, "SELECT 1") == 1
    return info.value


def expect_train_error(conn, exc, relation, model="svm", params=None):
    p = {"epochs": 1, "verbose": False}
    p.update(params or {})
    return expect_error(conn, exc, "SELECT corgipile_train(%s, %s, %s)", (relation, model, Jsonb(p)))


RELATIONS = [
    ("does_not_exist", E.UndefinedTable),
    ("public.does_not_exist", E.UndefinedTable),
    ("v", E.WrongObjectType),
    ("s", E.WrongObjectType),
    ("t_id", E.WrongObjectType),
    ("comp", E.WrongObjectType),  # a composite type has a pg_class row (relkind c)
]


@pytest.mark.parametrize("relation,exc", RELATIONS, ids=[r for r, _ in RELATIONS])
def test_relation_kinds(conn, relation, exc):
    expect_train_error(conn, exc, relation)
    expect_error(conn, exc, "SELECT * FROM corgipile_explain(%s, 'svm')", (relation,))


def test_foreign_table(conn):
    require_extension(conn, "file_fdw")  # the fixture made ft when it is available
    expect_train_error(conn, E.WrongObjectType, "ft")


def test_materialized_view_partitioned_table_and_partition_are_accepted(conn):
    for rel in ("mv", "part", "part_1"):
        model_id = train(conn, rel, "svm", {"epochs": 1, "seed": 1})
        assert scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 1000


@pytest.mark.parametrize("model", ["svmm", "SVM", "", "linear_svm", "svm; DROP TABLE t"])
def test_unknown_model(conn, model):
    expect_train_error(conn, E.InvalidParameterValue, "t", model)
    assert scalar(conn, "SELECT count(*) FROM t") == 1000


@pytest.mark.parametrize("key", ["epoch", "learningrate", "Epochs", "lr", "", "features ", "seed\u0000x"])
def test_unknown_param_key(conn, key):
    if "\u0000" in key:
        # jsonb cannot hold \u0000: the cast itself fails, before corgipile is called.
        expect_error(conn, E.UntranslatableCharacter, "SELECT corgipile_train('t', 'svm', %s::text::jsonb)",
                     ('{"seed\\u0000x": 1}',))
        return
    err = expect_train_error(conn, E.InvalidParameterValue, "t", "svm", {key: 1})
    # The message lists the valid keys, so a typo never silently falls back to a default.
    assert "epochs" in (err.diag.message_hint or "") + (err.diag.message_primary or "")


@pytest.mark.parametrize("params", ["[1]", '"epochs"', "1", "null", "true", "[]", '[{"epochs": 1}]'])
def test_params_not_an_object(conn, params):
    expect_error(conn, E.InvalidParameterValue, "SELECT corgipile_train('t', 'svm', %s::jsonb)", (params,))


def test_null_params_is_null_result(conn):
    # STRICT: SQL NULL params give NULL, and write nothing.
    before = catalog_counts(conn)
    assert scalar(conn, "SELECT corgipile_train('t', 'svm', NULL)") is None
    assert catalog_counts(conn) == before


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
def test_bad_param_value(conn, key, value):
    err = expect_train_error(conn, E.InvalidParameterValue, "t", "svm", {key: value})
    assert key in err.diag.message_primary


@pytest.mark.parametrize("params", ['{"epochs": 1e400}', '{"learning_rate": 1e309}', '{"seed": -1e400}',
                                    '{"unknown": {"a": 1.7976931348623157e308}}'])
def test_param_number_beyond_float8_range(conn, params):
    expect_error(conn, E.InvalidParameterValue, "SELECT corgipile_train('t', 'svm', %s::jsonb)", (params,))


def test_absurd_sizes_refused(conn):
    # 10^9 epochs is refused up front (the documented maximum is 1,000,000; a long training at the
    # maximum is cancellable, see test_reliability_interrupt.py).
    expect_train_error(conn, E.InvalidParameterValue, "t", "svm", {"epochs": 10**9})
    for size in ("1TB", 2**40):
        expect_train_error(conn, E.ProgramLimitExceeded, "t", "svm", {"buffer_size": size})
    expect_train_error(conn, E.ProgramLimitExceeded, "t", "svm", {"buffer_size": "1TB", "double_buffer": False})


def test_valid_boundaries_accepted(conn):
    # The documented edges of every range train fine (so the refusals above are not blanket ones).
    for params in ({"epochs": 1, "learning_rate": 1e6, "decay": 1, "l2": 0, "tolerance": 0, "seed": 0},
                   {"epochs": 1, "seed": 2**63 - 1, "batch_size": 1_000_000, "l2": 1e6},
                   {"epochs": 1, "block_size": "1TB", "buffer_size": "1B", "seed": None},
                   {"epochs": 1, "buffer_size": "100%", "block_size": 1, "shuffle": "block_only"}):
        # Every one trains: the hinge loss's steps are bounded (|step| <= learning_rate x |x| per
        # row, features in [0, 1)), so even learning_rate 1e6 cannot overflow on this table.
        model_id = train(conn, "t", "svm", params)
        assert scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 1000, params
        stored = scalar(conn, "SELECT params FROM corgipile.models WHERE id = %s", (model_id,))
        for key, value in params.items():
            if key in ("learning_rate", "decay", "l2", "tolerance", "batch_size", "shuffle") or (key == "seed" and value is not None):
                assert stored[key] == value, (key, value, stored)


def test_integer_array_features_are_accepted(conn):
    model_id = scalar(conn, "SELECT corgipile_train('f_int', 'svm', '{\"epochs\": 1, \"verbose\": false}')")
    assert scalar(conn, "SELECT n_features FROM corgipile.models WHERE id = %s", (model_id,)) == 2


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
def test_bad_data(conn, table, exc, double_buffer):
    for model in ("svm", "logistic"):
        try:
            expect_train_error(conn, exc, table, model, {"double_buffer": double_buffer, "epochs": 2})
        except AssertionError:
            raise
        except psycopg.Error as e:  # wrong class: report the class seen
            pytest.fail(f"{table}/{model}: expected {exc}, got {type(e).__name__} ({e.sqlstate}): {e}")


def test_empty_table_error_class(conn):
    # An empty table is reported as "no data" (SQLSTATE class 02/P0002 or 22): a DataException or a
    # NoDataFound, never an internal error.
    err = expect_train_error(conn, psycopg.Error, "empty")
    assert isinstance(err, (E.NoDataFound, psycopg.DataError)), type(err)


def test_ctid_named_in_row_errors(conn):
    err = expect_train_error(conn, psycopg.DataError, "f_nan")
    assert "(0,2)" in err.diag.message_primary


def test_null_label_and_features_skipped_and_counted(conn):
    for db_ in (True, False):
        model_id = train(conn, "some_skipped", "svm", {"epochs": 3, "seed": 1, "double_buffer": db_})
        trained, skipped = conn.execute(
            "SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()
        assert (trained, skipped) == (3, 3)
        tuples = [r[0] for r in conn.execute(
            "SELECT tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (model_id,))]
        assert tuples == [3, 3, 3]


def test_text_label(conn):
    """README (Training): svm/logistic take any label column with exactly two distinct values,
    'cat'/'dog' included (the negative class of text labels is the first one read), softmax takes
    text; predictions come back as the table's own labels through corgipile_predict_class."""
    for model in ("logistic", "svm", "softmax"):
        model_id = train(conn, "l_text", model, {"epochs": 1, "seed": 1})
        n_features, classes = conn.execute("""SELECT n_features, label_mapping->'classes' FROM corgipile.models
                                             WHERE id = %s""", (model_id,)).fetchone()
        assert n_features == 2, model
        assert sorted(classes) == ["a", "b"], (model, classes)
        predicted = [r[0] for r in conn.execute("SELECT corgipile_predict_class(%s, features) FROM l_text ORDER BY id",
                                                (model_id,))]
        assert set(predicted) <= {"a", "b"} and len(predicted) == 2, (model, predicted)


@pytest.mark.parametrize("label", ['label"; DROP TABLE t; --', "label'); DROP TABLE t; --", "t.label", "LABEL"])
def test_names_are_identifiers(conn, label):
    expect_train_error(conn, E.UndefinedColumn, "t", "svm", {"label": label})
    expect_train_error(conn, E.UndefinedColumn, "t", "svm", {"features": label})
    assert scalar(conn, "SELECT count(*) FROM t") == 1000


@pytest.fixture(scope="module")
def model(tables):
    with connect(tables) as c:
        return train(c, "t", "svm", {"epochs": 1, "seed": 5})


def test_predict_bad_input(conn, model):
    assert scalar(conn, "SELECT corgipile_predict(%s, NULL::float8[])", (model,)) is None
    assert scalar(conn, "SELECT corgipile_predict(NULL, ARRAY[1,2,3,4]::float8[])") is None
    ok = scalar(conn, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model,))
    assert ok in (0.0, 1.0)
    for arr, exc in [("ARRAY[1,2]::float8[]", psycopg.DataError),
                     ("ARRAY[1,2,3,4,5]::float8[]", psycopg.DataError),
                     ("'{}'::float8[]", psycopg.DataError),
                     ("ARRAY[1,NULL,3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[1,'NaN',3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[1,'-Infinity',3,4]::float8[]", psycopg.DataError),
                     ("ARRAY[[1,2],[3,4]]::float8[]", psycopg.DataError),
                     ("ARRAY[[1,2,3,4]]::float8[]", psycopg.DataError)]:
        expect_error(conn, exc, f"SELECT corgipile_predict(%s, {arr})", (model,))
    for bad_id in (0, -1, 2**63 - 1, model + 1_000_000):
        expect_error(conn, E.UndefinedObject, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (bad_id,))


def test_predict_deleted_model(conn, tables):
    model_id = train(conn, "t", "svm", {"epochs": 1, "seed": 5})
    assert scalar(conn, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model_id,)) is not None
    conn.execute("DELETE FROM corgipile.models WHERE id = %s", (model_id,))
    assert scalar(conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (model_id,)) == 0
    expect_error(conn, E.UndefinedObject, "SELECT corgipile_predict(%s, ARRAY[1,2,3,4]::float8[])", (model_id,))


@pytest.mark.parametrize("call", [
    "SELECT corgipile_train(%s::oid::regclass, 'svm', '{\"epochs\": 1}')",
    "SELECT corgipile_explain(%s::oid::regclass, 'svm', '{\"epochs\": 1}')",
    "SELECT count(*) FROM corgipile_trace(%s::oid::regclass, '{}')",
])
@pytest.mark.parametrize("oid", [0, 4294967295])
def test_an_oid_that_names_no_relation_is_undefined_table(conn, call, oid):
    # Not an internal error (XX000) from opening the relation.
    err = expect_error(conn, E.UndefinedTable, call, (oid,))
    assert f"relation with OID {oid} does not exist" in err.diag.message_primary


def test_huge_params_document_is_refused_before_it_is_parsed(conn):
    # 4 MB of JSON numbers would be ~100 MB as parsed values: refused by size (54000), and a
    # document just under the limit is read (its unknown key is the error).
    big = "[" + ",".join(["0"] * 2_000_000) + "]"
    err = expect_error(conn, E.ProgramLimitExceeded,
                       "SELECT corgipile_train('t', 'svm', jsonb_build_object('x', %s::jsonb))", (big,))
    assert "at most 1048576" in err.diag.message_primary
    small = "[" + ",".join(["0"] * 100_000) + "]"
    err = expect_error(conn, E.InvalidParameterValue,
                       "SELECT corgipile_train('t', 'svm', jsonb_build_object('x', %s::jsonb))", (small,))
    assert '"x"' in err.diag.message_primary


@pytest.mark.parametrize("ltype", ["bigint", "numeric"])
@pytest.mark.parametrize("model", ["svm", "softmax"])
def test_classifier_labels_beyond_2_53_are_refused_not_merged(conn, ltype, model):
    # 2^53 and 2^53 + 1 are one float8: as classes they would silently become one.
    conn.execute(f"DROP TABLE IF EXISTS l_big; CREATE TABLE l_big (features float8[], label {ltype})")
    conn.execute("""INSERT INTO l_big SELECT ARRAY[random(), random()], 9007199254740992 + (i % 2)
                    FROM generate_series(1, 200) i""")
    err = expect_train_error(conn, E.NumericValueOutOfRange, "l_big", model)
    assert "2^53" in err.diag.message_primary
    # Below 2^53 every integer is its own float8: the same labels shifted down train.
    conn.execute("UPDATE l_big SET label = label - 2")
    model_id = train(conn, "l_big", model, {"epochs": 1, "verbose": False})
    classes = scalar(conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (model_id,))
    assert sorted(float(c) for c in classes) == [9007199254740990.0, 9007199254740991.0], classes
    # A regression label is a value, not a class: large values are fine.
    conn.execute("UPDATE l_big SET label = label + 1e6")
    assert train(conn, "l_big", "linear", {"epochs": 1, "verbose": False}) is not None
    conn.execute("DROP TABLE l_big")


def test_evaluate_on_no_rows_reports_null_metrics_not_zero(conn):
    model_id = train(conn, "t", "svm", {"epochs": 1, "verbose": False})
    report = scalar(conn, "SELECT corgipile_evaluate(%s, 'empty')", (model_id,))
    assert report["rows_scored"] == 0
    assert report["accuracy"] is None, report
    assert report["note"] == "no rows to score"
    full = scalar(conn, "SELECT corgipile_evaluate(%s, 't')", (model_id,))
    assert full["rows_scored"] == 1000 and 0 <= full["accuracy"] <= 1


def test_no_crash_during_module(tables):
    # Checked last in this file (pytest runs tests in file order): no backend died on any of the above.
    with connect(tables) as c:
        assert scalar(c, "SELECT 1") == 1
    assert server_crashes() == CRASHES_AT_START["n"], "a backend died (see the server log)"
