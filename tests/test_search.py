"""Search in one pass (0.5.0): `"search": {"learning_rate": [...], "l2": [...]}` trains every
configuration side by side on the same shuffled buffers, each scored on the same validation rows,
and stores each as a version of the name, the best (select_by) last. Checked as a user sees it:

1. What is stored: one model per configuration, versions in order, the best one last and so the
   one a name's prediction uses; corgipile.search_trials (one row per configuration, its score
   the stored model's validation score); per-epoch validation of every configuration.
2. A configuration trained side by side is the model training it alone gives, bit for bit
   (linear, network, with patience); a seeded sample of the grid (search_trials).
3. A diverging configuration is set aside (not stored, reported); when all diverge, the ERROR
   of a training and nothing stored.
4. Refused params as an ordinary role, nothing stored; memory: the configurations share
   corgipile.max_model_memory; cancel; another role sees no trial it was not granted; EXPLAIN.

Tables are search_* in the shared database (dropped at the end of the module).
"""

import time

import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import (ROLES_ENV_ALICE, ROLES_ENV_BOB, cancel_and_join, catalog_counts, connect, describe, error_of,
                     models_count, scalar, start_training, stop_if_running, train, train_error, train_with_workers,
                     wait_active)
from tables import XY

TABLES = ("search_ring", "search_reg", "search_raw", "search_rls")
QUIET = {"verbose": False, "seed": 5}


@pytest.fixture(scope="module")
def tables(roles_env):
    dsn = roles_env
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")
        # A ring (inside: 1) with a third, useless feature; 6,000 rows stored ORDER BY label.
        c.execute(f"""CREATE TABLE search_ring AS
            SELECT i AS id, ARRAY[x, y, (hashint4(i * 11) % 1000) / 1000.0]::float8[] AS features,
                   (x * x + y * y < 1.2)::int AS label
            FROM (SELECT i, {XY} FROM generate_series(1, 6000) i) s ORDER BY 3, 1""")
        # A linear target with noise, raw scales.
        c.execute(f"""CREATE TABLE search_reg AS
            SELECT i AS id, ARRAY[x, 100 * y]::float8[] AS features,
                   3 * x - 0.02 * (100 * y) + 10 + ((hashint4(i * 5) % 1000) / 5000.0) AS label
            FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s""")
        # Raw scales in the thousands: a large step diverges without normalize.
        c.execute("""CREATE TABLE search_raw AS
            SELECT i AS id, ARRAY[i % 1000, (i * 7) % 1000]::float8[] AS features, (i % 1000) * 3.0 AS label
            FROM generate_series(1, 3000) i""")
        c.execute(f"GRANT SELECT ON {', '.join(TABLES[:3])} TO {ROLES_ENV_ALICE}, {ROLES_ENV_BOB}")
    yield dsn
    with connect(dsn) as c:
        for t in TABLES:
            c.execute(f"DROP TABLE IF EXISTS {t}")


@pytest.fixture
def tconn(tables):
    with connect(tables) as c:
        yield c


def search(conn, rel, model, name, grid, trainer=train, **extra):
    """A search stored as `name`; trainer=train_with_workers also proves a parallel worker ran."""
    return trainer(conn, rel, model, {"name": name, "search": grid, **extra}, defaults=QUIET)


def trials(conn, name):
    return conn.execute("""SELECT model_id, version, trial, trials, params, select_by, score, selected,
                                  validation_loss, validation_accuracy, validation_r2, epochs, search_id
                           FROM corgipile.search_trials WHERE name = %s ORDER BY version""", (name,)).fetchall()


def weights(conn, model_id):
    return conn.execute("SELECT weights, bias FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()


def alone(conn, rel, model, model_id, **extra):
    """Trains the stored params of model `model_id` alone (another name), returns the new id."""
    params = scalar(conn, "SELECT params FROM corgipile.models WHERE id = %s", (model_id,))
    params = {**params, "name": None, "verbose": False, **extra}
    return scalar(conn, "SELECT corgipile_train(%s::regclass, %s, %s)", (rel, model, Jsonb(params)))


# =============================================================================================
# 1. What is stored


def test_a_grid_stores_every_configuration_the_best_last(tconn):
    grid = {"learning_rate": [0.001, 0.01, 0.1], "l2": [0, 0.01]}
    best = search(tconn, "search_ring", "logistic", "s_grid", grid, epochs=3)
    rows = trials(tconn, "s_grid")
    assert len(rows) == 6
    assert [r[1] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert {r[3] for r in rows} == {6} and sorted(r[2] for r in rows) == [1, 2, 3, 4, 5, 6]
    # Every combination once, the searched values only.
    assert sorted((r[4]["learning_rate"], r[4]["l2"]) for r in rows) == sorted(
        (lr, l2) for lr in grid["learning_rate"] for l2 in grid["l2"])
    # The best by validation accuracy is stored last, is the one returned, and the one deployed.
    selected = [r for r in rows if r[7]]
    assert len(selected) == 1 and selected[0] == rows[-1] and selected[0][0] == best
    assert all(r[5] == "accuracy" and r[6] == r[9] for r in rows)
    assert selected[0][6] == max(r[6] for r in rows)
    assert scalar(tconn, "SELECT deployed FROM corgipile.model_summary WHERE id = %s", (best,))
    assert {r[12] for r in rows} == {rows[0][0]}, "one search_id: its first model's id"
    # Every configuration was validated after every epoch, on the default 20% split.
    for r in rows:
        assert r[11] == 3
        v = tconn.execute("SELECT count(validation_accuracy) FROM corgipile.epochs WHERE model_id = %s",
                          (r[0],)).fetchone()[0]
        assert v == 3
        params = scalar(tconn, "SELECT params FROM corgipile.models WHERE id = %s", (r[0],))
        assert params["validation"] == {"fraction": 0.2} and "search" not in params
        assert (params["learning_rate"], params["l2"]) == (r[4]["learning_rate"], r[4]["l2"])
    # The deployed model predicts by name.
    assert scalar(tconn, "SELECT corgipile_predict_class('s_grid', features) = corgipile_predict_class(%s, features) "
                         "FROM search_ring LIMIT 1", (best,))


def test_regression_ranks_by_r2_or_by_loss(tconn):
    search(tconn, "search_reg", "linear", "s_r2", {"learning_rate": [0.0001, 0.01, 0.1]}, epochs=3)
    rows = trials(tconn, "s_r2")
    assert all(r[5] == "r2" and r[6] == r[10] for r in rows)
    assert rows[-1][7] and rows[-1][6] == max(r[6] for r in rows)
    search(tconn, "search_reg", "linear", "s_loss", {"learning_rate": [0.0001, 0.01, 0.1]}, epochs=3,
           select_by="loss")
    rows = trials(tconn, "s_loss")
    assert all(r[5] == "loss" and r[6] == r[8] for r in rows)
    assert rows[-1][7] and rows[-1][6] == min(r[6] for r in rows)


@pytest.mark.parametrize("select_by,model,best", [("roc_auc", "logistic", max), ("f1", "svm", max),
                                                 ("log_loss", "logistic", min), ("log_loss", "mlp", min)])
def test_ranked_by_roc_auc_f1_or_log_loss(tconn, select_by, model, best):
    # A line separates these labels (stored sorted by label).
    tconn.execute(f"""CREATE TEMP TABLE IF NOT EXISTS s_line AS
        SELECT i AS id, ARRAY[x, y]::float8[] AS features, (x + 2 * y > 0.3)::int AS label
        FROM (SELECT i, {XY} FROM generate_series(1, 4000) i) s ORDER BY 3, 1""")
    name = f"s_by_{select_by}_{model}"
    grid = {"learning_rate": [0.0001, 0.01, 0.1]} if model != "mlp" else {"learning_rate": [0.0001, 0.01]}
    search(tconn, "s_line", model, name, grid, epochs=2, select_by=select_by,
           **({"hidden": [8]} if model == "mlp" else {}))
    rows = trials(tconn, name)
    stored = [scalar(tconn, "SELECT (metrics->'validation'->>%s)::float8 FROM corgipile.models WHERE id = %s",
                     (select_by, r[0])) for r in rows]
    assert all(r[5] == select_by for r in rows)
    assert [r[6] for r in rows] == stored and all(s is not None for s in stored), (rows, stored)
    assert rows[-1][7] and rows[-1][6] == best(stored)
    if select_by in ("roc_auc", "f1"):
        assert all(0 <= s <= 1 for s in stored) and best(stored) > 0.9, stored
    # Cross-validated: ranked by the folds' mean.
    if model == "logistic" and select_by == "roc_auc":
        search(tconn, "s_line", model, name + "_cv", grid, epochs=2, select_by=select_by, folds=3)
        cv = [scalar(tconn, "SELECT metrics->'cv' FROM corgipile.models WHERE id = %s", (r[0],))
              for r in trials(tconn, name + "_cv")]
        assert all(abs(c["roc_auc"] - sum(f["roc_auc"] for f in c["per_fold"]) / 3) < 1e-12 for c in cv)


# =============================================================================================
# 2. Side by side = alone


@pytest.mark.parametrize("double_buffer", [True, False])
def test_each_linear_configuration_is_what_training_it_alone_gives(tconn, double_buffer):
    name = f"s_alone_{double_buffer}"
    search(tconn, "search_ring", "svm", name, {"learning_rate": [0.01, 0.1], "batch_size": [1, 8]},
           epochs=3, double_buffer=double_buffer)
    rows = trials(tconn, name)
    assert len({tuple(weights(tconn, r[0])[0]) for r in rows}) == 4, "the configurations differ"
    for r in rows:
        assert weights(tconn, alone(tconn, "search_ring", "svm", r[0])) == weights(tconn, r[0]), r[4]


def test_network_configurations_are_what_training_them_alone_gives(tconn):
    search(tconn, "search_ring", "mlp", "s_mlp", {"hidden": [[8], [16, 8]], "optimizer": ["adam", "sgd"]}, epochs=3)
    rows = trials(tconn, "s_mlp")
    assert len(rows) == 4
    for r in rows:
        # Each configuration has the defaults of its own optimizer.
        lr = scalar(tconn, "SELECT (params->>'learning_rate')::float8 FROM corgipile.models WHERE id = %s", (r[0],))
        assert lr == (0.01 if r[4]["optimizer"] == "sgd" else 0.001)
        assert weights(tconn, alone(tconn, "search_ring", "mlp", r[0])) == weights(tconn, r[0]), r[4]
    # A network learns the ring better than chance.
    assert max(r[6] for r in rows) > 0.8


def test_the_model_kind_is_searched_among_kinds_that_read_the_label_alike(tconn):
    # Two-class kinds: svm and logistic, side by side; each stored as its own kind, each what
    # training that kind alone gives.
    search(tconn, "search_ring", "logistic", "s_kinds", {"model": ["svm", "logistic"], "learning_rate": [0.01, 0.1]},
           epochs=2)
    rows = trials(tconn, "s_kinds")
    kinds = [scalar(tconn, "SELECT model_type FROM corgipile.models WHERE id = %s", (r[0],)) for r in rows]
    assert sorted(kinds) == ["logistic", "logistic", "svm", "svm"], kinds
    for r, kind in zip(rows, kinds):
        assert r[4]["model"] == kind
        assert weights(tconn, alone(tconn, "search_ring", kind, r[0])) == weights(tconn, r[0]), r[4]
    # Regression: a linear model beside a network.
    search(tconn, "search_reg", "linear", "s_kinds_reg", {"model": ["linear", "mlp_regression"]}, epochs=2)
    rows = trials(tconn, "s_kinds_reg")
    kinds = {r[4]["model"]: scalar(tconn, "SELECT model_type FROM corgipile.models WHERE id = %s", (r[0],))
             for r in rows}
    assert kinds == {"linear": "linear", "mlp_regression": "mlp_regression"}
    for r in rows:
        kind = r[4]["model"]
        assert weights(tconn, alone(tconn, "search_reg", kind, r[0])) == weights(tconn, r[0]), r[4]
        assert r[10] is not None and r[10] > 0.5, r  # validation R2


def test_class_weight_is_searched_each_configuration_as_alone(tconn):
    # The ring holds about a quarter of positive rows: "balanced" weighs them up.
    search(tconn, "search_ring", "logistic", "s_cw", {"class_weight": [None, "balanced"], "learning_rate": [0.05]},
           epochs=2)
    rows = trials(tconn, "s_cw")
    assert len(rows) == 2
    stored = {json_key(r[4]["class_weight"]): r for r in rows}
    assert set(stored) == {"null", "balanced"}
    assert scalar(tconn, "SELECT params->'class_weight' FROM corgipile.models WHERE id = %s",
                  (stored["balanced"][0],)) == "balanced"
    for r in rows:
        assert weights(tconn, alone(tconn, "search_ring", "logistic", r[0])) == weights(tconn, r[0]), r[4]
    assert weights(tconn, stored["null"][0]) != weights(tconn, stored["balanced"][0])


def json_key(v):
    return "null" if v is None else str(v)


def test_a_search_and_folds_with_parallel_workers(tconn):
    """With "workers", every process trains every configuration (and fold) on its share of the
    blocks; validation and fold scores are pooled over the processes, so they count the same
    rows as one process's."""
    grid = {"learning_rate": [0.01, 0.1], "l2": [0, 0.001]}
    search(tconn, "search_ring", "logistic", "s_one", grid, epochs=2)
    search(tconn, "search_ring", "logistic", "s_team", grid, epochs=2, workers=2, trainer=train_with_workers)
    one, team = trials(tconn, "s_one"), trials(tconn, "s_team")
    assert [r[4] for r in team] == [r[4] for r in one] and len(team) == 4
    for a, b in zip(one, team):
        rows = [scalar(tconn, "SELECT (metrics->'validation'->>'rows')::int FROM corgipile.models WHERE id = %s",
                       (r[0],)) for r in (a, b)]
        assert rows[0] == rows[1] > 1000, rows
        assert abs(a[9] - b[9]) <= 0.05, (a, b)
    assert team[-1][7], "the best is stored last"
    search(tconn, "search_ring", "logistic", "s_team_cv", LR, epochs=2, folds=3, workers=2, trainer=train_with_workers)
    for model_id, cv in tconn.execute("""SELECT id, metrics->'cv' FROM corgipile.models WHERE name = 's_team_cv'
                                         ORDER BY version""").fetchall():
        assert sum(f["rows"] for f in cv["per_fold"]) == 6000, cv
        assert cv["accuracy"] > 0.5


def test_patience_stops_each_configuration_on_its_own(tconn):
    grid = {"learning_rate": [0.5, 0.0001]}
    search(tconn, "search_ring", "logistic", "s_pat", grid, epochs=12, patience=1, average=False)
    rows = trials(tconn, "s_pat")
    for r in rows:
        best_epoch = scalar(tconn, "SELECT (metrics->>'best_epoch')::int FROM corgipile.models WHERE id = %s", (r[0],))
        assert best_epoch is not None and best_epoch <= r[11]
        twin = alone(tconn, "search_ring", "logistic", r[0])
        assert weights(tconn, twin) == weights(tconn, r[0]), r[4]
        assert scalar(tconn, "SELECT metrics->>'epochs_run' FROM corgipile.models WHERE id = %s", (twin,)) == str(r[11])


def test_a_seeded_sample_of_the_grid(tconn):
    grid = {"learning_rate": [0.001, 0.01, 0.1], "l2": [0, 0.001, 0.01]}
    search(tconn, "search_ring", "logistic", "s_sample_a", grid, epochs=1, search_trials=4)
    search(tconn, "search_ring", "logistic", "s_sample_b", grid, epochs=1, search_trials=4)
    a = [r[4] for r in trials(tconn, "s_sample_a")]
    b = [r[4] for r in trials(tconn, "s_sample_b")]
    assert len(a) == 4 and len({str(x) for x in a}) == 4
    assert sorted(map(str, a)) == sorted(map(str, b)), "same seed, same sample"
    samples = set()
    for seed in range(6):
        name = f"s_sample_seed{seed}"
        train(tconn, "search_ring", "logistic", {"name": name, "search": grid, "search_trials": 2, "epochs": 1,
                                                  "seed": seed})
        samples.add(tuple(sorted(str(r[4]) for r in trials(tconn, name))))
    assert len(samples) > 1, "other seeds draw other samples"


# =============================================================================================
# 3. Divergence


def test_a_diverging_configuration_is_set_aside(tconn):
    params = {"epochs": 3, "normalize": False, "average": False}
    best = search(tconn, "search_raw", "linear", "s_div", {"learning_rate": [1e-9, 1e3]}, **params)
    rows = trials(tconn, "s_div")
    assert len(rows) == 1 and rows[0][0] == best and rows[0][4] == {"learning_rate": 1e-9}
    assert rows[0][3] == 2, "of 2 configurations"
    aside = scalar(tconn, "SELECT metrics->'search'->'set_aside' FROM corgipile.models WHERE id = %s", (best,))
    assert len(aside) == 1 and aside[0]["params"] == {"learning_rate": 1000} and "diverged" in aside[0]["error"]


def test_when_every_configuration_diverges_it_is_the_trainings_error(tconn):
    before = catalog_counts(tconn)
    e = train_error(tconn, "search_raw", "linear", {"name": "s_div_all", "epochs": 3, "normalize": False,
                                                     "search": {"learning_rate": [1e3, 1e4]}})
    assert e is not None and e.sqlstate == "22003", describe(e)
    assert catalog_counts(tconn) == before


# =============================================================================================
# 4. Refusals, memory, cancel, privileges, EXPLAIN


@pytest.fixture
def alice(roles_env, tables):
    with connect(roles_env, ROLES_ENV_ALICE) as c:
        yield c


LR = {"learning_rate": [0.01, 0.1]}
REFUSED = [
    ("svm", {"search": LR}, '"search" needs "name"'),
    ("svm", {"name": "x", "search": LR, "tolerance": 0.001}, '"tolerance"'),
    ("svm", {"name": "x", "search_trials": 2}, 'need "search"'),
    ("svm", {"name": "x", "select_by": "loss"}, 'need "search"'),
    ("svm", {"name": "x", "search": LR, "select_by": "r2"}, "for regression"),
    ("linear", {"name": "x", "search": LR, "select_by": "accuracy"}, "for classifiers"),
    ("svm", {"name": "x", "search": LR, "select_by": "log_loss"}, "with probabilities"),
    ("linear", {"name": "x", "search": LR, "select_by": "roc_auc"}, "two-class kinds"),
    ("svm", {"name": "x", "search": LR, "select_by": "auc"}, "select_by"),
    ("svm", {"name": "x", "search": {"epochs": [1, 2]}}, '"epochs" cannot be searched'),
    ("svm", {"name": "x", "search": {"learning_rate": []}}, "non-empty array"),
    ("svm", {"name": "x", "search": {"learning_rate": [0.1, -1]}}, 'in "search"'),
    ("svm", {"name": "x", "search": {"hidden": [[4]]}}, '"hidden" applies to mlp'),
    ("mlp", {"name": "x", "search": {"l1": [0, 0.1]}}, '"l1" cannot be used'),
    ("svm", {"name": "x", "search": {"l2": list(range(20)), "l1": list(range(20))}}, "400 configurations"),
    ("svm", {"name": "x", "search": [1, 2]}, "expected an object"),
    ("svm", {"name": "x", "search": LR, "search_trials": 0}, "search_trials"),
    ("logistic", {"name": "x", "search": {"model": ["svm", "linear"]}}, '"model" cannot be "linear"'),
    ("logistic", {"name": "x", "search": {"model": ["mlp"]}}, "can search the kinds svm, logistic"),
    ("svm", {"name": "x", "search": {"model": ["nope"]}}, '"model" cannot be "nope"'),
    ("logistic", {"name": "x", "search": {"model": ["svm", "logistic"]}, "select_by": "log_loss"},
     "with probabilities"),
    ("svm", {"folds": 1}, "folds"),
    ("svm", {"folds": 21}, "folds"),
    ("svm", {"folds": 3, "validation": {"fraction": 0.1}}, '"folds" cannot be used with "validation"'),
    ("svm", {"folds": 3, "tolerance": 0.1}, '"folds" cannot be used with "tolerance"'),
]


@pytest.mark.parametrize("model,params,message", REFUSED, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(REFUSED)])
def test_refused_params(alice, model, params, message):
    before = models_count(alice)
    e = train_error(alice, "search_ring", model, {"epochs": 1, **params})
    assert e is not None and e.sqlstate == "22023", describe(e)
    assert message in (e.diag.message_primary or "") + " " + (e.diag.message_hint or ""), describe(e)
    assert models_count(alice) == before


def test_configurations_share_max_model_memory(tables):
    with connect(tables) as su:
        su.execute("SET corgipile.max_model_memory = '1MB'")
        before = catalog_counts(su)
        # One network of [3, 128, 128, 2] with Adam fits 1 MB; 8 of them do not.
        grid = {"learning_rate": [0.001, 0.002, 0.003, 0.004], "optimizer": ["adam", "sgd"]}
        e = train_error(su, "search_ring", "mlp", {"name": "s_mem", "hidden": [128, 128], "epochs": 1,
                                                   "search": grid})
        assert e is not None and e.sqlstate == "54000", describe(e)
        assert "8 models" in e.diag.message_primary and "one such model fits" in e.diag.message_primary, describe(e)
        assert "search" in e.diag.message_hint, describe(e)
        assert catalog_counts(su) == before
        assert train(su, "search_ring", "mlp", {"hidden": [128, 128], "epochs": 1}) > 0


def test_cancel_of_a_search(tables):
    with connect(tables) as victim, connect(tables) as killer:
        before = catalog_counts(killer)
        pid = scalar(victim, "SELECT pg_backend_pid()")
        t, result = start_training(victim, "search_ring", "mlp", {
            "name": "s_cancel", "epochs": 1_000_000, "hidden": [256, 256], "batch_size": 1,
            "search": {"learning_rate": [0.001, 0.01, 0.1]}})
        try:
            wait_active(killer, pid)
            time.sleep(1.5)
            assert t.is_alive(), f"training ended: {result}"
            latency = cancel_and_join(killer, t, result, pid, timeout=30)
        finally:
            stop_if_running(killer, t, pid)
        print(f"\ncancel latency of a search of [256, 256] networks at batch 1: {latency:.3f} s")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < 1.0, f"cancel took {latency:.2f} s"
        assert catalog_counts(killer) == before


def test_another_role_sees_no_trial_it_was_not_granted(roles_env, alice):
    search(alice, "search_ring", "logistic", "s_alice", LR, epochs=1)
    assert len(trials(alice, "s_alice")) == 2
    with connect(roles_env, ROLES_ENV_BOB) as bob:
        assert bob.execute("SELECT count(*) FROM corgipile.search_trials WHERE trained_by = %s",
                           (ROLES_ENV_ALICE,)).fetchone()[0] == 0
        alice.execute("SELECT corgipile_grant('s_alice', %s, 'use')", (ROLES_ENV_BOB,))
        assert bob.execute("SELECT count(*) FROM corgipile.search_trials WHERE trained_by = %s",
                           (ROLES_ENV_ALICE,)).fetchone()[0] == 2


def test_row_level_security_decides_the_rows_of_every_trial_and_fold(roles_env, alice):
    """Every configuration and every fold trains and scores on the rows the role's policies show it."""
    with connect(roles_env) as admin:
        admin.execute("DROP TABLE IF EXISTS search_rls")
        admin.execute("CREATE TABLE search_rls AS SELECT * FROM search_ring ORDER BY label, id")
        admin.execute("ALTER TABLE search_rls ENABLE ROW LEVEL SECURITY")
        admin.execute(f"CREATE POLICY even_ids ON search_rls FOR SELECT TO {ROLES_ENV_ALICE} USING (id % 2 = 0)")
        admin.execute(f"GRANT SELECT ON search_rls TO {ROLES_ENV_ALICE}")
    search(alice, "search_rls", "logistic", "s_rls", LR, epochs=2, folds=3)
    stored = alice.execute("""SELECT rows_trained, metrics->'cv' FROM corgipile.models
                              WHERE name = 's_rls' ORDER BY version""").fetchall()
    assert len(stored) == 2
    for rows_trained, cv in stored:
        assert rows_trained == 3000
        assert sum(f["rows"] for f in cv["per_fold"]) == 3000, cv


def test_explain_names_the_search(tconn):
    lines = "\n".join(r[0] for r in tconn.execute(
        "SELECT * FROM corgipile_explain('search_ring', 'logistic', %s)",
        (Jsonb({"name": "s_explain", "search": {"learning_rate": [0.01, 0.1], "l2": [0, 1]}}),)).fetchall())
    assert "Search: 4 configurations side by side" in lines and "best by validation accuracy" in lines, lines
    assert scalar(tconn, "SELECT count(*) FROM corgipile.models WHERE name = 's_explain'") == 0


# =============================================================================================
# 5. Deploying by score


def test_deploy_best_pins_the_version_with_the_best_validation_score(tconn):
    name = "s_deploy"
    best = search(tconn, "search_reg", "linear", name, {"learning_rate": [0.0001, 0.01]}, epochs=2)
    # A later version, trained without validation, is the newest (and deployed) but has no score.
    later = train(tconn, "search_reg", "linear", {"name": name, "epochs": 1})
    assert scalar(tconn, "SELECT corgipile_deploy(%s)", (name,)) == later
    assert scalar(tconn, "SELECT corgipile_deploy(%s, 'best')", (name,)) == best
    assert scalar(tconn, "SELECT pinned FROM corgipile.models WHERE id = %s", (best,))
    # A version with a worse validation R² trained later does not displace it.
    worse = train(tconn, "search_reg", "linear", {"name": name, "epochs": 1, "learning_rate": 1e-7,
                                                  "normalize": False, "validation": {"fraction": 0.2}})
    r2 = {m: scalar(tconn, "SELECT (metrics->'validation'->>'r2')::float8 FROM corgipile.models WHERE id = %s", (m,))
          for m in (best, worse)}
    assert r2[worse] < r2[best], r2
    assert scalar(tconn, "SELECT corgipile_deploy(%s, 'best')", (name,)) == best
    # 'latest' and NULL unpin; a number is a model id, as before, given as a number or as text.
    assert scalar(tconn, "SELECT corgipile_deploy(%s, 'latest')", (name,)) == worse
    assert scalar(tconn, "SELECT corgipile_deploy(%s, NULL)", (name,)) == worse
    assert scalar(tconn, "SELECT corgipile_deploy(%s, %s::bigint)", (name, later)) == later
    assert scalar(tconn, "SELECT corgipile_deploy(%s, %s)", (name, str(best))) == best


def test_deploy_best_refuses_without_scores_and_unknown_strategies(tconn):
    train(tconn, "search_ring", "logistic", {"name": "s_deploy_none", "epochs": 1})
    e = error_of(tconn, "SELECT corgipile_deploy('s_deploy_none', 'best')")
    assert e is not None and e.sqlstate == "P0002" and "validation score" in e.diag.message_primary, describe(e)
    e = error_of(tconn, "SELECT corgipile_deploy('s_deploy_none', 'fastest')")
    assert e is not None and e.sqlstate == "22023" and "strategy" in e.diag.message_primary, describe(e)
    e = error_of(tconn, "SELECT corgipile_deploy('no_such_name_at_all', 'best')")
    assert e is not None and e.sqlstate == "42704", describe(e)


def test_another_role_cannot_deploy_by_score(roles_env, alice):
    search(alice, "search_ring", "logistic", "s_alice_deploy", LR, epochs=1)
    with connect(roles_env, ROLES_ENV_BOB) as bob:
        e = error_of(bob, f"SELECT corgipile_deploy('{ROLES_ENV_ALICE}.s_alice_deploy', 'best')")
        assert e is not None and e.sqlstate in ("42704", "42501"), describe(e)


# =============================================================================================
# 6. k-fold cross-validation in the same pass


def test_folds_store_the_model_of_every_row_with_its_cross_validation(tconn):
    m = train(tconn, "search_ring", "logistic", {"epochs": 3, "folds": 5}, defaults=QUIET)
    cv = scalar(tconn, "SELECT metrics->'cv' FROM corgipile.models WHERE id = %s", (m,))
    assert cv["folds"] == 5 and len(cv["per_fold"]) == 5
    rows = [f["rows"] for f in cv["per_fold"]]
    # Every row is scored once, by the fold model that never trained on it.
    assert sum(rows) == 6000 and min(rows) > 900, rows
    accuracies = [f["accuracy"] for f in cv["per_fold"]]
    assert abs(cv["accuracy"] - sum(accuracies) / 5) < 1e-12 and cv["accuracy_std"] >= 0
    assert 0.5 < cv["accuracy"] < 1
    # The stored model is the one training alone on every row gives, bit for bit.
    params = scalar(tconn, "SELECT params FROM corgipile.models WHERE id = %s", (m,))
    assert params["folds"] == 5
    twin = train(tconn, "search_ring", "logistic", {**params, "folds": None}, defaults={})
    assert weights(tconn, twin) == weights(tconn, m)


def test_folds_rank_a_search_by_the_mean_of_its_folds(tconn):
    best = search(tconn, "search_reg", "linear", "s_cv", {"learning_rate": [0.00001, 0.01]}, epochs=2, folds=3)
    rows = trials(tconn, "s_cv")
    assert len(rows) == 2 and rows[-1][0] == best and rows[-1][7]
    for r in rows:
        cv = scalar(tconn, "SELECT metrics->'cv' FROM corgipile.models WHERE id = %s", (r[0],))
        assert r[6] == cv["r2"], (r, cv)
        assert r[9] is None and r[10] is None, "no validation split with folds"
    assert rows[-1][6] == max(r[6] for r in rows)
    assert rows[-1][4] == {"learning_rate": 0.01}


def test_folds_of_networks_and_of_a_column_list(tconn):
    m = train(tconn, "search_ring", "mlp", {"epochs": 2, "folds": 3, "hidden": [8]}, defaults=QUIET)
    cv = scalar(tconn, "SELECT metrics->'cv' FROM corgipile.models WHERE id = %s", (m,))
    assert sum(f["rows"] for f in cv["per_fold"]) == 6000 and cv["accuracy"] > 0.5


def test_folds_share_max_model_memory(tables):
    with connect(tables) as su:
        su.execute("SET corgipile.max_model_memory = '1MB'")
        e = train_error(su, "search_ring", "mlp", {"hidden": [128, 128], "epochs": 1, "folds": 5})
        assert e is not None and e.sqlstate == "54000", describe(e)
        assert "6 models" in e.diag.message_primary, describe(e)


def test_explain_names_the_folds(tconn):
    lines = "\n".join(r[0] for r in tconn.execute(
        "SELECT * FROM corgipile_explain('search_ring', 'logistic', %s)", (Jsonb({"folds": 4}),)).fetchall())
    assert "Folds: 4" in lines, lines
