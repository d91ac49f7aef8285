#!/usr/bin/env python3
"""Training over a table sharded across two servers (postgres_fdw partitions) against training
the same rows on one server, side by side in one run: epoch time, accuracy, and the bytes that
cross the network per epoch. The shard servers are throw-away clusters on this machine (they
share its cores with the coordinator: read the times as such).

Usage: bench/shard_epochs.py [--rows 1000000] [--features 18] [--epochs 3] [--rounds 3] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for the coordinator cluster with corgipile installed (make
bench-shards does it); starts and destroys the shard clusters with scripts/cluster.sh."""

import argparse
import os
import re
import statistics
import subprocess

import psycopg

import provenance
import records
from psycopg.types.json import Jsonb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DB = "corgipile_bench_shards"


def cluster(port, action):
    env = dict(os.environ, CORGIPILE_CLUSTER_DIR=f"/tmp/corgipile-benchshard-{port}", CORGIPILE_PORT=str(port))
    subprocess.run([os.path.join(ROOT, "scripts/cluster.sh"), action], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return f"/tmp/corgipile-benchshard-{port}"


def make_shard(host, port, rows, features, first):
    with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            c.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(host=host, port=port, user="postgres", dbname=DB, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        c.execute("ALTER EXTENSION corgipile UPDATE")
        coords = ", ".join("s * 0.3 + (random() - 0.5) * 2" for _ in range(features))
        for name, where in (("by_hash", f"i % 2 = {first}"), ("by_label", f"(i <= {rows} / 2) = {first == 0}")):
            if c.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]:
                continue
            # Every row i of 1..rows with label (i > rows/2): by_hash splits them by parity,
            # by_label gives each shard one class (the worst case for combining models).
            c.execute(f"""CREATE TABLE {name} AS
                SELECT i AS id, ARRAY[{coords}]::float8[] AS features, (s > 0)::int AS label
                FROM (SELECT i, CASE WHEN i <= {rows} / 2 THEN -1 ELSE 1 END AS s
                      FROM generate_series(1, {rows}) i WHERE {where}) g ORDER BY label, i""")
            c.execute(f"VACUUM ANALYZE {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=18)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/shard_epochs.md")
    args = ap.parse_args()
    base = int(os.environ.get("PGPORT", "28815"))
    ports = [base + 26, base + 27]
    hosts = [cluster(p, "start") for p in ports]
    try:
        for k, (h, p) in enumerate(zip(hosts, ports)):
            make_shard(h, p, args.rows, args.features, k)
        with psycopg.connect(dbname="postgres", autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
                c.execute(f"CREATE DATABASE {DB}")
        notices = []
        with psycopg.connect(dbname=DB, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
            conn.execute("ALTER EXTENSION corgipile UPDATE")
            conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
            conn.execute("SET max_parallel_workers_per_gather = 0")
            for k, (h, p) in enumerate(zip(hosts, ports)):
                conn.execute(f"DROP SERVER IF EXISTS bench_shard{k} CASCADE")
                conn.execute(f"CREATE SERVER bench_shard{k} FOREIGN DATA WRAPPER postgres_fdw "
                             f"OPTIONS (host '{h}', port '{p}', dbname '{DB}')")
                conn.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER bench_shard{k} OPTIONS (user 'postgres')")
            results = {}
            for layout in ("by_hash", "by_label"):
                conn.execute(f"DROP TABLE IF EXISTS sh_{layout}, one_{layout} CASCADE")
                conn.execute(f"CREATE TABLE sh_{layout} (id int, features float8[], label int) PARTITION BY LIST (id)")
                for k in range(2):
                    # LIST partitioning with DEFAULT: the bounds do not matter (rows are never
                    # routed through the coordinator).
                    bound = "DEFAULT" if k == 1 else "IN (-1)"
                    conn.execute(f"CREATE FOREIGN TABLE sh_{layout}_{k} PARTITION OF sh_{layout} "
                                 f"{'DEFAULT' if k == 1 else 'FOR VALUES ' + bound} SERVER bench_shard{k} "
                                 f"OPTIONS (table_name '{layout}')")
                # The same rows on one server, in the same storage order as the shards together.
                conn.execute(f"CREATE TABLE one_{layout} AS SELECT * FROM sh_{layout} ORDER BY label, id")
                conn.execute(f"VACUUM ANALYZE one_{layout}")
                configs = [("one server", f"one_{layout}", {}),
                           ("2 shards, sync auto (64, the default)", f"sh_{layout}", {}),
                           ("2 shards, sync 1", f"sh_{layout}", {"sync": 1}),
                           ("2 shards, sync 8", f"sh_{layout}", {"sync": 8})]
                for r in range(args.rounds):
                    for name, table, extra in configs[r % 4:] + configs[: r % 4]:
                        notices.clear()
                        p = {"epochs": args.epochs, "seed": 1, "verbose": True, **extra}
                        m = conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (table, Jsonb(p))).fetchone()[0]
                        secs = [x[0] for x in conn.execute(
                            "SELECT seconds FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (m,))]
                        acc = conn.execute(
                            f"SELECT (corgipile_evaluate({m}, 'one_{layout}')->>'accuracy')::float8").fetchone()[0]
                        sent = [int(x) for n in notices for x in re.findall(r"(\d+) bytes to and from", n)]
                        entry = results.setdefault((layout, name), ([], [], []))
                        entry[0].extend(secs)
                        entry[1].append(acc)
                        entry[2].extend(sent)
            server = conn.execute("SHOW server_version").fetchone()[0]
            installed = records.server(conn)
    finally:
        for p in ports:
            cluster(p, "destroy")
    out = [
        f"{args.rows:,} rows x {args.features} float8 features, svm, {args.epochs} epochs, defaults; two shard "
        f"servers and the coordinator on this {os.cpu_count()}-core machine (PostgreSQL {server}); {args.rounds} rounds, "
        "configurations rotated. Accuracy: `corgipile_evaluate` on the one-server copy of all rows. Bytes: "
        "requests and replies between the coordinator and the shards (JSON text), per epoch.",
        "",
        "| rows on the shards | configuration | epoch median s | range s | ÷ one server | accuracy (median) | Δ points | bytes per epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for layout, what in (("by_hash", "split by id parity (same label mix)"), ("by_label", "one class per shard")):
        one = statistics.median(results[(layout, "one server")][0])
        one_acc = statistics.median(results[(layout, "one server")][1])
        for name in ("one server", "2 shards, sync auto (64, the default)", "2 shards, sync 1", "2 shards, sync 8"):
            secs, accs, sent = results[(layout, name)]
            m = statistics.median(secs)
            a = statistics.median(accs)
            b = f"{statistics.median(sent):,.0f}" if sent else "0"
            out.append(f"| {what} | {name} | {m:.3f} | {min(secs):.3f}–{max(secs):.3f} | {m / one:.2f} | {a:.4f} | "
                       f"{100 * (a - one_acc):+.2f} | {b} |")
    text = "\n".join(out) + "\n"
    print(text)
    provenance.write(args.out, text, "bench-shards", DB)
    figures = {}
    for layout in ("by_hash", "by_label"):
        one = statistics.median(results[(layout, "one server")][0])
        one_acc = statistics.median(results[(layout, "one server")][1])
        figures[layout] = {name: {**records.median_range(secs), "div_one_server": statistics.median(secs) / one,
                                  "accuracy": statistics.median(accs),
                                  "accuracy_delta_points": 100 * (statistics.median(accs) - one_acc),
                                  "bytes_per_epoch": statistics.median(sent) if sent else 0}
                           for (lay, name), (secs, accs, sent) in results.items() if lay == layout}
    records.append_record("shard_epochs", figures, make_target="bench-shards", results_file=args.out,
                          config={"rows": args.rows, "features": args.features, "epochs": args.epochs,
                                  "rounds": args.rounds}, **installed)


if __name__ == "__main__":
    main()
