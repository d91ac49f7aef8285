"""Per-group models ("group_by") on a sharded table (the shard servers of test_shards.py).

Training: round 0 brings every shard's group keys and rows, the coordinator adds them up per key,
applies min_group_rows and numbers the groups; every training round carries their keys and a
learner per group beside the model of every row; the family is stored as one server stores one.
Checked against one server's training on a local copy of the same rows: the same groups with the
same rows, the same small groups, and each group's accuracy (corgipile_evaluate on the copy)
within GROUP_TOLERANCE of one server's — for an integer key, text keys, two group columns, a
group on one shard only, a "where" filter, and min_group_rows keeping a group only its summed rows reach (no shard
alone has them); corgipile_predict by the family's id predicts as its evaluation scores, and the
family evaluates on the sharded table itself; a network is 0A000 before any work, and what one
server refuses with groups (folds, search, validation) is the same ERROR; a cancel stops the
coordinator and every shard's round within test_shards.CANCEL_LIMIT; a simple view over the
sharded table (a group column renamed, a WHERE) trains the groups the table with that "where"
trains on one server.

Evaluation: corgipile_evaluate of a family on a sharded table: the request carries every group's
model; each shard numbers its rows' groups by the family's keys and scores each row with its
group's model (the model of every row for the others); the coordinator merges every row's, each
group's and the other rows' metrics. Checked: the report equals one server's on a local copy of
the same rows (counts and accuracy exactly, ROC AUC within the histogram's resolution) for an
integer and a text group key, rows of one group on several shards and in a local partition, and
the memory bound before any shard is contacted."""

import time

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import test_shards
from helpers import cancel_and_join, models_count, scalar, start_training, stop_if_running, train, wait_active
from test_shards import (CANCEL_LIMIT, DEAD_PORT, PROTOCOL, S1, S2, SETTLE, cluster_dir, local_copy, on_shard, shard_dsn,
                         sharded_table, version, wait_shards_quiet)

pytestmark = pytest.mark.own_cluster  # the two shard servers of test_shards.py

# test_shards.py's module fixture: its two shard servers, started for this module too.
shards = test_shards.shards
# Rows of shard 1, shard 2 and the local partition; every store has rows on each.
SIZES = (12_000, 6_000, 3_000)
# Stores 0-9: stores 0-4 label x1 + x2 > 0, stores 5-9 x1 - x2 > 0 (one model of every row
# cannot do both); store 99 has 21 rows (too few for a model), 21 rows have no store. Sites:
# 'only_s2' is every row of shard 2 and of no other shard; 'rare' is every 50th other row (240
# on shard 1, 60 in the local partition: 300 in all), 'site_0' / 'site_1' the rest.
ROWS_SQL = """SELECT i AS id, CASE WHEN i % 1000 = 0 THEN NULL WHEN i % 997 = 0 THEN 99 ELSE i % 10 END AS store,
                     x1, x2, CASE WHEN i % 10 < 5 THEN x1 + x2 > 0 ELSE x1 - x2 > 0 END AS y,
                     'region_' || (i % 10 % 3) AS region,
                     CASE WHEN i BETWEEN 12001 AND 18000 THEN 'only_s2' WHEN i % 50 = 0 THEN 'rare'
                          ELSE 'site_' || (i % 2) END AS site
              FROM (SELECT i, (hashint4(i) % 1000) / 250.0 AS x1, (hashint4(i * 7 + 3) % 1000) / 250.0 AS x2
                    FROM generate_series({start}, {stop}) i) s"""
COLS = "id int, store int, x1 float8, x2 float8, y bool, region text, site text"
# How far a group's accuracy on the shards may be from one server's (both scored on the copy):
# the combined model of the shards' rounds is not one server's bit for bit.
GROUP_TOLERANCE = 0.02
AUC_TOLERANCE = 0.001


def rows_sql(start, n):
    return ROWS_SQL.format(start=start, stop=start + n - 1)


@pytest.fixture(scope="module")
def grp(dsn, shards):
    """sh_grp: ids 1-12000 on shard 1, 12001-18000 on shard 2, 18001-21000 in a local partition;
    sh_grp_copy: a local copy of every row."""
    starts = (1, 1 + SIZES[0], 1 + SIZES[0] + SIZES[1])
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS grp_part", f"CREATE TABLE grp_part AS {rows_sql(starts[i], SIZES[i])}")
    with psycopg.connect(dsn, autocommit=True) as c:
        bounds = [f"FOR VALUES FROM ({s}) TO ({s + n})" for s, n in zip(starts, SIZES)]
        sharded_table(c, "sh_grp", [(bounds[0], S1, "grp_part"), (bounds[1], S2, "grp_part"), (bounds[2], None, None)],
                      cols=COLS)
        c.execute(f"INSERT INTO sh_grp {rows_sql(starts[2], SIZES[2])}")
        local_copy(c, "sh_grp")
    return "sh_grp"


def family(conn, group_by):
    return train(conn, "sh_grp_copy", "logistic", {"features": ["x1", "x2"], "label": "y", "epochs": 3, "seed": 1,
                                                   "group_by": group_by, "min_group_rows": 100, "verbose": False,
                                                   "name": f"shg_{group_by}"})


def assert_same_report(got, want, where="whole"):
    for key, value in want.items():
        if key in ("groups", "other_rows"):
            continue
        if key in ("roc_auc",) and value is not None and got.get(key) is not None:
            assert abs(got[key] - value) <= AUC_TOLERANCE, (where, key, got[key], value)
        elif key in ("roc_auc", "roc_auc_note"):
            continue  # one server keeps a share of the scores; the shards merge histograms
        elif isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (where, key, got[key], value)
        else:
            assert got[key] == value, (where, key, got[key], value)


@pytest.mark.parametrize("group_by", ["store", "region"])
def test_a_family_evaluates_on_a_sharded_table_as_on_one_server(conn, grp, group_by):
    m = family(conn, group_by)
    sharded = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp')", (m,))
    single = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_copy')", (m,))
    print(f"\n{group_by}: accuracy one server {single['accuracy']:.4f}, sharded {sharded['accuracy']:.4f}; "
          f"groups {sorted(single['groups'])}")
    assert single["rows_scored"] == sum(SIZES) and sharded["model_id"] == single["model_id"] == m
    assert_same_report(sharded, single)
    assert set(sharded["groups"]) == set(single["groups"]) and len(single["groups"]) >= 3
    for key, part in single["groups"].items():
        assert part["rows_scored"] > 0
        assert_same_report(sharded["groups"][key], part, where=key)
    assert_same_report(sharded["other_rows"], single["other_rows"], where="other_rows")
    if group_by == "store":
        # Store 99 (too small) and the rows without a store: the model of every row.
        assert single["other_rows"]["rows_scored"] == 21 + 21
        # Each group's model does better than the model of every row on its rows.
        assert min(p["accuracy"] for p in sharded["groups"].values()) > 0.9 > sharded["other_rows"]["accuracy"]


def test_the_memory_bound_comes_before_any_shard_is_contacted(dsn, conn, grp):
    """A shard where nothing listens would be 08001: the per-group report's 54000 comes first."""
    m = family(conn, "store")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SERVER IF EXISTS shg_dead CASCADE")
        c.execute(f"""CREATE SERVER shg_dead FOREIGN DATA WRAPPER postgres_fdw
                      OPTIONS (host '{cluster_dir(DEAD_PORT)}', port '{DEAD_PORT}', dbname 'x')""")
        c.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER shg_dead OPTIONS (user 'postgres')")
        try:
            sharded_table(c, "sh_grp_dead", [("FOR VALUES FROM (1) TO (100)", S1, "grp_part"),
                                             ("FOR VALUES FROM (100) TO (200)", "shg_dead", "grp_part")], cols=COLS)
            with pytest.raises(psycopg.OperationalError) as err:
                scalar(c, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_dead')", (m,))
            assert err.value.sqlstate == "08001", err.value.diag.message_primary
            # Ten groups' ROC histograms (1 MB each) and the whole's: more than 8 MB.
            c.execute("SET corgipile.max_model_memory = '8MB'")
            with pytest.raises(psycopg.Error) as err:
                scalar(c, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_dead')", (m,))
            assert err.value.sqlstate == "54000", (err.value.sqlstate, err.value.diag.message_primary)
            assert "per-group report" in err.value.diag.message_primary
        finally:
            c.execute("DROP TABLE IF EXISTS sh_grp_dead")
            c.execute(sql.SQL("DROP SERVER IF EXISTS shg_dead CASCADE"))


# ----------------------------------------------------------------------------------------------
# training per-group models on the shards


def train_family(conn, rel, group_by, name, **extra):
    params = {"features": ["x1", "x2"], "label": "y", "epochs": 5, "seed": 1, "group_by": group_by,
              "min_group_rows": 100, "verbose": False, "name": name, **extra}
    return train(conn, rel, "logistic", params)


def family_of(conn, family_id):
    """{key: rows} of the family's group models, and its metrics->'groups' without the ids."""
    rows = dict(conn.execute("SELECT group_key, group_rows FROM corgipile.group_models WHERE family_id = %s",
                             (family_id,)).fetchall())
    groups = scalar(conn, "SELECT metrics->'groups' FROM corgipile.models WHERE id = %s", (family_id,))
    assert set(groups.pop("models")) == set(rows)
    return rows, groups


@pytest.mark.parametrize("group_by, extra", [
    ("store", {}),
    ("region", {}),
    ("site", {}),
    ("store", {"where": "x2 > -2"}),
    # 'rare' has 300 rows: 240 on shard 1, 60 in the local partition; kept only by their sum.
    ("site", {"min_group_rows": 250}),
    ("site", {"min_group_rows": 500}),
    (["region", "site"], {}),
], ids=["int_key", "text_key", "one_shard_only", "where", "summed_rows_kept", "small_group", "two_columns"])
def test_per_group_models_train_on_shards_as_on_one_server(request, conn, grp, group_by, extra):
    tag = request.node.callspec.id
    single = train_family(conn, "sh_grp_copy", group_by, f"shgt1_{tag}", **extra)
    sharded = train_family(conn, "sh_grp", group_by, f"shgt2_{tag}", **extra)
    (want_rows, want), (got_rows, got) = family_of(conn, single), family_of(conn, sharded)
    # The same groups with the same rows, the same small groups.
    assert got_rows == want_rows and got == want, (got_rows, want_rows, got, want)
    assert len(got_rows) >= 3
    rows_trained = "SELECT rows_trained FROM corgipile.models WHERE id = %s"
    assert scalar(conn, rows_trained, (sharded,)) == scalar(conn, rows_trained, (single,))
    one = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_copy')", (single,))
    shards = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_copy')", (sharded,))
    gaps = {key: shards["groups"][key]["accuracy"] - part["accuracy"] for key, part in one["groups"].items()}
    print(f"\n{group_by} {extra}: groups {want_rows}; accuracy one server {one['accuracy']:.4f}, "
          f"sharded {shards['accuracy']:.4f}; per-group gaps " + ", ".join(f"{k} {v:+.4f}" for k, v in gaps.items()))
    assert set(shards["groups"]) == set(one["groups"])
    assert all(abs(g) <= GROUP_TOLERANCE for g in gaps.values()), gaps
    assert abs(shards["accuracy"] - one["accuracy"]) <= GROUP_TOLERANCE
    if group_by == "store" and not extra:
        assert want["small_groups"] == 1 and want["small_group_rows"] == 21
        assert min(p["accuracy"] for p in shards["groups"].values()) > 0.9
    if extra.get("min_group_rows") == 250:
        assert want_rows["rare"] == 300 and want["small_groups"] == 0
    if extra.get("min_group_rows") == 500:
        assert "rare" not in want_rows and want["small_group_rows"] == 300
    if group_by == "site" and "min_group_rows" not in extra:
        # A group of one shard's rows only: trained by that shard alone.
        assert want_rows["only_s2"] == SIZES[1]


def test_a_sharded_family_predicts_and_evaluates_on_the_shards(conn, grp):
    family = train_family(conn, "sh_grp", "store", "shgt_predict")
    report = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp_copy')", (family,))
    # corgipile_predict from a row uses its group's model, as the evaluation scores it.
    predicted = scalar(conn, """SELECT avg((corgipile_predict(%s::bigint, s) = y::int)::int)::float8
                                FROM sh_grp_copy s""", (family,))
    assert predicted == pytest.approx(report["accuracy"], abs=1e-12)
    # The family evaluates on the sharded table itself as on the copy.
    sharded = scalar(conn, "SELECT corgipile_evaluate(%s::bigint, 'sh_grp')", (family,))
    assert_same_report(sharded, report)
    assert set(sharded["groups"]) == set(report["groups"])


def test_per_group_networks_on_shards_are_0a000_before_any_work(conn, grp):
    before = scalar(conn, "SELECT count(*) FROM corgipile.models")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
        train(conn, "sh_grp", "mlp", {"features": ["x1", "x2"], "label": "y", "epochs": 1, "hidden": [4],
                                      "group_by": "store", "name": "shgt_mlp"})
    assert err.value.diag.message_primary == "per-group networks and factorization machines cannot train on a sharded table yet"
    assert "per-group linear models" in err.value.diag.message_hint
    assert scalar(conn, "SELECT count(*) FROM corgipile.models") == before


def test_a_forged_groups_round_is_refused_by_the_shard(grp):
    """A training round's groups (protocol 7) are checked before a row is read: groups in a
    statistics round, a learner of a group the round does not number, a key twice, a learner of
    one group twice, group learners for params without "group_by" (08P01); a key of 1001 bytes
    or 100,001 keys are refused as the request is read (22023)."""
    import json
    on_shard(0, "DROP TABLE IF EXISTS forge_grp",
             "CREATE TABLE forge_grp AS SELECT i % 2 AS label, ARRAY[i, 2.0]::float8[] AS features, "
             "'g' || (i % 3) AS g FROM generate_series(1, 100) i")
    params = Jsonb({"features": "features", "label": "label"})

    def learner(group):
        return {"weights": [0.0, 0.0], "bias": [0.0], "group": group}

    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": PROTOCOL, "phase": "Train", "epoch": 1, "round": 0, "rounds": 1,
                "n_features": 2, "extras": {"label_values": [0.0, 1.0]}, "training": 5, "groups": ["g0", "g1"]}
        cases = [({**base, "phase": "Statistics", "learners": []}, "08P01", "groups in a round that trains nothing"),
                 ({**base, "learners": [learner(None), learner(2)]}, "08P01", "a group the round does not number"),
                 ({**base, "groups": ["g0", "g0"], "learners": [learner(None)]}, "08P01", "a group listed twice"),
                 ({**base, "learners": [learner(1), learner(1)]}, "08P01", "a configuration twice"),
                 ({**base, "learners": [learner(None), learner(0)]}, "08P01",
                  'per-group learners for a training without "group_by"'),
                 ({**base, "groups": ["x" * 1001], "learners": [learner(None)]}, "22023", "a group key of 1001 bytes"),
                 ({**base, "groups": [f"k{i}" for i in range(100_001)], "learners": [learner(None)]}, "22023",
                  "more than 100000 elements")]
        for request, state, why in cases:
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('forge_grp', 'svm', %s, %s)", (params, json.dumps(request)))
            assert err.value.sqlstate == state, (why, err.value.sqlstate, err.value.diag.message_primary)
            assert why in err.value.diag.message_primary, (why, err.value.diag.message_primary)
        on_shard(0, "DROP TABLE forge_grp")


@pytest.mark.parametrize("extra", [{"folds": 3}, {"search": {"learning_rate": [0.01, 0.1]}},
                                   {"validation": {"fraction": 0.2}}], ids=["folds", "search", "validation"])
def test_what_one_server_refuses_with_groups_the_shards_refuse_alike(conn, grp, extra):
    """Per-group models train alone on one server (no folds, search or validation): the same
    ERROR on the shards, before any work."""
    errors = []
    for rel in ("sh_grp_copy", "sh_grp"):
        with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
            train_family(conn, rel, "store", "shgt_refused", **extra)
        errors.append((err.value.diag.message_primary, err.value.diag.message_hint))
    assert errors[0] == errors[1], errors


def test_cancel_stops_a_per_group_training_and_its_shards(dsn, conn, grp):
    """The learners of every group in every round: a cancel stops the coordinator and every
    shard's round within CANCEL_LIMIT, and nothing is stored."""
    params = {"features": ["x1", "x2"], "label": "y", "epochs": 1_000_000, "sync": 50, "seed": 1,
              "group_by": "store", "verbose": False, "name": "shgt_cancel"}
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer:
        before = models_count(killer)
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_grp", "logistic", params)
        try:
            wait_active(killer, pid)
            time.sleep(1.0)
            assert t.is_alive(), f"training should still be running: {result}"
            latency = cancel_and_join(killer, t, result, pid)
        finally:
            stop_if_running(killer, t, pid)
        still = wait_shards_quiet()
        print(f"\ngroups: cancel latency {latency:.3f} s; after {SETTLE} s: {still}")
        assert isinstance(result.get("error"), psycopg.errors.QueryCanceled), result
        assert latency < CANCEL_LIMIT, f"cancel took {latency:.2f} s"
        assert still == {0: [], 1: []}, still
        assert models_count(killer) == before


def test_per_group_models_of_a_view_over_the_sharded_table(conn, grp):
    """A simple view over the sharded table (a group column renamed, a WHERE) trains its groups
    on the shards as the table with that "where" trains them on one server's copy."""
    conn.execute("DROP VIEW IF EXISTS sh_grp_view")
    conn.execute("CREATE VIEW sh_grp_view AS SELECT id, store AS shop, x1, x2, y FROM sh_grp WHERE x2 > -2")
    try:
        sharded = train_family(conn, "sh_grp_view", "shop", "shgt_view")
        single = train_family(conn, "sh_grp_copy", "store", "shgt_view_copy", where="x2 > -2")
        (want_rows, want), (got_rows, got) = family_of(conn, single), family_of(conn, sharded)
        print(f"\nview: the family's group columns {got['columns']} (one server's {want['columns']})")
        got.pop("columns"), want.pop("columns")
        assert got_rows == want_rows and got == want, (got_rows, want_rows, got, want)
    finally:
        conn.execute("DROP VIEW IF EXISTS sh_grp_view")
