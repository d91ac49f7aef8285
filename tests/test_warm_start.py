"""Warm starts: `"warm_start": <name or id>` continues a stored model instead of starting from
zeros.

What a user depends on:
* the training starts from the stored model's function, exactly: with a vanishing learning
  rate, the model stored is the one it started from (to 1e-6), whatever the features (an
  array standardized by a new statistics pass, a column list with its stored preprocessing,
  sparse pairs), the kind (svm, logistic with text labels, softmax, linear) and with workers;
* with an ordinary learning rate it goes on learning: its first epoch's loss is near where the
  stored model ended, far below a training from zeros;
* the result is the next version of the model's name, and records the id it started from;
* a model of another kind, other features, a family of group models, rows of another width,
  or a missing column are ERRORs before any model is stored (a softmax model meeting a new
  class grows an output for it, from zeros); a table rewritten by VACUUM FULL or emptied
  behaves as for any training;
* networks and factorization machines continue alike: the same layers, activation or factors
  (taken from the stored model when the params give none; others are an ERROR 22023 before
  any row is read), predictions equal to the stored model's with a vanishing step, a training
  loss no worse after a few more epochs, `since` on an appended table, and a column list's
  stored preprocessing kept.
"""

import psycopg
import pytest

from psycopg.types.json import Jsonb

from helpers import (connect, describe, models_count, rows_trained, scalar, train, train_error,
                     train_with_workers)
from tables import replicate

ROWS = 4000
TINY = 1e-12
# Adam's step is about the learning rate whatever the gradient: a network's or machine's
# vanishing step must vanish against 1e-9 over an epoch's batches.
TINY_ADAM = 1e-16


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        admin.execute(f"""CREATE TABLE ws AS SELECT i AS id,
                ARRAY[(i % 2) * 2 - 1 + ((i * 37) % 100) / 50.0, ((i * 53) % 100) * 3.0 + 100]::float8[] AS features,
                (i % 2) AS label, CASE WHEN i % 2 = 1 THEN 'yes' ELSE 'no' END AS answer,
                i % 3 AS class3, ((i * 37) % 100) / 10.0 AS x, (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS color,
                (i % 3) * 2.5 + ((i * 53) % 100) / 100.0 AS target,
                ARRAY[1 + i % 5, 7]::int4[] AS idx, ARRAY[(i % 2) * 2 - 1.0, 0.5]::float8[] AS val
            FROM generate_series(1, {ROWS}) i""")
    yield db


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def model_values(c, model):
    return c.execute("SELECT weights, bias FROM corgipile.models WHERE id = %s", (model,)).fetchone()


def assert_same_function(c, a, b, rel=1e-6):
    (wa, ba), (wb, bb) = model_values(c, a), model_values(c, b)
    assert len(wa) == len(wb) and len(ba) == len(bb)
    for x, y in zip(wa + ba, wb + bb):
        assert abs(x - y) <= rel * max(1.0, abs(x)), f"model {b} moved away from model {a}: {wa + ba} vs {wb + bb}"


CASES = [
    ("array, normalized", "logistic", {"features": "features"}),
    ("array, not normalized", "svm", {"features": "features", "normalize": False}),
    ("text labels", "logistic", {"features": "features", "label": "answer"}),
    ("column list", "logistic", {"features": ["x", "color"]}),
    ("softmax", "softmax", {"features": ["x", "color"], "label": "class3"}),
    ("linear", "linear", {"features": ["x", "color"], "label": "target"}),
    ("sparse", "svm", {"features": {"indices": "idx", "values": "val"}}),
]


@pytest.mark.parametrize("kind,params", [(k, p) for _, k, p in CASES], ids=[i for i, _, _ in CASES])
def test_warm_start_starts_from_the_stored_model(env, admin, kind, params):
    name = f"ws_{kind}_{abs(hash(str(params))) % 10000}"
    first = train(admin, "ws", kind, dict(params, epochs=3, seed=1, name=name))
    # A vanishing step: the model stored is the one it started from.
    again = train(admin, "ws", kind, {"epochs": 1, "seed": 2, "warm_start": name, "learning_rate": TINY,
                                      "average": False})
    assert_same_function(admin, first, again)
    version, started_from, features = admin.execute(
        "SELECT version, (params->>'warm_start')::bigint, features FROM corgipile.models WHERE id = %s",
        (again,)).fetchone()
    assert (version, started_from) == (2, first)
    assert features == scalar(admin, "SELECT features FROM corgipile.models WHERE id = %s", (first,))


def test_warm_start_with_workers(env, admin):
    admin.execute("DROP TABLE IF EXISTS ws_big")
    replicate(admin, "ws_big", "ws", 10)
    first = train(admin, "ws_big", "logistic", {"epochs": 2, "seed": 1, "name": "ws_workers"})
    again = train_with_workers(admin, "ws_big", "logistic", {"epochs": 1, "seed": 2, "warm_start": first,
                                                             "workers": 1, "learning_rate": TINY, "average": False})
    assert_same_function(admin, first, again)
    assert scalar(admin, "SELECT name FROM corgipile.models WHERE id = %s", (again,)) == "ws_workers"


def test_warm_start_goes_on_learning(env, admin):
    params = {"features": ["x", "color"], "label": "class3", "seed": 5, "learning_rate": 0.002}
    cold = train(admin, "ws", "softmax", dict(params, epochs=4, name="ws_learning"))
    warm = train(admin, "ws", "softmax", dict(params, epochs=1, warm_start="ws_learning"))
    losses = dict(admin.execute("""SELECT model_id, array_agg(loss ORDER BY epoch) FROM corgipile.epochs
                                   WHERE model_id IN (%s, %s) GROUP BY model_id""", (cold, warm)).fetchall())
    # Where the stored model ended, not where a training from zeros begins.
    assert losses[cold][-1] < losses[cold][0], losses
    assert losses[warm][0] < losses[cold][0], losses
    assert losses[warm][0] < losses[cold][1], losses


def test_refusals_store_nothing(env, admin):
    base = train(admin, "ws", "logistic", {"features": ["x", "color"], "epochs": 1, "seed": 1, "name": "ws_ref"})
    admin.execute("DROP TABLE IF EXISTS ws_other")
    admin.execute("""CREATE TABLE ws_other AS SELECT id, x, label, class3,
                            ARRAY[1.0, 2.0, 3.0]::float8[] AS features FROM ws""")
    cases = [
        ({"warm_start": "ws_ref"}, "svm", "22023"),                                 # another kind
        ({"warm_start": "ws_ref", "features": ["x"]}, "logistic", "22023"),        # other features
        ({"warm_start": "ws_ref", "folds": 3}, "logistic", "0A000"),            # not yet: one table
        ({"warm_start": "ws_ref", "validation": {"relation": "ws"}}, "logistic", "0A000"),
        ({"warm_start": 2 ** 40}, "logistic", None),                                # no such model
        ({"warm_start": ""}, "logistic", "22023"),
        ({"warm_start": [1]}, "logistic", "22023"),
    ]
    for params, kind, code in cases:
        before = models_count(admin)
        e = train_error(admin, "ws", kind, dict(params, epochs=1))
        assert e is not None and not e.sqlstate.startswith("XX"), f"{params}: {describe(e)}"
        if code:
            assert e.sqlstate == code, f"{params}: {describe(e)}"
        assert models_count(admin) == before
    # The relation lacks a column of the model (color): the column is named.
    e = train_error(admin, "ws_other", "logistic", {"warm_start": base, "epochs": 1})
    assert e is not None and e.sqlstate == "42703" and "color" in e.diag.message_primary, describe(e)
    # Rows of another width than the model's.
    arr = train(admin, "ws", "logistic", {"features": "features", "epochs": 1, "seed": 1})
    e = train_error(admin, "ws_other", "logistic", {"warm_start": arr, "epochs": 1})
    assert e is not None and e.sqlstate == "42804" and "features" in e.diag.message_primary, describe(e)
    # A class the softmax model never saw gets outputs of its own, from zeros.
    two = train(admin, "ws", "softmax", {"features": ["x"], "label": "class3", "epochs": 1, "seed": 1,
                                          "where": "class3 < 2"})
    three = train(admin, "ws", "softmax", {"warm_start": two, "epochs": 1})
    assert scalar(admin, "SELECT n_outputs FROM corgipile.models WHERE id = %s", (three,)) == 3
    # A family of group models.
    fam = train(admin, "ws", "logistic", {"features": ["x"], "epochs": 1, "seed": 1, "group_by": "color",
                                          "name": "ws_family", "min_group_rows": 10})
    e = train_error(admin, "ws", "logistic", {"warm_start": fam, "epochs": 1})
    assert e is not None and e.sqlstate == "0A000", describe(e)


def test_rewritten_and_emptied_tables(env, admin):
    admin.execute("DROP TABLE IF EXISTS ws_copy")
    admin.execute("CREATE TABLE ws_copy AS SELECT * FROM ws")
    first = train(admin, "ws_copy", "logistic", {"features": ["x", "color"], "epochs": 2, "seed": 1, "name": "ws_copy"})
    admin.execute("DELETE FROM ws_copy WHERE id % 2 = 0 AND id > 100")
    admin.execute("VACUUM FULL ws_copy")
    again = train(admin, "ws_copy", "logistic", {"warm_start": "ws_copy", "epochs": 1, "seed": 1})
    assert scalar(admin, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (again,)) == \
        scalar(admin, "SELECT count(*) FROM ws_copy")
    assert again > first
    admin.execute("TRUNCATE ws_copy")
    e = train_error(admin, "ws_copy", "logistic", {"warm_start": "ws_copy", "epochs": 1})
    assert e is not None and e.sqlstate == "P0002", describe(e)


def test_explain_plans_and_runs_the_warm_start(env, admin):
    """corgipile_explain reads a warm start (and "since") as training does: the model's label
    and features where the params are silent, and with "analyze" it trains from the model."""
    params = {"features": ["x", "color"], "label": "class3", "seed": 5, "learning_rate": 0.002}
    cold = train(admin, "ws", "softmax", dict(params, epochs=4, name="ws_explained"))
    first_loss = scalar(admin, "SELECT loss FROM corgipile.epochs WHERE model_id = %s AND epoch = 1", (cold,))
    models = models_count(admin)
    lines = [r[0] for r in admin.execute(
        """SELECT * FROM corgipile_explain('ws', 'softmax', '{"warm_start": "ws_explained", "epochs": 1,
               "seed": 6, "learning_rate": 0.002}', "analyze" => true)""").fetchall()]
    encoded = next(int(line.split(":")[1]) for line in lines if "Encoded Features:" in line)
    final = next(float(line.split(":")[1]) for line in lines if "Final Loss:" in line)
    assert f"Warm Start: from model {cold}" in [line.strip() for line in lines], lines
    # The model's columns (x and three colors), not the default "features" array of width 2.
    assert encoded == 4, lines
    # Where the stored model ended, not where a training from zeros begins.
    assert final < first_loss / 2, (final, first_loss)
    assert models_count(admin) == models  # nothing stored
    # A warm start of another kind is refused by explain as by training.
    with pytest.raises(psycopg.Error) as refused:
        admin.execute("""SELECT * FROM corgipile_explain('ws', 'svm', '{"warm_start": "ws_explained"}')""")
    assert refused.value.sqlstate == "22023", refused.value


# Networks and factorization machines: (kind, params of the stored model, how to read a row's
# prediction). Classifiers compare every class probability, regressions the value.
FAMILIES = [
    ("mlp, array", "mlp", {"features": "features", "label": "class3", "hidden": [8, 4]}),
    ("mlp, column list", "mlp", {"features": ["x", "color"], "label": "class3", "hidden": [6],
                                 "activation": "tanh"}),
    ("mlp_regression", "mlp_regression", {"features": ["x", "color"], "label": "target", "hidden": [5]}),
    ("fm, array", "fm", {"features": "features", "label": "class3", "factors": 3}),
    ("fm_regression, column list", "fm_regression", {"features": ["x", "color"], "label": "target",
                                                     "factors": 2}),
    ("fm, sgd", "fm", {"features": ["x", "color"], "label": "answer", "optimizer": "sgd"}),
]


def predictions(c, model, table="ws"):
    """Every row's prediction by `model`, in id order: class probabilities, or the value."""
    kind, features = c.execute("SELECT model_type, features FROM corgipile.models WHERE id = %s", (model,)).fetchone()
    row = f"t.{features}" if isinstance(features, str) else "t"  # an array column, or a column list
    call = f"corgipile_predict_proba(%s, {row})" if kind in ("mlp", "fm") else f"ARRAY[corgipile_predict(%s, {row})]"
    return [r[0] for r in c.execute(f"SELECT {call} FROM {table} t ORDER BY id", (model,)).fetchall()]


def assert_same_predictions(c, a, b, table="ws", tol=1e-9):
    pa, pb = predictions(c, a, table), predictions(c, b, table)
    assert len(pa) == len(pb) > 0
    worst = max(abs(x - y) / max(1.0, abs(x)) for ra, rb in zip(pa, pb) for x, y in zip(ra, rb))
    assert worst <= tol, f"model {b} predicts up to {worst} away from model {a}"


def shape_of(c, model):
    """What a warm start keeps: the layers, shape params, the stored preprocessing (but for its
    profile of the predictions, each model's own) and classes."""
    return c.execute("""SELECT layers, params->'hidden', params->'activation', params->'factors',
                               preprocessing #- '{profile,predictions}', label_mapping
                        FROM corgipile.models WHERE id = %s""", (model,)).fetchone()


@pytest.mark.parametrize("kind,params", [(k, p) for _, k, p in FAMILIES], ids=[i for i, _, _ in FAMILIES])
def test_a_network_or_fm_starts_from_the_stored_model(env, admin, kind, params):
    name = f"wsn_{kind}_{abs(hash(str(params))) % 10000}"
    first = train(admin, "ws", kind, dict(params, epochs=3, seed=1, name=name))
    # The shape params left out: the stored model's are taken (not the defaults).
    again = train(admin, "ws", kind, {"epochs": 1, "seed": 2, "warm_start": name, "learning_rate": TINY_ADAM})
    assert_same_predictions(admin, first, again)
    assert shape_of(admin, again) == shape_of(admin, first)
    version, started_from, features = admin.execute(
        "SELECT version, (params->>'warm_start')::bigint, features FROM corgipile.models WHERE id = %s",
        (again,)).fetchone()
    assert (version, started_from) == (2, first)
    assert features == scalar(admin, "SELECT features FROM corgipile.models WHERE id = %s", (first,))
    # No early stopping by default when continuing: the epochs asked for, no rows held out.
    assert scalar(admin, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (again,)) == 1
    assert scalar(admin, "SELECT params->'validation' FROM corgipile.models WHERE id = %s", (again,)) is None


@pytest.mark.parametrize("kind,params", [
    ("mlp_regression", {"features": ["x", "color"], "label": "target", "hidden": [5]}),
    ("fm", {"features": "features", "label": "class3", "factors": 2}),
], ids=["mlp_regression", "fm"])
def test_a_network_or_fm_warm_start_with_workers(env, admin, kind, params):
    """Every process starts from the stored model (the leader sends it to its workers)."""
    admin.execute("DROP TABLE IF EXISTS ws_big")
    replicate(admin, "ws_big", "ws", 10)
    name = f"wsw_{kind}"
    first = train(admin, "ws_big", kind, dict(params, epochs=2, seed=1, name=name))
    again = train_with_workers(admin, "ws_big", kind, {"epochs": 1, "seed": 2, "warm_start": first, "workers": 1,
                                                       "learning_rate": TINY_ADAM})
    assert_same_predictions(admin, first, again, "ws", tol=1e-8)
    assert scalar(admin, "SELECT name FROM corgipile.models WHERE id = %s", (again,)) == name


def test_a_column_list_network_keeps_its_stored_preprocessing(env, admin):
    """Continued on rows whose columns look otherwise (two colors, x shifted): the stored
    categories, means and scales still encode them, so the model is the stored one's function."""
    admin.execute("DROP TABLE IF EXISTS ws_shifted")
    admin.execute("CREATE TABLE ws_shifted AS SELECT id, x * 3 + 40 AS x, color, class3 FROM ws WHERE color <> 'blue'")
    first = train(admin, "ws", "mlp", {"features": ["x", "color"], "label": "class3", "hidden": [6], "epochs": 3,
                                      "seed": 1, "name": "ws_pre"})
    again = train(admin, "ws_shifted", "mlp", {"warm_start": "ws_pre", "epochs": 1, "seed": 2,
                                               "learning_rate": TINY_ADAM})
    assert shape_of(admin, again) == shape_of(admin, first)
    assert_same_predictions(admin, first, again)
    # Its predictions' profile is its own, from the rows it continued on (none blue).
    predictions = [admin.execute("SELECT preprocessing->'profile'->'predictions' FROM corgipile.models WHERE id = %s",
                                 (m,)).fetchone()[0] for m in (first, again)]
    shifted = admin.execute("SELECT count(*) FROM ws_shifted").fetchone()[0]
    assert predictions[1] != predictions[0] and 0 < predictions[1]["rows"] <= shifted
    # A training of its own on those rows would have learned another preprocessing.
    own = train(admin, "ws_shifted", "mlp", {"features": ["x", "color"], "label": "class3", "hidden": [6],
                                             "epochs": 1, "seed": 1})
    assert shape_of(admin, own)[4] != shape_of(admin, first)[4]


LEARNING = [
    ("mlp", "mlp", {"features": ["x", "color"], "label": "class3", "hidden": [6]}),
    ("mlp_regression", "mlp_regression", {"features": ["x", "color"], "label": "target", "hidden": [5]}),
    ("fm", "fm", {"features": "features", "label": "label", "factors": 3}),
    ("fm_regression", "fm_regression", {"features": ["x", "color"], "label": "target", "factors": 2}),
]


@pytest.mark.parametrize("kind,params", [(k, p) for _, k, p in LEARNING], ids=[i for i, _, _ in LEARNING])
def test_a_network_or_fm_goes_on_learning(env, admin, kind, params):
    """A few more epochs from the stored model: the loss on the training rows is not worse."""
    name = f"wsl_{kind}_{abs(hash(str(params))) % 10000}"
    first = train(admin, "ws", kind, dict(params, epochs=3, seed=1, name=name))
    more = train(admin, "ws", kind, {"epochs": 3, "seed": 2, "warm_start": name})
    key = "mse" if kind.endswith("regression") else "log_loss"
    loss = {m: scalar(admin, "SELECT (corgipile_evaluate(%s, 'ws') ->> %s)::float8", (m, key)) for m in (first, more)}
    assert loss[more] <= loss[first], loss
    # Where the stored model ended, not where a training from zeros begins.
    epochs = dict(admin.execute("""SELECT model_id, array_agg(loss ORDER BY epoch) FROM corgipile.epochs
                                   WHERE model_id IN (%s, %s) GROUP BY model_id""", (first, more)).fetchall())
    assert epochs[more][0] < epochs[first][0], epochs


@pytest.mark.parametrize("kind,params", [
    ("mlp", {"label": "label", "hidden": [4]}),
    ("fm", {"label": "label", "factors": 2}),
], ids=["mlp", "fm"])
def test_since_continues_a_network_or_fm_on_the_rows_added(env, admin, kind, params):
    table = f"wsi_{kind}"
    admin.execute(f"DROP TABLE IF EXISTS {table}")
    admin.execute(f"CREATE TABLE {table} AS SELECT id, x, color, label FROM ws WHERE id <= 3000")
    first = train(admin, table, kind, dict(params, features=["x", "color"], epochs=2, seed=1, name=table))
    # The pages the model read: up to its last page in use (a CREATE TABLE AS on 16+ leaves
    # empty pages after it, where the rows appended go first).
    pages = scalar(admin, "SELECT (metrics->'read'->>'pages')::int FROM corgipile.models WHERE id = %s", (first,))
    admin.execute(f"INSERT INTO {table} SELECT id, x, color, label FROM ws WHERE id > 3000")
    expected = scalar(admin, f"SELECT count(*) FROM {table} WHERE ctid >= '({pages - 1},0)'::tid")
    assert expected >= 1000
    # A vanishing step: the model of the added rows is the stored one.
    second = train(admin, table, kind, {"since": table, "replay": 0, "epochs": 1, "seed": 2,
                                        "learning_rate": TINY_ADAM})
    assert rows_trained(admin, second) == expected
    version, started_from, since = admin.execute(
        "SELECT version, (params->>'warm_start')::bigint, params->>'since' FROM corgipile.models WHERE id = %s",
        (second,)).fetchone()
    assert (version, started_from, since) == (2, first, table)
    assert_same_predictions(admin, first, second, table)
    # And learning on them: from the stored model, with an ordinary step.
    third = train(admin, table, kind, {"since": table, "replay": 0, "epochs": 2, "seed": 2})
    assert rows_trained(admin, third) > 0
    assert shape_of(admin, third) == shape_of(admin, first)


def test_another_shape_is_refused_before_any_row_is_read(env, admin):
    mlp = train(admin, "ws", "mlp", {"features": ["x"], "label": "class3", "epochs": 1, "seed": 1, "hidden": [4]})
    fm = train(admin, "ws", "fm", {"features": ["x"], "label": "class3", "epochs": 1, "seed": 1, "factors": 2})
    cases = [
        ("mlp", mlp, {"hidden": [5]}, "hidden"),
        ("mlp", mlp, {"hidden": [4, 4]}, "hidden"),
        ("mlp", mlp, {"activation": "tanh"}, "activation"),
        ("fm", fm, {"factors": 3}, "factors"),
        ("mlp", mlp, {"search": {"hidden": [[4], [8]]}, "name": "wsn_search"}, "hidden"),
    ]
    for kind, model, params, key in cases:
        before = models_count(admin)
        e = train_error(admin, "ws", kind, dict(params, warm_start=model, epochs=1))
        assert e is not None and e.sqlstate == "22023", f"{params}: {describe(e)}"
        assert f'"{key}"' in e.diag.message_primary and e.diag.message_hint, describe(e)
        assert models_count(admin) == before
        # A plain EXPLAIN reads no row, and refuses it alike.
        with pytest.raises(psycopg.Error) as refused:
            admin.execute("SELECT * FROM corgipile_explain('ws', %s, %s)",
                          (kind, Jsonb(dict(params, warm_start=model, epochs=1))))
        assert refused.value.sqlstate == "22023", refused.value
    # The same shape, given: it trains.
    assert train(admin, "ws", "mlp", {"warm_start": mlp, "hidden": [4], "activation": "relu", "epochs": 1}) > mlp
    # A class the network never saw: its rows do not fit the stored output layer.
    two = train(admin, "ws", "mlp", {"features": ["x"], "label": "class3", "epochs": 1, "seed": 1, "hidden": [3],
                                     "where": "class3 < 2"})
    e = train_error(admin, "ws", "mlp", {"warm_start": two, "epochs": 1})
    assert e is not None and e.sqlstate == "42804", describe(e)
