#!/usr/bin/env python3
"""What corgipile_drift costs next to an epoch, and how much its distances spread over samples.

Tables: bench-epochs' table (bench/epoch_times.py make_table: --rows rows, 4,500,000, of an
18-element float8[] and a label, stored clustered by label) and a column copy of it (f1..f18
float8 columns, the same rows). Arms, interleaved over --rounds rounds:
  epoch, array       one epoch of logistic on the array table (default params, seed = round)
  drift, array       corgipile_drift of that model on the array table (default "rows": 50,000)
  epoch, columns     one epoch of logistic on the 18 columns (its statistics pass stores the
                     drift profile: deciles of every column)
  drift, columns     corgipile_drift of that model on the column table (PSI of each column)
Figures: seconds of each call (wall clock, the client's), drift / epoch per table (the epoch
arm's corgipile.epochs.seconds, reading included, and its statistics pass's seconds beside);
the spread of the PSI of the 18 columns over --seeds samples of 50,000 rows of the training
table itself (no drift: what a sample alone gives): median and largest over seeds and columns.

Usage: bench/drift_cost.py [--rows 4500000] [--rounds 3] [--seeds 10] [--out bench/results/drift_cost.md]
Writes the results file and one record (bench/results/runs/drift_cost.jsonl)."""
import argparse
import os
import statistics
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402
import records  # noqa: E402
from epoch_times import make_table  # noqa: E402

DBNAME = "corgipile_bench_drift"
FEATURES = 18


def log(msg):
    print(f"[drift-cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def setup(rows):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            admin.execute(f"CREATE DATABASE {DBNAME}")
    conn = psycopg.connect(dbname=DBNAME, autocommit=True)
    conn.execute("DROP EXTENSION IF EXISTS corgipile CASCADE")
    conn.execute("CREATE EXTENSION corgipile")
    start = time.time()
    make_table(conn, "t", rows, FEATURES)
    if not conn.execute("SELECT to_regclass('tc') IS NOT NULL").fetchone()[0] or \
            conn.execute("SELECT count(*) FROM tc").fetchone()[0] != rows:
        conn.execute("DROP TABLE IF EXISTS tc")
        cols = ", ".join(f"features[{k}] AS f{k}" for k in range(1, FEATURES + 1))
        conn.execute(f"CREATE TABLE tc AS SELECT id, label, {cols} FROM t ORDER BY id")
        conn.execute("VACUUM ANALYZE tc")
    log(f"tables of {rows} rows ready in {time.time() - start:.0f} s")
    return conn


def timed(conn, sql, params):
    start = time.perf_counter()
    out = conn.execute(sql, params).fetchall()
    return time.perf_counter() - start, out


def train(conn, table, seed):
    features = "features" if table == "t" else [f"f{k}" for k in range(1, FEATURES + 1)]
    params = {"label": "label", "features": features, "epochs": 1, "seed": seed, "verbose": False}
    wall, out = timed(conn, "SELECT corgipile_train(%s, 'logistic', %s)", (table, Jsonb(params)))
    m = out[0][0]
    epoch, stats = conn.execute("SELECT e.seconds, (m.metrics->>'statistics_seconds')::float8 "
                                "FROM corgipile.epochs e JOIN corgipile.models m ON m.id = e.model_id "
                                "WHERE m.id = %s", (m,)).fetchone()
    return m, epoch, stats or 0.0, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "drift_cost.md"))
    args = ap.parse_args()
    conn = setup(args.rows)
    res = {k: [] for k in ("epoch_t", "stats_t", "drift_t", "epoch_tc", "stats_tc", "drift_tc")}
    models = {}
    for r in range(1, args.rounds + 1):
        for table in ("t", "tc"):
            m, epoch, stats, _ = train(conn, table, r)
            drift_s, rows = timed(conn, "SELECT * FROM corgipile_drift(%s::bigint, %s::regclass)", (m, table))
            res[f"epoch_{table}"].append(epoch)
            res[f"stats_{table}"].append(stats)
            res[f"drift_{table}"].append(drift_s)
            log(f"round {r} {table}: epoch {epoch:.2f} s (statistics pass {stats:.2f} s), drift {drift_s:.3f} s, "
                f"{len(rows)} rows, all pass: {all(x[6] is not False for x in rows)}")
            if r < args.rounds:
                conn.execute("SELECT corgipile_drop_model(%s)", (m,))
            else:
                models[table] = m
    psis = []
    for seed in range(1, args.seeds + 1):
        rows = conn.execute("SELECT distance FROM corgipile_drift(%s::bigint, 'tc', %s) WHERE role = 'feature'",
                            (models["tc"], Jsonb({"seed": seed}))).fetchall()
        psis.append([x[0] for x in rows])
    flat = [p for ps in psis for p in ps]
    log(f"PSI over {args.seeds} seeds x {FEATURES} columns: median {statistics.median(flat):.5f}, max {max(flat):.5f}")

    def mr(xs):
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"
    lines = [
        "# What corgipile_drift costs next to an epoch (`make bench-drift`)",
        "",
        f"Generated by `bench/drift_cost.py` (see its docstring): {args.rows:,} rows, 18 features stored clustered by "
        f"label, as an array (`t`) and as 18 float8 columns (`tc`); {args.rounds} rounds; medians (min–max) over rounds. "
        "corgipile_drift reads its default sample (`\"rows\"`: 50,000) through the block shuffle.",
        "",
        "| table | epoch s | statistics pass s | corgipile_drift s | drift / epoch |",
        "|---|---|---|---|---|",
    ]
    figures = {}
    for table, label in (("t", "array (mean shift)"), ("tc", "18 columns (PSI)")):
        e, s, d = res[f"epoch_{table}"], res[f"stats_{table}"], res[f"drift_{table}"]
        ratio = [di / ei for di, ei in zip(d, e)]
        lines.append(f"| {label} | {mr(e)} | {mr(s)} | {mr(d)} | {mr(ratio)} |")
        figures[f"{table}_epoch_seconds"] = records.median_range(e)
        figures[f"{table}_statistics_seconds"] = records.median_range(s)
        figures[f"{table}_drift_seconds"] = records.median_range(d)
        figures[f"{table}_drift_per_epoch"] = records.median_range(ratio)
    figures["psi_no_drift_median"] = statistics.median(flat)
    figures["psi_no_drift_max"] = max(flat)
    lines += ["", f"PSI of each of the 18 columns of `tc` against the model trained on `tc` itself, over "
              f"{args.seeds} seeds of the default 50,000-row sample: median {statistics.median(flat):.5f}, "
              f"largest {max(flat):.5f} (the default threshold is 0.25)."]
    text = "\n".join(lines) + "\n"
    print(text)
    provenance.write(args.out, text, "bench-drift", dbname=DBNAME)
    records.append_record("drift_cost", figures, conn=conn, results_file=args.out, make_target="bench-drift",
                          config={"rows": args.rows, "rounds": args.rounds, "seeds": args.seeds})


if __name__ == "__main__":
    main()
