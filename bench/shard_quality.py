#!/usr/bin/env python3
"""Quality over shards (issue #55): every model kind trained on a table sharded across two
servers (postgres_fdw partitions) and on the same rows on one server, side by side in one run,
each scored by `corgipile_evaluate` on the same test table of rows neither trained on. The
target: a sharded training within 0.5 point (accuracy, or R² × 100) of the one-server training.

Datasets (generated here, deterministic):
- binary, rows hashed over the shards (same label mix on both);
- binary, one class per shard (the worst case for combining models);
- five classes, each shard holding another mix (80% of classes 0-2 on one, of 3-4 on the other);
- mixed types: numbers, an integer, two text columns one-hot encoded, a text label of two
  classes ("churn") and one of three ("tier"), rows hashed over the shards;
- regression, rows hashed over the shards.

Then the cost of a search (issue #55 item 4: a search of 12 configurations at most 2.5× one
sharded training): on the binary hashed table, svm, 3 epochs, 20% held out, one training and a
search of 12 configurations (3 learning rates × 4 l2), alternating, sharded and on one server.

Usage: bench/shard_quality.py [--rows 100000] [--test-rows 20000] [--epochs 5] [--seeds 3] [--out FILE]
                              [--only DATASET.KIND ...] [--params JSON]  (a part, other params: to explore)
Needs PGHOST/PGPORT/PGUSER for the coordinator cluster with corgipile installed (make
bench-shards does it); starts and destroys the shard clusters with scripts/cluster.sh."""

import argparse
import json
import os
import statistics
import time

import psycopg
from psycopg.types.json import Jsonb

import provenance
import records
from shard_epochs import cluster

DB = "corgipile_bench_shard_quality"
TARGET_POINTS = 0.5

# A number near N(0, 1) from random() (the sum of three uniforms, scaled): SQL has no normal.
NORMAL = "((random() + random() + random() - 1.5) * 2.0)"
# Logistic noise: a latent label with it is a logistic regression's.
LOGISTIC = "ln(greatest(random(), 1e-12) / greatest(1 - random(), 1e-12))"


def binary_rows(n):
    coords = ", ".join(f"s * {0.15 + 0.05 * j:.2f} + {NORMAL}" for j in range(8))
    return (f"SELECT i AS id, ARRAY[{coords}]::float8[] AS features, (s > 0)::int AS label "
            f"FROM (SELECT i, CASE WHEN random() < 0.5 THEN -1 ELSE 1 END AS s "
            f"FROM generate_series(1, {n}) i) g")


def five_rows(n):
    coords = ", ".join(f"cos(k * 1.3 + {j}) * 1.2 + {NORMAL}" for j in range(8))
    # part: which shard (80% of classes 0-2 on shard 0, 80% of classes 3-4 on shard 1).
    return (f"SELECT i AS id, ((k <= 2) = (random() < 0.2))::int AS part, "
            f"ARRAY[{coords}]::float8[] AS features, k AS label "
            f"FROM (SELECT i, floor(random() * 5)::int AS k FROM generate_series(1, {n}) i) g")


def mixed_rows(n):
    latent = "1.2 * x1 - 0.8 * x2 + 0.04 * (x3 - 10) + 0.5 * (c % 5 - 2) + 0.6 * (p - 2) + 0.5 * x1 * x2"
    return (f"SELECT i AS id, x1, x2, x3, 'city ' || c AS city, "
            f"(ARRAY['basic', 'plus', 'pro', 'team', 'enterprise'])[p + 1] AS plan, "
            f"CASE WHEN {latent} + {LOGISTIC} > 0 THEN 'yes' ELSE 'no' END AS churn, "
            f"CASE WHEN {latent} + {NORMAL} < -1 THEN 'bronze' WHEN {latent} + {NORMAL} < 1 THEN 'silver' "
            f"ELSE 'gold' END AS tier "
            f"FROM (SELECT i, {NORMAL} AS x1, {NORMAL} AS x2, floor(random() * 21)::int AS x3, "
            f"floor(random() * 20)::int AS c, floor(random() * 5)::int AS p "
            f"FROM generate_series(1, {n}) i) g")


def regression_rows(n):
    coords = [f"{NORMAL}" for _ in range(6)]
    return (f"SELECT i AS id, f AS features, "
            f"f[1] * 1.5 - f[2] + 0.5 * f[3] + 0.8 * f[4] * f[5] + 0.3 * {NORMAL} AS label "
            f"FROM (SELECT i, ARRAY[{', '.join(coords)}]::float8[] AS f FROM generate_series(1, {n}) i) g")


MIXED_COLUMNS = "id int, x1 float8, x2 float8, x3 int, city text, plan text, churn text, tier text"
MIXED_FEATURES = ["x1", "x2", "x3", "city", "plan"]
# (dataset, columns, partitioned by, partition bounds, rows SQL, [(kind, label params, metric)])
DATASETS = [
    ("binary_hash", "id int, features float8[], label int", "HASH (id)",
     ["FOR VALUES WITH (MODULUS 2, REMAINDER 0)", "FOR VALUES WITH (MODULUS 2, REMAINDER 1)"], binary_rows,
     [(k, {}, "accuracy") for k in ("svm", "logistic", "mlp", "fm")]),
    ("binary_by_label", "id int, features float8[], label int", "LIST (label)",
     ["FOR VALUES IN (0)", "FOR VALUES IN (1)"], binary_rows,
     [(k, {}, "accuracy") for k in ("svm", "logistic", "mlp", "fm")]),
    ("five_mixes", "id int, part int, features float8[], label int", "LIST (part)",
     ["FOR VALUES IN (0)", "FOR VALUES IN (1)"], five_rows,
     [(k, {"features": "features", "label": "label"}, "accuracy") for k in ("softmax", "mlp", "fm")]),
    ("mixed", MIXED_COLUMNS, "HASH (id)",
     ["FOR VALUES WITH (MODULUS 2, REMAINDER 0)", "FOR VALUES WITH (MODULUS 2, REMAINDER 1)"], mixed_rows,
     [(k, {"features": MIXED_FEATURES, "label": "churn"}, "accuracy") for k in ("svm", "logistic", "mlp", "fm")]
     + [("softmax", {"features": MIXED_FEATURES, "label": "tier"}, "accuracy")]),
    ("regression", "id int, features float8[], label float8", "HASH (id)",
     ["FOR VALUES WITH (MODULUS 2, REMAINDER 0)", "FOR VALUES WITH (MODULUS 2, REMAINDER 1)"], regression_rows,
     [(k, {}, "r2") for k in ("linear", "mlp_regression", "fm_regression")]),
]
DESCRIBED = {
    "binary_hash": "binary, rows hashed over the shards",
    "binary_by_label": "binary, one class per shard",
    "five_mixes": "5 classes, each shard another mix",
    "mixed": "mixed types, text columns and text labels",
    "regression": "regression, rows hashed",
}


def load(conn, hosts, ports, rows, test_rows):
    """Every dataset: the shards' tables (rows routed through the coordinator's partitioned
    table), one_<name> (the same rows on one server) and test_<name> (other rows)."""
    for k, (h, p) in enumerate(zip(hosts, ports)):
        with psycopg.connect(host=h, port=p, user="postgres", dbname="postgres", autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
                c.execute(f"CREATE DATABASE {DB}")
        with psycopg.connect(host=h, port=p, user="postgres", dbname=DB, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
            c.execute("ALTER EXTENSION corgipile UPDATE")
            for name, columns, *_ in DATASETS:
                c.execute(f"DROP TABLE IF EXISTS {name}")
                c.execute(f"CREATE TABLE {name} ({columns})")
        conn.execute(f"DROP SERVER IF EXISTS quality_shard{k} CASCADE")
        conn.execute(f"CREATE SERVER quality_shard{k} FOREIGN DATA WRAPPER postgres_fdw "
                     f"OPTIONS (host '{h}', port '{p}', dbname '{DB}', batch_size '1000')")
        conn.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER quality_shard{k} OPTIONS (user 'postgres')")
    for seed, (name, columns, by, bounds, rows_sql, _) in enumerate(DATASETS):
        conn.execute(f"DROP TABLE IF EXISTS sh_{name}, one_{name}, test_{name} CASCADE")
        conn.execute(f"CREATE TABLE sh_{name} ({columns}) PARTITION BY {by}")
        for k, bound in enumerate(bounds):
            conn.execute(f"CREATE FOREIGN TABLE sh_{name}_{k} PARTITION OF sh_{name} {bound} "
                         f"SERVER quality_shard{k} OPTIONS (table_name '{name}')")
        conn.execute(f"SELECT setseed({0.1 + 0.05 * seed})")
        conn.execute(f"INSERT INTO sh_{name} {rows_sql(rows)}")
        conn.execute(f"CREATE TABLE one_{name} AS SELECT * FROM sh_{name}")
        conn.execute(f"SELECT setseed({-0.1 - 0.05 * seed})")
        conn.execute(f"CREATE TABLE test_{name} AS {rows_sql(test_rows)}")
        conn.execute(f"VACUUM ANALYZE one_{name}")
        conn.execute(f"VACUUM ANALYZE test_{name}")
    for h, p in zip(hosts, ports):
        with psycopg.connect(host=h, port=p, user="postgres", dbname=DB, autocommit=True) as c:
            for name, *_ in DATASETS:
                c.execute(f"VACUUM ANALYZE {name}")


def train(conn, table, kind, params):
    """(model id, the epochs' median seconds) of one training."""
    model = conn.execute("SELECT corgipile_train(%s, %s, %s)", (table, kind, Jsonb(params))).fetchone()[0]
    secs = [r[0] for r in conn.execute("SELECT seconds FROM corgipile.epochs WHERE model_id = %s", (model,))]
    return model, statistics.median(secs)


SEARCH = {"learning_rate": [0.001, 0.01, 0.1], "l2": [0.0, 0.0001, 0.001, 0.01]}
SEARCH_SIZE = 12
TARGET_SEARCH = 2.5


def search_cost(conn, pairs):
    """{"sharded"|"one server": ([one training's seconds], [the search's seconds])}, alternating
    (empty without pairs)."""
    out = {}
    if pairs == 0:
        return out
    for where, table in (("sharded", "sh_binary_hash"), ("one server", "one_binary_hash")):
        common = {"epochs": 3, "seed": 1, "verbose": False, "validation": {"fraction": 0.2},
                  "name": f"bench_search_{where.replace(' ', '_')}"}
        one, search = [], []
        for r in range(pairs):
            for p, into in ((common, one), ({**common, "search": SEARCH}, search))[:: 1 if r % 2 == 0 else -1]:
                started = time.monotonic()
                conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (table, Jsonb(p)))
                into.append(time.monotonic() - started)
        conn.execute("SELECT corgipile_drop_model(id) FROM corgipile.models WHERE name LIKE 'bench_search_%'")
        out[where] = (one, search)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--test-rows", type=int, default=20_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/shard_quality.md")
    ap.add_argument("--only", nargs="*", help="dataset.kind pairs to run (default: all)")
    ap.add_argument("--params", default="{}", help="more training params for both sides (JSON)")
    ap.add_argument("--search-pairs", type=int, default=6, help="alternating pairs of the search's cost (0: none)")
    args = ap.parse_args()
    extra = json.loads(args.params)
    base = int(os.environ.get("PGPORT", "28815"))
    ports = [base + 28, base + 29]
    hosts = [cluster(p, "start") for p in ports]
    started = time.monotonic()
    results = {}
    try:
        with psycopg.connect(dbname="postgres", autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
                c.execute(f"CREATE DATABASE {DB}")
        with psycopg.connect(dbname=DB, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
            conn.execute("ALTER EXTENSION corgipile UPDATE")
            conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
            conn.execute("SET max_parallel_workers_per_gather = 0")
            load(conn, hosts, ports, args.rows, args.test_rows)
            for name, _, _, _, _, kinds in DATASETS:
                for kind, label, metric in kinds:
                    if args.only and f"{name}.{kind}" not in args.only:
                        continue
                    for seed in range(1, args.seeds + 1):
                        # Alternate which goes first: neither always trains on a warm cache.
                        order = ("one", "sh") if seed % 2 else ("sh", "one")
                        for where in order:
                            p = {"epochs": args.epochs, "seed": seed, "verbose": False, **label, **extra}
                            model, secs = train(conn, f"{where}_{name}", kind, p)
                            score = conn.execute(
                                f"SELECT (corgipile_evaluate(%s, 'test_{name}')->>%s)::float8", (model, metric)
                            ).fetchone()[0]
                            entry = results.setdefault((name, kind, label.get("label", "label"), metric),
                                                       {"one": ([], []), "sh": ([], [])})
                            entry[where][0].append(score)
                            entry[where][1].append(secs)
                            conn.execute("SELECT corgipile_drop_model(%s)", (model,))
            search_times = search_cost(conn, args.search_pairs)
            server = conn.execute("SHOW server_version").fetchone()[0]
            installed = records.server(conn)
    finally:
        for p in ports:
            cluster(p, "destroy")
    out = [
        f"{args.rows:,} rows per dataset, split over two shard servers (postgres_fdw partitions) and the same rows "
        f"on one server; {args.epochs} epochs, seeds 1–{args.seeds}, "
        f"{'params ' + json.dumps(extra) + ', ' if extra else ''}the other params defaults (`sync` auto). "
        f"Score: `corgipile_evaluate` on {args.test_rows:,} other rows of the same distribution (accuracy; R² for "
        f"regression, shown × 100 as points). Target: |Δ| ≤ {TARGET_POINTS} point (issue #55). Shard servers and "
        f"the coordinator on this {os.cpu_count()}-core machine (PostgreSQL {server}); epoch seconds are "
        f"medians over every epoch of the seeds' trainings. Run took {time.monotonic() - started:.0f} s.",
        "",
        "| dataset | kind | label | one server (median) | sharded (median) | Δ points (median) | Δ points per seed | "
        "target | epoch s one server | epoch s sharded | ÷ |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    figures = {}
    for (name, kind, label, metric), e in results.items():
        one, sh = e["one"][0], e["sh"][0]
        deltas = [100 * (s - o) for s, o in zip(sh, one)]
        delta = 100 * (statistics.median(sh) - statistics.median(one))
        ok = abs(delta) <= TARGET_POINTS
        t_one, t_sh = statistics.median(e["one"][1]), statistics.median(e["sh"][1])
        out.append(f"| {DESCRIBED[name]} | {kind} | {label} | {statistics.median(one):.4f} | "
                   f"{statistics.median(sh):.4f} | {delta:+.2f} | {', '.join(f'{d:+.2f}' for d in deltas)} | "
                   f"{'PASS' if ok else 'FAIL'} | {t_one:.3f} | {t_sh:.3f} | {t_sh / t_one:.2f} |")
        figures[f"{name}.{kind}.{label}"] = {
            "metric": metric, "one_server": statistics.median(one), "sharded": statistics.median(sh),
            "delta_points": delta, "delta_points_per_seed": deltas, "pass": ok,
            "epoch_seconds_one_server": t_one, "epoch_seconds_sharded": t_sh, "div_one_server": t_sh / t_one}
    if search_times:
        out += ["", f"A search of {SEARCH_SIZE} configurations against one training on the binary hashed table (svm, 3 "
                f"epochs, 20% held out; {args.search_pairs} alternating pairs; whole `corgipile_train` calls). Target: "
                f"sharded search ÷ sharded training ≤ {TARGET_SEARCH}.", "",
                "| where | one training, median s | search, median s | ÷ (medians) | ÷ per pair, range | target |",
                "|---|---|---|---|---|---|"]
        for where, (one, search) in search_times.items():
            ratio = statistics.median(search) / statistics.median(one)
            pairs = [s_ / o for s_, o in zip(search, one)]
            ok = "PASS" if ratio <= TARGET_SEARCH else "FAIL"
            out.append(f"| {where} | {statistics.median(one):.3f} | {statistics.median(search):.3f} | {ratio:.2f} | "
                       f"{min(pairs):.2f}–{max(pairs):.2f} | {ok if where == 'sharded' else ''} |")
            figures[f"search.{where}"] = {**records.median_range(pairs), "div_one_training": ratio,
                                          "one_training_seconds": statistics.median(one),
                                          "search_seconds": statistics.median(search)}
    text = "\n".join(out) + "\n"
    print(text)
    provenance.write(args.out, text, "bench-shards", DB)
    records.append_record("shard_quality", figures, make_target="bench-shards", results_file=args.out,
                          config={"rows": args.rows, "test_rows": args.test_rows, "epochs": args.epochs,
                                  "seeds": args.seeds, "only": args.only, "params": extra}, **installed)


if __name__ == "__main__":
    main()
