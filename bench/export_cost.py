#!/usr/bin/env python3
"""What an export costs: the size and time of corgipile_export_sql and corgipile_export_onnx for
models of every family.

The table (generated in SQL, setseed 0.5): --rows rows of 10 float8 columns n1..n10 (uniform in
[0, k)), two text columns c1 (20 categories) and c2 (50 categories), and a boolean label; the
models (seed 1, 2 epochs, column list n1..n10, c1, c2): logistic, softmax of c1's first letter
class, fm, mlp (hidden [64], numbers piecewise-linear: a network's default) and mlp [256, 256].
Each export runs --repeat times (after one untimed call); the figures are the median seconds of
a call (client side: the text or bytes travel to the client) and the size in bytes.

Usage: bench/export_cost.py [--rows 100000] [--repeat 5] [--out bench/results/export_cost.md]
Writes the results file and one record (bench/results/runs/export_cost.jsonl)."""
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

DBNAME = "corgipile_bench_export"
FEATURES = [f"n{k}" for k in range(1, 11)] + ["c1", "c2"]
MODELS = [
    ("logistic", "logistic", {}),
    ("fm", "fm", {}),
    ("mlp [64]", "mlp", {}),
    ("mlp [256, 256]", "mlp", {"hidden": [256, 256]}),
]


def log(msg):
    print(f"[export-cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def setup(rows):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DBNAME}")
    conn = psycopg.connect(dbname=DBNAME, autocommit=True)
    conn.execute("CREATE EXTENSION corgipile")
    conn.execute("SELECT setseed(0.5)")
    numbers = ", ".join(f"(random() * {k})::float8 AS n{k}" for k in range(1, 11))
    conn.execute(f"""CREATE TABLE t AS SELECT i AS id, {numbers},
                            'c' || (i % 20) AS c1, 'k' || ((i * 7) % 50) AS c2
                     FROM generate_series(1, {rows}) i""")
    conn.execute("ALTER TABLE t ADD COLUMN y boolean")
    conn.execute("UPDATE t SET y = n1 + n2 / 2 + (c1 IN ('c1', 'c3', 'c5'))::int > 1.5")
    conn.execute("VACUUM ANALYZE t")
    return conn


def timed(conn, sql, args, repeat):
    conn.execute(sql, args).fetchone()  # untimed: the model loads into the session's cache
    times, size = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        value = conn.execute(sql, args).fetchone()[0]
        times.append(time.perf_counter() - started)
        size = len(value)
    return statistics.median(times), size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench/results/export_cost.md")
    args = ap.parse_args()
    started = time.time()
    conn = setup(args.rows)
    results = {}
    for label, kind, extra in MODELS:
        params = {"features": FEATURES, "label": "y", "epochs": 2, "seed": 1, "verbose": False, **extra}
        model = conn.execute("SELECT corgipile_train('t', %s, %s)", (kind, Jsonb(params))).fetchone()[0]
        n_params = conn.execute("SELECT n_features FROM corgipile.models WHERE id = %s", (model,)).fetchone()[0]
        sql_s, sql_bytes = timed(conn, "SELECT corgipile_export_sql(%s::bigint, 'score')", (model,), args.repeat)
        onnx_s, onnx_bytes = timed(conn, "SELECT corgipile_export_onnx(%s::bigint)", (model,), args.repeat)
        results[label] = {"features": n_params, "sql_seconds": sql_s, "sql_bytes": sql_bytes,
                          "onnx_seconds": onnx_s, "onnx_bytes": onnx_bytes}
        log(f"{label}: sql {sql_bytes} B in {sql_s * 1000:.1f} ms, onnx {onnx_bytes} B in {onnx_s * 1000:.1f} ms")
    lines = ["# What an export costs", "",
             f"{args.rows:,} rows of 10 numbers and 2 text columns (20 and 50 categories); each model "
             f"trained 2 epochs on the column list; median of {args.repeat} calls after one untimed "
             "call, client side (the text or bytes travel to the client).", "",
             "| model | encoded features | corgipile_export_sql bytes | ms | corgipile_export_onnx bytes | ms |",
             "|---|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['features']} | {r['sql_bytes']:,} | {r['sql_seconds'] * 1000:.1f} | "
                     f"{r['onnx_bytes']:,} | {r['onnx_seconds'] * 1000:.1f} |")
    lines += ["", f"Run time: {(time.time() - started) / 60:.1f} min."]
    provenance.write(args.out, "\n".join(lines) + "\n", "bench-export", DBNAME)
    records.append_record("export_cost", {"models": results}, make_target="bench-export", results_file=args.out,
                          config={"rows": args.rows, "repeat": args.repeat}, conn=conn)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
