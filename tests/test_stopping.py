"""Defaults that train enough: networks and factorization machines hold out 10% of the rows and
stop on them ("patience": "auto", at most 200 epochs), keeping the best epoch's model, unless the
call says how long to train or what to validate on. Checked as a user sees them: the stored
params and metrics, the rows trained, the NOTICE that says when and why, EXPLAIN, and that
giving `epochs` keeps the old behaviour exactly.

Tables are st_* in the shared database (dropped at the end of the module).
"""

import psycopg
import pytest
from psycopg.types.json import Jsonb

import tables
from helpers import describe, error_of, evaluate, explain, scalar, train

ROWS = 3000


@pytest.fixture(scope="module", autouse=True)
def st_tables(dsn):
    conn = psycopg.connect(dsn, autocommit=True)
    # Two classes separated by a ring (a network learns it; a line cannot), 20% of the labels
    # flipped, 3,000 rows; and a number to regress, with noise: the validation loss levels off.
    tables.create(conn, "st_ring",
                  "SELECT i AS id, ARRAY[x, y] AS features, "
                  "((x * x + y * y < 0.5) <> ((i * 0.3819660113) % 1 < 0.2))::int AS label, "
                  "x * y + x + ((i * 0.5698402910) % 1) AS target FROM (SELECT i, ((i * 0.6180339887) % 1)::float8 * 2 - 1 AS x, "
                  f"((i * 0.7548776662) % 1)::float8 * 2 - 1 AS y FROM generate_series(1, {ROWS}) i) p",
                  replace=True)
    yield
    conn.execute("DROP TABLE IF EXISTS st_ring")
    conn.close()


def stored(conn, model):
    return conn.execute(
        "SELECT params, metrics, rows_trained FROM corgipile.models WHERE id = %s", (model,)).fetchone()


@pytest.mark.parametrize("kind, label", [("mlp", "label"), ("mlp_regression", "target"),
                                         ("fm", "label"), ("fm_regression", "target")])
def test_a_network_or_machine_stops_on_held_out_rows_by_default(conn, kind, label):
    m = train(conn, "st_ring", kind, {"label": label, "seed": 1})
    params, metrics, rows = stored(conn, m)
    assert params["epochs"] == 200 and params["patience"] == "auto", params
    assert params["validation"] == {"fraction": 0.1}, params
    # About 90% of the rows trained (a hash picks the held-out 10%), fewer epochs than the cap,
    # and the best epoch's model kept, its epoch at least 2 (patience "auto": 10 epochs here)
    # before the last.
    assert 0.85 * ROWS < rows < 0.95 * ROWS, rows
    run, best = metrics["epochs_run"], metrics["best_epoch"]
    assert best is not None and run < 200 and run - best >= 2, metrics


def test_giving_epochs_keeps_what_was_given(conn):
    m = train(conn, "st_ring", "mlp", {"seed": 1, "epochs": 4})
    params, metrics, rows = stored(conn, m)
    assert (params["epochs"], params["patience"], params["validation"]) == (4, None, None)
    assert rows == ROWS and metrics["epochs_run"] == 4
    # Any of validation or patience keeps what was said too.
    m = train(conn, "st_ring", "mlp", {"seed": 1, "validation": {"fraction": 0.2}})
    params, _, _ = stored(conn, m)
    assert (params["epochs"], params["patience"]) == (20, None), params
    # A linear model keeps its 20 epochs on every row.
    m = train(conn, "st_ring", "logistic", {"seed": 1})
    params, metrics, rows = stored(conn, m)
    assert (params["epochs"], params["patience"], rows) == (20, None, ROWS)


def test_it_trains_what_twenty_epochs_do_not(conn):
    """On the ring, stopping on held-out rows is at least as good as the old 20 epochs."""
    auto = train(conn, "st_ring", "mlp", {"seed": 3})
    fixed = train(conn, "st_ring", "mlp", {"seed": 3, "epochs": 20})
    a, f = (evaluate(conn, m, "st_ring")["accuracy"] for m in (auto, fixed))
    assert a >= f - 0.01, (a, f)
    assert stored(conn, auto)[1]["epochs_run"] > 20, stored(conn, auto)[1]


def test_the_notice_and_explain_say_when_and_why_it_stopped(conn):
    notices = []

    def keep(d):
        notices.append(d.message_primary)

    conn.add_notice_handler(keep)
    try:
        train(conn, "st_ring", "mlp", {"seed": 1, "verbose": True}, defaults={})
    finally:
        conn.remove_notice_handler(keep)
    stops = [n for n in notices if n.startswith("stopped after epoch")]
    assert len(stops) == 1, notices[-5:]
    assert "the validation loss did not improve for" in stops[0] and "is kept" in stops[0], stops
    plan = explain(conn, "st_ring", "mlp", {"seed": 1})
    assert any(line.strip().startswith("Patience: auto") for line in plan), plan
    assert any('Validation: {"fraction":0.1}' in line for line in plan), plan
    analyzed = explain(conn, "st_ring", "mlp", {"seed": 1}, analyze=True)
    assert any(line.strip().startswith("Stopped Early: no lower validation loss for")
               for line in analyzed), analyzed
    # Told the epochs, nothing of the kind.
    plan = explain(conn, "st_ring", "mlp", {"seed": 1, "epochs": 3})
    assert not any(line.strip().startswith("Patience") for line in plan), plan


def test_auto_patience_is_a_param_any_kind_may_ask_for(conn):
    m = train(conn, "st_ring", "logistic",
              {"seed": 1, "validation": {"fraction": 0.1}, "patience": "auto", "epochs": 50})
    params, metrics, _ = stored(conn, m)
    assert params["patience"] == "auto" and metrics["epochs_run"] <= 50
    for bad in ("soon", -1, 0, 1.5, True):
        e = error_of(conn, "SELECT corgipile_train('st_ring', 'mlp', %s)",
                     (Jsonb({"patience": bad, "validation": {"fraction": 0.1}}),))
        assert isinstance(e, psycopg.Error) and e.sqlstate == "22023", describe(e)
    e = error_of(conn, "SELECT corgipile_train('st_ring', 'mlp', %s)", (Jsonb({"patience": "auto"}),))
    assert e.sqlstate == "22023" and "needs \"validation\"" in e.diag.message_primary, describe(e)


def test_the_same_seed_stops_at_the_same_epoch_with_the_same_model(conn):
    a = train(conn, "st_ring", "mlp", {"seed": 5})
    b = train(conn, "st_ring", "mlp", {"seed": 5})
    ma, mb = stored(conn, a)[1], stored(conn, b)[1]
    assert (ma["epochs_run"], ma["best_epoch"]) == (mb["epochs_run"], mb["best_epoch"])
    same = scalar(conn, "SELECT a.weights = b.weights FROM corgipile.models a, corgipile.models b "
                        "WHERE a.id = %s AND b.id = %s", (a, b))
    assert same


def test_a_network_shuffles_at_least_sixteen_megabytes_of_a_table(conn):
    """A network's default buffer on a small table is all of it, stored in its params (so that
    training again with them reads the same buffers); a linear model keeps 10%; a given size
    is kept; a search with a network among its kinds gives every configuration the bigger one."""
    m = train(conn, "st_ring", "mlp", {"seed": 1, "epochs": 2})
    assert stored(conn, m)[0]["buffer_size"] == "100%"
    plan = explain(conn, "st_ring", "mlp", {"seed": 1, "epochs": 2})
    assert any(line.strip() == "Buffer Size: 100% of table" for line in plan), plan
    m = train(conn, "st_ring", "logistic", {"seed": 1, "epochs": 2})
    assert stored(conn, m)[0]["buffer_size"] == "10%"
    m = train(conn, "st_ring", "mlp", {"seed": 1, "epochs": 2, "buffer_size": "20%"})
    assert stored(conn, m)[0]["buffer_size"] == "20%"
    conn.execute("SELECT corgipile_train('st_ring', 'linear', %s)",
                 (Jsonb({"label": "target", "seed": 1, "epochs": 2, "verbose": False, "name": "st_kinds",
                         "search": {"model": ["linear", "mlp_regression"]}}),))
    sizes = {r[0] for r in conn.execute(
        "SELECT params->>'buffer_size' FROM corgipile.models WHERE name = 'st_kinds'")}
    assert sizes == {"100%"}, sizes


def test_a_big_table_holds_out_at_most_twenty_thousand_rows_by_default(conn):
    """10% of a big table's rows would not fit in memory encoded (piecewise-linear columns take
    about 1.8 kB a row): the default split holds out 20,000 rows by the planner's estimate, and
    stores the fraction it used. A fraction the call gives is kept."""
    conn.execute("DROP TABLE IF EXISTS st_big")
    conn.execute("CREATE TABLE st_big AS SELECT * FROM st_ring")
    conn.execute("ANALYZE st_big")
    plan = explain(conn, "st_big", "mlp", {"seed": 1})
    assert any('Validation: {"fraction":0.1}' in line for line in plan), plan  # 300 of 3,000 rows
    # What the planner believes of a table of 10 million rows (as ANALYZE would store it).
    conn.execute("UPDATE pg_class SET reltuples = 1e7 WHERE oid = 'st_big'::regclass")
    plan = explain(conn, "st_big", "mlp", {"seed": 1})
    assert any('Validation: {"fraction":0.002}' in line for line in plan), plan
    m = train(conn, "st_big", "mlp", {"seed": 1, "hidden": [4]}, defaults={"verbose": False})
    params, metrics, _ = stored(conn, m)
    assert params["validation"] == {"fraction": 0.002}, params
    # 0.2% of the 3,000 rows read are held out.
    assert 0 < metrics["validation"]["rows"] < 30, metrics
    plan = explain(conn, "st_big", "mlp", {"seed": 1, "validation": {"fraction": 0.1}, "patience": "auto"})
    assert any('Validation: {"fraction":0.1}' in line for line in plan), plan
    conn.execute("DROP TABLE st_big")
