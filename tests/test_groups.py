"""Per-group models in one pass (0.5.0): `"group_by": "store"` trains one model per group with at
least `min_group_rows` rows, side by side on the same shuffled buffers beside the model of every
row. Checked as a user sees it:

1. What is stored: each group's model a version of the name, the model of every row last (the
   version the name stands for), corgipile.group_models; predictions from a row pick the row's
   group's model; corgipile_predict_group says which model predicted.
2. A group's model is as good as a model trained on that group's rows alone (within 1 point);
   with parallel workers, every process trains every group's model on its share.
3. Small groups, NULL groups and groups never seen in training are predicted by the model of
   every row; keys of several columns, text and date columns; networks.
4. Refused params, nothing stored; memory (every model counted, ERROR saying how many fit); too
   many groups; cancel; another role sees no group model it was not granted, and predicts
   through a granted name; EXPLAIN.

Tables are groups_* in the shared database (dropped at the end of the module).
"""

import time

import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import (ROLES_ENV_ALICE, ROLES_ENV_BOB, cancel_and_join, catalog_counts, connect, describe, scalar,
                     start_training, stop_if_running, train, train_error, train_with_workers, wait_active)

TABLES = ("groups_sales", "groups_store3", "groups_many", "groups_mixed", "groups_rls")
QUIET = {"verbose": False, "seed": 7}
SALES = {"features": ["x1", "x2"], "label": "y", "epochs": 4}


@pytest.fixture(scope="module")
def tables(roles_env):
    dsn = roles_env
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")
        # 20 stores of 1,500 rows: stores 0-9 label x1 + x2 > 0, stores 10-19 x1 - x2 > 0 (one
        # linear model of every row cannot do both); store 99 has 5 rows, 30 rows have no store.
        # Stored ORDER BY label.
        c.execute("""CREATE TABLE groups_sales AS
            SELECT i AS id, store, x1, x2,
                   CASE WHEN store < 10 THEN x1 + x2 > 0 ELSE x1 - x2 > 0 END AS y,
                   'region_' || (store % 3) AS region, DATE '2026-01-01' + (store % 4) AS day
            FROM (SELECT i, i % 20 AS store, (hashint4(i) % 1000) / 250.0 AS x1,
                         (hashint4(i * 7 + 3) % 1000) / 250.0 AS x2
                  FROM generate_series(1, 30000) i) s
            UNION ALL SELECT 100000 + i, 99, 0.5, -0.25, i % 2 = 0, 'region_x', DATE '2020-01-01'
                      FROM generate_series(1, 5) i
            UNION ALL SELECT 200000 + i, NULL, 0.5, 0.25, i % 2 = 0, NULL, NULL FROM generate_series(1, 30) i
            ORDER BY y, id""")
        c.execute("CREATE TABLE groups_store3 AS SELECT * FROM groups_sales WHERE store = 3")
        c.execute(f"GRANT SELECT ON {', '.join(TABLES[:2])} TO {ROLES_ENV_ALICE}, {ROLES_ENV_BOB}")
    yield dsn
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")


@pytest.fixture
def tconn(tables):
    with connect(tables) as c:
        yield c


def grouped(conn, name, group_by="store", model="logistic", rel="groups_sales", trainer=train, **extra):
    """One model per group stored as `name`; trainer=train_with_workers also proves a parallel
    worker ran."""
    return trainer(conn, rel, model, {**SALES, "name": name, "group_by": group_by, **extra}, defaults=QUIET)


def group_models(conn, name):
    return conn.execute("""SELECT model_id, version, family_id, group_key, group_rows, group_columns
                           FROM corgipile.group_models WHERE name = %s ORDER BY version""", (name,)).fetchall()


def accuracy(conn, model, where="true"):
    return scalar(conn, f"""SELECT avg((corgipile_predict(%s, s) = y::int)::int)::float8
                            FROM groups_sales s WHERE {where}""", (model,))


# =============================================================================================
# 1. What is stored, and how rows are predicted


def test_every_big_group_gets_a_model_and_the_model_of_every_row_comes_last(tconn):
    family = grouped(tconn, "g_sales")
    rows = group_models(tconn, "g_sales")
    assert len(rows) == 20, rows
    assert [r[1] for r in rows] == list(range(1, 21))
    assert {r[2] for r in rows} == {family}
    assert sorted(int(r[3]) for r in rows) == list(range(20))
    assert all(r[4] == 1500 and r[5] == ["store"] for r in rows)
    # The model of every row: the newest version, deployed, and it knows its groups.
    version, deployed, groups = tconn.execute(
        "SELECT version, deployed, (SELECT metrics->'groups' FROM corgipile.models WHERE id = %s) "
        "FROM corgipile.model_summary WHERE id = %s", (family, family)).fetchone()
    assert version == 21 and deployed
    assert groups["groups"] == 21 and groups["small_groups"] == 1 and groups["small_group_rows"] == 5
    assert groups["min_group_rows"] == 100 and groups["columns"] == ["store"]
    assert groups["models"] == {r[3]: r[0] for r in rows}
    params = scalar(tconn, "SELECT params FROM corgipile.models WHERE id = %s", (family,))
    assert params["group_by"] == ["store"] and params["min_group_rows"] == 100
    # Each group's model trained on its rows: 1,500 a epoch; the model of every row on all.
    assert scalar(tconn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (rows[0][0],)) == 1500
    assert scalar(tconn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (family,)) == 30035
    # Predicting by name from a row uses the row's group's model: far better than one model.
    per_group = accuracy(tconn, "g_sales", "store < 20")
    plain = train(tconn, "groups_sales", "logistic", SALES)
    assert per_group > 0.97 and accuracy(tconn, plain, "store < 20") < 0.85, (per_group,)
    # The same through the family's id.
    assert accuracy(tconn, family, "store < 20") == per_group


def test_predict_group_says_which_model_predicted(tconn):
    family = grouped(tconn, "g_which")
    models = {r[3]: r[0] for r in group_models(tconn, "g_which")}
    got = tconn.execute("""SELECT s.store, p.prediction, p.model_id, p.group_key, p.own_model,
                                  corgipile_predict_class('g_which', s)
                           FROM groups_sales s, corgipile_predict_group('g_which', s) p
                           WHERE s.id IN (3, 17, 100001, 200001) ORDER BY s.id""").fetchall()
    (s3, s17, small, none) = got
    assert s3[2:5] == (models["3"], "3", True) and s17[2:5] == (models["17"], "17", True)
    # A group too small for a model, and a row without a group: the model of every row.
    assert small[2:5] == (family, "99", False)
    assert none[2:5] == (family, None, False)
    assert all(r[1] == r[5] for r in got), got
    # A group never seen in training.
    assert tconn.execute("""SELECT model_id, group_key, own_model FROM corgipile_predict_group('g_which',
                            ROW(1, 12345, 0.5, 0.5, true, 'r', DATE '2026-01-01')::groups_sales)""").fetchone() \
        == (family, "12345", False)


def test_min_group_rows_decides_which_groups_get_a_model(tconn):
    family = grouped(tconn, "g_min", min_group_rows=3)
    keys = {r[3] for r in group_models(tconn, "g_min")}
    assert "99" in keys and len(keys) == 21
    grouped(tconn, "g_none", min_group_rows=1_000_000)
    assert group_models(tconn, "g_none") == []
    assert scalar(tconn, "SELECT metrics->'groups'->'small_groups' FROM corgipile.models WHERE name = 'g_none'") == 21
    assert family > 0


def test_evaluate_scores_each_row_with_its_groups_model(tconn):
    family = grouped(tconn, "g_eval")
    report = scalar(tconn, "SELECT corgipile_evaluate('g_eval', 'groups_sales')")
    assert report["model_id"] == family and report["rows_scored"] == 30035
    # The whole report is the rows' predictions by name: each row by its group's model.
    by_name = scalar(tconn, "SELECT avg((corgipile_predict('g_eval', s) = y::int)::int)::float8 FROM groups_sales s")
    assert abs(report["accuracy"] - by_name) < 1e-12, (report["accuracy"], by_name)
    groups = report["groups"]
    models = {r[3]: r[0] for r in group_models(tconn, "g_eval")}
    assert set(groups) == set(models)
    for key, part in groups.items():
        assert part["model_id"] == models[key] and part["rows_scored"] == 1500
        expected = scalar(tconn, "SELECT avg((corgipile_predict(%s, s) = y::int)::int)::float8 "
                                 "FROM groups_sales s WHERE store = %s", (models[key], int(key)))
        assert abs(part["accuracy"] - expected) < 1e-12, key
    # Store 99 (too small) and the rows without a store: the model of every row.
    assert report["other_rows"]["rows_scored"] == 35 and report["other_rows"]["model_id"] == family
    # One group's model evaluates as any model.
    one = scalar(tconn, "SELECT corgipile_evaluate(%s, 'groups_store3')", (models["3"],))
    assert "groups" not in one and abs(one["accuracy"] - groups["3"]["accuracy"]) < 1e-12


# =============================================================================================
# 2. As good as training a group alone


def test_a_groups_model_is_as_good_as_one_trained_on_its_rows_alone(tconn):
    grouped(tconn, "g_alone", epochs=6)
    own = scalar(tconn, "SELECT model_id FROM corgipile.group_models WHERE name = 'g_alone' AND group_key = '3'")
    # The same seed: only the rows' order differs (the group's rows within the whole table's
    # shuffle against its own table's).
    alone = train(tconn, "groups_store3", "logistic", {**SALES, "epochs": 6}, defaults=QUIET)
    a, b = accuracy(tconn, own, "store = 3"), accuracy(tconn, alone, "store = 3")
    assert a >= b - 0.01 and a > 0.95, (a, b)


def test_single_buffered_trains_the_same_group_models(tconn):
    double = grouped(tconn, "g_double")
    single = grouped(tconn, "g_single", double_buffer=False)
    weights = "SELECT group_key, weights, bias FROM corgipile.group_models g JOIN corgipile.models m " \
              "ON m.id = g.model_id WHERE g.name = %s ORDER BY group_key"
    assert tconn.execute(weights, ("g_double",)).fetchall() == tconn.execute(weights, ("g_single",)).fetchall()
    assert scalar(tconn, "SELECT weights FROM corgipile.models WHERE id = %s", (double,)) == \
        scalar(tconn, "SELECT weights FROM corgipile.models WHERE id = %s", (single,))


def test_parallel_workers_train_every_group_model_on_their_share(tconn):
    """With "workers", every process trains every group's model on its share of each epoch's
    blocks, exchanging with that model's copy in shared memory: the same groups (numbered by the
    leader's statistics pass), every row trained once per epoch, and each group's model as good
    as one process's. Where no parallel worker can start, the backend trains alone."""
    one = grouped(tconn, "g_one_process")
    team = grouped(tconn, "g_workers", workers=2, trainer=train_with_workers)
    rows_one, rows_team = group_models(tconn, "g_one_process"), group_models(tconn, "g_workers")
    assert [(r[3], r[4]) for r in rows_team] == [(r[3], r[4]) for r in rows_one]
    trained = "SELECT rows_trained FROM corgipile.models WHERE id = %s"
    assert scalar(tconn, trained, (team,)) == scalar(tconn, trained, (one,)) == 30035
    assert scalar(tconn, trained, (rows_team[0][0],)) == 1500
    for store in (0, 3, 12, 19):
        models = [scalar(tconn, "SELECT model_id FROM corgipile.group_models WHERE name = %s AND group_key = %s",
                         (name, str(store))) for name in ("g_one_process", "g_workers")]
        a, b = (accuracy(tconn, m, f"store = {store}") for m in models)
        assert b > 0.95 and abs(a - b) <= 0.02, (store, a, b)
    lines = [r[0] for r in tconn.execute(
        "SELECT * FROM corgipile_explain('groups_sales', 'logistic', %s, true)",
        (Jsonb({**SALES, "name": "g_explain_workers", "group_by": "store", "workers": 2}),)).fetchall()]
    launched = [int(line.split(": ", 1)[1]) for line in lines if line.strip().startswith("Workers Launched: ")]
    assert launched and launched[0] >= 1 and "Groups: " in "\n".join(lines), lines
    tconn.execute("SET max_parallel_workers = 0")
    try:
        alone = grouped(tconn, "g_no_worker_free", workers=2)
    finally:
        tconn.execute("RESET max_parallel_workers")
    assert [(r[3], r[4]) for r in group_models(tconn, "g_no_worker_free")] == [(r[3], r[4]) for r in rows_one]
    assert scalar(tconn, trained, (alone,)) == 30035


# =============================================================================================
# 3. Keys of several columns, text and date columns, networks


def test_keys_of_several_columns_and_of_text_and_date_columns(tconn):
    grouped(tconn, "g_two", group_by=["region", "day"], min_group_rows=50)
    keys = {r[3] for r in group_models(tconn, "g_two")}
    assert '["region_0","2026-01-01"]' in keys and len(keys) == 12, keys
    got = tconn.execute("""SELECT p.group_key, p.own_model FROM groups_sales s, corgipile_predict_group('g_two', s) p
                           WHERE s.id = 4""").fetchone()
    assert got == ('["region_1","2026-01-01"]', True)
    grouped(tconn, "g_day", group_by="day")
    assert {r[3] for r in group_models(tconn, "g_day")} == {f"2026-01-0{d}" for d in range(1, 5)}


def test_a_network_per_group(tconn):
    family = grouped(tconn, "g_mlp", model="mlp", hidden=[8], epochs=3, group_by="region")
    rows = group_models(tconn, "g_mlp")
    assert sorted(r[3] for r in rows) == ["region_0", "region_1", "region_2"]
    assert sorted(r[4] for r in rows) == [9000, 10500, 10500]
    assert scalar(tconn, "SELECT count(DISTINCT p.model_id) FROM groups_sales s, "
                         "corgipile_predict_group('g_mlp', s) p WHERE s.store < 20") == 3
    assert family not in {r[0] for r in rows}


def test_text_labels_and_regression_per_group(tconn):
    grouped(tconn, "g_reg", model="linear", group_by="region", features=["x2"], label="x1")
    assert len(group_models(tconn, "g_reg")) == 3
    v = scalar(tconn, "SELECT corgipile_predict('g_reg', s) FROM groups_sales s WHERE id = 1")
    assert isinstance(v, float)


# =============================================================================================
# 4. Refused, bounded, cancelled, private


REFUSED = [
    ({"group_by": "store"}, '"group_by" needs "name"'),
    ({"group_by": "store", "name": "x", "search": {"l2": [0, 1]}}, '"search"'),
    ({"group_by": "store", "name": "x", "folds": 3}, '"folds"'),
    ({"group_by": "store", "name": "x", "validation": {"fraction": 0.1}}, '"validation"'),
    ({"min_group_rows": 5}, '"min_group_rows" needs "group_by"'),
    ({"group_by": [], "name": "x"}, "group_by"),
    ({"group_by": ["a", "b", "c", "d", "e", "f", "g", "h", "i"], "name": "x"}, "group_by"),
    ({"group_by": "store", "name": "x", "min_group_rows": 0}, "min_group_rows"),
    ({"group_by": "nope", "name": "x"}, "nope"),
    ({"group_by": "y", "name": "x"}, "both the label"),
]


@pytest.mark.parametrize("params,message", REFUSED)
def test_refused_before_any_work(tconn, params, message):
    before = catalog_counts(tconn)
    e = train_error(tconn, "groups_sales", "logistic", {**SALES, **params})
    assert e is not None and e.sqlstate in ("22023", "42703", "0A000"), describe(e)
    assert message in e.diag.message_primary, describe(e)
    assert catalog_counts(tconn) == before


def test_array_features_are_refused(tconn):
    tconn.execute("CREATE TEMP TABLE g_arr AS SELECT ARRAY[x1, x2] AS f, y, store FROM groups_sales")
    e = train_error(tconn, "g_arr", "logistic", {"features": "f", "label": "y", "group_by": "store", "name": "x"})
    assert e.sqlstate == "0A000" and "feature columns" in e.diag.message_primary, describe(e)


def test_every_model_counts_against_max_model_memory(tables):
    with connect(tables) as su:
        before = catalog_counts(su)
        # 21 models of a 2-feature logistic model fit the default; not 64 kB.
        su.execute("SET corgipile.max_model_memory = '64kB'")
        su.execute("CREATE TEMP TABLE g_wide AS SELECT s.*, g.v1, g.v2 FROM groups_sales s, "
                   "LATERAL (SELECT random() AS v1, random() AS v2) g")
        e = train_error(su, "g_wide", "logistic", {"features": "*", "label": "y", "exclude": ["id", "day"],
                                                  "group_by": "store", "name": "g_mem", "epochs": 1,
                                                  "preprocess": {"region": {"encode": "hash", "buckets": 64}}})
        assert e is not None and e.sqlstate == "54000", describe(e)
        assert "21 models" in e.diag.message_primary and "such models fit" in e.diag.message_primary, describe(e)
        assert "min_group_rows" in e.diag.message_hint, describe(e)
        assert catalog_counts(su) == before
        # With workers every process holds every model, and shared memory one more copy: the 21
        # models that fit alone do not, 4 times over.
        su.execute("SET corgipile.max_model_memory = '512kB'")
        assert grouped(su, "g_mem_alone", epochs=1) is not None
        before = catalog_counts(su)
        e = train_error(su, "groups_sales", "logistic", {**SALES, "group_by": "store", "name": "g_mem_workers",
                                                        "epochs": 1, "workers": 2})
        assert e is not None and e.sqlstate == "54000", describe(e)
        assert "84 models" in e.diag.message_primary, describe(e)
        assert "one copy in each of 3 processes and one in shared memory" in e.diag.message_primary, describe(e)
        assert catalog_counts(su) == before


def test_too_many_groups_is_an_error(tconn):
    tconn.execute("DROP TABLE IF EXISTS groups_many")
    tconn.execute("CREATE TABLE groups_many AS SELECT i AS id, i % 2 = 0 AS y, i * 0.001 AS x1, 1.0 AS x2 "
                  "FROM generate_series(1, 100001) i")
    before = catalog_counts(tconn)
    e = train_error(tconn, "groups_many", "logistic", {**SALES, "group_by": "id", "name": "g_many", "epochs": 1})
    assert e is not None and e.sqlstate == "54000" and "100000 groups" in e.diag.message_primary, describe(e)
    assert catalog_counts(tconn) == before


def test_cancel_of_a_grouped_training(tables):
    with connect(tables) as victim, connect(tables) as killer:
        before = catalog_counts(killer)
        pid = scalar(victim, "SELECT pg_backend_pid()")
        t, result = start_training(victim, "groups_sales", "logistic", {
            **SALES, "name": "g_cancel", "group_by": "store", "epochs": 1_000_000, "batch_size": 1})
        try:
            wait_active(killer, pid)
            time.sleep(1.5)
            assert t.is_alive(), f"training ended: {result}"
            latency = cancel_and_join(killer, t, result, pid, timeout=30)
        finally:
            stop_if_running(killer, t, pid)
        print(f"\ncancel latency of a grouped training at batch 1: {latency:.3f} s")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < 1.0, f"cancel took {latency:.2f} s"
        assert catalog_counts(killer) == before


@pytest.fixture
def alice(roles_env, tables):
    with connect(roles_env, ROLES_ENV_ALICE) as c:
        yield c


def test_another_role_sees_no_group_model_until_granted(roles_env, alice):
    family = grouped(alice, "g_alice", epochs=1)
    assert len(group_models(alice, "g_alice")) == 20
    with connect(roles_env, ROLES_ENV_BOB) as bob:
        assert bob.execute("SELECT count(*) FROM corgipile.group_models WHERE trained_by = %s",
                           (ROLES_ENV_ALICE,)).fetchone()[0] == 0
        e = None
        try:
            bob.execute("SELECT corgipile_predict(%s, s) FROM groups_sales s LIMIT 1", (family,))
        except Exception as ex:  # noqa: BLE001 - the error is checked below
            e = ex
        assert e is not None, "bob predicted with alice's model"
        # A grant on the family's id covers that model only: a row of a group with a model of
        # its own is an ERROR that says so, not a prediction by another model.
        alice.execute("SELECT corgipile_grant(%s, %s, 'use')", (family, ROLES_ENV_BOB))
        try:
            bob.execute("SELECT corgipile_predict(%s, s) FROM groups_sales s WHERE id = 3", (family,))
            e = None
        except E.InsufficientPrivilege as ex:
            e = ex
        assert e is not None and "which you may not use" in e.diag.message_primary, describe(e)
        assert "grant on the model's name" in e.diag.message_hint
        small = bob.execute("SELECT corgipile_predict(%s, s) FROM groups_sales s WHERE id = 100001",
                            (family,)).fetchone()[0]
        assert small is not None, "a row of a small group is the family's own"
        alice.execute("SELECT corgipile_grant('g_alice', %s, 'use')", (ROLES_ENV_BOB,))
        assert bob.execute("SELECT count(*) FROM corgipile.group_models WHERE trained_by = %s",
                           (ROLES_ENV_ALICE,)).fetchone()[0] == 20
        mine = alice.execute("SELECT p.model_id FROM groups_sales s, corgipile_predict_group(%s::text, s) p "
                             "WHERE s.id = 3", (family,)).fetchone()
        theirs = bob.execute("SELECT p.model_id, p.own_model FROM groups_sales s, "
                             "corgipile_predict_group(%s, s) p WHERE s.id = 3", (f"{ROLES_ENV_ALICE}.g_alice",)).fetchone()
        assert theirs == (mine[0], True)


def test_row_level_security_decides_which_groups_a_role_finds(roles_env, alice):
    """A role trains on the rows its policies show it: the groups it finds, their rows and every
    key stored are of those rows only (the statistics pass and the epochs read through the same
    scan), so no key of a hidden row reaches the catalog."""
    with connect(roles_env) as admin:
        admin.execute("DROP TABLE IF EXISTS groups_rls")
        admin.execute("CREATE TABLE groups_rls AS SELECT * FROM groups_sales ORDER BY y, id")
        admin.execute("ALTER TABLE groups_rls ENABLE ROW LEVEL SECURITY")
        admin.execute(f"CREATE POLICY first_stores ON groups_rls FOR SELECT TO {ROLES_ENV_ALICE} USING (store < 5)")
        admin.execute(f"GRANT SELECT ON groups_rls TO {ROLES_ENV_ALICE}")
    family = grouped(alice, "g_rls", rel="groups_rls", epochs=1, min_group_rows=10)
    stored = group_models(alice, "g_rls")
    assert sorted(r[3] for r in stored) == ["0", "1", "2", "3", "4"]
    assert all(r[4] == 1500 for r in stored), stored
    visible = alice.execute("SELECT count(*) FROM groups_rls").fetchone()[0]
    assert visible == 7500
    metrics = alice.execute("SELECT rows_trained, metrics->'groups' FROM corgipile.models WHERE id = %s",
                            (family,)).fetchone()
    assert metrics[0] == visible
    assert metrics[1]["groups"] == 5 and metrics[1]["small_groups"] == 0, metrics[1]
    assert set(metrics[1]["models"]) == {"0", "1", "2", "3", "4"}


def test_explain_names_the_groups(tconn):
    lines = "\n".join(r[0] for r in tconn.execute(
        "SELECT * FROM corgipile_explain('groups_sales', 'logistic', %s)",
        (Jsonb({**SALES, "name": "g_explain", "group_by": ["store", "region"], "min_group_rows": 10}),)).fetchall())
    assert "Groups: a model per group of store, region with at least 10 rows" in lines, lines
    assert scalar(tconn, "SELECT count(*) FROM corgipile.models WHERE name = 'g_explain'") == 0
