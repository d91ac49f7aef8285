"""Sharded tables: a partitioned table whose partitions are postgres_fdw foreign tables on other
servers (maybe beside local partitions). corgipile_train does not pull their rows: it connects
to every shard server through the foreign server and user mapping options, checks that the same
corgipile version is installed there, runs a statistics pass on every shard
(corgipile_shard_round), then for every epoch "sync" rounds in which every shard trains on its
share of its blocks from the combined model, and combines the shards' models weighted by tuples.
Local partitions train in the coordinator's backend as one more shard. The model is stored on
the coordinator only.

Harness: the test cluster (PGHOST/PGPORT) is the coordinator; two shard servers are started with
scripts/cluster.sh on ports PGPORT+100 and PGPORT+101 (so that the PostgreSQL 15 and 18 runs never
collide; CORGIPILE_PG_BIN passes through) and destroyed at the end. A third foreign server points
at PGPORT+102, where nothing listens.

Checked here: hash-sharded tables train as well as one server on a local copy of the same rows
(svm, logistic, linear; a9a too), range-sharded by label (one class per shard, equal and unequal
shard sizes; a9a too) with the default "sync" and with 8 rounds per epoch, an unequal 90/10
split, an empty shard, a local partition beside a foreign one, NULL rows skipped and counted, the
per-epoch NOTICE, one epochs row per epoch, the seed, nothing stored on the shards; a shard down,
without corgipile, with another corgipile version, a remote role without SELECT, bad data on a
shard (its SQLSTATE, the server named, the other shards' work cancelled), cancel and
statement_timeout (the remote queries stop too, also one waiting for a lock), parameters a
sharded training does not support, a non-superuser whose user mapping has no password,
privileges and row-level security on the coordinator's table, and the functions that still read
locally (_trace / _shuffle: 0A000 naming the foreign partition). corgipile_evaluate scores on the
shards and merges: the same report as one server (ROC AUC within 0.001) for every kind of model,
the same failures and privileges, a forged request refused by the shard. corgipile.progress shows
the round and every shard's state. A hung shard server (accepts, never answers): 08001 after
connect_timeout, and cancel while connecting stops within 1 s. Classes are numbered once for
every shard: softmax (numbers and texts), logistic and mlp of a text label on shards that hold
different class mixes (a class on one shard only) have the one-server training's classes and
accuracy; a third text class over the shards is refused for a binary kind; forged class rounds
and requests of another corgipile or shard protocol version are refused by the shard. A warm
start continues the stored model on the shards (svm, logistic, mlp, mlp_regression, fm; a
column list's stored preprocessing; a softmax's classes in the model's order): with a vanishing
step it is the stored model within 1e-9, with an ordinary one it starts below a cold start's
first loss and ends within 0.5 point of one server's warm start; what one server refuses of a
warm start, the shards refuse with the same ERROR. A search (and folds) trains its
configurations as the learners of every round: it stores what one server's search stores and
picks its configuration when the configurations are apart (or one within the tolerance when
they are not); folds hold the rows one server's folds hold; forged learners are refused by the
shard. "since" on shards: every sharded training records each shard table's mark (its
cluster's system identifier, table oid, file, pages in use; a local partition's too); a
training "since" that model trains exactly the rows from each table's last page read on
(replay 0: rows_trained and the epochs table), about the replay share of the older rows with a
replay fraction, within 0.5 point of one server's "since" of the same rows; a truncated shard table is read whole ("rewritten"), an unchanged one from its last page
("no page was added"), a recreated one whole — each NOTICE naming the shard; a shard table
with inheritance children is 0A000; a shard picks its own mark by cluster and table, and
refuses marks in a round that trains nothing, of a zero oid, or too many."""


import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from helpers import (DBNAME, PGPORT, REPO, SHARD_PROTOCOL, cancel_and_join, cluster_sh, dataset, evaluate, models_count, rows_trained,
                     require_extension, scalar, start_training, stop_if_running, train, wait_active)
from tables import GAUSS, blobs_sql, regression_sql

pytestmark = pytest.mark.own_cluster  # two shard servers of its own (see above)
QUIET = {"verbose": False}
ACCURACY_TOLERANCE = 0.01  # 1 accuracy point
R2_TOLERANCE = 0.01
CANCEL_LIMIT = 1.0  # seconds from pg_cancel_backend (or a shard's ERROR) to the ERROR at the client
SETTLE = 3.0  # seconds after which no shard may still run corgipile_shard_round

SHARD_PORTS = (PGPORT + 100, PGPORT + 101)
PROTOCOL = SHARD_PROTOCOL  # src/pipeline/protocol.rs


def learner(weights, bias=()):
    """A training round's one learner (shard protocol 5: a round carries a list of learners)."""
    return {"learners": [{"weights": list(weights), "bias": list(bias)}]}
DEAD_PORT = PGPORT + 102  # nothing listens there
SHARD_DB = f"{DBNAME}_shard"  # corgipile installed, current version (both shard servers)
NOCORGI_DB = f"{DBNAME}_nocorgi"  # no corgipile (shard 1)
OLD_DB = f"{DBNAME}_old"  # corgipile 0.3.0 (shard 1)
S1, S2 = "sht_s1", "sht_s2"
EXTRA_SERVERS = ("sht_dead", "sht_nocorgi", "sht_old", "sht_noread")
ROLES = ("sht_user", "sht_nosel", "sht_rls")


# ----------------------------------------------------------------------------------------------
# shard servers


def cluster_dir(port):
    return f"/tmp/corgipile-shardtest-{port}"


def shard_dsn(i, dbname=SHARD_DB):
    """Shard i (0 or 1)."""
    port = SHARD_PORTS[i]
    return f"host={cluster_dir(port)} port={port} user=postgres dbname={dbname}"


def on_shard(i, *statements, dbname=SHARD_DB):
    with psycopg.connect(shard_dsn(i, dbname), autocommit=True) as c:
        for s in statements:
            c.execute(s)


def shard_scalar(i, query, dbname=SHARD_DB):
    with psycopg.connect(shard_dsn(i, dbname), autocommit=True) as c:
        return scalar(c, query)


def shard_models(i):
    return shard_scalar(i, "SELECT count(*) FROM corgipile.models")


def running_rounds(i):
    """Backends of shard i that run corgipile_shard_round right now (this query excluded)."""
    with psycopg.connect(shard_dsn(i, "postgres"), autocommit=True) as c:
        return c.execute("""SELECT pid, datname, state FROM pg_stat_activity
                            WHERE query LIKE '%corgipile_shard_round%' AND state = 'active'
                              AND pid <> pg_backend_pid()""").fetchall()


def corgipile_connections(i):
    """Backends of shard i connected by a coordinator (fallback_application_name corgipile)."""
    with psycopg.connect(shard_dsn(i, "postgres"), autocommit=True) as c:
        return c.execute("""SELECT pid, state, left(query, 80) FROM pg_stat_activity
                            WHERE application_name = 'corgipile' AND pid <> pg_backend_pid()""").fetchall()


@pytest.fixture(scope="module")
def shards(dsn):
    """Two shard servers, foreign servers sht_s1 / sht_s2 on the coordinator (and the broken ones
    of the failure tests), user mappings for the current user as postgres."""
    with psycopg.connect(dsn, autocommit=True) as c:
        require_extension(c, "postgres_fdw")
        had_fdw = bool(scalar(c, "SELECT count(*) FROM pg_extension WHERE extname = 'postgres_fdw'"))
    try:
        for port in SHARD_PORTS:
            cluster_sh("destroy", cluster_dir(port), port)  # a fresh cluster even after an interrupted run
            cluster_sh("start", cluster_dir(port), port)
        for i in (0, 1):
            with psycopg.connect(shard_dsn(i, "postgres"), autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {SHARD_DB} WITH (FORCE)")
                c.execute(f"CREATE DATABASE {SHARD_DB}")
            on_shard(i, "CREATE EXTENSION corgipile")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
            for name in (S1, S2, *EXTRA_SERVERS):
                c.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
            for i, name in enumerate((S1, S2)):
                port = SHARD_PORTS[i]
                c.execute(f"""CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw
                              OPTIONS (host '{cluster_dir(port)}', port '{port}', dbname '{SHARD_DB}',
                                       batch_size '1000')""")
                c.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {name} OPTIONS (user 'postgres')")
        yield
    finally:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                drop_roles(c)
                for (stmt,) in c.execute("""SELECT format('DROP TABLE IF EXISTS %s CASCADE', oid::regclass)
                                            FROM pg_class WHERE relname LIKE 'sh\\_%' AND relkind IN ('p', 'r')
                                              AND NOT relispartition""").fetchall():
                    c.execute(stmt)
                for name in (S1, S2, *EXTRA_SERVERS):
                    c.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
                if not had_fdw:
                    c.execute("DROP EXTENSION IF EXISTS postgres_fdw CASCADE")
        finally:
            for port in SHARD_PORTS:
                cluster_sh("destroy", cluster_dir(port), port)


# ----------------------------------------------------------------------------------------------
# helpers


def stored(c, model_id):
    row = c.execute("SELECT rows_trained, rows_skipped, weights, bias, params, relation FROM corgipile.models WHERE id = %s",
                    (model_id,)).fetchone()
    return dict(zip(("rows_trained", "rows_skipped", "weights", "bias", "params", "relation"), row))


def version(c):
    return scalar(c, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'")


def sharded_table(c, name, partitions, cols="id int, label int, features float8[]", by="RANGE (id)"):
    """CREATE TABLE name (cols) PARTITION BY by, with foreign partitions: partitions is a list of
    (bounds, server, remote table); server None = a local partition."""
    c.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
    c.execute(f"CREATE TABLE {name} ({cols}) PARTITION BY {by}")
    for k, (bounds, server, remote) in enumerate(partitions):
        if server is None:
            c.execute(f"CREATE TABLE {name}_{k} PARTITION OF {name} {bounds}")
        else:
            c.execute(f"CREATE FOREIGN TABLE {name}_{k} PARTITION OF {name} {bounds} "
                      f"SERVER {server} OPTIONS (table_name '{remote}')")


def local_copy(c, rel):
    """A plain local table with every row of `rel` (read through postgres_fdw)."""
    copy = f"{rel}_copy"
    c.execute(f"DROP TABLE IF EXISTS {copy}")
    c.execute(f"CREATE TABLE {copy} AS SELECT * FROM {rel}")
    c.execute(f"VACUUM ANALYZE {copy}")
    return copy


def compare(c, sharded, copy, model, params, eval_rel=None, metric="accuracy", tol=ACCURACY_TOLERANCE, label=""):
    """Trains on the sharded table and on its local copy with the same params; returns
    (sharded metric, single-server metric, sharded model id) measured on eval_rel (the copy)."""
    eval_rel = eval_rel or copy
    single = train(c, copy, model, params)
    shard = train(c, sharded, model, params)
    got = evaluate(c, shard, eval_rel)[metric]
    ref = evaluate(c, single, eval_rel)[metric]
    msg = f"{label or sharded} {model} {params}: {metric} single-server {ref:.4f}, sharded {got:.4f}"
    print("\n" + msg)
    assert abs(got - ref) <= tol, msg
    return got, ref, shard


def wait_shards_quiet(timeout=SETTLE):
    """Sleeps `timeout` seconds, then returns what still runs corgipile_shard_round on each shard."""
    time.sleep(timeout)
    return {i: running_rounds(i) for i in (0, 1)}


def drop_roles(admin):
    for role in ROLES:
        if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
            for srv in (S1, S2):
                if scalar(admin, "SELECT count(*) FROM pg_foreign_server WHERE srvname = %s", (srv,)):
                    admin.execute(sql.SQL("DROP USER MAPPING IF EXISTS FOR {} SERVER {}").format(
                        sql.Identifier(role), sql.Identifier(srv)))
            admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# ----------------------------------------------------------------------------------------------
# data


@pytest.fixture(scope="module")
def blobs(dsn, shards):
    """sh_hash: 200,000 blob rows hash-partitioned by id over both shards (inserted through the
    coordinator, each shard's table clustered by label); sh_range: one class per shard,
    100,000 rows each, generated on the shards. Local copies sh_hash_copy, sh_range_copy."""
    t0 = time.monotonic()
    for i in (0, 1):
        on_shard(i, "CREATE TABLE hash_part (id int, label int, features float8[])",
                 f"SELECT setseed({0.11 + 0.3 * i})",
                 f"CREATE TABLE range_part AS {blobs_sql(100_000, str(i), start=1 + 100_000 * i)}",
                 "VACUUM ANALYZE range_part")
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_hash", [(f"FOR VALUES WITH (MODULUS 2, REMAINDER {k})", srv, "hash_part")
                                     for k, srv in enumerate((S1, S2))], by="HASH (id)")
        c.execute("SELECT setseed(0.21)")
        c.execute(f"INSERT INTO sh_hash {blobs_sql(200_000, 'random() < 0.5')}")
        sharded_table(c, "sh_range", [("FOR VALUES IN (0)", S1, "range_part"), ("FOR VALUES IN (1)", S2, "range_part")],
                      by="LIST (label)")
        local_copy(c, "sh_hash")
        local_copy(c, "sh_range")
    for i in (0, 1):
        on_shard(i, "VACUUM ANALYZE hash_part")
    per_shard = [shard_scalar(i, "SELECT count(*) FROM hash_part") for i in (0, 1)]
    labels = [shard_scalar(i, "SELECT avg(label)::float8 FROM hash_part") for i in (0, 1)]
    print(f"\nblobs loaded in {time.monotonic() - t0:.1f} s; hash shards {per_shard}, label means {labels}")
    assert sum(per_shard) == 200_000 and min(per_shard) > 90_000
    assert all(0.45 < m < 0.55 for m in labels), labels
    assert [shard_scalar(i, "SELECT count(DISTINCT label) FROM range_part") for i in (0, 1)] == [1, 1]
    return {"hash_per_shard": per_shard}


# ----------------------------------------------------------------------------------------------
# 1 / 5: hash-sharded, svm and logistic; linear regression


@pytest.mark.parametrize("model", ["svm", "logistic"])
def test_hash_sharded_trains_like_one_server(conn, blobs, model):
    before_shards = [shard_models(i) for i in (0, 1)]
    before = models_count(conn)
    params = {"epochs": 5, "seed": 7}
    got, ref, m = compare(conn, "sh_hash", "sh_hash_copy", model, params)
    assert ref > 0.95, ref
    row = stored(conn, m)
    assert row["rows_trained"] == 200_000 and row["rows_skipped"] == 0
    assert row["relation"] == "public.sh_hash"
    assert row["params"]["sync"] == "auto"
    epochs = conn.execute("SELECT epoch, tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch",
                          (m,)).fetchall()
    assert epochs == [(e, 200_000) for e in range(1, 6)], epochs
    assert models_count(conn) == before + 2
    # Nothing is stored on the shards.
    assert [shard_models(i) for i in (0, 1)] == before_shards == [0, 0]
    assert [shard_scalar(i, "SELECT count(*) FROM corgipile.epochs") for i in (0, 1)] == [0, 0]


# Searches ranked by validation loss. "apart": two learning rates whose models' losses differ
# far more than a sharded model's differs from one server's; "close": a third between them
# whose loss is within that difference of the best (measured, logistic: 0.0733 and 0.0735 on one
# server, 0.0761 and 0.0757 on the shards).
SEARCHES = {"apart": {"learning_rate": [0.00001, 0.1]}, "close": {"learning_rate": [0.00001, 0.001, 0.1]}}
SEARCH = {"epochs": 3, "seed": 7, "validation": {"fraction": 0.2}, "select_by": "loss"}
# How far a configuration's validation loss on the shards may be from one server's (other
# held-out rows, a model combined from the shards' rounds; measured at most 0.008).
SCORE_TOLERANCE = 0.015


def search_rows(c, model_id):
    """The search's rows of corgipile.search_trials (by trial), and its epochs rows per trial."""
    rows = c.execute("""SELECT trial, trials, params, select_by, score, selected, epochs, model_id
                        FROM corgipile.search_trials
                        WHERE search_id = (SELECT (metrics #>> '{search,search_id}')::bigint
                                           FROM corgipile.models WHERE id = %s)
                        ORDER BY trial""", (model_id,)).fetchall()
    epochs = {r[0]: c.execute("SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (r[7],)).fetchone()[0]
              for r in rows}
    return rows, epochs


@pytest.mark.parametrize("model, searched", [("svm", "apart"), ("logistic", "apart"), ("logistic", "close")])
def test_a_search_on_shards_stores_and_picks_as_one_server(conn, blobs, model, searched):
    """A search over a sharded table stores what one server's search of the same rows stores (a
    version per configuration, the best last, its corgipile.search_trials rows), and its best
    model scores within 0.5 point of one server's. Every configuration's validation loss is
    within SCORE_TOLERANCE of one server's, so a configuration better than the others by more
    than twice that is the one picked on both ("apart"); among configurations closer than that,
    the one picked on the shards is within twice of one server's best there ("close")."""
    before = models_count(conn)
    params = {**SEARCH, "search": SEARCHES[searched]}
    single = train(conn, "sh_hash_copy", model, params, name=f"sh_search_one_{model}_{searched}")
    sharded = train(conn, "sh_hash", model, params, name=f"sh_search_{model}_{searched}")
    n = len(SEARCHES[searched]["learning_rate"])
    assert models_count(conn) == before + 2 * n
    (one, one_epochs), (got, got_epochs) = search_rows(conn, single), search_rows(conn, sharded)
    assert [r[:4] for r in got] == [r[:4] for r in one], (got, one)
    assert [r[1] for r in got] == [n] * n
    assert got_epochs == one_epochs == {t: 3 for t in range(1, n + 1)}
    # The best is selected and stored last (the id returned), as on one server.
    assert max(r[7] for r in got) == sharded and [r[7] for r in got if r[5]] == [sharded]
    assert [r[7] for r in one if r[5]] == [single]
    for g, o in zip(got, one):
        assert abs(g[4] - o[4]) <= SCORE_TOLERANCE, (g, o)
    picked, best_one = [r for r in got if r[5]][0], [r for r in one if r[5]][0]
    if searched == "apart":
        assert picked[2] == best_one[2] == {"learning_rate": 0.1}, (got, one)
    else:
        one_score_of_picked = next(o[4] for o in one if o[2] == picked[2])
        assert one_score_of_picked <= best_one[4] + 2 * SCORE_TOLERANCE, (got, one)
    row = stored(conn, sharded)
    assert row["params"]["learning_rate"] == picked[2]["learning_rate"] and row["relation"] == "public.sh_hash"
    got_acc = evaluate(conn, sharded, "sh_hash_copy")["accuracy"]
    ref_acc = evaluate(conn, single, "sh_hash_copy")["accuracy"]
    assert abs(got_acc - ref_acc) <= 0.005, (got_acc, ref_acc)
    assert all(shard_models(i) == 0 for i in (0, 1))


def cv_of(c, model_id):
    return c.execute("SELECT metrics->'cv' FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()[0]


def test_folds_on_shards_hold_out_the_folds_one_server_holds_out(conn, blobs):
    """"folds" on a sharded table: each fold's learner trains on the other folds' rows of every
    shard and scores its own fold's rows in the last epoch. A row's fold is a hash of the row, so
    every fold holds the rows it holds on one server (the same rows scored per fold); the folds'
    mean accuracy is within 1 point of one server's, and the stored model is the one a training
    without folds stores on the shards, bit for bit."""
    params = {"epochs": 3, "seed": 7, "folds": 3}
    single = train(conn, "sh_hash_copy", "svm", params)
    sharded = train(conn, "sh_hash", "svm", params)
    one, got = cv_of(conn, single), cv_of(conn, sharded)
    assert got["folds"] == 3 and len(got["per_fold"]) == 3, got
    rows = [f["rows"] for f in got["per_fold"]]
    assert rows == [f["rows"] for f in one["per_fold"]] and sum(rows) == 200_000, (got, one)
    assert abs(got["accuracy"] - one["accuracy"]) <= ACCURACY_TOLERANCE, (got, one)
    assert got["accuracy"] > 0.95
    plain = stored(conn, train(conn, "sh_hash", "svm", {"epochs": 3, "seed": 7}))
    with_folds = stored(conn, sharded)
    assert with_folds["weights"] == plain["weights"] and with_folds["bias"] == plain["bias"]
    assert conn.execute("SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (sharded,)).fetchone()[0] == 3


def test_a_search_with_folds_on_shards_ranks_by_the_folds(conn, blobs):
    """A search with "folds" on shards ranks its configurations by their folds' mean, as one
    server does, and picks the same one when they are apart."""
    params = {"epochs": 2, "seed": 7, "folds": 3, "select_by": "loss", "search": SEARCHES["apart"]}
    single = train(conn, "sh_hash_copy", "logistic", params, name="sh_search_folds_one")
    sharded = train(conn, "sh_hash", "logistic", params, name="sh_search_folds")
    (one, _), (got, _) = search_rows(conn, single), search_rows(conn, sharded)
    assert [r[:4] for r in got] == [r[:4] for r in one]
    assert [r[2] for r in got if r[5]] == [r[2] for r in one if r[5]] == [{"learning_rate": 0.1}]
    # (Learning rate 1e-5 is far from converged after 2 epochs, where a classifier's shards'
    # summed changes move further than one server's steps: 0.263 against 0.281 measured.)
    for g, o in zip(got, one):
        assert g[4] == cv_of(conn, g[7])["loss"] and abs(g[4] - o[4]) <= 0.05, (g, o)


def test_a_search_on_shards_is_one_training_per_configuration(conn, blobs):
    """Each configuration's model of a sharded search is the model that configuration trains
    alone on the shards (the same seed, the same rounds): side by side changes nothing."""
    params = {**SEARCH, "search": {"learning_rate": [0.001, 0.1]}, "patience": 1}
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    best = train(conn, "sh_hash", "svm", params, name="sh_search_alone", verbose=True)
    # verbose: one server's search line per epoch (not the shard line of one model).
    lines = [n for n in notices if re.match(r"epoch \d/3: \d of 2 configurations trained; best validation loss", n)]
    assert len(lines) == 3, notices
    rows, _ = search_rows(conn, best)
    for r in rows:
        lone = {k: v for k, v in params.items() if k not in ("search", "select_by")} | r[2]
        alone = stored(conn, train(conn, "sh_hash", "svm", lone))
        together = stored(conn, r[7])
        assert together["weights"] == alone["weights"] and together["bias"] == alone["bias"], r[2]


def test_a_sharded_search_refuses_what_it_cannot_search(conn, blobs):
    """A searched model kind or class_weight: 0A000 before any work, as the capability table's
    rows say (a network's search and folds train: test_shard_networks.py)."""
    before = models_count(conn)
    page = (pathlib.Path(REPO) / "docs" / "reference.md").read_text()
    for model, search, searched in (("svm", {"model": ["svm", "logistic"]}, "model"),
                                    ("mlp", {"model": ["mlp", "fm"]}, "model"),
                                    ("logistic", {"class_weight": [None, "balanced"]}, "class_weight")):
        with pytest.raises(E.FeatureNotSupported) as err:
            train(conn, "sh_hash", model, {"epochs": 1, "validation": {"fraction": 0.2}, "search": search,
                                           "name": "sh_search_refused"})
        d = err.value.diag
        assert d.message_primary == f'a "search" on a sharded table cannot search "{searched}" yet', d.message_primary
        row = f'| a sharded table | a `"search"` of `"{searched}"` | {d.message_hint} |'
        assert row in page, (row, d.message_hint)
    assert_nothing_stored(conn, before)


def test_hash_sharded_verbose_notice_per_epoch(conn, blobs):
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    train(conn, "sh_hash", "svm", {"epochs": 3, "seed": 1, "verbose": True, "sync": 2})
    epochs = [n for n in notices if n.startswith("corgipile epoch")]
    assert len(epochs) == 3, notices
    n1, n2 = blobs["hash_per_shard"]
    for e, text in enumerate(epochs, start=1):
        assert re.fullmatch(rf"corgipile epoch {e}/3: loss [0-9.]+, metric [0-9.]+, 200000 tuples "
                            rf"\({S1} {n1}, {S2} {n2}\), 2 round\(s\), [0-9.]+ s"
                            r"(, [0-9]+ bytes to and from shard servers)?", text), text


def test_same_seed_same_sharded_model(conn, blobs):
    params = {"epochs": 2, "seed": 99, "sync": 3}
    a, b = (stored(conn, train(conn, "sh_hash", "logistic", params)) for _ in range(2))
    assert a["weights"] == b["weights"] and a["bias"] == b["bias"]
    c = stored(conn, train(conn, "sh_hash", "logistic", {**params, "seed": 100}))
    assert c["weights"] != a["weights"]


def test_linear_regression_sharded(conn, shards):
    """y = w.x + noise; shard 1 holds x around -1, shard 2 around +1, each stored ordered by y."""
    for i in (0, 1):
        shift = -1.0 if i == 0 else 1.0
        on_shard(i, "DROP TABLE IF EXISTS reg_part", f"SELECT setseed({0.4 + 0.1 * i})",
                 f"CREATE TABLE reg_part AS {regression_sql(100_000, start=1 + 100_000 * i, shift=shift, label_first=True)}",
                 "VACUUM ANALYZE reg_part")
    sharded_table(conn, "sh_reg", [("FOR VALUES FROM (1) TO (100001)", S1, "reg_part"),
                                   ("FOR VALUES FROM (100001) TO (200001)", S2, "reg_part")],
                  cols="id int, label float8, features float8[]")
    copy = local_copy(conn, "sh_reg")
    try:
        got, ref, m = compare(conn, "sh_reg", copy, "linear", {"epochs": 5, "seed": 3}, metric="r2", tol=R2_TOLERANCE)
        assert ref > 0.9, ref
        assert stored(conn, m)["rows_trained"] == 200_000
    finally:
        conn.execute("DROP TABLE IF EXISTS sh_reg, sh_reg_copy CASCADE")


# ----------------------------------------------------------------------------------------------
# networks: the coordinator numbers the classes (the shards' label values, ascending) and
# combines the parameters; every round starts a fresh optimizer state on each shard


@pytest.mark.parametrize("table", ["sh_hash", "sh_range"])
def test_mlp_sharded_trains_like_one_server(conn, blobs, table):
    # sh_range: one class per shard, the hardest split.
    params = {"epochs": 3, "seed": 7, "hidden": [16]}
    got, ref, m = compare(conn, table, f"{table}_copy", "mlp", params)
    assert ref > 0.95, ref
    assert stored(conn, m)["rows_trained"] == 200_000
    layers, classes = conn.execute("SELECT layers, label_mapping->'classes' FROM corgipile.models WHERE id = %s",
                                   (m,)).fetchone()
    assert layers == [10, 16, 2] and classes == [0, 1]
    # The sharded network scored on the sharded table (each shard scores its rows) and on the
    # copy: the same rows, the same metrics.
    on_shards = evaluate(conn, m, table)
    on_copy = evaluate(conn, m, f"{table}_copy")
    assert on_shards["rows_scored"] == on_copy["rows_scored"] == 200_000
    assert abs(on_shards["accuracy"] - on_copy["accuracy"]) < 1e-12
    assert abs(on_shards["log_loss"] - on_copy["log_loss"]) < 1e-9


def test_mlp_regression_sharded(conn, shards):
    """A non-linear target (y = x1 * x2 + noise) split over two shards, each stored ordered by y."""
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS nreg_part", f"SELECT setseed({0.6 + 0.1 * i})",
                 f"""CREATE TABLE nreg_part AS
                     SELECT id, 2 * x1 * x2 + 0.1 * g AS label, ARRAY[x1, x2]::float8[] AS features
                     FROM (SELECT i AS id, {GAUSS} AS x1, {GAUSS} AS x2, {GAUSS} AS g
                           FROM generate_series({1 + 50_000 * i}, {50_000 * (i + 1)}) i) s
                     ORDER BY label""", "VACUUM ANALYZE nreg_part")
    sharded_table(conn, "sh_nreg", [("FOR VALUES FROM (1) TO (50001)", S1, "nreg_part"),
                                    ("FOR VALUES FROM (50001) TO (100001)", S2, "nreg_part")],
                  cols="id int, label float8, features float8[]")
    copy = local_copy(conn, "sh_nreg")
    try:
        params = {"epochs": 5, "seed": 3, "hidden": [16]}
        got, ref, m = compare(conn, "sh_nreg", copy, "mlp_regression", params, metric="r2", tol=0.02)
        assert ref > 0.9, ref
        # Momentum and one round per epoch: the shards' changes are averaged, not added (added,
        # momentum diverged and one round lost 1.0 of R²).
        for extra in ({"optimizer": "sgd"}, {"sync": 1}):
            compare(conn, "sh_nreg", copy, "mlp_regression", {**params, **extra}, metric="r2", tol=0.02)
        on_shards = evaluate(conn, m, "sh_nreg")
        assert abs(on_shards["r2"] - got) < 1e-9
        # What the network is for: a linear model explains nothing of x1 * x2.
        linear = train(conn, "sh_nreg", "linear", {"epochs": 3, "seed": 3})
        assert evaluate(conn, linear, copy)["r2"] < 0.1
    finally:
        conn.execute("DROP TABLE IF EXISTS sh_nreg, sh_nreg_copy CASCADE")


def test_an_exactly_linear_target_trains_on_shards(conn, shards):
    """An exactly linear target on two shards and a local partition: every part fits it within
    its round. Adding the three changes (as classifiers do) overshot threefold: the loss grew
    round after round (3.5e38 in 3 epochs; later an ERROR "diverged in epoch 1" with the default
    params). Regression now moves by the mean of the parts' changes: the default params fit it,
    with the default rounds and with 8. A step that really diverges is still an ERROR that stores
    nothing."""
    det = """SELECT i AS id, sin(i) * 3 + cos(i * 0.7) AS label,
                    ARRAY[sin(i), cos(i * 0.7), (i % 13) / 13.0, ((i * 7919) % 1000) / 1000.0]::float8[] AS features
             FROM generate_series({lo}, {hi}) i"""
    for i, (lo, hi) in enumerate(((1, 12000), (12001, 20000))):
        on_shard(i, "DROP TABLE IF EXISTS exact_part", f"CREATE TABLE exact_part AS {det.format(lo=lo, hi=hi)}")
    sharded_table(conn, "sh_exact", [("FOR VALUES FROM (1) TO (12001)", S1, "exact_part"),
                                     ("FOR VALUES FROM (12001) TO (20001)", S2, "exact_part"),
                                     ("FOR VALUES FROM (20001) TO (30001)", None, None)],
                  cols="id int, label float8, features float8[]")
    conn.execute(f"INSERT INTO sh_exact_2 {det.format(lo=20001, hi=30000)}")
    try:
        for extra in ({}, {"sync": 8}, {"normalize": False}):
            m = train(conn, "sh_exact", "linear", {"epochs": 3, "seed": 7, **extra})
            assert evaluate(conn, m, "sh_exact")["r2"] > 0.99, extra
        before = models_count(conn)
        with pytest.raises(E.NumericValueOutOfRange) as err:
            train(conn, "sh_exact", "linear", {"epochs": 3, "seed": 7, "learning_rate": 1000})
        assert err.value.diag.message_primary.startswith("training diverged in epoch "), \
            err.value.diag.message_primary
        assert "learning_rate" in err.value.diag.message_hint
        assert_nothing_stored(conn, before)
    finally:
        conn.execute("DROP TABLE IF EXISTS sh_exact CASCADE")


# ----------------------------------------------------------------------------------------------
# 2: one class per shard


def test_range_sharded_by_label_default_sync_and_sync_8(conn, blobs):
    params = {"epochs": 5, "seed": 11}
    single = train(conn, "sh_range_copy", "svm", params)
    ref = evaluate(conn, single, "sh_range_copy")["accuracy"]
    acc = {}
    for sync in ("auto", 1, 8):
        m = train(conn, "sh_range", "svm", {**params, "sync": sync})
        assert stored(conn, m)["rows_trained"] == 200_000
        assert stored(conn, m)["params"]["sync"] == sync
        acc[sync] = evaluate(conn, m, "sh_range_copy")["accuracy"]
    # One round per epoch averages two models that each saw one class for a whole epoch: it
    # holds on equal shards, but one seed can land two points off (seed 11: 0.951, seeds
    # 12–14: 0.969), so it is judged on the median of three seeds.
    sync1 = [acc[1]] + [evaluate(conn, train(conn, "sh_range", "svm", {**params, "seed": s, "sync": 1}),
                                 "sh_range_copy")["accuracy"] for s in (12, 13)]
    msg = (f"range-sharded by label (one class per shard), svm {params}: single-server {ref:.4f}, "
           f"sharded sync auto {acc['auto']:.4f}, sync 1 {sync1} (seeds 11-13), sync 8 {acc[8]:.4f}")
    print("\n" + msg)
    assert ref > 0.95, msg
    for sync in ("auto", 8):
        assert abs(acc[sync] - ref) <= ACCURACY_TOLERANCE, msg
    assert abs(sorted(sync1)[1] - ref) <= ACCURACY_TOLERANCE, msg


def test_range_sharded_by_label_unequal_shards(conn, shards):
    """One class per shard again, but 90,000 rows of class 0 on shard 1 and 10,000 of class 1
    on shard 2 (a9a sharded by label is like this: 24,720 / 7,841)."""
    on_shard(0, "DROP TABLE IF EXISTS imb_part", "SELECT setseed(0.3)",
             f"CREATE TABLE imb_part AS {blobs_sql(90_000, '0')}", "VACUUM ANALYZE imb_part")
    on_shard(1, "DROP TABLE IF EXISTS imb_part", "SELECT setseed(0.4)",
             f"CREATE TABLE imb_part AS {blobs_sql(10_000, '1', start=90_001)}", "VACUUM ANALYZE imb_part")
    sharded_table(conn, "sh_imb", [("FOR VALUES IN (0)", S1, "imb_part"), ("FOR VALUES IN (1)", S2, "imb_part")],
                  by="LIST (label)")
    copy = local_copy(conn, "sh_imb")
    params = {"epochs": 5, "seed": 3}
    ref = evaluate(conn, train(conn, copy, "svm", params), copy)["accuracy"]
    acc = {}
    for sync in ("auto", 1, 8):
        m = train(conn, "sh_imb", "svm", {**params, "sync": sync})
        assert stored(conn, m)["rows_trained"] == 100_000
        acc[sync] = evaluate(conn, m, copy)["accuracy"]
    msg = (f"range-sharded by label, 90,000 class 0 / 10,000 class 1, svm {params}: single-server {ref:.4f}, "
           f"sharded sync auto {acc['auto']:.4f}, sync 1 {acc[1]:.4f}, sync 8 {acc[8]:.4f} "
           "(always predicting class 0: 0.9000)")
    print("\n" + msg)
    assert ref > 0.95, msg
    # Unequal one-class shards need rounds within the epoch: the default (64) holds; 1 and 8
    # are reported (README), not asserted.
    assert abs(acc["auto"] - ref) <= ACCURACY_TOLERANCE, msg


# ----------------------------------------------------------------------------------------------
# 3: unequal split, an empty shard, a local partition beside a foreign one


@pytest.fixture(scope="module")
def uneven(dsn, shards):
    """uneven_part: 90,000 rows on shard 1 (40% label 1), 10,000 on shard 2 (70% label 1); an empty
    table empty_part on shard 2."""
    on_shard(0, "SELECT setseed(0.61)", f"CREATE TABLE uneven_part AS {blobs_sql(90_000, 'random() < 0.4', mean=0.4)}",
             "VACUUM ANALYZE uneven_part")
    on_shard(1, "SELECT setseed(0.62)",
             f"CREATE TABLE uneven_part AS {blobs_sql(10_000, 'random() < 0.7', start=90_001, mean=0.4)}",
             "CREATE TABLE empty_part (id int, label int, features float8[])",
             "VACUUM ANALYZE uneven_part")


def verbose_notices(conn):
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    return notices


def test_unequal_split_90_10(conn, uneven):
    sharded_table(conn, "sh_uneven", [("FOR VALUES FROM (1) TO (90001)", S1, "uneven_part"),
                                      ("FOR VALUES FROM (90001) TO (100001)", S2, "uneven_part")])
    copy = local_copy(conn, "sh_uneven")
    notices = verbose_notices(conn)
    got, ref, m = compare(conn, "sh_uneven", copy, "svm", {"epochs": 5, "seed": 2, "verbose": True})
    assert ref > 0.85, ref  # class means +-0.4: Bayes accuracy ~0.9
    assert stored(conn, m)["rows_trained"] == 100_000
    shard_epochs = [n for n in notices if n.startswith("corgipile epoch") and "round(s)" in n]
    assert len(shard_epochs) == 5, notices
    assert all(f"100000 tuples ({S1} 90000, {S2} 10000)" in n for n in shard_epochs), shard_epochs


def test_a_shard_with_zero_rows(conn, uneven):
    sharded_table(conn, "sh_zero", [("FOR VALUES FROM (1) TO (90001)", S1, "uneven_part"),
                                    ("FOR VALUES FROM (90001) TO (100001)", S2, "empty_part")])
    copy = local_copy(conn, "sh_zero")
    assert scalar(conn, f"SELECT count(*) FROM {copy}") == 90_000
    notices = verbose_notices(conn)
    got, ref, m = compare(conn, "sh_zero", copy, "logistic", {"epochs": 3, "seed": 2, "verbose": True})
    assert stored(conn, m)["rows_trained"] == 90_000
    shard_epochs = [n for n in notices if "round(s)" in n]
    assert len(shard_epochs) == 3 and all(f"({S1} 90000, {S2} 0)" in n for n in shard_epochs), shard_epochs


def test_no_rows_on_any_shard_is_no_data_found(conn, uneven):
    """The condition no_data_found (SQLSTATE P0002), as for an empty table on one server."""
    sharded_table(conn, "sh_none", [("FOR VALUES FROM (1) TO (90001)", S2, "empty_part"),
                                    ("FOR VALUES FROM (90001) TO (100001)", S2, "empty_part")])
    conn.execute("DROP TABLE IF EXISTS sh_none_local")
    conn.execute("CREATE TABLE sh_none_local (id int, label int, features float8[])")
    with pytest.raises(psycopg.Error) as local:
        train(conn, "sh_none_local", "svm", {"epochs": 1})
    before = models_count(conn)
    with pytest.raises(psycopg.Error) as err:
        train(conn, "sh_none", "svm", {"epochs": 1})
    msg = err.value.diag.message_primary
    assert isinstance(err.value, E.NoDataFound), (err.value.sqlstate, msg)
    assert err.value.sqlstate == local.value.sqlstate == "P0002", (err.value.sqlstate, local.value.sqlstate, msg)
    assert "no rows" in msg, msg
    assert_nothing_stored(conn, before)


def test_a_local_partition_beside_a_foreign_one(conn, uneven):
    sharded_table(conn, "sh_mixed", [("FOR VALUES FROM (1) TO (90001)", None, None),
                                     ("FOR VALUES FROM (90001) TO (100001)", S2, "uneven_part")])
    # The local partition holds shard 1's rows (read through a temporary foreign table).
    sharded_table(conn, "sh_feed", [("FOR VALUES FROM (1) TO (90001)", S1, "uneven_part")])
    conn.execute("INSERT INTO sh_mixed_0 SELECT * FROM sh_feed")
    conn.execute("DROP TABLE sh_feed CASCADE")
    conn.execute("VACUUM ANALYZE sh_mixed_0")
    copy = local_copy(conn, "sh_mixed")
    notices = verbose_notices(conn)
    before_shards = [shard_models(i) for i in (0, 1)]
    got, ref, m = compare(conn, "sh_mixed", copy, "svm", {"epochs": 5, "seed": 4, "verbose": True})
    assert stored(conn, m)["rows_trained"] == 100_000
    shard_epochs = [n for n in notices if "round(s)" in n]
    assert len(shard_epochs) == 5, notices
    assert all("local partition" in n and "sh_mixed_0 90000" in n and f"{S2} 10000" in n for n in shard_epochs), \
        shard_epochs
    assert [shard_models(i) for i in (0, 1)] == before_shards


def test_null_rows_are_skipped_and_counted_on_the_shards(conn, blobs):
    on_shard(1, "DROP TABLE IF EXISTS null_part",
             "CREATE TABLE null_part AS SELECT id, label, CASE WHEN id % 100 = 0 THEN NULL ELSE features END AS features "
             "FROM range_part")
    sharded_table(conn, "sh_null", [("FOR VALUES IN (0)", S1, "range_part"), ("FOR VALUES IN (1)", S2, "null_part")],
                  by="LIST (label)")
    copy = local_copy(conn, "sh_null")
    params = {"epochs": 2, "seed": 5}
    single = stored(conn, train(conn, copy, "svm", params))
    shard = stored(conn, train(conn, "sh_null", "svm", params))
    assert single["rows_skipped"] == 1000 and single["rows_trained"] == 199_000, single
    assert (shard["rows_trained"], shard["rows_skipped"]) == (199_000, 1000), shard


# ----------------------------------------------------------------------------------------------
# 4: a9a


A9A_FEATURES = 123


@pytest.fixture(scope="module")
def a9a(dsn, shards):
    train_file, test_file = dataset("a9a.train.bz2", "a9a.test.bz2")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS sh_a9a_train, sh_a9a_test")
    for path, table in ((train_file, "sh_a9a_train"), (test_file, "sh_a9a_test")):
        subprocess.run([sys.executable, str(REPO / "scripts" / "load_libsvm.py"), str(path), table,
                        "--n-features", str(A9A_FEATURES), "-d", DBNAME], check=True, capture_output=True)
    cols = "id bigint, label float8, features float8[]"
    for i in (0, 1):
        on_shard(i, f"CREATE TABLE a9a_hash ({cols})", f"CREATE TABLE a9a_label ({cols})")
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_a9a_hash", [(f"FOR VALUES WITH (MODULUS 2, REMAINDER {k})", srv, "a9a_hash")
                                         for k, srv in enumerate((S1, S2))], cols=cols, by="HASH (id)")
        sharded_table(c, "sh_a9a_label", [("FOR VALUES IN (-1)", S1, "a9a_label"), ("FOR VALUES IN (1)", S2, "a9a_label")],
                      cols=cols, by="LIST (label)")
        for t in ("sh_a9a_hash", "sh_a9a_label"):
            c.execute(f"INSERT INTO {t} SELECT * FROM sh_a9a_train ORDER BY label, id")
        c.execute("VACUUM ANALYZE sh_a9a_train, sh_a9a_test")
        assert scalar(c, "SELECT count(*) FROM sh_a9a_train") == 32561
        assert scalar(c, "SELECT count(*) FROM sh_a9a_hash") == scalar(c, "SELECT count(*) FROM sh_a9a_label") == 32561
    for i in (0, 1):
        on_shard(i, "VACUUM ANALYZE a9a_hash", "VACUUM ANALYZE a9a_label")
    assert [shard_scalar(i, "SELECT count(DISTINCT label) FROM a9a_label") for i in (0, 1)] == [1, 1]
    cache = {}
    with psycopg.connect(dsn, autocommit=True) as c:
        m = train(c, "sh_a9a_train", "svm", A9A_PARAMS)
        cache["single"] = evaluate(c, m, "sh_a9a_test")["accuracy"]
    return cache


A9A_PARAMS = {"seed": 5}  # svm, default params otherwise (20 epochs)


@pytest.mark.parametrize("table", ["sh_a9a_hash", "sh_a9a_label"])
def test_a9a_sharded_matches_one_server(conn, a9a, table):
    ref = a9a["single"]
    m = train(conn, table, "svm", A9A_PARAMS)
    assert stored(conn, m)["rows_trained"] == 32561
    got = evaluate(conn, m, "sh_a9a_test")["accuracy"]
    extra = ""
    if table == "sh_a9a_label":  # reported, not asserted: one class per shard, 1 and 8 rounds per epoch
        for sync in (1, 8):
            m_sync = train(conn, table, "svm", {**A9A_PARAMS, "sync": sync})
            extra += f", sync {sync} {evaluate(conn, m_sync, 'sh_a9a_test')['accuracy']:.4f}"
    msg = f"a9a svm {A9A_PARAMS} test accuracy: single-server {ref:.4f}, {table} {got:.4f}{extra}"
    print("\n" + msg)
    assert ref > 0.84, msg
    assert abs(got - ref) <= ACCURACY_TOLERANCE, msg


# ----------------------------------------------------------------------------------------------
# 6: failures (nothing is stored on the coordinator nor on the shards)


def assert_nothing_stored(conn, before):
    assert models_count(conn) == before
    assert [shard_models(i) for i in (0, 1)] == [0, 0]


@pytest.fixture
def broken(conn, blobs):
    """A foreign server per way of failing; tables sh_<kind> with one good partition on sht_s1
    (range_part) and the other on the failing server."""
    for name in EXTRA_SERVERS:
        conn.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    with psycopg.connect(shard_dsn(0, "postgres"), autocommit=True) as c:
        for db in (NOCORGI_DB, OLD_DB):
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {db}")
    for db in (NOCORGI_DB, OLD_DB):
        on_shard(0, "CREATE TABLE range_part (id int, label int, features float8[])",
                 "INSERT INTO range_part SELECT i, 1, ARRAY[i % 3, 1]::float8[] FROM generate_series(1, 100) i", dbname=db)
    on_shard(0, "CREATE EXTENSION corgipile VERSION '0.3.0'", dbname=OLD_DB)
    on_shard(1, "DROP ROLE IF EXISTS sht_noread", "CREATE ROLE sht_noread LOGIN")
    d0, p0, p1 = cluster_dir(SHARD_PORTS[0]), SHARD_PORTS[0], SHARD_PORTS[1]
    servers = {
        "sht_dead": (d0, DEAD_PORT, SHARD_DB, "postgres"),
        "sht_nocorgi": (d0, p0, NOCORGI_DB, "postgres"),
        "sht_old": (d0, p0, OLD_DB, "postgres"),
        "sht_noread": (cluster_dir(p1), p1, SHARD_DB, "sht_noread"),
    }
    for name, (host, port, db, user) in servers.items():
        conn.execute(f"CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw "
                     f"OPTIONS (host '{host}', port '{port}', dbname '{db}')")
        conn.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {name} OPTIONS (user '{user}')")
        sharded_table(conn, f"sh_{name[4:]}", [("FOR VALUES IN (0)", S1, "range_part"),
                                                ("FOR VALUES IN (1)", name, "range_part")], by="LIST (label)")
    try:
        yield
    finally:
        for name in EXTRA_SERVERS:
            conn.execute(f"DROP TABLE IF EXISTS sh_{name[4:]} CASCADE")
            conn.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        with psycopg.connect(shard_dsn(0, "postgres"), autocommit=True) as c:
            for db in (NOCORGI_DB, OLD_DB):
                c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        on_shard(1, "DROP ROLE IF EXISTS sht_noread")


def test_a_shard_down_is_08001_naming_the_server(conn, broken):
    before = models_count(conn)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError) as err:
        train(conn, "sh_dead", "svm", {"epochs": 1})
    assert err.value.sqlstate == "08001"
    assert 'could not connect to shard server "sht_dead"' in err.value.diag.message_primary
    assert time.monotonic() - started < 15
    assert_nothing_stored(conn, before)


@pytest.fixture
def silent(conn, blobs):
    """sh_silent: one partition on sht_s1, one on sht_silent — a socket that accepts
    connections and never answers (a hung server), with connect_timeout 3 s."""
    import socket
    port = DEAD_PORT + 1
    directory = f"/tmp/corgipile-silent-{port}"
    os.makedirs(directory, exist_ok=True)
    path = f"{directory}/.s.PGSQL.{port}"
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(directory, 0o777)  # the servers run as another user
    os.chmod(path, 0o777)
    listener.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    conn.execute("DROP SERVER IF EXISTS sht_silent CASCADE")
    conn.execute(f"CREATE SERVER sht_silent FOREIGN DATA WRAPPER postgres_fdw "
                 f"OPTIONS (host '{directory}', port '{port}', dbname '{SHARD_DB}', connect_timeout '3')")
    conn.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER sht_silent OPTIONS (user 'postgres')")
    sharded_table(conn, "sh_silent", [("FOR VALUES IN (0)", S1, "range_part"),
                                      ("FOR VALUES IN (1)", "sht_silent", "range_part")], by="LIST (label)")
    try:
        yield held
    finally:
        stop.set()
        acceptor.join(timeout=5)
        for c in held:
            c.close()
        listener.close()
        os.unlink(path)
        conn.execute("DROP TABLE IF EXISTS sh_silent CASCADE")
        conn.execute("DROP SERVER IF EXISTS sht_silent CASCADE")


def test_a_hung_shard_server_is_08001_after_connect_timeout(conn, silent):
    before = models_count(conn)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError) as err:
        train(conn, "sh_silent", "svm", {"epochs": 1})
    took = time.monotonic() - started
    assert err.value.sqlstate == "08001"
    assert 'shard server "sht_silent"' in err.value.diag.message_primary
    assert "timeout expired" in err.value.diag.message_primary
    assert 2.5 < took < 6, took
    assert silent, "the coordinator never connected"
    assert_nothing_stored(conn, before)


def test_cancel_while_connecting_to_a_hung_shard_server(dsn, conn, silent):
    conn.execute("ALTER SERVER sht_silent OPTIONS (SET connect_timeout '60')")
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer:
        before = models_count(killer)
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_silent", "svm", {"epochs": 1})
        try:
            wait_active(killer, pid)
            deadline = time.monotonic() + 10
            while not silent and time.monotonic() < deadline:
                time.sleep(0.02)
            assert silent, "the coordinator never connected"
            time.sleep(0.5)
            assert t.is_alive(), result
            latency = cancel_and_join(killer, t, result, pid, timeout=30)
        finally:
            stop_if_running(killer, t, pid)
        print(f"\ncancel while connecting to a hung shard server: ERROR after {latency:.3f} s")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < 1.0, f"cancel took {latency:.2f} s"
        assert_nothing_stored(killer, before)


def test_a_shard_without_corgipile_is_42704(conn, broken):
    before = models_count(conn)
    with pytest.raises(E.UndefinedObject) as err:
        train(conn, "sh_nocorgi", "svm", {"epochs": 1})
    assert err.value.sqlstate == "42704"
    assert 'corgipile is not installed on shard server "sht_nocorgi"' in err.value.diag.message_primary
    assert_nothing_stored(conn, before)


def test_a_shard_with_another_corgipile_version_is_0A000(conn, broken):
    assert version(conn) != "0.3.0"
    assert shard_scalar(0, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'", dbname=OLD_DB) == "0.3.0"
    before = models_count(conn)
    with pytest.raises(E.FeatureNotSupported) as err:
        train(conn, "sh_old", "svm", {"epochs": 1})
    assert err.value.sqlstate == "0A000"
    assert err.value.diag.message_primary == f'shard server "sht_old" has corgipile 0.3.0, this server {version(conn)}'
    assert_nothing_stored(conn, before)


def test_a_remote_role_without_select_is_42501_from_the_shard(conn, broken):
    before = models_count(conn)
    with pytest.raises(E.InsufficientPrivilege) as err:
        train(conn, "sh_noread", "svm", {"epochs": 1})
    assert err.value.sqlstate == "42501"
    msg = err.value.diag.message_primary
    assert msg.startswith('shard server "sht_noread": ') and "permission denied" in msg, msg
    assert_nothing_stored(conn, before)


def test_a_third_label_value_on_one_shard(conn, blobs):
    on_shard(1, "DROP TABLE IF EXISTS bad3_part",
             "CREATE TABLE bad3_part AS SELECT id, CASE WHEN id % 100 = 0 THEN 2 ELSE label END AS label, features "
             "FROM range_part")
    sharded_table(conn, "sh_bad3", [("FOR VALUES FROM (1) TO (100001)", S1, "range_part"),
                                    ("FOR VALUES FROM (100001) TO (200001)", S2, "bad3_part")])
    before = models_count(conn)
    with pytest.raises(psycopg.Error) as err:
        train(conn, "sh_bad3", "svm", {"epochs": 1})
    msg = err.value.diag.message_primary
    from_shard = msg.startswith(f'shard server "{S2}": ') and "more than two distinct values" in msg
    from_stats = "3 distinct values" in msg and not msg.startswith("shard server")
    assert from_shard or from_stats, (err.value.sqlstate, msg)
    assert err.value.sqlstate.startswith("22"), (err.value.sqlstate, msg)
    assert_nothing_stored(conn, before)


def test_a_shard_error_keeps_its_sqlstate_and_names_the_server(conn, blobs):
    """A shorter feature array on shard 2 (every 100th row): shard 2's own ERROR, 2202E."""
    on_shard(1, "DROP TABLE IF EXISTS badw_part",
             "CREATE TABLE badw_part AS SELECT id, label, CASE WHEN id % 100 = 0 THEN features[1:9] ELSE features END "
             "AS features FROM range_part")
    sharded_table(conn, "sh_badw", [("FOR VALUES FROM (1) TO (100001)", S1, "range_part"),
                                    ("FOR VALUES FROM (100001) TO (200001)", S2, "badw_part")])
    before = models_count(conn)
    with pytest.raises(psycopg.Error) as err:
        train(conn, "sh_badw", "svm", {"epochs": 1})
    msg = err.value.diag.message_primary
    assert err.value.sqlstate == "2202E", (err.value.sqlstate, msg)
    assert msg.startswith(f'shard server "{S2}": ') and "9 elements" in msg, msg
    assert_nothing_stored(conn, before)


def test_a_shard_error_cancels_the_other_shards_work(conn, blobs):
    """Shard 1's round waits for a lock while shard 2 raises: the ERROR comes at once and shard
    1's query is cancelled (it would otherwise wait as long as the lock is held)."""
    on_shard(1, "DROP TABLE IF EXISTS badw_part",
             "CREATE TABLE badw_part AS SELECT id, label, CASE WHEN id % 100 = 0 THEN features[1:9] ELSE features END "
             "AS features FROM range_part")
    sharded_table(conn, "sh_badw2", [("FOR VALUES FROM (1) TO (100001)", S1, "range_part"),
                                     ("FOR VALUES FROM (100001) TO (200001)", S2, "badw_part")])
    before = models_count(conn)
    with psycopg.connect(shard_dsn(0)) as locker:
        locker.execute("LOCK TABLE range_part IN ACCESS EXCLUSIVE MODE")
        try:
            started = time.monotonic()
            with pytest.raises(psycopg.Error) as err:
                train(conn, "sh_badw2", "svm", {"epochs": 1})
            elapsed = time.monotonic() - started
            still = wait_shards_quiet()
        finally:
            locker.rollback()
    print(f"\nshard 2 ERROR while shard 1 waits: after {elapsed:.3f} s; after {SETTLE} s: {still}")
    assert err.value.sqlstate == "2202E" and err.value.diag.message_primary.startswith(f'shard server "{S2}": ')
    assert elapsed < CANCEL_LIMIT, elapsed
    assert still == {0: [], 1: []}, still
    assert_nothing_stored(conn, before)


LONG = {"epochs": 1_000_000, "sync": 50, "seed": 1}
# Each loop the coordinator runs: the one model's rounds, a search's learners, folds' learners,
# a validation round after every epoch (with patience that never stops), a network's rounds.
LONG_SHAPES = {
    "one model": ("svm", LONG),
    "search": ("svm", {**LONG, "search": {"learning_rate": [0.01, 0.1, 0.3]}, "validation": {"fraction": 0.2}, "name": "sh_cancel_search"}),
    "folds": ("logistic", {**LONG, "folds": 3}),
    "validation": ("logistic", {**LONG, "validation": {"fraction": 0.2}, "patience": 1_000_000}),
    "mlp": ("mlp", {**LONG, "hidden": [8]}),
}


@pytest.mark.parametrize("shape", LONG_SHAPES)
def test_cancel_stops_the_coordinator_and_the_shards(dsn, blobs, shape):
    model, params = LONG_SHAPES[shape]
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer:
        before = models_count(killer)
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_range", model, params)
        try:
            wait_active(killer, pid)
            time.sleep(1.0)
            assert t.is_alive(), f"training should still be running: {result}"
            # Rounds are short (2,000 rows): look for one in progress for up to 1 s more.
            seen = {0: [], 1: []}
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and not (seen[0] or seen[1]):
                seen = {i: running_rounds(i) for i in (0, 1)}
            latency = cancel_and_join(killer, t, result, pid)
        finally:
            stop_if_running(killer, t, pid)
        still = wait_shards_quiet()
        print(f"\n{shape}: cancel latency {latency:.3f} s (shard rounds seen running before: "
              f"{[len(v) for v in seen.values()]}); after {SETTLE} s: {still}")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert result["error"].sqlstate == "57014"
        assert latency < CANCEL_LIMIT, f"cancel took {latency:.2f} s"
        assert still == {0: [], 1: []}, still
        assert {i: corgipile_connections(i) for i in (0, 1)} == {0: [], 1: []}
        assert_nothing_stored(killer, before)
        assert scalar(victim, "SELECT 1") == 1


def test_progress_shows_the_round_and_each_shards_state(dsn, blobs):
    """corgipile.progress on the coordinator: the round ("statistics", then "round r/R") and every
    shard done (with its rows) or running (for how long). Shard 2's table is locked, so its
    statistics round waits, and shard 1's is done."""
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as observer, \
            psycopg.connect(shard_dsn(1)) as locker:
        locker.execute("LOCK TABLE range_part IN ACCESS EXCLUSIVE MODE")
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_range", "svm", {"epochs": 2, "seed": 1, "sync": 4})
        try:
            def shards_column():
                row = observer.execute("SELECT shards FROM corgipile.progress WHERE pid = %s", (pid,)).fetchone()
                return row and row[0]
            deadline = time.monotonic() + 15
            seen = None
            while time.monotonic() < deadline:
                seen = shards_column()
                if seen and f"{S1} done 100000 rows" in seen and "running" in seen:
                    break
                time.sleep(0.05)
            assert seen and re.fullmatch(rf"statistics: {S1} done 100000 rows, {S2} running \d+\.\d s", seen), seen
            row = observer.execute("SELECT relation, model, phase FROM corgipile.progress WHERE pid = %s",
                                   (pid,)).fetchone()
            assert row == ("sh_range", "svm", "statistics pass"), row
            locker.rollback()
            rounds = set()
            while t.is_alive() and time.monotonic() < deadline + 30:
                seen = shards_column()
                if seen and seen.startswith("round "):
                    rounds.add(seen.split(":")[0])
                time.sleep(0.01)
            t.join(timeout=60)
            assert "value" in result, result
            assert rounds and rounds <= {f"round {r}/4" for r in range(1, 5)}, rounds
        finally:
            locker.rollback()
            stop_if_running(observer, t, pid)
    with psycopg.connect(dsn, autocommit=True) as c:
        assert scalar(c, "SELECT count(*) FROM corgipile.progress WHERE pid = %s", (pid,)) == 0


def test_cancel_while_a_shard_round_waits_cancels_the_remote_query(dsn, blobs):
    """Shard 2's table is locked, so its round waits there: cancelling the coordinator must
    cancel that remote query too (it would otherwise wait as long as the lock is held)."""
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer, \
            psycopg.connect(shard_dsn(1)) as locker:
        before = models_count(killer)
        locker.execute("LOCK TABLE range_part IN ACCESS EXCLUSIVE MODE")  # held until rollback
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_range", "svm", {"epochs": 2, "seed": 1})
        try:
            deadline = time.monotonic() + 15
            waiting = []
            while time.monotonic() < deadline and not waiting:
                waiting = running_rounds(1)
                time.sleep(0.02)
            assert waiting, "shard 2 never started corgipile_shard_round"
            time.sleep(0.3)
            assert t.is_alive(), result
            latency = cancel_and_join(killer, t, result, pid)
            still = wait_shards_quiet()  # the lock is still held
            connected = corgipile_connections(1)
        finally:
            stop_if_running(killer, t, pid)
            locker.rollback()
        print(f"\ncancel while shard 2 waits for a lock: ERROR after {latency:.3f} s; "
              f"after {SETTLE} s: {still}, connections {connected}")
        assert isinstance(result.get("error"), E.QueryCanceled), result
        assert latency < CANCEL_LIMIT, latency
        assert still == {0: [], 1: []}, still
        assert connected == [], connected
        assert_nothing_stored(killer, before)


def test_statement_timeout_stops_the_coordinator_and_the_shards(conn, blobs):
    before = models_count(conn)
    conn.execute("SET statement_timeout = '1500ms'")
    started = time.monotonic()
    try:
        with pytest.raises(E.QueryCanceled) as err:
            train(conn, "sh_hash", "logistic", LONG)
    finally:
        elapsed = time.monotonic() - started
        conn.execute("RESET statement_timeout")
    still = wait_shards_quiet()
    print(f"\nstatement_timeout 1.5 s: ERROR after {elapsed:.3f} s; after {SETTLE} s: {still}")
    assert err.value.sqlstate == "57014"
    assert elapsed < 1.5 + CANCEL_LIMIT, elapsed
    assert still == {0: [], 1: []}, still
    assert {i: corgipile_connections(i) for i in (0, 1)} == {0: [], 1: []}
    assert_nothing_stored(conn, before)
    # The session and the shards train again afterwards.
    assert stored(conn, train(conn, "sh_hash", "svm", {"epochs": 1, "seed": 1}))["rows_trained"] == 200_000


@pytest.fixture
def odd_tables(conn, shards):
    """sh_text (a text label) and sh_sparse (an index/value pair), a shard table of each on both
    shards."""
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS text_part, sparse_part",
                 """CREATE TABLE text_part AS SELECT i AS id, (ARRAY['no', 'yes'])[1 + i % 2] AS label,
                    ARRAY[i % 2 + (i % 7) / 7.0, 1]::float8[] AS features FROM generate_series(1, 1000) i""",
                 """CREATE TABLE sparse_part AS SELECT i AS id, i % 2 AS label,
                    ARRAY[1 + i % 2, 3 + i % 3]::int4[] AS idx, ARRAY[1.0, 0.5]::float8[] AS val
                    FROM generate_series(1, 1000) i""")
    parts = [("FOR VALUES WITH (MODULUS 2, REMAINDER 0)", S1, None), ("FOR VALUES WITH (MODULUS 2, REMAINDER 1)", S2, None)]
    sharded_table(conn, "sh_text", [(b, s, "text_part") for b, s, _ in parts], by="HASH (id)",
                  cols="id int, label text, features float8[]")
    sharded_table(conn, "sh_sparse", [(b, s, "sparse_part") for b, s, _ in parts], by="HASH (id)",
                  cols="id int, label int, idx int4[], val float8[]")
    try:
        yield
    finally:
        conn.execute("DROP TABLE IF EXISTS sh_text, sh_sparse CASCADE")


@pytest.mark.parametrize("model", ["svm", "mlp", "softmax"])
def test_a_text_label_once_refused_trains_on_shards(conn, odd_tables, model):
    """Once 0A000 ("the classes would be numbered differently"): sh_text's 'no'/'yes' labels."""
    m = train(conn, "sh_text", model, {"epochs": 2, "seed": 1, **({"hidden": [4]} if model == "mlp" else {})})
    classes = scalar(conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (m,))
    assert classes == ["no", "yes"], classes
    assert evaluate(conn, m, "sh_text")["rows_scored"] == 2000


@pytest.mark.parametrize("params, what", [({"workers": 2}, '"workers"')])
def test_workers_are_refused_not_dropped(conn, blobs, params, what):
    """Each shard trains in one process: before 0.5.0 "workers" (and "folds", which trains on
    shards now: test_folds_on_shards_hold_out_the_folds_one_server_holds_out) were accepted and
    silently ignored."""
    before = models_count(conn)
    with pytest.raises(E.FeatureNotSupported) as err:
        train(conn, "sh_hash", "svm", {"epochs": 1, **params})
    assert err.value.diag.message_primary == f"{what} cannot train on a sharded table yet"
    assert err.value.diag.message_hint
    assert_nothing_stored(conn, before)


def test_sparse_needs_n_features(conn, odd_tables):
    before = models_count(conn)
    features = {"indices": "idx", "values": "val"}
    with pytest.raises(E.InvalidParameterValue) as err:
        train(conn, "sh_sparse", "svm", {"epochs": 1, "features": features})
    assert err.value.sqlstate == "22023"
    assert "n_features" in err.value.diag.message_primary
    assert_nothing_stored(conn, before)
    # With n_features it trains.
    m = train(conn, "sh_sparse", "svm", {"epochs": 2, "seed": 1, "features": features, "n_features": 5})
    assert stored(conn, m)["rows_trained"] == 2000


@pytest.mark.parametrize("sync", [0, 1001, "two", 1.5, None])
def test_invalid_sync_is_22023(conn, blobs, sync):
    with pytest.raises(E.InvalidParameterValue):
        train(conn, "sh_hash", "svm", {"epochs": 1, "sync": sync})


@pytest.mark.parametrize("call", [
    "SELECT count(*) FROM corgipile_trace('sh_hash', %s)",
    "SELECT corgipile_shuffle('sh_hash', 'sh_hash_shuffled', %s)",
])
def test_functions_that_read_locally_name_the_foreign_partition(conn, blobs, call):
    params = Jsonb({"seed": 1} if "shuffle" in call else {**QUIET, "epochs": 1})
    with pytest.raises(E.FeatureNotSupported) as err:
        conn.execute(call, (params,))
    assert "sh_hash_0" in err.value.diag.message_primary or "sh_hash_1" in err.value.diag.message_primary


def test_explain_shows_the_shards_and_with_analyze_their_tuples(conn, blobs):
    before = models_count(conn)
    plain = [r[0] for r in conn.execute(
        "SELECT * FROM corgipile_explain('sh_hash', 'svm', %s)", (Jsonb({"epochs": 2, "sync": 3}),))]
    assert "Sharded Training: sh_hash" in plain and "Shards: 2" in plain and "Sync: 3 rounds per epoch" in plain
    assert sum(line.startswith("Shard ") and " table " in line for line in plain) == 2
    analyzed = [r[0] for r in conn.execute(
        "SELECT * FROM corgipile_explain('sh_hash', 'svm', %s, true)", (Jsonb({"epochs": 2, "seed": 1}),))]
    tuples = [int(line.split(": ")[2].split(" tuples")[0]) for line in analyzed if line.startswith("Shard ")]
    assert len(tuples) == 2 and sum(tuples) == 200_000, analyzed
    assert "Rounds Per Epoch: 64" in analyzed and "Epochs Run: 2" in analyzed
    assert any(line.startswith("Bytes Per Epoch: ") and int(line.split(": ")[1]) > 0 for line in analyzed)
    # JSON is one well-formed document; EXPLAIN ANALYZE stores no model.
    doc = conn.execute("SELECT * FROM corgipile_explain('sh_hash', 'svm', %s, true, 'json')",
                       (Jsonb({"epochs": 1, "seed": 1, "sync": 1}),)).fetchone()[0]
    import json
    assert json.loads(doc)[0]["Tuples Per Epoch"] == 200_000
    # A network's layers, optimizer and how the shards' changes are combined.
    net = [r[0] for r in conn.execute(
        "SELECT * FROM corgipile_explain('sh_hash', 'mlp', %s)", (Jsonb({"hidden": [8, 4]}),))]
    assert "Hidden Layers: 8, 4 (relu)" in net and "Optimizer: adam" in net, net
    assert "Combine: mean of the shards' changes" in net, net
    # A network stops on held-out rows by default; shards take none yet: 20 epochs on every row.
    assert not any(line.strip().startswith(("Patience", "Validation")) for line in net), net
    assert "Epochs: 20" in net, net
    assert models_count(conn) == before


def assert_same_evaluation(sharded, single):
    """Every metric equal to one server's; ROC AUC from the merged histogram within 1e-3."""
    assert set(sharded) - {"roc_auc_note"} == set(single) - {"roc_auc_note"}, (sharded, single)
    for key, want in single.items():
        got = sharded[key]
        if key == "roc_auc_note":
            continue
        if key == "roc_auc" and want is not None:
            assert abs(got - want) <= 1e-3, (key, got, want)
            assert "histogram" in sharded["roc_auc_note"], sharded
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (key, got, want)
        else:
            assert got == want, (key, got, want)


@pytest.mark.parametrize("model", ["svm", "logistic", "linear"])
def test_evaluate_on_a_sharded_table_equals_one_server(conn, blobs, model):
    m = train(conn, "sh_hash_copy", model, {"epochs": 2, "seed": 1})
    before_shards = [shard_models(i) for i in (0, 1)]
    sharded = evaluate(conn, m, "sh_hash")
    single = evaluate(conn, m, "sh_hash_copy")
    assert sharded["rows_scored"] == 200_000 and sharded["model_id"] == m
    assert_same_evaluation(sharded, single)
    assert [shard_models(i) for i in (0, 1)] == before_shards


def test_evaluate_on_one_class_per_shard_and_a_local_partition(conn, blobs, uneven):
    m = train(conn, "sh_range_copy", "logistic", {"epochs": 2, "seed": 1})
    assert_same_evaluation(evaluate(conn, m, "sh_range"), evaluate(conn, m, "sh_range_copy"))
    if scalar(conn, "SELECT to_regclass('sh_mixed') IS NOT NULL"):
        m = train(conn, "sh_mixed_copy", "svm", {"epochs": 2, "seed": 1})
        assert_same_evaluation(evaluate(conn, m, "sh_mixed"), evaluate(conn, m, "sh_mixed_copy"))


@pytest.fixture
def classes3(conn, shards):
    """sh_cls: text labels a/b/c, two numeric columns and a text column, hash-sharded; a copy."""
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS cls_part",
                 "CREATE TABLE cls_part (id int, label text, x1 float8, x2 float8, color text)")
    sharded_table(conn, "sh_cls", [(f"FOR VALUES WITH (MODULUS 2, REMAINDER {k})", srv, "cls_part")
                                   for k, srv in enumerate((S1, S2))],
                  cols="id int, label text, x1 float8, x2 float8, color text", by="HASH (id)")
    conn.execute("SELECT setseed(0.3)")
    conn.execute(f"""INSERT INTO sh_cls SELECT i, (ARRAY['a','b','c'])[1 + i % 3],
                            (i % 3) + {GAUSS}, (i % 3) * 0.5 + {GAUSS},
                            (ARRAY['red','green','blue'])[1 + (i + (random() < 0.3)::int) % 3]
                     FROM generate_series(1, 30000) i""")
    copy = local_copy(conn, "sh_cls")
    try:
        yield copy
    finally:
        conn.execute("DROP TABLE IF EXISTS sh_cls, sh_cls_copy CASCADE")


def test_evaluate_softmax_with_text_labels_and_a_column_list_on_a_sharded_table(conn, classes3):
    params = {"epochs": 3, "seed": 1, "label": "label", "features": ["x1", "x2", "color"]}
    m = train(conn, classes3, "softmax", params)
    sharded = evaluate(conn, m, "sh_cls")
    assert sharded["rows_scored"] == 30_000
    assert_same_evaluation(sharded, evaluate(conn, m, classes3))
    # A binary model of a text label: rows of the third class are unknown, counted alike.
    conn.execute("DELETE FROM sh_cls_copy WHERE label = 'c'")
    m = train(conn, classes3, "logistic", params)
    sharded = evaluate(conn, m, "sh_cls")
    assert sharded["rows_with_unknown_label"] == 10_000
    conn.execute(f"INSERT INTO {classes3} SELECT * FROM sh_cls WHERE label = 'c'")
    assert_same_evaluation(sharded, evaluate(conn, m, classes3))


def evaluation_tables(conn, model_id, rel):
    """corgipile_confusion_matrix, corgipile_roc_curve and corgipile_calibration (when the model
    has probabilities) of a model on a relation."""
    tables = {}
    for function in ("corgipile_confusion_matrix", "corgipile_roc_curve", "corgipile_calibration"):
        if function == "corgipile_calibration" and scalar(
                conn, "SELECT model_type = 'svm' FROM corgipile.models WHERE id = %s", (model_id,)):
            continue
        tables[function] = conn.execute(
            f"SELECT * FROM {function}(%s::bigint, %s::regclass)", (model_id, rel)).fetchall()
    return tables


def assert_same_tables(sharded, single):
    """Counts equal; sums of probabilities (calibration means) equal up to rounding."""
    assert sharded.keys() == single.keys()
    for function, rows in single.items():
        assert len(sharded[function]) == len(rows), function
        for got, want in zip(sharded[function], rows):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                if isinstance(w, float):
                    assert g == pytest.approx(w, rel=1e-9, abs=1e-12), (function, got, want)
                else:
                    assert g == w, (function, got, want)


@pytest.mark.parametrize("model", ["svm", "logistic"])
def test_evaluation_tables_of_a_sharded_table_equal_one_server(conn, blobs, model):
    m = train(conn, "sh_hash_copy", model, {"epochs": 2, "seed": 1})
    sharded, single = evaluation_tables(conn, m, "sh_hash"), evaluation_tables(conn, m, "sh_hash_copy")
    assert sum(r[2] for r in single["corgipile_confusion_matrix"]) == 200_000
    assert_same_tables(sharded, single)


def test_evaluation_tables_of_softmax_with_text_labels_on_a_sharded_table(conn, classes3):
    params = {"epochs": 3, "seed": 1, "label": "label", "features": ["x1", "x2", "color"]}
    m = train(conn, classes3, "softmax", params)
    sharded, single = evaluation_tables(conn, m, "sh_cls"), evaluation_tables(conn, m, classes3)
    assert {r[0] for r in single["corgipile_confusion_matrix"]} == {"a", "b", "c"}
    assert len(single["corgipile_calibration"]) == 30
    assert_same_tables(sharded, single)


def test_evaluate_failures_on_a_sharded_table(conn, broken):
    m = train(conn, "sh_range_copy", "svm", {"epochs": 1, "seed": 1})
    with pytest.raises(psycopg.OperationalError) as err:
        evaluate(conn, m, "sh_dead")
    assert err.value.sqlstate == "08001" and '"sht_dead"' in err.value.diag.message_primary
    with pytest.raises(E.UndefinedObject) as err:
        evaluate(conn, m, "sh_nocorgi")
    assert 'shard server "sht_nocorgi"' in err.value.diag.message_primary
    with pytest.raises(E.InsufficientPrivilege) as err:
        evaluate(conn, m, "sh_noread")
    assert err.value.diag.message_primary.startswith('shard server "sht_noread": ')
    # Rows of another width on a shard: the shard's ERROR, naming it.
    on_shard(1, "DROP TABLE IF EXISTS wide_part",
             "CREATE TABLE wide_part AS SELECT id, label, features || 0.0::float8 AS features FROM range_part")
    sharded_table(conn, "sh_wide", [("FOR VALUES IN (0)", S1, "range_part"), ("FOR VALUES IN (1)", S2, "wide_part")],
                  by="LIST (label)")
    with pytest.raises(psycopg.Error) as err:
        evaluate(conn, m, "sh_wide")
    assert err.value.sqlstate == "2202E", (err.value.sqlstate, err.value.diag.message_primary)
    assert err.value.diag.message_primary.startswith(f'shard server "{S2}": ')
    assert running_rounds(0) == [] or wait_shards_quiet()[0] == []


def test_a_forged_evaluation_request_is_refused_by_the_shard(shards):
    """corgipile_shard_round is callable by anyone who can read the table: a model whose shape
    does not match what it says is refused before any row is scored."""
    on_shard(0, "DROP TABLE IF EXISTS forge_part",
             "CREATE TABLE forge_part AS SELECT 1 AS label, ARRAY[1.0, 2.0]::float8[] AS features")
    import json
    base = {"phase": "Evaluate", "epoch": 1, "round": 0, "rounds": 1, "n_features": 2,
            "weights": [], "bias": [], "extras": {}}
    forged = {
        "svm": {"kind": "svm", "n_features": 1000, "n_outputs": 1, "weights": [0.5], "bias": [0.0],
                "layers": None, "activation": None},
        # A network whose layers say 2 x 3 x 2 (6 + 6 weights) with one weight; one whose widths
        # multiply beyond any memory (refused, never allocated); a factorization machine whose
        # layers say 2 x 8 x 2 (2 x 2 x 9 weights) with one.
        "mlp": {"kind": "mlp", "n_features": 2, "n_outputs": 2, "layers": [2, 3, 2], "activation": "relu",
                "weights": [0.5], "bias": [0.0, 0.0, 0.0, 0.0, 0.0]},
        "mlp_regression": {"kind": "mlp_regression", "n_features": 2, "n_outputs": 1,
                           "layers": [2, 2**62, 2**62, 1], "activation": "tanh", "weights": [], "bias": []},
        "fm": {"kind": "fm", "n_features": 2, "n_outputs": 2, "layers": [2, 8, 2], "activation": None,
               "weights": [0.5], "bias": [0.0, 0.0]},
    }
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        for kind, model in forged.items():
            request = {**base, "version": version(c), "protocol": SHARD_PROTOCOL,
                       "evaluate": {"model": model, "classes": [], "preprocessing": None}}
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('forge_part', %s, %s, %s)",
                          (kind, Jsonb({"features": "features", "label": "label"}), json.dumps(request)))
            assert err.value.sqlstate == "08P01", (kind, err.value.sqlstate, err.value.diag.message_primary)
            assert "another shape" in err.value.diag.message_primary, kind


def test_a_forged_network_round_is_refused_by_the_shard(shards):
    """A training round of a network whose parameters do not fit the shard's params (hidden
    [4] over 2 features and 2 classes: 22 parameters), or of a network for a linear kind; a
    drift correction of another length than the parameters, or for a linear model."""
    on_shard(0, "DROP TABLE IF EXISTS forge_part",
             "CREATE TABLE forge_part AS SELECT i % 2 AS label, ARRAY[i, 2.0]::float8[] AS features "
             "FROM generate_series(1, 100) i")
    import json
    network = {"classes": [0, 1], "target_mean": 0.0, "target_scale": 1.0}
    params = Jsonb({"features": "features", "label": "label", "hidden": [4]})
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Train", "epoch": 1, "round": 0, "rounds": 1, "n_features": 2,
                "bias": [], "extras": {}}
        ok = {**base, **learner([0.1] * 22), "network": network}
        reply = json.loads(scalar(c, "SELECT corgipile_shard_round('forge_part', 'mlp', %s, %s)",
                                  (params, json.dumps(ok))))
        got = reply["learners"][0]
        assert got["tuples"] == 100 and len(got["weights"]) == 22 and got["bias"] == []

        def corrected(correction, weights=(0.1,) * 22):
            return {"learners": [{"weights": list(weights), "bias": [], "correction": correction}]}

        # A drift correction (protocol 8): none yet (empty) or one per parameter; the shard
        # answers its round's mean gradient, one per parameter, and steps by the correction.
        # Each a training of its own (a fresh optimizer).
        def round_of(training, **extra):
            request = {**base, **extra, "network": network, "training": training}
            return json.loads(scalar(c, "SELECT corgipile_shard_round('forge_part', 'mlp', %s, %s)",
                                     (params, json.dumps(request))))["learners"][0]

        plain, first = round_of(201, **learner([0.1] * 22)), round_of(202, **corrected([]))
        assert plain["control"] is None
        assert len(first["control"]) == 22 and any(v != 0 for v in first["control"])
        # A correction far above any gradient here: every Adam step moves every parameter
        # against its sign, whatever the rows say.
        down, up = round_of(203, **corrected([1e4] * 22)), round_of(204, **corrected([-1e4] * 22))
        assert all(w < 0.1 for w in down["weights"]) and all(w > 0.1 for w in up["weights"])
        assert len(down["control"]) == 22 and not all(w < 0.1 for w in first["weights"])
        svm = {"learners": [{"weights": [0.1, 0.1], "bias": [0.0], "correction": [1.0, 1.0]}]}
        for model, request in (("mlp", {**base, **corrected([1.0] * 21), "network": network}),
                               ("mlp", {**base, **corrected([1.0] * 23), "network": network}),
                               ("svm", {**base, **svm}),
                               ("mlp", {**base, **learner([0.1] * 21), "network": network}),
                               ("mlp", {**base, **learner([0.1] * 22)}),
                               ("svm", {**base, **learner([0.1] * 22), "network": network}),
                               ("mlp", {**base, **learner([0.1] * 22), "network": {**network, "classes": [0]}}),
                               # A regression network has no classes (hidden [4]: 17 parameters).
                               ("mlp_regression", {**base, **learner([0.1] * 17), "network": network})):
            linear = Jsonb({"features": "features", "label": "label"})
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('forge_part', %s, %s, %s)",
                          (model, params if model.startswith("mlp") else linear, json.dumps(request)))
            assert err.value.sqlstate == "08P01", (model, err.value.sqlstate, err.value.diag.message_primary)


def test_a_forged_learners_round_is_refused_by_the_shard(shards):
    """A training round's learners (protocol 5) are checked before a row is read: a configuration
    the search of the shard's params does not have, one sent twice, none at all, a learner of a
    fold beyond the round's folds, another number of folds than the params', folds scored
    outside a training round, learners in a statistics round, a validation round's models of
    two shapes: 08P01. The honest round trains each learner and answers each in order."""
    on_shard(0, "DROP TABLE IF EXISTS forge_part",
             "CREATE TABLE forge_part AS SELECT i % 2 AS label, ARRAY[i, 2.0]::float8[] AS features "
             "FROM generate_series(1, 100) i")
    import json
    search = {"learning_rate": [0.01, 0.1]}
    params = Jsonb({"features": "features", "label": "label", "search": search, "name": "forge",
                    "validation": {"fraction": 0.2}})
    folded = Jsonb({"features": "features", "label": "label", "folds": 3})

    def lr(rate, fold=None, weights=(0.0, 0.0)):
        return {"configuration": {"learning_rate": rate}, "fold": fold, "weights": list(weights), "bias": [0.0]}

    def model(n):
        return {"model": {"kind": "svm", "n_features": n, "n_outputs": 1, "weights": [0.1] * n, "bias": [0.0],
                          "layers": None, "activation": None}, "classes": [], "preprocessing": None}

    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": PROTOCOL, "phase": "Train", "epoch": 1, "round": 0, "rounds": 1,
                "n_features": 2, "extras": {"label_values": [0.0, 1.0]}, "training": 5}
        ok = {**base, "learners": [lr(0.1), lr(0.01)]}
        reply = json.loads(scalar(c, "SELECT corgipile_shard_round('forge_part', 'svm', %s, %s)",
                                  (params, json.dumps(ok))))
        assert [len(x["weights"]) for x in reply["learners"]] == [2, 2] and reply["learners"][0]["tuples"] > 0
        assert reply["learners"][0]["weights"] != reply["learners"][1]["weights"]  # each its own rate
        validate = {**base, "phase": "Validate", "learners": [
            {"configuration": {"learning_rate": 0.01}, "score": model(2)},
            {"configuration": {"learning_rate": 0.1}, "score": model(3)}]}
        cases = [(params, {**base, "learners": [lr(0.5)]}, "the search of these params does not have"),
                 (params, {**base, "learners": [lr(0.1), lr(0.1)]}, "a configuration twice"),
                 (params, {**base, "learners": []}, "0 learners in a round of phase Train"),
                 (params, {**base, "phase": "Statistics", "learners": [lr(0.1)]}, "1 learners in a round"),
                 (params, {**base, "learners": [lr(0.1)], "score_folds": True}, "folds to score"),
                 (params, validate, "models of several shapes"),
                 (folded, {**base, "folds": 3, "learners": [{**lr(0.1, fold=3), "configuration": {}}]},
                  "a fold the round does not have"),
                 (folded, {**base, "folds": 2, "learners": [{**lr(0.1, fold=0), "configuration": {}}]},
                  "another number of folds"),
                 (folded, {**base, "folds": 1, "learners": [{**lr(0.1), "configuration": {}}]}, "1 folds")]
        for p, request, why in cases:
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('forge_part', 'svm', %s, %s)", (p, json.dumps(request)))
            assert err.value.sqlstate == "08P01", (request, err.value.sqlstate, err.value.diag.message_primary)
            assert why in err.value.diag.message_primary, (why, err.value.diag.message_primary)


# ----------------------------------------------------------------------------------------------
# classes numbered once for every shard (round 0 brings back each shard's classes), versions


MIX_ROWS = 15_000  # per shard


@pytest.fixture(scope="module")
def class_mix(dsn, shards):
    """sh_mix: three Gaussian blobs (classes 0, 1, 2 centred at -1.5, 0, 1.5 on both axes, sd 0.6),
    range-sharded so that the shards hold different class mixes: shard 1 classes 0 and 1, shard 2
    classes 1 and 2 (0 and 2 each on one shard only). `word` names the class as text ('cat' 0,
    'ant' 1, 'bee' 2: sorted 'ant' < 'bee' < 'cat', not the classes' order), `tag` as 'c0', 'c1',
    'c2' (sorted as the numbers), `side` is 'no' for
    class 0 and 'yes' otherwise (shard 2 holds only 'yes'). Generated on the shards, stored
    clustered by class; a local copy sh_mix_copy."""
    for i in (0, 1):
        first = 1 + MIX_ROWS * i
        on_shard(i, "DROP TABLE IF EXISTS mix_part",
                 f"SELECT setseed({0.41 + 0.2 * i})",
                 f"""CREATE TABLE mix_part AS
                     SELECT id, y AS label, (ARRAY['cat', 'ant', 'bee'])[1 + y] AS word, 'c' || y AS tag,
                            CASE WHEN y = 0 THEN 'no' ELSE 'yes' END AS side,
                            ARRAY[1.5 * (y - 1) + 0.6 * {GAUSS}, 1.5 * (y - 1) + 0.6 * {GAUSS}]::float8[] AS features
                     FROM (SELECT i AS id, {i} + (i % 2) AS y
                           FROM generate_series({first}, {first + MIX_ROWS - 1}) i) s
                     ORDER BY y, id""",
                 "VACUUM ANALYZE mix_part")
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_mix", [(f"FOR VALUES FROM ({1 + MIX_ROWS * k}) TO ({1 + MIX_ROWS * (k + 1)})", srv, "mix_part")
                                    for k, srv in enumerate((S1, S2))],
                      cols="id int, label int, word text, tag text, side text, features float8[]")
        copy = local_copy(c, "sh_mix")
    assert [shard_scalar(i, "SELECT array_agg(DISTINCT label ORDER BY label) FROM mix_part") for i in (0, 1)] == [[0, 1], [1, 2]]
    yield copy


def classes_of(c, model_id):
    return scalar(c, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (model_id,))


def test_softmax_on_shards_of_different_class_mixes(conn, class_mix):
    """Three classes, one of them on each shard only: the coordinator numbers every shard's
    classes (sorted), every shard trains a softmax of all three. The classes are the one-server
    training's (one server lists them as it meets them: compared as sets, and sorted on shards),
    the accuracy within 0.5 point of one server's on the same rows."""
    params = {"epochs": 5, "seed": 3}
    got, ref, m = compare(conn, "sh_mix", class_mix, "softmax", params, tol=0.005)
    assert ref > 0.9, ref
    single = train(conn, class_mix, "softmax", params)
    assert classes_of(conn, m) == [0, 1, 2]
    assert sorted(classes_of(conn, single)) == [0, 1, 2]
    assert stored(conn, m)["rows_trained"] == 2 * MIX_ROWS
    n_outputs = scalar(conn, "SELECT n_outputs FROM corgipile.models WHERE id = %s", (m,))
    assert n_outputs == 3
    # Scored on the shards (each scores its rows with the stored classes) as on the copy.
    assert_same_evaluation(evaluate(conn, m, "sh_mix"), evaluate(conn, m, class_mix))
    # A class on one shard only still weighs as everyone's: class_weight names all three.
    weighted = train(conn, "sh_mix", "softmax", {**params, "class_weight": "balanced"})
    assert classes_of(conn, weighted) == [0, 1, 2]


def test_softmax_of_a_text_label_on_shards(conn, class_mix):
    params = {"epochs": 5, "seed": 3, "label": "word"}
    got, ref, m = compare(conn, "sh_mix", class_mix, "softmax", params, tol=0.005)
    assert classes_of(conn, m) == ["ant", "bee", "cat"]
    assert sorted(classes_of(conn, train(conn, class_mix, "softmax", params))) == ["ant", "bee", "cat"]


def test_logistic_with_a_text_label_on_shards(conn, class_mix):
    """'no' on shard 1 only: the shards' classes merged give the two; the positive class is the
    second in sorted order ('yes'), as predictions say."""
    params = {"epochs": 5, "seed": 3, "label": "side"}
    got, ref, m = compare(conn, "sh_mix", class_mix, "logistic", params, tol=0.005)
    assert ref > 0.9, ref
    assert classes_of(conn, m) == ["no", "yes"]
    assert sorted(classes_of(conn, train(conn, class_mix, "logistic", params))) == ["no", "yes"]
    # Predictions name the classes as the column holds them, the right way round.
    agree = scalar(conn, f"SELECT avg((corgipile_predict_class(%s, features) = side)::int)::float8 FROM {class_mix}",
                   (m,))
    assert abs(agree - got) < 1e-9, (agree, got)


def test_mlp_with_a_text_label_on_shards(conn, class_mix):
    """A network's classes were the shards' label values (numbers only): texts now, merged alike.
    Texts sorted as the numbers ('c0' < 'c1' < 'c2') number the classes as the numbers do: the
    same network, weight for weight. Against one server: within 2 points after 10 epochs, not
    0.5 (a network over shards of different class mixes converges more slowly than on one server,
    number labels as much: 0.93 against 0.94 measured here, 0.78 against 0.94 after 4 epochs;
    the quality target of #55 item 3, not what this numbering changes)."""
    params = {"epochs": 4, "seed": 3, "hidden": [8]}
    by_number = train(conn, "sh_mix", "mlp", {**params, "label": "label"})
    by_text = train(conn, "sh_mix", "mlp", {**params, "label": "tag"})
    assert classes_of(conn, by_text) == ["c0", "c1", "c2"] and classes_of(conn, by_number) == [0, 1, 2]
    assert stored(conn, by_text)["weights"] and stored(conn, by_text)["weights"] == stored(conn, by_number)["weights"]
    assert stored(conn, by_text)["bias"] == stored(conn, by_number)["bias"]
    params = {"epochs": 10, "seed": 3, "label": "word", "hidden": [8]}
    got, ref, m = compare(conn, "sh_mix", class_mix, "mlp", params, tol=0.02)
    assert ref > 0.9, ref
    layers, classes = conn.execute("SELECT layers, label_mapping->'classes' FROM corgipile.models WHERE id = %s",
                                   (m,)).fetchone()
    assert layers == [2, 8, 3] and classes == ["ant", "bee", "cat"]


def test_a_third_text_label_over_the_shards_is_refused_for_a_binary_kind(conn, class_mix):
    """Each shard holds two of the three words: no shard refuses, the merged classes do."""
    before = models_count(conn)
    with pytest.raises(psycopg.Error) as err:
        train(conn, "sh_mix", "svm", {"epochs": 1, "label": "word"})
    assert err.value.sqlstate.startswith("22"), (err.value.sqlstate, err.value.diag.message_primary)
    assert "3 distinct values" in err.value.diag.message_primary, err.value.diag.message_primary
    assert_nothing_stored(conn, before)


def shard_round(c, model, params, request):
    import json
    return c.execute("SELECT corgipile_shard_round('mix_part', %s, %s, %s)",
                     (model, Jsonb(params), json.dumps(request))).fetchone()[0]


def test_a_request_of_another_version_names_both(class_mix):
    """A shard reads a request's versions before the rest of it: another corgipile version, or
    the same version speaking another shard protocol (a development build), or a coordinator of
    0.5.0 (no protocol number) is 0A000 naming both."""
    import json
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        ours = version(c)
        base = {"version": ours, "protocol": SHARD_PROTOCOL, "phase": "Statistics", "epoch": 1, "round": 0, "rounds": 1,
                "n_features": 0, "weights": [], "bias": [], "extras": {}}
        params = {"features": "features", "label": "word"}
        reply = json.loads(shard_round(c, "softmax", params, base))
        assert reply["protocol"] == SHARD_PROTOCOL and reply["version"] == ours
        assert sorted(reply["classes"]) == ["ant", "cat"]  # in this shard's own numbering
        for request, theirs in (({**base, "version": "0.0.1"}, f"corgipile 0.0.1 (shard protocol {SHARD_PROTOCOL})"),
                                ({**base, "protocol": 1}, f"corgipile {ours} (shard protocol 1)"),
                                # A 0.5.0 coordinator: no protocol, and fields this one reads otherwise.
                                ({k: v for k, v in base.items() if k != "protocol"} | {"version": "0.5.0-old"},
                                 "corgipile 0.5.0-old (a shard protocol older than 2)")):
            with pytest.raises(E.FeatureNotSupported) as err:
                shard_round(c, "softmax", params, request)
            assert err.value.diag.message_primary == \
                f"the coordinator runs {theirs}, this shard corgipile {ours} (shard protocol {SHARD_PROTOCOL})"
            assert err.value.diag.message_hint


def test_a_forged_class_round_is_refused_by_the_shard(class_mix):
    """A training round of a softmax whose classes do not fit its model, repeat a class or are
    missing, or of a binary kind with three classes: 08P01 before a row is read."""
    import json
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Train", "epoch": 1, "round": 0, "rounds": 1,
                "n_features": 2, "extras": {}}
        params = {"features": "features", "label": "word"}
        ok = {**base, **learner([0.0] * 6, [0.0] * 3), "classes": ["ant", "bee", "cat"]}
        reply = json.loads(shard_round(c, "softmax", params, ok))
        assert reply["learners"][0]["tuples"] == MIX_ROWS and len(reply["learners"][0]["weights"]) == 6
        for model, request in (("softmax", {**ok, "classes": ["ant", "bee"]}),
                               ("softmax", {**ok, "classes": ["ant", "ant", "cat"]}),
                               ("softmax", {**ok, "classes": ["ant", "bee", 3]}),
                               ("softmax", {**ok, "classes": ["ant", "bee", "x" * 5000]}),
                               ("softmax", {**ok, "classes": []}),
                               ("svm", {**base, **learner([0.0] * 2, [0.0]), "classes": ["ant", "bee", "cat"]}),
                               ("svm", {**base, **learner([0.0] * 2, [0.0])})):
            with pytest.raises(psycopg.Error) as err:
                shard_round(c, model, params, request)
            assert err.value.sqlstate == "08P01", (model, request.get("classes"), err.value.sqlstate,
                                                   err.value.diag.message_primary)


# ----------------------------------------------------------------------------------------------
# column lists: the preprocessing merged from every shard's statistics

COLS_ROWS = 20_000  # per shard
COLS = ["x1", "x2", "color", "day", "seen", "flag"]


@pytest.fixture(scope="module")
def mixed(dsn, shards):
    """sh_cols: a mixed-type table range-sharded so that the shards hold different mixes: x1
    (numbers, 5% NULL; N(0, 1) on shard 1, N(0.5, 1.5) on shard 2), x2, color (red, green, blue
    on shard 1; red, blue, teal on shard 2: green and teal each on one shard only; 3% NULL), day
    (a date: January to June on shard 1, April to December on shard 2), seen (a timestamptz),
    flag (boolean, 30% / 70% true); label (0/1) and kind (low, mid, high) from a score of all of
    them with noise; tag, distinct in every row. Generated on the shards (shard 1's table has a
    column more, note, which sh_cols does not declare); a local copy sh_cols_copy."""
    score = ("1.2 * coalesce(x1, 0) - 0.8 * x2 + CASE color WHEN 'red' THEN 1 WHEN 'teal' THEN -1.5 "
             "WHEN 'green' THEN 0.5 ELSE 0 END + 0.8 * flag::int + 0.004 * (day - DATE '2024-01-01') "
             f"+ 0.5 * {GAUSS}")
    for i in (0, 1):
        first = 1 + COLS_ROWS * i
        colors = "ARRAY['red', 'green', 'blue']" if i == 0 else "ARRAY['red', 'blue', 'teal', 'teal']"
        on_shard(i, "DROP TABLE IF EXISTS cols_part",
                 f"SELECT setseed({0.17 + 0.3 * i})",
                 f"""CREATE TABLE cols_part AS
                     SELECT id, (s > 0.4)::int AS label,
                            CASE WHEN s < -0.3 THEN 'low' WHEN s < 1.2 THEN 'mid' ELSE 'high' END AS kind,
                            x1, x2, color, day, seen, flag, 't' || id AS tag
                     FROM (SELECT *, {score} AS s
                           FROM (SELECT i AS id,
                                        CASE WHEN random() < 0.05 THEN NULL ELSE {0.5 * i} + {1 + 0.5 * i} * {GAUSS} END AS x1,
                                        {GAUSS} AS x2,
                                        CASE WHEN random() < 0.03 THEN NULL
                                             ELSE ({colors})[1 + floor(random() * {3 + i})::int] END AS color,
                                        DATE '2024-01-01' + {90 * i} + floor(random() * {180 + 90 * i})::int AS day,
                                        TIMESTAMPTZ '2024-03-01 00:00+00' + random() * interval '200 days' AS seen,
                                        random() < {0.3 + 0.4 * i} AS flag
                                 FROM generate_series({first}, {first + COLS_ROWS - 1}) i) r) t""",
                 # A column the coordinator's table does not have: "*" is the coordinator's.
                 *(["ALTER TABLE cols_part ADD COLUMN note text DEFAULT 'shard one'"] if i == 0 else []),
                 "VACUUM ANALYZE cols_part")
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_cols", [(f"FOR VALUES FROM ({1 + COLS_ROWS * k}) TO ({1 + COLS_ROWS * (k + 1)})", srv, "cols_part")
                                     for k, srv in enumerate((S1, S2))],
                      cols="id int, label int, kind text, x1 float8, x2 float8, color text, day date, "
                           "seen timestamptz, flag boolean, tag text")
        copy = local_copy(c, "sh_cols")
    colors = [shard_scalar(i, "SELECT array_agg(DISTINCT color ORDER BY color) FROM cols_part WHERE color IS NOT NULL") for i in (0, 1)]
    assert colors == [["blue", "green", "red"], ["blue", "red", "teal"]], colors
    yield copy


def preprocessing_of(c, model_id):
    return scalar(c, "SELECT preprocessing FROM corgipile.models WHERE id = %s", (model_id,))


def assert_same_preprocessing(c, sharded, single, copy):
    """The stored preprocessing of a training on the shards against one server's on the copy:
    the same columns, features and categories (in the same order), the same NULL categories;
    means, standard deviations and imputed values within 1e-9 relative; the bins of a number
    encoded "ple" (quantiles of merged sketches) at the same ranks of the copy's column within
    0.02, its outer edges (the extremes) equal."""
    import bisect
    got, want = preprocessing_of(c, sharded), preprocessing_of(c, single)
    assert got["n_features"] == want["n_features"] and got["rows"] == want["rows"]
    assert [col["name"] for col in got["columns"]] == [col["name"] for col in want["columns"]]
    for g, w in zip(got["columns"], want["columns"]):
        assert (g["encode"], g["offset"], g["scaled"]) == (w["encode"], w["offset"], w["scaled"]), (g, w)
        if g["encode"] == "one_hot":
            assert (g["categories"], g["other"], g["null"]) == (w["categories"], w["other"], w["null"])
        for key in ("mean", "std", "fill"):
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-9, abs=1e-12), (g["name"], key, g[key], w[key])
        if g["encode"] == "ple":
            e, f = g["edges"], w["edges"]
            assert len(e) == len(f) and (e[0], e[-1]) == (f[0], f[-1]), (e, f)
            values = [float(v) for (v,) in c.execute(f"SELECT {g['name']} FROM {copy} "
                                                     f"WHERE {g['name']} IS NOT NULL ORDER BY 1")]
            ranks = [(bisect.bisect_left(values, a) - bisect.bisect_left(values, b)) / len(values) for a, b in zip(e, f)]
            assert max(map(abs, ranks)) < 0.02, (g["name"], e, f)
    return got


@pytest.mark.parametrize("model, params", [
    ("logistic", {"label": "label", "features": COLS}),
    ("logistic", {"label": "label", "features": "*", "exclude": ["id", "kind", "tag"]}),
    ("softmax", {"label": "kind", "features": COLS}),
    ("mlp", {"label": "kind", "features": COLS, "hidden": [16], "epochs": 8}),
])
def test_column_lists_on_shards_train_like_one_server(conn, mixed, model, params):
    """A list of feature columns (or "*") over shards that hold different mixes, a category on
    one shard only: every shard's statistics merged give one server's preprocessing on the same
    rows, every shard encodes with it, and the model is as good as one server's (within 1
    point). The session's time zone (not the shards' UTC) reads the timestamptz column, as on
    one server. The stored preprocessing evaluates on the shards and predicts from rows."""
    params = {"epochs": 5, "seed": 3, **params}
    conn.execute("SET TimeZone = 'Asia/Kolkata'")
    try:
        single = train(conn, mixed, model, params)
        m = train(conn, "sh_cols", model, params)
    finally:
        conn.execute("RESET TimeZone")
    got, ref = evaluate(conn, m, mixed)["accuracy"], evaluate(conn, single, mixed)["accuracy"]
    print(f"\nsh_cols {model} {params}: accuracy single-server {ref:.4f}, sharded {got:.4f}")
    assert abs(got - ref) <= ACCURACY_TOLERANCE, (got, ref)
    assert ref > (0.8 if model == "logistic" else 0.7), ref
    p = assert_same_preprocessing(conn, m, single, mixed)
    # The coordinator holds no rows to score: a sharded model's predictions are not profiled
    # (corgipile_drift answers "no training profile" for them); one server's are.
    assert "predictions" not in p.get("profile", {})
    assert "predictions" in preprocessing_of(conn, single)["profile"]
    color = next(col for col in p["columns"] if col["name"] == "color")
    assert sorted(color["categories"]) == ["blue", "green", "red", "teal"] and color["null"]
    if model == "mlp":  # numbers encoded "ple" by default: bins from the merged sketches
        assert {col["encode"] for col in p["columns"] if col["name"] in ("x1", "x2")} == {"ple"}
    assert stored(conn, m)["rows_trained"] == 2 * COLS_ROWS
    # The stored preprocessing is the model's: scored on the shards as on the copy, and
    # predictions from a row agree with the evaluation.
    assert_same_evaluation(evaluate(conn, m, "sh_cols"), evaluate(conn, m, mixed))
    label = params["label"]
    agree = scalar(conn, f"SELECT avg((corgipile_predict_class(%s, c) = c.{label}::text)::int)::float8 FROM {mixed} c",
                   (m,))
    assert abs(agree - got) < 1e-9, (agree, got)


def test_column_lists_on_shards_hold_out_validation_rows(conn, mixed):
    """A validation predicate holds out the same rows on the shards as on one server: the
    statistics round leaves them out as one server's pass does (the same preprocessing), each
    shard encodes its held-out rows with the merged preprocessing, and the pooled validation
    scores are one server's within 1 point."""
    params = {"epochs": 4, "seed": 3, "label": "kind", "features": COLS, "patience": 2,
              "validation": {"predicate": "id % 5 = 0"}}
    single = train(conn, mixed, "softmax", params)
    m = train(conn, "sh_cols", "softmax", params)
    assert_same_preprocessing(conn, m, single, mixed)
    assert preprocessing_of(conn, m)["rows"] == 2 * COLS_ROWS * 4 // 5
    one, sharded = epoch_validation(conn, single)[-1], epoch_validation(conn, m)[-1]
    print(f"\nsh_cols softmax {params}: validation accuracy one server {one[2]:.4f}, sharded {sharded[2]:.4f}")
    assert abs(one[2] - sharded[2]) <= ACCURACY_TOLERANCE, (one, sharded)
    assert validation_metrics(conn, m)["validation"]["rows"] == 2 * COLS_ROWS // 5


def test_fm_with_a_column_list_on_shards(conn, mixed):
    """A factorization machine encodes numbers "ple" by default: it trains on shards too."""
    params = {"epochs": 4, "seed": 3, "label": "label", "features": COLS}
    got, ref, m = compare(conn, "sh_cols", mixed, "fm", params, tol=0.02)
    assert ref > 0.8, ref


def test_the_merged_categories_are_bounded_as_on_one_server(conn, mixed):
    """`tag` is distinct in every row: each shard's 20,000 fit the coordinator's
    corgipile.max_buffer_memory, the 40,000 of both do not: 54000 as on one server, naming the
    column, with the hint to hash it; nothing stored."""
    params = {"epochs": 1, "label": "label", "features": ["x1", "tag"]}
    conn.execute("SET corgipile.max_buffer_memory = '6MB'")
    before = models_count(conn)
    try:
        with pytest.raises(psycopg.Error) as err:
            train(conn, mixed, "logistic", params)
        assert err.value.sqlstate == "54000", err.value.diag.message_primary
        with pytest.raises(psycopg.Error) as err:
            train(conn, "sh_cols", "logistic", params)
        assert err.value.sqlstate == "54000", err.value.diag.message_primary
        assert err.value.diag.message_primary.startswith('sh_cols, over its shards: the categories of column "tag"'), \
            err.value.diag.message_primary
        assert '"encode": "hash"' in err.value.diag.message_hint
    finally:
        conn.execute("RESET corgipile.max_buffer_memory")
    assert_nothing_stored(conn, before)


def test_a_forged_column_round_is_refused_by_the_shard(mixed):
    """A training round of a list of feature columns without the coordinator's preprocessing,
    with one that does not tile its features or has another width than the model (a statistics
    round's too: a warm start's), a time zone outside the statistics round or too long: 08P01 before a row
    is read; a time zone PostgreSQL does not know: 22023."""
    import json
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Statistics", "epoch": 1, "round": 0,
                "rounds": 1, "n_features": 0, "weights": [], "bias": [], "extras": {}}
        params = {"features": ["x1", "color", "day"], "label": "label"}
        reply = json.loads(shard_round_on(c, "cols_part", "logistic", params, {**base, "zone": "Asia/Kolkata"}))
        part = reply["columns"]
        assert part["rows"] == COLS_ROWS and [col["kind"] for col in part["columns"]] == ["number", "categories", "time"]
        assert [k for k, _ in part["columns"][1]["counts"]] == ["blue", "green", "red"]
        # A timestamptz is read on the coordinator's wall clock for the statistics round only.
        c.execute("SET TimeZone = 'UTC'")
        seen = [json.loads(shard_round_on(c, "cols_part", "logistic", {"features": ["seen"], "label": "label"},
                                          {**base, **zone}))["columns"]["columns"][0]["moments"]["mean"]
                for zone in ({}, {"zone": "Asia/Kolkata"})]
        assert seen[1] - seen[0] == pytest.approx(5.5 / 24, abs=1e-9), seen  # days
        assert scalar(c, "SHOW TimeZone") == "UTC"
        # The coordinator's preprocessing of x1, color, day (one-hot blue, green, red), trained with.
        p = {"columns": [
            {"name": "x1", "source": "number", "offset": 0, "impute": "mean", "scaled": True, "encode": "number",
             "fill": 0.0, "mean": 0.0, "std": 1.0},
            {"name": "color", "source": "text", "offset": 1, "impute": "category", "scaled": False,
             "encode": "one_hot", "categories": ["blue", "green", "red"], "other": False, "null": True},
            {"name": "day", "source": {"time": "date"}, "offset": 5, "impute": "mean", "scaled": True, "encode": "time",
             "kind": "date", "parts": ["value"], "zone": None, "fill": 19800.0, "mean": 19800.0, "std": 50.0}],
            "n_features": 6, "rows": 40000}
        train_round = {**base, "phase": "Train", "n_features": 6, **learner([0.0] * 6, [0.0])}
        reply = json.loads(shard_round_on(c, "cols_part", "logistic", params, {**train_round, "preprocessing": p}))
        assert reply["learners"][0]["tuples"] == COLS_ROWS
        for request in ({**train_round},
                        {**train_round, "preprocessing": {**p, "n_features": 7}},
                        {**train_round, "preprocessing": {**p, "columns": p["columns"][:2]}},
                        {**train_round, "n_features": 5, **learner([0.0] * 5, [0.0]), "preprocessing": p},
                        {**train_round, "preprocessing": p, "zone": "UTC"},
                        {**base, "preprocessing": p},
                        {**base, "zone": "x" * 300}):
            with pytest.raises(psycopg.Error) as err:
                shard_round_on(c, "cols_part", "logistic", params, request)
            assert err.value.sqlstate == "08P01", (request.keys(), err.value.sqlstate, err.value.diag.message_primary)
        # The preprocessing names the columns a round reads, whatever the params say.
        reply = json.loads(shard_round_on(c, "cols_part", "logistic", {"features": "*", "label": "label"},
                                          {**train_round, "preprocessing": p}))
        assert reply["learners"][0]["tuples"] == COLS_ROWS
        # A warm start's statistics round: every row encoded with the stored preprocessing,
        # counted, and no statistics of the columns (nothing to learn).
        reply = json.loads(shard_round_on(c, "cols_part", "logistic", params,
                                          {**base, "n_features": 6, "preprocessing": p}))
        assert reply["rows"] == COLS_ROWS and reply["columns"] is None and reply["width"] is None
        with pytest.raises(psycopg.Error) as err:
            shard_round_on(c, "cols_part", "logistic", params, {**base, "zone": "Mars/Olympus"})
        assert err.value.sqlstate == "22023", err.value.diag.message_primary


def shard_round_on(c, table, model, params, request):
    import json
    return c.execute("SELECT corgipile_shard_round(%s, %s, %s, %s)",
                     (table, model, Jsonb(params), json.dumps(request))).fetchone()[0]


# ----------------------------------------------------------------------------------------------
# 7 / 8: roles on the coordinator


@pytest.fixture
def roles(conn, blobs):
    drop_roles(conn)
    for role in ROLES:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON FOREIGN SERVER {S1}, {S2} TO {role}")
    try:
        yield
    finally:
        drop_roles(conn)
        conn.execute("DROP TABLE IF EXISTS sh_rls CASCADE")


def test_non_superuser_mapping_without_password(dsn, conn, roles):
    conn.execute("GRANT SELECT ON sh_hash TO sht_user")
    for srv in (S1, S2):
        conn.execute(f"CREATE USER MAPPING FOR sht_user SERVER {srv} OPTIONS (user 'postgres')")
    before = models_count(conn)
    with psycopg.connect(dsn, user="sht_user", autocommit=True) as u:
        with pytest.raises(psycopg.Error) as err:
            train(u, "sh_hash", "svm", {"epochs": 1})
    assert "password is required" in err.value.diag.message_primary, (err.value.sqlstate, err.value.diag.message_primary)
    assert err.value.sqlstate == "2F003"
    # A password in the mapping that the shard (trust authentication) never asks for: refused
    # too, as postgres_fdw refuses it.
    for srv in (S1, S2):
        conn.execute(f"ALTER USER MAPPING FOR sht_user SERVER {srv} OPTIONS (ADD password 'secret')")
    with psycopg.connect(dsn, user="sht_user", autocommit=True) as u:
        with pytest.raises(psycopg.Error) as err:
            train(u, "sh_hash", "svm", {"epochs": 1})
    assert err.value.sqlstate == "2F003", (err.value.sqlstate, err.value.diag.message_primary)
    assert "did not ask for the user mapping's password" in err.value.diag.message_primary
    assert_nothing_stored(conn, before)


def test_caller_without_select_on_the_coordinator_table_is_42501(dsn, conn, roles):
    for srv in (S1, S2):
        conn.execute(f"CREATE USER MAPPING FOR sht_nosel SERVER {srv} OPTIONS (user 'postgres', password 'secret')")
    before = models_count(conn)
    m = train(conn, "sh_hash_copy", "svm", {"epochs": 1, "seed": 1})
    conn.execute("SELECT corgipile_grant(%s::bigint, 'sht_nosel', 'use')", (m,))
    with psycopg.connect(dsn, user="sht_nosel", autocommit=True) as u:
        with pytest.raises(E.InsufficientPrivilege) as err:
            train(u, "sh_hash", "svm", {"epochs": 1})
        assert err.value.sqlstate == "42501"
        with pytest.raises(E.InsufficientPrivilege) as err:
            evaluate(u, m, "sh_hash")
    assert err.value.sqlstate == "42501" and "permission denied for table" in err.value.diag.message_primary
    conn.execute("DELETE FROM corgipile.models WHERE id = %s", (m,))
    assert_nothing_stored(conn, before)


def test_row_level_security_on_the_coordinator_table_is_0A000(dsn, conn, roles):
    sharded_table(conn, "sh_rls", [(f"FOR VALUES WITH (MODULUS 2, REMAINDER {k})", srv, "hash_part")
                                   for k, srv in enumerate((S1, S2))], by="HASH (id)")
    conn.execute("ALTER TABLE sh_rls ENABLE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY some_rows ON sh_rls FOR SELECT USING (id % 2 = 0)")
    conn.execute("GRANT SELECT ON sh_rls TO sht_user")
    before = models_count(conn)
    with psycopg.connect(dsn, user="sht_user", autocommit=True) as u:
        with pytest.raises(E.FeatureNotSupported) as err:
            train(u, "sh_rls", "svm", {"epochs": 1})
    assert err.value.sqlstate == "0A000" and "row-level security" in err.value.diag.message_primary
    # The owner is subject to it with FORCE.
    conn.execute("ALTER TABLE sh_rls OWNER TO sht_rls")
    conn.execute("ALTER TABLE sh_rls FORCE ROW LEVEL SECURITY")
    with psycopg.connect(dsn, user="sht_rls", autocommit=True) as o:
        with pytest.raises(E.FeatureNotSupported) as err:
            train(o, "sh_rls", "svm", {"epochs": 1})
    assert err.value.sqlstate == "0A000" and "row-level security" in err.value.diag.message_primary
    # A superuser is not subject to it: trains.
    assert stored(conn, train(conn, "sh_rls", "svm", {"epochs": 1, "seed": 1}))["rows_trained"] == 200_000
    assert models_count(conn) == before + 1


def test_nothing_was_ever_stored_on_the_shards(shards):
    for i in (0, 1):
        assert shard_scalar(i, "SELECT count(*) FROM corgipile.models") == 0
        assert shard_scalar(i, "SELECT count(*) FROM corgipile.epochs") == 0
        assert running_rounds(i) == []



# ----------------------------------------------------------------------------------------------
# validation on shards: every shard holds out its own rows (the same hash of the ctid as one
# server, or a predicate), keeps them from the first epoch, and scores the epoch's combined model
# on them; the coordinator pools the scores (patience, the best epoch) as one server does.


def epoch_validation(c, model_id):
    return c.execute("SELECT epoch, validation_loss, validation_accuracy, validation_r2 FROM corgipile.epochs "
                     "WHERE model_id = %s ORDER BY epoch", (model_id,)).fetchall()


def validation_metrics(c, model_id):
    return scalar(c, "SELECT metrics FROM corgipile.models WHERE id = %s", (model_id,))


@pytest.mark.parametrize("model, params", [
    ("svm", {}),
    ("logistic", {"validation": {"predicate": "id % 5 = 0"}}),
    ("mlp", {"hidden": [8]}),
])
def test_validation_on_a_sharded_table_like_one_server(conn, blobs, model, params):
    p = {"epochs": 3, "seed": 1, "validation": {"fraction": 0.2}, **params}
    single = train(conn, "sh_hash_copy", model, p)
    shard = train(conn, "sh_hash", model, p)
    held_out = {}
    for m in (single, shard):
        epochs = epoch_validation(conn, m)
        assert [e[0] for e in epochs] == [1, 2, 3]
        assert all(e[1] is not None and 0 <= e[1] < 10 and 0.5 < e[2] <= 1 for e in epochs), epochs
        held_out[m] = validation_metrics(conn, m)["validation"]["rows"]
        # Every row either trained or was held out, once.
        assert rows_trained(conn, m) + held_out[m] == 200_000, (m, rows_trained(conn, m), held_out[m])
        assert 0.18 * 200_000 < held_out[m] < 0.22 * 200_000, held_out[m]
    if "predicate" in str(params):
        # A predicate selects the same rows on the shards as on one server.
        assert held_out[shard] == held_out[single] == 40_000
    one, sharded = epoch_validation(conn, single)[-1], epoch_validation(conn, shard)[-1]
    print(f"\n{model} {params}: validation accuracy one server {one[2]:.4f}, sharded {sharded[2]:.4f}")
    assert abs(one[2] - sharded[2]) <= ACCURACY_TOLERANCE, (one, sharded)
    # The model stored scores on the held-out rows as the last epoch's validation said.
    got = evaluate(conn, shard, "sh_hash_copy")["accuracy"]
    assert abs(got - sharded[2]) < 0.02, (got, sharded)


def test_patience_on_a_sharded_table_keeps_the_best_epoch(conn, blobs):
    """A learning rate too high for the data makes the validation loss wander: the training
    stops after `patience` epochs without a lower one and keeps the best epoch's model, whose
    validation loss is the lowest of the epochs' (as one server does)."""
    p = {"epochs": 40, "seed": 3, "validation": {"fraction": 0.2}, "patience": 1, "learning_rate": 2.0,
         "learning_rate_schedule": "constant", "average": False}
    m = train(conn, "sh_range", "svm", p)
    metrics = validation_metrics(conn, m)
    epochs = epoch_validation(conn, m)
    run, best = metrics["epochs_run"], metrics["best_epoch"]
    assert run < 40 and best is not None and run == len(epochs), (metrics, epochs)
    losses = [e[1] for e in epochs]
    assert best == 1 + losses.index(min(losses)), (best, losses)
    assert run == best + 1, (run, best, losses)  # patience 1: the first epoch not better
    assert metrics["validation"]["loss"] == pytest.approx(min(losses), rel=1e-9), (metrics["validation"], losses)


def test_validation_rows_of_every_shard_fit_the_buffer_limit(conn, blobs):
    """Held-out rows stay in memory on each shard for the whole training, within that server's
    corgipile.max_buffer_memory (as on one server): past it, 54000 and nothing stored."""
    before = models_count(conn)
    for i in (0, 1):
        on_shard(i, "ALTER ROLE postgres SET corgipile.max_buffer_memory = '1MB'")
    try:
        with pytest.raises(psycopg.Error) as err:
            train(conn, "sh_hash", "svm", {"epochs": 2, "validation": {"fraction": 0.5}, "buffer_size": "256kB"})
        assert err.value.sqlstate == "54000", (err.value.sqlstate, err.value.diag.message_primary)
        assert "validation rows" in err.value.diag.message_primary
    finally:
        for i in (0, 1):
            on_shard(i, "ALTER ROLE postgres RESET corgipile.max_buffer_memory")
    assert_nothing_stored(conn, before)


# ----------------------------------------------------------------------------------------------
# what a training reads: a "where" filter and a view over a sharded table


def test_where_on_a_sharded_table_trains_the_rows_it_selects(conn, blobs):
    """Each shard applies the filter to its own rows: the rows trained are the rows selected."""
    params = {"epochs": 2, "seed": 1, "where": "id % 4 <> 0"}
    selected = scalar(conn, "SELECT count(*) FROM sh_hash_copy WHERE id % 4 <> 0")
    got, ref, m = compare(conn, "sh_hash", "sh_hash_copy", "logistic", params)
    assert stored(conn, m)["rows_trained"] == selected == 150_000


def test_a_view_over_a_sharded_table_trains_on_its_shards(conn, blobs):
    """A view of the table's columns and a WHERE trains as the table with that "where" (every
    shape, the exact model and privileges: test_shard_views.py); corgipile_evaluate reads the
    sharded table itself, a view over it is 0A000 saying so."""
    conn.execute("CREATE OR REPLACE VIEW sh_hash_some AS SELECT * FROM sh_hash WHERE id % 4 <> 1")
    try:
        m = train(conn, "sh_hash_some", "svm", {"epochs": 1})
        assert stored(conn, m)["rows_trained"] == scalar(conn, "SELECT count(*) FROM sh_hash_copy WHERE id % 4 <> 1")
        with pytest.raises(E.FeatureNotSupported) as err:
            conn.execute("SELECT corgipile_evaluate(%s, 'sh_hash_some')", (m,))
        assert err.value.diag.message_primary == "this view over a sharded table cannot be read on its shards yet"
        assert "stored model" in err.value.diag.message_detail and '"where"' in err.value.diag.message_hint
    finally:
        conn.execute("DROP VIEW IF EXISTS sh_hash_some")


# ----------------------------------------------------------------------------------------------
# "warm_start" on shards: the coordinator loads and checks the stored model as one server does,
# numbers the classes as the model does, and the first round starts from its parameters


TINY = 1e-12  # a vanishing step: the model stored is the one the training started from
TINY_ADAM = 1e-16  # Adam's step is about the learning rate whatever the gradient


def model_values(c, model_id):
    w, b = c.execute("SELECT weights, bias FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()
    return w + b


def assert_same_function(c, a, b, rel=1e-9):
    """Models a and b have the same parameters within `rel` (relative to the parameter, or
    absolute below 1); a's are far from zero, so that a model started from zeros cannot pass."""
    va, vb = model_values(c, a), model_values(c, b)
    assert len(va) == len(vb) and max(map(abs, va)) > 0.05, (va, vb)
    for x, y in zip(va, vb):
        assert abs(x - y) <= rel * max(1.0, abs(x)), f"model {b} moved from model {a}: {va} vs {vb}"


def first_loss(c, model_id):
    return scalar(c, "SELECT loss FROM corgipile.epochs WHERE model_id = %s AND epoch = 1", (model_id,))


def same_error(run_sharded, run_single):
    """The ERRORs of a training on the shards and of one on one server: the same SQLSTATE and
    message and hint, up to the relation's name and the classes counted (one server counts
    those of the rows it has read when it finds the misfit, the shards those of every row)."""
    errors = []
    for run in (run_sharded, run_single):
        with pytest.raises(psycopg.Error) as err:
            run()
        errors.append(err.value)
    sharded, single = errors
    cut = [re.sub(r"the classes \d+", "the classes N", re.sub(r"\b(public\.)?sh_\w+", "REL", e.diag.message_primary))
           for e in errors]
    assert (sharded.sqlstate, cut[0], sharded.diag.message_hint) == (single.sqlstate, cut[1], single.diag.message_hint), \
        (sharded.diag.message_primary, single.diag.message_primary)
    return sharded


@pytest.mark.parametrize("model", ["svm", "logistic"])
def test_warm_start_on_shards_continues_the_stored_model(conn, blobs, model):
    """A sharded warm start starts from the stored model, exactly: with a vanishing step the
    stored model is the one it started from (the scaling the shards' statistics give unfolded
    and folded back), the next version of its name, recording the id it started from; with an
    ordinary step its first epoch's loss is below a training from zeros', and its accuracy
    within 0.5 point of one server's warm start of the same rows from the same model."""
    name = f"shw_{model}"
    cold = train(conn, "sh_hash", model, {"epochs": 2, "seed": 7, "name": name})
    again = train(conn, "sh_hash", model, {"epochs": 1, "seed": 8, "warm_start": name, "learning_rate": TINY,
                                           "average": False})
    assert_same_function(conn, cold, again)
    version_, started_from = conn.execute(
        "SELECT version, (params->>'warm_start')::bigint FROM corgipile.models WHERE id = %s", (again,)).fetchone()
    assert (version_, started_from) == (2, cold)
    # The same with averaging (the mean of rounds that all start from the model).
    averaged = train(conn, "sh_hash", model, {"epochs": 2, "seed": 8, "warm_start": cold, "learning_rate": TINY})
    assert_same_function(conn, cold, averaged)
    # It goes on learning, from where the stored model ended.
    warm = train(conn, "sh_hash", model, {"epochs": 1, "seed": 9, "warm_start": cold})
    assert first_loss(conn, warm) < first_loss(conn, cold), (first_loss(conn, warm), first_loss(conn, cold))
    single = train(conn, "sh_hash_copy", model, {"epochs": 1, "seed": 9, "warm_start": cold, "name": f"{name}_one"})
    got, ref = (evaluate(conn, m, "sh_hash_copy")["accuracy"] for m in (warm, single))
    print(f"\nwarm start {model}: accuracy single-server {ref:.4f}, sharded {got:.4f}")
    assert abs(got - ref) <= 0.005, (got, ref)
    assert stored(conn, warm)["rows_trained"] == 200_000


@pytest.mark.parametrize("model, shape", [("mlp", {"hidden": [4]}), ("mlp_regression", {"hidden": [4]}),
                                          ("fm", {"factors": 2})])
def test_warm_start_on_shards_of_a_network(conn, blobs, model, shape):
    """A network or factorization machine continues alike: its parameters unfolded into the
    merged scaling (and a regression's target standardized by the shards' label moments), its
    layers or factors and classes the stored model's; with a vanishing step it is the stored
    model, with an ordinary one its first epoch's loss is below a training from zeros', and as
    good as one server's warm start from the same model (within 0.5 point, or 0.005 of R²)."""
    name = f"shw_{model}"
    cold = train(conn, "sh_hash", model, {**shape, "seed": 3, "epochs": 2, "name": name})
    again = train(conn, "sh_hash", model, {"epochs": 1, "seed": 4, "warm_start": name, "learning_rate": TINY_ADAM})
    assert_same_function(conn, cold, again)
    warm = train(conn, "sh_hash", model, {"epochs": 1, "seed": 5, "warm_start": cold})
    assert first_loss(conn, warm) < first_loss(conn, cold), (first_loss(conn, warm), first_loss(conn, cold))
    single = train(conn, "sh_hash_copy", model, {"epochs": 1, "seed": 5, "warm_start": cold, "name": f"{name}_one"})
    metric = "r2" if model == "mlp_regression" else "accuracy"
    got, ref = (evaluate(conn, m, "sh_hash_copy")[metric] for m in (warm, single))
    print(f"\nwarm start {model}: {metric} single-server {ref:.4f}, sharded {got:.4f}")
    assert abs(got - ref) <= 0.005, (got, ref)
    if model != "mlp_regression":
        assert classes_of(conn, warm) == classes_of(conn, cold) == [0, 1]


def test_warm_start_on_shards_numbers_classes_as_the_model(conn, class_mix):
    """A softmax trained on one server numbers its text classes as it met them (not sorted);
    warm-started on the shards it keeps that numbering, so it starts from the stored function;
    a class it never saw gets an output of its own from zeros, as on one server."""
    params = {"features": "features", "label": "word", "seed": 3}
    conn.execute("DROP TABLE IF EXISTS shw_ordered")
    conn.execute(f"CREATE TABLE shw_ordered AS SELECT * FROM {class_mix} ORDER BY label DESC, id")
    try:
        one = train(conn, "shw_ordered", "softmax", {**params, "epochs": 2, "shuffle": "no_shuffle"})
        order = classes_of(conn, one)
        assert sorted(order) == ["ant", "bee", "cat"] and order != sorted(order), order
        # (Three outputs move by every row's gradient: a step 100 times smaller than TINY.)
        again = train(conn, "sh_mix", "softmax", {"epochs": 1, "warm_start": one, "learning_rate": TINY / 100,
                                                  "average": False})
        assert classes_of(conn, again) == order
        assert_same_function(conn, one, again)
        two = train(conn, class_mix, "softmax", {**params, "epochs": 2, "where": "label < 2"})
        grown = train(conn, "sh_mix", "softmax", {"epochs": 1, "warm_start": two})
        single = train(conn, class_mix, "softmax", {"epochs": 1, "warm_start": two})
        assert classes_of(conn, grown)[:2] == classes_of(conn, two) and len(classes_of(conn, grown)) == 3
        assert sorted(classes_of(conn, grown)) == sorted(classes_of(conn, single))
    finally:
        conn.execute("DROP TABLE IF EXISTS shw_ordered")


def test_warm_start_on_shards_keeps_the_stored_preprocessing(conn, mixed):
    """A column list's warm start encodes every shard's rows with the stored preprocessing (sent
    in the statistics round), not one learned anew from the shards' rows: with a vanishing step
    the stored model, and the preprocessing stored with the new version is the old one's."""
    params = {"label": "label", "features": COLS, "seed": 3}
    cold = train(conn, mixed, "logistic", {**params, "epochs": 2, "where": "id % 3 <> 0"})
    again = train(conn, "sh_cols", "logistic", {"epochs": 1, "warm_start": cold, "learning_rate": TINY,
                                                "average": False})
    assert_same_function(conn, cold, again)
    # The same preprocessing; the profile of its predictions is each model's own (one server
    # profiles the cold model's; the coordinator of a sharded training holds no rows to score).
    assert scalar(conn, "SELECT preprocessing #- '{profile,predictions}' FROM corgipile.models WHERE id = %s",
                  (again,)) == scalar(conn, "SELECT preprocessing #- '{profile,predictions}' "
                                            "FROM corgipile.models WHERE id = %s", (cold,))
    assert "predictions" not in preprocessing_of(conn, again)["profile"]
    assert stored(conn, again)["rows_trained"] == 2 * COLS_ROWS


def test_warm_start_misfits_on_shards_are_one_servers_errors(conn, class_mix):
    """What one server refuses of a warm start, the shards refuse with the same ERROR before any
    model is stored: a network meeting a class it never saw (42804), rows of another width
    (42804), other features (22023), a third label for a binary model (22000)."""
    before = models_count(conn)
    conn.execute("DROP TABLE IF EXISTS shw_wide")
    conn.execute("CREATE TABLE shw_wide AS SELECT id, label, features || 1.0::float8 AS features FROM sh_mix_copy")
    try:
        two = train(conn, class_mix, "mlp", {"hidden": [3], "epochs": 1, "seed": 1, "where": "label < 2"})
        wide = train(conn, "shw_wide", "logistic", {"epochs": 1, "seed": 1, "where": "label < 2"})
        binary = train(conn, class_mix, "logistic", {"epochs": 1, "seed": 1, "where": "label < 2"})
        before = models_count(conn)
        cases = [("mlp", {"warm_start": two}, "42804"),
                 ("logistic", {"warm_start": wide}, "42804"),
                 ("logistic", {"warm_start": binary, "features": ["label"]}, "22023"),
                 ("logistic", {"warm_start": binary}, "22000")]
        for model, params, code in cases:
            p = {"epochs": 1, **params}
            e = same_error(lambda: train(conn, "sh_mix", model, p), lambda: train(conn, class_mix, model, p))
            assert e.sqlstate == code, (params, e.sqlstate, e.diag.message_primary)
        assert models_count(conn) == before
    finally:
        conn.execute("DROP TABLE IF EXISTS shw_wide")


# ----------------------------------------------------------------------------------------------
# "since" on shards: every sharded training stores each shard table's mark (its server's system
# identifier and database, the table's oid, file and pages in use); a training "since" that
# model reads on each shard the pages added since its mark (plus the replay sample), by one
# server's rule, with one server's NOTICEs for each shard


INC_ROWS = 20_000
INC_RANGES = ((1, 1_000_001), (1_000_001, 2_000_001), (2_000_001, 3_000_001))  # shard 1, shard 2, local


def inc_fill(c, table, i, first, n, seed):
    """n blob rows of range i (shard 1, shard 2 or the local partition) from id first on."""
    c.execute(f"SELECT setseed({seed})")
    c.execute(f"INSERT INTO {table} {blobs_sql(n, 'random() < 0.5', start=INC_RANGES[i][0] + first)}")


@pytest.fixture
def incremental(dsn, shards):
    """sh_inc: range-sharded over both shards' inc_part (20,000 rows each) and a local partition
    (5,000 rows); sh_inc_one: one server's table of the same rows."""
    for i in (0, 1):
        with psycopg.connect(shard_dsn(i), autocommit=True) as c:
            c.execute("DROP TABLE IF EXISTS inc_part CASCADE")
            c.execute("CREATE TABLE inc_part (id int, label int, features float8[]) WITH (autovacuum_enabled = off)")
            inc_fill(c, "inc_part", i, 0, INC_ROWS, 0.1 + 0.2 * i)
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_inc", [(f"FOR VALUES FROM ({lo}) TO ({hi})", srv, "inc_part")
                                    for (lo, hi), srv in zip(INC_RANGES, (S1, S2, None))])
        inc_fill(c, "sh_inc", 2, 0, 5_000, 0.7)
        c.execute("DROP TABLE IF EXISTS sh_inc_one")
        c.execute("CREATE TABLE sh_inc_one AS SELECT * FROM sh_inc ORDER BY label, id")
        c.execute("DELETE FROM corgipile.models WHERE name LIKE 'shinc%'")
    yield "sh_inc"
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS inc_part CASCADE")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS sh_inc, sh_inc_one CASCADE")


def read_of(c, model_id):
    return scalar(c, "SELECT metrics->'read' FROM corgipile.models WHERE id = %s", (model_id,))


def last_page_on(i, pages):
    """Rows of shard i's inc_part from page `pages - 1` on (what "since" reads, replay 0)."""
    return shard_scalar(i, f"SELECT count(*) FROM inc_part WHERE ctid >= '({max(pages - 1, 0)},0)'::tid")


def marks_by_shard(c, model_id):
    """The model's marks of shard 1's, shard 2's and the local partition's table."""
    leaves = read_of(c, model_id)["leaves"]
    oids = [scalar(c, f"SELECT 'sh_inc_{k}'::regclass::oid") for k in range(3)]
    return [next(m for m in leaves if m["leaf"] == oid) for oid in oids]


def new_rows(c, marks):
    """Rows from each table's last page read on: what a "since" with replay 0 trains."""
    local = scalar(c, f"SELECT count(*) FROM sh_inc_2 WHERE ctid >= '({marks[2]['pages'] - 1},0)'::tid")
    return last_page_on(0, marks[0]["pages"]) + last_page_on(1, marks[1]["pages"]) + local


def append_everywhere(c, first, n, seed):
    """n rows appended to each shard's table and to the local partition, and to sh_inc_one."""
    for i in (0, 1):
        with psycopg.connect(shard_dsn(i), autocommit=True) as s:
            inc_fill(s, "inc_part", i, first, n, seed + 0.1 * i)
    inc_fill(c, "sh_inc", 2, first, n, seed + 0.2)
    c.execute(f"INSERT INTO sh_inc_one SELECT * FROM sh_inc WHERE id % 1000000 > {first}")


def test_a_sharded_training_records_each_shards_table(conn, incremental):
    """metrics->'read' holds one mark per leaf: the shard table's oid, file and pages in use,
    and its cluster's system identifier (two shard servers: two clusters)."""
    m = train(conn, incremental, "logistic", {"epochs": 1, "seed": 1})
    read = read_of(conn, m)
    assert read["relid"] == scalar(conn, "SELECT 'sh_inc'::regclass::oid")
    marks = marks_by_shard(conn, m)
    for i in (0, 1):
        assert marks[i]["relid"] == shard_scalar(i, "SELECT 'inc_part'::regclass::oid")
        assert marks[i]["filenode"] == shard_scalar(i, "SELECT relfilenode FROM pg_class WHERE relname = 'inc_part'")
        assert marks[i]["pages"] == shard_scalar(i, "SELECT max((ctid::text::point)[0])::int + 1 FROM inc_part")
        assert marks[i]["system"] == shard_scalar(i, "SELECT system_identifier FROM pg_control_system()")
    assert marks[2]["system"] == scalar(conn, "SELECT system_identifier FROM pg_control_system()")
    assert len({mark["system"] for mark in marks}) == 3


def test_since_on_shards_trains_the_added_rows_like_one_server(conn, incremental):
    """Rows appended on both shards and the local partition: "since" with replay 0 trains
    exactly the rows from each table's last page read on (rows_trained and the epochs table);
    with a replay fraction, those and about that share of the older rows; it continues the
    model as the next version of its name; and the model is within 0.5 point of one server's
    "since" of the same rows."""
    first = train(conn, incremental, "logistic", {"epochs": 2, "seed": 1, "name": "shinc"})
    one = train(conn, "sh_inc_one", "logistic", {"epochs": 2, "seed": 1, "name": "shinc_one"})
    marks = marks_by_shard(conn, first)
    append_everywhere(conn, INC_ROWS, 3_000, 0.5)
    expected = new_rows(conn, marks)
    assert expected >= 9_000
    second = train(conn, incremental, "logistic", {"since": "shinc", "replay": 0, "epochs": 2, "seed": 1})
    assert rows_trained(conn, second) == expected
    assert [r[0] for r in conn.execute(
        "SELECT tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (second,))] == [expected] * 2
    assert conn.execute("SELECT version, (params->>'warm_start')::bigint FROM corgipile.models WHERE id = %s",
                        (second,)).fetchone() == (2, first)
    assert all(now["pages"] > then["pages"] for now, then in zip(marks_by_shard(conn, second), marks))
    # A replay share of the older rows (block_size 2: many small blocks to sample).
    total = scalar(conn, "SELECT count(*) FROM sh_inc")
    replayed = train(conn, incremental, "logistic", {"since": first, "replay": 0.5, "epochs": 1, "seed": 1,
                                                    "block_size": 2})
    extra = rows_trained(conn, replayed) - expected
    assert 0.4 * (total - expected) < extra < 0.6 * (total - expected), (extra, total, expected)
    plan = "\n".join(r[0] for r in conn.execute(
        "SELECT * FROM corgipile_explain('sh_inc', 'logistic', %s)", (Jsonb({"since": first, "replay": 0.25}),)))
    assert f"Since: model {first}: on each shard" in plan and "(3 marks) and 0.25 of its older" in plan, plan
    # Like one server's "since" of the same rows, from its own model of the same first rows.
    sharded = train(conn, incremental, "logistic", {"since": first, "epochs": 2, "seed": 2})
    single = train(conn, "sh_inc_one", "logistic", {"since": one, "epochs": 2, "seed": 2})
    got, ref = (evaluate(conn, m, "sh_inc_one")["accuracy"] for m in (sharded, single))
    print(f"\nsince on shards: accuracy single-server {ref:.4f}, sharded {got:.4f}")
    assert abs(got - ref) <= 0.005, (got, ref)


def test_since_on_rewritten_recreated_or_unchanged_shards(conn, incremental):
    """One server's rule on each shard: a truncated shard table is read whole ("rewritten"),
    a shard table where nothing was added is read from its last page ("no page was added"), a
    table dropped and created again is read whole (no mark names it) — each with a NOTICE naming
    the shard; a shard table with inheritance children is 0A000, and a model that recorded no
    mark of it cannot be continued (22023)."""
    base = train(conn, incremental, "logistic", {"epochs": 1, "seed": 1, "name": "shinc2"})
    marks = marks_by_shard(conn, base)
    on_shard(0, "TRUNCATE inc_part")
    with psycopg.connect(shard_dsn(0), autocommit=True) as s:
        inc_fill(s, "inc_part", 0, 0, 500, 0.3)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    m = train(conn, incremental, "logistic", {"since": "shinc2", "replay": 0, "epochs": 1, "seed": 1})
    local = scalar(conn, f"SELECT count(*) FROM sh_inc_2 WHERE ctid >= '({marks[2]['pages'] - 1},0)'::tid")
    assert rows_trained(conn, m) == 500 + last_page_on(1, marks[1]["pages"]) + local
    assert any("rewritten" in n and S1 in n for n in notices), notices
    assert any("no page was added" in n and S2 in n for n in notices), notices
    notices.clear()
    on_shard(1, "DROP TABLE inc_part",
             "CREATE TABLE inc_part (id int, label int, features float8[])")
    with psycopg.connect(shard_dsn(1), autocommit=True) as s:
        inc_fill(s, "inc_part", 1, 0, 700, 0.4)
    m2 = train(conn, incremental, "logistic", {"since": "shinc2", "replay": 0, "epochs": 1, "seed": 1})
    pages0 = marks_by_shard(conn, m)[0]["pages"]
    assert rows_trained(conn, m2) == last_page_on(0, pages0) + 700 + local
    assert any("read no table of" in n and S2 in n for n in notices), notices
    # A shard table with inheritance children: what one server refuses of such a table. (A
    # partitioned shard table is refused by any sharded training: a shard reads only its table.)
    on_shard(1, "CREATE TABLE inc_child () INHERITS (inc_part)")
    before = models_count(conn)
    with pytest.raises(psycopg.Error) as err:
        train(conn, incremental, "logistic", {"since": "shinc2", "epochs": 1})
    assert err.value.sqlstate == "0A000", err.value.diag.message_primary
    unmarked = train(conn, incremental, "logistic", {"epochs": 1, "seed": 1})
    assert read_of(conn, unmarked) is None
    for since, code in ((unmarked, "22023"), ("shinc_no_such", None)):
        with pytest.raises(psycopg.Error) as err:
            train(conn, incremental, "logistic", {"since": since, "epochs": 1})
        assert not err.value.sqlstate.startswith("XX") and err.value.sqlstate == (code or err.value.sqlstate)
    assert models_count(conn) == before + 1


def test_a_shard_reads_what_its_own_mark_says(incremental):
    """corgipile_shard_round with a "since" training's marks: the statistics reply's mark is
    taken before the scan, the shard picks its own mark by (system, database, table) and reads
    from its last page read; marks of another cluster or table are not its own (read whole).
    Marks in a round that trains nothing, with a zero oid, or too many: refused."""
    import json
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Statistics", "epoch": 1, "round": 0,
                "rounds": 1, "n_features": 0, "weights": [], "bias": [], "extras": {}}
        params = {"since": 1, "replay": 0}
        mark = json.loads(shard_round_on(c, "inc_part", "logistic", {}, base))["mark"]
        assert mark["relid"] == scalar(c, "SELECT 'inc_part'::regclass::oid")
        inc_fill(c, "inc_part", 0, INC_ROWS, 1_000, 0.9)
        added = last_page_on(0, mark["pages"])
        others = [{**mark, "system": mark["system"] ^ 1}, {**mark, "relid": mark["relid"] + 1}]
        for marks, rows in ((others + [mark], added), (others, INC_ROWS + 1_000)):
            reply = json.loads(shard_round_on(c, "inc_part", "logistic", params, {**base, "marks": marks}))
            assert reply["rows"] == rows, (marks, reply["rows"])
        for request in ({**base, "phase": "Evaluate", "marks": [mark]},
                        {**base, "marks": [{**mark, "relid": 0}]},
                        {**base, "marks": [mark] * 70_000}):
            with pytest.raises(psycopg.Error) as err:
                shard_round_on(c, "inc_part", "logistic", params, request)
            assert err.value.sqlstate in ("08P01", "22023"), (err.value.sqlstate, err.value.diag.message_primary)


# ----------------------------------------------------------------------------------------------
# one snapshot of every shard for the whole training


def test_a_sharded_training_reads_one_snapshot_of_every_shard(dsn, shards):
    """Rows deleted on a shard while a training runs there are still the training's (as one
    server's training reads one snapshot of its table): every epoch trains the rows the first
    one did, and the held-out ids a gate scores still name those rows."""
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS snap_part",
                 f"SELECT setseed({0.31 + 0.2 * i})",
                 f"CREATE TABLE snap_part AS {blobs_sql(50_000, 'random() < 0.5', start=1 + 50_000 * i)}")
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer:
        sharded_table(killer, "sh_snap", [(f"FOR VALUES FROM ({1 + 50_000 * k}) TO ({1 + 50_000 * (k + 1)})", srv, "snap_part")
                                          for k, srv in enumerate((S1, S2))])
        pid = victim.info.backend_pid
        t, result = start_training(victim, "sh_snap", "svm", {"epochs": 40, "sync": 50, "seed": 1})
        try:
            wait_active(killer, pid)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not running_rounds(1):
                time.sleep(0.01)
            on_shard(1, "DELETE FROM snap_part WHERE id % 2 = 0")
            alive = t.is_alive()
            t.join(timeout=300)
        finally:
            stop_if_running(killer, t, pid)
        assert alive, "the training ended before the rows were deleted: make it longer"
        assert "error" not in result, result
        model = result["value"]
        deleted = 50_000 - shard_scalar(1, "SELECT count(*) FROM snap_part")
        print(f"\n{deleted} rows deleted on shard 2 during the training; rows trained {rows_trained(killer, model)}")
        assert deleted == 25_000
        assert rows_trained(killer, model) == 100_000
        # A new training sees the rows as they are now.
        assert rows_trained(killer, train(killer, "sh_snap", "svm", {"epochs": 1, "seed": 1})) == 75_000
