"""ALTER EXTENSION corgipile UPDATE from the previous releases (whose install scripts are frozen
in sql/released/): old models keep predicting, and the upgraded database has exactly the objects
of a fresh install of the current version.

Models written by the released versions themselves (tests/fixtures/golden/<version>/, made by
scripts/make_golden_fixtures.sh with each release's own library; see the README there) are loaded
into a database created at that version and must predict exactly what that version predicted,
before and after the update."""

import csv
import io
import json
import struct

import psycopg
import pytest

from helpers import REPO, scalar
from tables import three_classes

OLD, FRESH = "corgipile_upgrade_old", "corgipile_upgrade_fresh"
CURRENT = "0.5.0"

# Columns corgipile.models had in 0.1.0: what a 0.1.0 training wrote.
COLUMNS_0_1_0 = ["model_type", "relation", "label_column", "features", "n_features", "n_outputs", "label_mapping",
                 "weights", "bias", "standardizer", "params", "metrics", "rows_trained", "rows_skipped",
                 "training_seconds", "created_at", "trained_by"]


def recreate(db):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db}")


def drop(db):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.fixture(scope="module")
def databases():
    """OLD: created at 0.1.0 with models rows as 0.1.0 wrote them, then updated. FRESH: 0.2.0."""
    recreate(OLD)
    recreate(FRESH)
    yield
    drop(OLD)
    drop(FRESH)


def schema_description(conn):
    """Everything the extension owns, in a form that ignores column order and object ids."""
    q = {
        "columns": """SELECT table_name, column_name, data_type, is_nullable, column_default
                      FROM information_schema.columns WHERE table_schema = 'corgipile' ORDER BY 1, 2""",
        "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                          WHERE connamespace = 'corgipile'::regnamespace ORDER BY 1, 2""",
        "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'corgipile' ORDER BY 1",
        "views": """SELECT c.relname, pg_get_viewdef(c.oid), c.reloptions FROM pg_class c
                    WHERE c.relnamespace = 'corgipile'::regnamespace AND c.relkind = 'v' ORDER BY 1""",
        "acl": """SELECT relname, relacl::text, relrowsecurity FROM pg_class
                  WHERE relnamespace = 'corgipile'::regnamespace ORDER BY 1""",
        "column_acl": """SELECT attrelid::regclass::text, attname, attacl::text FROM pg_attribute
                         WHERE attrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'corgipile'::regnamespace)
                           AND attacl IS NOT NULL ORDER BY 1, 2""",
        "policies": "SELECT tablename, policyname, cmd, qual, with_check FROM pg_policies WHERE schemaname = 'corgipile' ORDER BY 1, 2",
        "functions": """SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), p.prosrc,
                               p.provolatile, p.proparallel, p.proisstrict, p.prosupport::text
                        FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
                        JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'corgipile' AND d.deptype = 'e'
                        ORDER BY 1, 2""",
        "members": """SELECT pg_describe_object(d.classid, d.objid, d.objsubid) FROM pg_depend d
                      JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'corgipile' AND d.deptype = 'e'
                      ORDER BY 1""",
        "config_dump": """SELECT array_length(extconfig, 1), extversion FROM pg_extension WHERE extname = 'corgipile'""",
    }
    return {k: conn.execute(v).fetchall() for k, v in q.items()}


def test_update_keeps_old_models_and_matches_a_fresh_install(databases, conn):
    # Models as 0.1.0 wrote them: trained here (current version), copied column by column.
    conn.execute("DROP TABLE IF EXISTS pts")
    three_classes(conn)
    ids = [scalar(conn, "SELECT corgipile_train('pts', %s, %s)", (m, psycopg.types.json.Jsonb(p)))
           for m, p in [("svm", {"label": "flag", "epochs": 2, "seed": 1, "verbose": False}),
                        ("softmax", {"epochs": 2, "seed": 1, "verbose": False, "normalize": True})]]
    cols = ", ".join(COLUMNS_0_1_0)
    # Copied as text, cast back to each column's type.
    types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                              "WHERE attrelid = 'corgipile.models'::regclass AND attnum > 0").fetchall())
    as_text = ", ".join(f"{c}::text" for c in COLUMNS_0_1_0)
    rows = conn.execute(f"SELECT {as_text} FROM corgipile.models WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
    expected = conn.execute("""SELECT corgipile_decision_function(%s, features), corgipile_predict_class(%s, features)
                               FROM pts ORDER BY id""", (ids[0], ids[1])).fetchall()

    with psycopg.connect(dbname=OLD, autocommit=True) as old:
        old.execute("CREATE EXTENSION corgipile VERSION '0.1.0'")
        three_classes(old)
        placeholders = ", ".join(f"%s::{types[c]}" for c in COLUMNS_0_1_0)
        with old.cursor() as cur:
            cur.executemany(f"INSERT INTO corgipile.models ({cols}) VALUES ({placeholders})", rows)
        old_ids = [r[0] for r in old.execute("SELECT id FROM corgipile.models ORDER BY id").fetchall()]
        old_pred = """SELECT corgipile_decision_function(%s, features), corgipile_predict_class(%s, features)
                      FROM pts ORDER BY id"""
        # The 0.1.0 SQL functions run on the new library and predict alike before the update.
        assert old.execute(old_pred, (old_ids[0], old_ids[1])).fetchall() == expected
        # Training needs the new catalog: a clear error, not a broken INSERT.
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            old.execute("SELECT corgipile_train('pts', 'svm', '{\"label\": \"flag\", \"epochs\": 1}')")
        assert "ALTER EXTENSION corgipile UPDATE" in e.value.diag.message_hint

        old.execute("ALTER EXTENSION corgipile UPDATE")
        assert scalar(old, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == CURRENT
        assert old.execute(old_pred, (old_ids[0], old_ids[1])).fetchall() == expected
        summary = old.execute("SELECT id, name, version, deployed FROM corgipile.model_summary ORDER BY id").fetchall()
        assert summary == [(old_ids[0], None, None, False), (old_ids[1], None, None, False)]
        # What 0.2.0 adds works on the upgraded database.
        new_id = scalar(old, "SELECT corgipile_train('pts', 'svm', '{\"label\": \"flag\", \"epochs\": 1, \"name\": \"m\", \"verbose\": false}')")
        assert new_id > max(old_ids)
        assert scalar(old, "SELECT corgipile_deploy('m')") == new_id
        assert scalar(old, "SELECT count(*) FROM corgipile_model_coefficients(%s)", (old_ids[0],)) == 3
        upgraded = schema_description(old)

    with psycopg.connect(dbname=FRESH, autocommit=True) as fresh:
        fresh.execute("CREATE EXTENSION corgipile")
        installed = schema_description(fresh)
    # Every part has rows (no column privileges remain since 0.3.0: PUBLIC only reads).
    assert all(rows for part, rows in installed.items() if part != "column_acl")
    assert installed["column_acl"] == []
    assert len(installed["functions"]) > 20 and ("corgipile_deploy",) in {(f[0],) for f in installed["functions"]}
    for part in installed:
        assert upgraded[part] == installed[part], part


def test_update_from_0_2_0_matches_a_fresh_install(databases):
    """0.2.0 -> current: the catalog's privileges change (writes only through corgipile's
    functions); an updated database must grant exactly what a fresh one grants."""
    recreate(OLD)
    with psycopg.connect(dbname=OLD, autocommit=True) as old:
        old.execute("CREATE EXTENSION corgipile VERSION '0.2.0'")
        assert scalar(old, "SELECT has_table_privilege('public', 'corgipile.models', 'INSERT')")
        old.execute("ALTER EXTENSION corgipile UPDATE")
        assert scalar(old, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == CURRENT
        assert not scalar(old, "SELECT has_table_privilege('public', 'corgipile.models', 'INSERT')")
        upgraded = schema_description(old)
    recreate(FRESH)
    with psycopg.connect(dbname=FRESH, autocommit=True) as fresh:
        fresh.execute("CREATE EXTENSION corgipile")
        installed = schema_description(fresh)
    for part in installed:
        assert upgraded[part] == installed[part], part


def test_update_from_0_3_0_matches_a_fresh_install(databases):
    """0.3.0 -> current: models get a preprocessing column and predictions from a row appear
    (tests/test_tabular.py checks that 0.3.0 models predict alike before and after)."""
    recreate(OLD)
    with psycopg.connect(dbname=OLD, autocommit=True) as old:
        old.execute("CREATE EXTENSION corgipile VERSION '0.3.0'")
        old.execute("ALTER EXTENSION corgipile UPDATE")
        assert scalar(old, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == CURRENT
        # What 0.4.0 adds works on the updated database: a column list, predicted from rows.
        three_classes(old)
        named = scalar(old, "SELECT corgipile_train('pts', 'svm', %s)",
                       (psycopg.types.json.Jsonb({"label": "flag", "features": ["id", "label"], "epochs": 2,
                                                  "seed": 1, "verbose": False}),))
        assert scalar(old, "SELECT count(corgipile_predict(%s, p)) FROM pts p", (named,)) == 3000
        assert scalar(old, "SELECT preprocessing IS NOT NULL FROM corgipile.models WHERE id = %s", (named,))
        upgraded = schema_description(old)
    recreate(FRESH)
    with psycopg.connect(dbname=FRESH, autocommit=True) as fresh:
        fresh.execute("CREATE EXTENSION corgipile")
        installed = schema_description(fresh)
    for part in installed:
        assert upgraded[part] == installed[part], part


def test_update_from_0_4_0_keeps_models_and_matches_a_fresh_install(databases, conn):
    """0.4.0 -> current: models get a layers column (networks; NULL for linear models) and the size
    checks of weights and bias apply to linear models only. Models as 0.4.0 wrote them (an array
    svm and softmax, a column-list logistic) predict alike before and after the update, and their
    layers is NULL."""
    conn.execute("DROP TABLE IF EXISTS pts")
    three_classes(conn)
    ids = [scalar(conn, "SELECT corgipile_train('pts', %s, %s)", (m, psycopg.types.json.Jsonb(p)))
           for m, p in [("svm", {"label": "flag", "epochs": 2, "seed": 1, "verbose": False}),
                        ("softmax", {"epochs": 2, "seed": 1, "verbose": False}),
                        ("logistic", {"label": "flag", "features": ["id", "label"], "epochs": 2, "seed": 1,
                                      "verbose": False})]]
    pred = """SELECT corgipile_decision_function(%s, features), corgipile_predict_class(%s, features),
                     corgipile_predict_proba(%s, features), corgipile_predict(%s, p), corgipile_predict_proba(%s, p)
              FROM pts p ORDER BY id"""
    expected = conn.execute(pred, (ids[0], ids[1], ids[1], ids[2], ids[2])).fetchall()
    types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                              "WHERE attrelid = 'corgipile.models'::regclass AND attnum > 0").fetchall())
    recreate(OLD)
    with psycopg.connect(dbname=OLD, autocommit=True) as old:
        old.execute("CREATE EXTENSION corgipile VERSION '0.4.0'")
        three_classes(old)
        # The columns of 0.4.0's catalog, copied as text and cast back to each column's type.
        cols = [r[0] for r in old.execute(
            """SELECT attname FROM pg_attribute WHERE attrelid = 'corgipile.models'::regclass AND attnum > 0
               AND NOT attisdropped AND attname <> 'id' ORDER BY attnum""").fetchall()]
        assert "preprocessing" in cols and "layers" not in cols
        rows = conn.execute(f"SELECT {', '.join(c + '::text' for c in cols)} FROM corgipile.models "
                            "WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
        placeholders = ", ".join(f"%s::{types[c]}" for c in cols)
        with old.cursor() as cur:
            cur.executemany(f"INSERT INTO corgipile.models ({', '.join(cols)}) VALUES ({placeholders})", rows)
        old_ids = [r[0] for r in old.execute("SELECT id FROM corgipile.models ORDER BY id").fetchall()]
        old_args = (old_ids[0], old_ids[1], old_ids[1], old_ids[2], old_ids[2])
        # The 0.4.0 SQL functions run on the new library and predict alike before the update.
        assert old.execute(pred, old_args).fetchall() == expected

        old.execute("ALTER EXTENSION corgipile UPDATE")
        assert scalar(old, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == CURRENT
        assert scalar(old, """SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                              WHERE attrelid = 'corgipile.models'::regclass AND attname = 'layers'""") == "integer[]"
        assert old.execute("SELECT id, layers FROM corgipile.models ORDER BY id").fetchall() == [(i, None) for i in old_ids]
        assert old.execute(pred, old_args).fetchall() == expected
        # The size checks still hold a linear model (layers NULL) to n_features x n_outputs.
        with pytest.raises(psycopg.errors.CheckViolation) as e:
            old.execute("UPDATE corgipile.models SET weights = weights || 0.0::float8 WHERE id = %s", (old_ids[0],))
        assert e.value.diag.constraint_name == "models_check"
        # Training works on the updated database; a linear model's layers is NULL.
        new_id = scalar(old, "SELECT corgipile_train('pts', 'svm', '{\"label\": \"flag\", \"epochs\": 1, \"verbose\": false}')")
        assert new_id > max(old_ids)
        assert scalar(old, "SELECT layers IS NULL FROM corgipile.models WHERE id = %s", (new_id,))
        # What 0.5.0 adds works on the updated database, beside the 0.4.0 models: a search
        # (corgipile.search_trials, deployed by its best score) and per-group models.
        Jsonb = psycopg.types.json.Jsonb
        best = scalar(old, "SELECT corgipile_train('pts', 'logistic', %s)",
                      (Jsonb({"label": "flag", "epochs": 1, "seed": 1, "verbose": False, "name": "upg_search",
                              "search": {"learning_rate": [0.01, 0.1]}}),))
        assert scalar(old, "SELECT count(*) FROM corgipile.search_trials WHERE name = 'upg_search'") == 2
        assert scalar(old, "SELECT corgipile_deploy('upg_search', 'best')") == best
        family = scalar(old, "SELECT corgipile_train('pts', 'logistic', %s)",
                        (Jsonb({"label": "flag", "features": ["id"], "epochs": 1, "seed": 1, "verbose": False,
                                "name": "upg_groups", "group_by": "label"}),))
        assert scalar(old, "SELECT count(*) FROM corgipile.group_models WHERE family_id = %s", (family,)) == 3
        assert old.execute(pred, old_args).fetchall() == expected
        upgraded = schema_description(old)
    recreate(FRESH)
    with psycopg.connect(dbname=FRESH, autocommit=True) as fresh:
        fresh.execute("CREATE EXTENSION corgipile")
        installed = schema_description(fresh)
    for part in installed:
        assert upgraded[part] == installed[part], part


# ----------------------------------------------------------------------------------------------
# Golden fixtures: models written by each released version's own library.

GOLDEN = REPO / "tests" / "fixtures" / "golden"
GOLDEN_VERSIONS = sorted((d.name for d in GOLDEN.iterdir() if (d / "meta.json").exists()),
                         key=lambda v: tuple(int(p) for p in v.split(".")))


def copy_in(conn, table, path):
    """COPY a fixture CSV (with a header naming its columns) into `table`."""
    text = path.read_text()
    cols = ", ".join(next(csv.reader(io.StringIO(text))))
    with conn.cursor() as cur:
        with cur.copy(f"COPY {table} ({cols}) FROM STDIN WITH (FORMAT csv, HEADER true)") as cp:
            cp.write(text)


def same_bits(a, b):
    """Bit for bit: floats by their IEEE 754 bytes (so 0.0 and -0.0 differ), lists element-wise."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# The documented changes of what an old model predicts (README, Upgrades): since 0.2.0 the class
# of a boolean label is shown as the label column shows it, `false`/`true`; 0.1.0 returned
# `0`/`1`, and its models, predicted by a later library, return `false`/`true` too.
BOOLEAN_CLASS_TEXT = {"0": "false", "1": "true"}


def expected_now(version, entry, label_type):
    if (version == "0.1.0" and entry["function"] == "corgipile_predict_class"
            and label_type[entry["id"]] == "boolean"):
        return BOOLEAN_CLASS_TEXT[entry["value"]]
    return entry["value"]


def golden_mismatches(conn, version, entries):
    """Every golden prediction recomputed by the library installed now; the ones that differ from
    what the version that trained the model returned (or its documented change, expected_now)."""
    label_type = dict(conn.execute("SELECT id, label_mapping->>'label_type' FROM corgipile.models").fetchall())
    bad = []
    for e in entries:
        by_id = e["by"] == "id"
        ref, cast = (e["id"], "%s::bigint") if by_id else (e["model"], "%s::text")
        fn = e["function"]
        if "indices" in e:
            sql, args = f"SELECT {fn}({cast}, %s::int4[], %s::float8[])", (ref, e["indices"], e["values"])
        elif "features" in e:
            sql, args = f"SELECT {fn}({cast}, %s::float8[])", (ref, e["features"])
        else:
            sql, args = f"SELECT {fn}({cast}, g) FROM g WHERE id = %s", (ref, e["row"])
        try:
            got = conn.execute(sql, args).fetchone()[0]
        except psycopg.Error as err:
            got = f"ERROR {err.sqlstate}: {err.diag.message_primary}"
        if not same_bits(got, expected_now(version, e, label_type)):
            bad.append((e["model"], e["by"], fn, e.get("features") or e.get("indices") or e.get("row"),
                        e["value"], got))
    return bad


@pytest.mark.parametrize("version", GOLDEN_VERSIONS)
def test_golden_models_of_each_version_predict_identically(version):
    """The models a released version trained (its own catalog rows, loaded into a database created
    at that version) predict bit for bit what that version predicted: with the current library
    before ALTER EXTENSION corgipile UPDATE (README, Upgrades: until then existing models keep
    predicting) and after it; by id, and by name (a pinned version stays the one a name
    resolves to). Bit for bit, not within a tolerance: the stored weights are the same numbers and
    a prediction is computed from them in the same order, so any difference is a change in the
    arithmetic of prediction, which must not pass unnoticed. The current version's own fixture
    (made by this build) catches a future change of the same kind."""
    fixture = GOLDEN / version
    meta = json.loads((fixture / "meta.json").read_text())
    entries = [e for e in json.loads((fixture / "predictions.json").read_text()) if "value" in e]
    assert meta["version"] == version
    # Every model of the fixture is checked by id, and every name by name.
    assert {e["id"] for e in entries if e["by"] == "id"} == set(meta["models"].values())
    assert {e["model"] for e in entries if e["by"] == "name"} == set(meta["names"])
    db = "corgipile_golden_" + version.replace(".", "_")
    recreate(db)
    try:
        with psycopg.connect(dbname=db, autocommit=True) as c:
            c.execute(f"CREATE EXTENSION corgipile VERSION '{version}'")
            c.execute((fixture / "tables.sql").read_text())
            copy_in(c, "corgipile.models", fixture / "models.csv")
            copy_in(c, "corgipile.epochs", fixture / "epochs.csv")
            c.execute("SELECT setval(pg_get_serial_sequence('corgipile.models', 'id'), max(id)) FROM corgipile.models")
            assert scalar(c, "SELECT count(*) FROM corgipile.models") == len(meta["models"])
            if version != CURRENT:
                bad = golden_mismatches(c, version, entries)
                assert not bad, f"{version} models before the update, {len(bad)} of {len(entries)} differ: {bad[:5]}"
                c.execute("ALTER EXTENSION corgipile UPDATE")
            assert scalar(c, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == CURRENT
            bad = golden_mismatches(c, version, entries)
            assert not bad, f"{version} models after the update, {len(bad)} of {len(entries)} differ: {bad[:5]}"
    finally:
        drop(db)


def test_golden_fixtures_cover_every_version():
    """A fixture for every released version (sql/released/) and the current one."""
    released = sorted(p.name[len("corgipile--"):-len(".sql")] for p in (REPO / "sql" / "released").glob("corgipile--*.sql"))
    assert set(GOLDEN_VERSIONS) == {*released, CURRENT}, (GOLDEN_VERSIONS, released)
