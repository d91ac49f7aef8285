"""The deploy gate ("deploy": "if_better") and validation relations on a sharded table.

Harness: test_shards.py's two shard servers (PGPORT+100, PGPORT+101, started and destroyed by its
`shards` fixture, imported here). shg_pts is hash-partitioned by id three ways: two postgres_fdw
partitions (one on each shard server) and a local one; its rows are test_gate.py's (x is
informative: label = x > 0, y = 3x + a little noise; noise is not). Everything is trained by an
ordinary role, shg_alice, whose user mappings (user postgres, password_required 'false', set by
the superuser) reach the shards.

Checked here:
- The gate on shards, both ways: the first version is deployed and scored; a clear winner (x)
  replaces a clear loser (noise), another loser is stored but not deployed (the winner stays,
  pinned); the history rows say so. Each version reads other columns (another preprocessing):
  both scores equal corgipile_evaluate of each version on the held-out rows (a predicate: its
  rows, evaluated on the sharded table with "where"), and the rows are the predicate's count.
  With a fraction: the gate's score of the new version is its stored validation score (the same
  rows, kept by id on every shard). A regression is gated by R².
- A validation relation on shards: every epoch's combined model is scored on it; patience stops
  on it and keeps the best epoch (whose score is corgipile_evaluate's on the relation); with
  patience off the last epoch's score is corgipile_evaluate's of the stored model; the gate with
  a validation relation scores both versions on the relation's rows.
- Refused before any work: a gated network without `validation` (its default holds out no rows
  on shards), 22023; a deployed family of per-group models (it cannot score a sharded table
  yet), 0A000; a validation relation that does not exist, 42P01.
- Forged requests of the new protocol fields are refused by the shard (08P01): held-out ids kept
  outside a training round, held-out rows scored outside an evaluation or with no training
  number, held-out rows of a training this backend never kept."""

import json

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import evaluate, scalar, train
import test_shards
from test_shards import PROTOCOL, S1, S2, on_shard, shard_dsn, sharded_table, version

pytestmark = pytest.mark.own_cluster  # test_shards.py's shard servers
shards = test_shards.shards  # its fixture: the two shard servers, foreign servers S1 and S2

ROLE = "shg_alice"
ROWS = 6000
PREDICATE = "id % 4 = 0"
BASE = {"label": "label", "epochs": 3, "seed": 7, "verbose": False}
GATE = {**BASE, "validation": {"predicate": PREDICATE}, "deploy": "if_better"}
GOOD, BAD = {"features": ["x"]}, {"features": ["noise"]}
COLUMNS = "id int, x float8, noise float8, label bool, y float8"


def rows_sql(start, rows):
    """test_gate.py's generator: x and noise pseudo-random in [-1, 1) and [0, 1) (fixed formulas)."""
    return f"""SELECT i AS id, x, noise, x > 0 AS label, 3 * x + 0.1 * (noise - 0.5) AS y
               FROM (SELECT i, ((i::bigint * 2654435761) % 100003) / 50001.5 - 1 AS x,
                            ((i::bigint * 40503) % 9973) / 9973.0 AS noise
                     FROM generate_series({start}, {start + rows - 1}) i) g"""


@pytest.fixture(scope="module")
def env(dsn, shards):
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS shg_part", f"CREATE TABLE shg_part ({COLUMNS})")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {ROLE}")
        c.execute(f"CREATE ROLE {ROLE} LOGIN")
        sharded_table(c, "shg_pts", [("FOR VALUES WITH (MODULUS 3, REMAINDER 0)", S1, "shg_part"),
                                     ("FOR VALUES WITH (MODULUS 3, REMAINDER 1)", S2, "shg_part"),
                                     ("FOR VALUES WITH (MODULUS 3, REMAINDER 2)", None, None)],
                      cols=COLUMNS, by="HASH (id)")
        c.execute(f"INSERT INTO shg_pts {rows_sql(1, ROWS)}")
        c.execute("DROP TABLE IF EXISTS shg_val")
        c.execute(f"CREATE TABLE shg_val AS {rows_sql(ROWS + 1, 1500)}")
        c.execute(f"GRANT SELECT ON shg_pts, shg_val TO {ROLE}")
        for srv in (S1, S2):
            c.execute(f"GRANT USAGE ON FOREIGN SERVER {srv} TO {ROLE}")
            c.execute(f"CREATE USER MAPPING FOR {ROLE} SERVER {srv} "
                      "OPTIONS (user 'postgres', password_required 'false')")
    for i in (0, 1):
        on_shard(i, "VACUUM ANALYZE shg_part")
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM corgipile.deployments WHERE owner = %s", (ROLE,))
            c.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (ROLE,))
            for srv in (S1, S2):
                c.execute(f"DROP USER MAPPING IF EXISTS FOR {ROLE} SERVER {srv}")
            c.execute(f"DROP OWNED BY {ROLE}")
            c.execute(f"DROP ROLE {ROLE}")
            c.execute("DROP TABLE IF EXISTS shg_pts, shg_val, shg_local CASCADE")


@pytest.fixture
def alice(dsn, env):
    with psycopg.connect(dsn, user=ROLE, autocommit=True) as c:
        yield c


def history(c, name):
    """The name's rows of corgipile.deployments, oldest first."""
    return c.execute("""SELECT how, from_model, to_model, candidate, metric, new_score, old_score, held_out_rows
                        FROM corgipile.deployments WHERE name = %s AND owner = current_user
                        ORDER BY id""", (name,)).fetchall()


def deployed(c, name):
    return scalar(c, "SELECT id FROM corgipile.model_summary WHERE name = %s AND deployed AND trained_by = current_user",
                  (name,))


def pinned(c, name):
    return [r[0] for r in c.execute("SELECT id FROM corgipile.models WHERE name = %s AND pinned", (name,))]


def stored_validation(c, model_id, key="accuracy"):
    return c.execute("""SELECT (metrics->'validation'->>%s)::float8, (metrics->'validation'->>'rows')::bigint
                        FROM corgipile.models WHERE id = %s""", (key, model_id)).fetchone()


def held_out_score(c, model_id, metric="accuracy"):
    """corgipile_evaluate of a version on the held-out rows: the predicate's rows of the sharded table."""
    report = evaluate(c, model_id, "shg_pts", {"where": PREDICATE})
    assert report["rows_scored"] == ROWS // 4, report
    return report[metric]


def test_the_gate_on_a_sharded_table_both_ways(alice):
    c = alice
    v1 = train(c, "shg_pts", "logistic", {**GATE, **BAD, "name": "both"})
    assert deployed(c, "both") == v1 and pinned(c, "both") == []
    v2 = train(c, "shg_pts", "logistic", {**GATE, **GOOD, "name": "both"})
    assert deployed(c, "both") == v2 and pinned(c, "both") == []
    v3 = train(c, "shg_pts", "logistic", {**GATE, **BAD, "name": "both", "seed": 8})
    assert deployed(c, "both") == v2 and pinned(c, "both") == [v2]
    rows = history(c, "both")
    assert [r[:5] for r in rows] == [("gated", None, v1, v1, "accuracy"),
                                     ("gated", v1, v2, v2, "accuracy"),
                                     ("gated", v2, v2, v3, "accuracy")], rows
    assert all(r[7] == ROWS // 4 for r in rows), rows
    scores = {m: held_out_score(c, m) for m in (v1, v2, v3)}
    print(f"\nheld-out accuracy: v1 (noise) {scores[v1]:.4f}, v2 (x) {scores[v2]:.4f}, v3 (noise) {scores[v3]:.4f}")
    assert scores[v2] > 0.95 and max(scores[v1], scores[v3]) < 0.8, scores
    # Both versions' scores are corgipile_evaluate's on the held-out rows: the new one's
    # (its columns) and the deployed one's (other columns, another preprocessing).
    (_, _, _, _, _, new1, old1, _), (_, _, _, _, _, new2, old2, _), (_, _, _, _, _, new3, old3, _) = rows
    assert old1 is None and new1 == pytest.approx(scores[v1], abs=1e-9)
    assert (new2, old2) == (pytest.approx(scores[v2], abs=1e-9), pytest.approx(scores[v1], abs=1e-9)), rows
    assert (new3, old3) == (pytest.approx(scores[v3], abs=1e-9), pytest.approx(scores[v2], abs=1e-9)), rows
    # ... which is each new version's stored validation score: the same rows.
    for m, new in ((v1, new1), (v2, new2), (v3, new3)):
        assert stored_validation(c, m) == (pytest.approx(new, abs=1e-9), ROWS // 4), m


def test_a_fraction_is_gated_on_the_rows_every_shard_kept(alice):
    """A fraction's rows are a hash of each shard's tuple ids: the gate scores both versions on
    the ids every shard kept, and its score of the new version is the validation score of the
    rows the shards held out."""
    c = alice
    p = {**BASE, "validation": {"fraction": 0.25}, "deploy": "if_better", "name": "frac"}
    v1 = train(c, "shg_pts", "logistic", {**p, **BAD})
    v2 = train(c, "shg_pts", "logistic", {**p, **GOOD})
    assert deployed(c, "frac") == v2
    (_, _, _, _, _, new1, _, n1), (_, _, _, _, _, new2, old2, n2) = history(c, "frac")
    assert 0.2 * ROWS < n1 == n2 < 0.3 * ROWS, (n1, n2)
    assert stored_validation(c, v1) == (pytest.approx(new1, abs=1e-9), n1)
    assert stored_validation(c, v2) == (pytest.approx(new2, abs=1e-9), n2)
    assert new2 > 0.95 and old2 < 0.8, (new2, old2)


def test_a_regression_is_gated_by_r2_on_shards(alice):
    c = alice
    p = {**BASE, "label": "y", "validation": {"predicate": PREDICATE}, "deploy": "if_better", "name": "reg"}
    v1 = train(c, "shg_pts", "linear", {**p, **GOOD})
    v2 = train(c, "shg_pts", "linear", {**p, **BAD})
    assert deployed(c, "reg") == v1 and pinned(c, "reg") == [v1]
    (_, _, _, _, metric, _, _, _), (_, _, to, cand, _, new, old, n) = history(c, "reg")
    assert metric == "r2" and (to, cand, n) == (v1, v2, ROWS // 4)
    assert new == pytest.approx(held_out_score(c, v2, "r2"), abs=1e-9)
    assert old == pytest.approx(held_out_score(c, v1, "r2"), abs=1e-9)
    assert old > 0.9 and new < 0.2, (old, new)


def epochs_of(c, model_id):
    return c.execute("SELECT epoch, validation_loss, validation_accuracy FROM corgipile.epochs "
                     "WHERE model_id = %s ORDER BY epoch", (model_id,)).fetchall()


def test_a_validation_relation_scores_every_epoch_on_shards(alice):
    """Patience off: every epoch is scored on the relation, and the last epoch's score is
    corgipile_evaluate's of the stored model (the last epoch's) on the relation."""
    c = alice
    m = train(c, "shg_pts", "logistic", {**BASE, **GOOD, "validation": {"relation": "shg_val"}})
    epochs = epochs_of(c, m)
    assert [e[0] for e in epochs] == [1, 2, 3] and all(e[1] is not None for e in epochs), epochs
    report = evaluate(c, m, "shg_val")
    assert report["rows_scored"] == 1500
    assert epochs[-1][2] == pytest.approx(report["accuracy"], abs=1e-9), (epochs, report)
    assert stored_validation(c, m) == (pytest.approx(report["accuracy"], abs=1e-9), 1500)
    # The shards held out nothing: every row trained.
    assert scalar(c, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (m,)) == ROWS


def test_patience_on_a_validation_relation_keeps_the_best_epoch_on_shards(alice):
    """A learning rate too high makes the validation loss on the relation wander: the training
    stops after `patience` epochs without a lower one and keeps the best epoch's model, whose
    accuracy on the relation is that epoch's validation accuracy."""
    c = alice
    p = {**BASE, **GOOD, "epochs": 40, "seed": 3, "validation": {"relation": "shg_val"}, "patience": 1,
         "learning_rate": 5.0, "learning_rate_schedule": "constant", "average": False}
    m = train(c, "shg_pts", "svm", p)
    metrics = scalar(c, "SELECT metrics FROM corgipile.models WHERE id = %s", (m,))
    epochs = epochs_of(c, m)
    run, best = metrics["epochs_run"], metrics["best_epoch"]
    losses = [e[1] for e in epochs]
    print(f"\nvalidation losses on shg_val: {losses}; best epoch {best}")
    assert run < 40 and best is not None and run == len(epochs) == best + 1, (metrics, losses)
    assert best == 1 + losses.index(min(losses)), (best, losses)
    assert evaluate(c, m, "shg_val")["accuracy"] == pytest.approx(epochs[best - 1][2], abs=1e-9), epochs


def test_the_gate_with_a_validation_relation_on_shards(alice):
    c = alice
    p = {**BASE, "validation": {"relation": "shg_val"}, "deploy": "if_better", "name": "rel"}
    v1 = train(c, "shg_pts", "logistic", {**p, **GOOD})
    v2 = train(c, "shg_pts", "logistic", {**p, **BAD})
    assert deployed(c, "rel") == v1 and pinned(c, "rel") == [v1]
    (_, _, _, _, _, new1, _, n1), (_, _, to, cand, _, new2, old2, n2) = history(c, "rel")
    assert (to, cand, n1, n2) == (v1, v2, 1500, 1500)
    on_relation = {m: evaluate(c, m, "shg_val")["accuracy"] for m in (v1, v2)}
    assert new1 == pytest.approx(on_relation[v1], abs=1e-9) and old2 == pytest.approx(on_relation[v1], abs=1e-9)
    assert new2 == pytest.approx(on_relation[v2], abs=1e-9)


def test_a_gated_network_without_validation_is_22023_before_any_work(alice):
    """A network holds out 10% by default on one server, none on a sharded table."""
    with pytest.raises(E.InvalidParameterValue) as err:
        train(alice, "shg_pts", "mlp", {"label": "label", "features": ["x"], "hidden": [2],
                                        "deploy": "if_better", "name": "net"})
    assert "needs held-out rows" in err.value.diag.message_primary
    assert "validation" in err.value.diag.message_hint
    assert history(alice, "net") == []


def test_a_deployed_family_of_groups_is_0A000_before_any_work(dsn, alice):
    """The deployed version, a family of per-group models (trained on one server), cannot be
    scored on a sharded table yet: refused when the gate is checked, before any work."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS shg_local")
        admin.execute("CREATE TABLE shg_local AS SELECT * FROM shg_pts")
        admin.execute(f"GRANT SELECT ON shg_local TO {ROLE}")
    c = alice
    p = {**BASE, **GOOD, "label": "y", "name": "fam"}
    family = train(c, "shg_local", "linear", {**p, "group_by": "label"})
    assert deployed(c, "fam") == family
    models = scalar(c, "SELECT count(*) FROM corgipile.models")
    notices = []
    c.add_notice_handler(lambda d: notices.append(d.message_primary))
    with pytest.raises(E.FeatureNotSupported) as err:
        train(c, "shg_pts", "linear", {**p, "validation": {"predicate": PREDICATE}, "deploy": "if_better",
                                       "verbose": True})
    assert err.value.diag.message_primary == \
        "the deploy gate cannot score a model per group on a sharded table's held-out rows yet"
    assert scalar(c, "SELECT count(*) FROM corgipile.models") == models
    assert notices == [], notices  # no epoch trained: without the gate, a NOTICE per epoch
    train(c, "shg_pts", "linear", {**p, "name": "fam2", "validation": {"predicate": PREDICATE}, "verbose": True})
    assert len(notices) >= BASE["epochs"], notices
    assert deployed(c, "fam") == family


def test_a_missing_validation_relation_is_42P01_before_any_work(alice):
    with pytest.raises(E.UndefinedTable) as err:
        train(alice, "shg_pts", "logistic", {**BASE, **GOOD, "validation": {"relation": "shg_nothing"}})
    assert "shg_nothing" in err.value.diag.message_primary


def test_forged_held_out_requests_are_refused_by_the_shard(env):
    """The new fields of shard protocol 6, in rounds a coordinator never sends them in."""
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        ours = version(c)
        model = {"kind": "logistic", "n_features": 1, "n_outputs": 1, "weights": [0.5], "bias": [0.0],
                 "layers": None, "activation": None}
        base = {"version": ours, "protocol": PROTOCOL, "epoch": 1, "round": 0, "rounds": 1, "n_features": 1,
                "weights": [], "bias": [], "extras": {}, "training": 77}
        held = {"model": model, "classes": [0, 1], "preprocessing": None, "held_out": True}
        cases = [
            ({**base, "phase": "Statistics", "keep_held_out_ids": True}, "held-out rows to keep"),
            ({**base, "phase": "Validate", "keep_held_out_ids": True,
              "learners": [{"score": {**held, "held_out": False}}]}, "held-out rows to keep"),
            ({**base, "phase": "Validate", "learners": [{"score": held}]}, "held-out rows to score"),
            ({**base, "phase": "Evaluate", "training": 0, "evaluate": held}, "held-out rows to score"),
            # A training this backend never kept rows of.
            ({**base, "phase": "Evaluate", "evaluate": held}, "no held-out rows of this training"),
        ]
        for request, says in cases:
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('shg_part', 'logistic', %s, %s)",
                          (Jsonb({"features": ["x"], "label": "label"}), json.dumps(request)))
            assert err.value.sqlstate == "08P01", (request, err.value.sqlstate, err.value.diag.message_primary)
            assert says in err.value.diag.message_primary, (request, err.value.diag.message_primary)
