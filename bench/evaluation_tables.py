#!/usr/bin/env python3
"""What each evaluation function costs, side by side with a plain scan of the same table:
corgipile_evaluate, corgipile_confusion_matrix, corgipile_roc_curve and corgipile_calibration of
a logistic model (and corgipile_roc_curve of a softmax model of 10 classes: ten curves) on a
table of 8 features, each one scan.

Usage: bench/evaluation_tables.py [--rows 1000000] [--rounds 5] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-tables does it)."""

import argparse
import statistics
import time

import psycopg

import provenance
import records

DBNAME = "corgipile_bench_tables"


def build(conn, rows):
    table = f"tables_{rows}"
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
    if exists and conn.execute(f"SELECT count(*) = %s FROM {table}", (rows,)).fetchone()[0]:
        return table
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute("SELECT setseed(0.1)")
    x = ", ".join("random()" for _ in range(8))
    conn.execute(f"""CREATE TABLE {table} AS
                     SELECT i AS id, ARRAY[{x}] AS features, (random() < 0.5)::int AS label,
                            (i % 10) AS class10
                     FROM generate_series(1, {rows}) i""")
    conn.execute(f"VACUUM ANALYZE {table}")
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/evaluation_tables.md")
    args = ap.parse_args()
    with psycopg.connect(dbname="postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(f"CREATE DATABASE {DBNAME}")
    with psycopg.connect(dbname=DBNAME, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        t = build(conn, args.rows)
        train = "SELECT corgipile_train(%s, %s, %s::jsonb)"
        m = conn.execute(train, (t, "logistic", '{"epochs": 1, "seed": 1, "verbose": false}')).fetchone()[0]
        m10 = conn.execute(train, (t, "softmax", '{"epochs": 1, "seed": 1, "verbose": false, "label": "class10"}')).fetchone()[0]
        conn.execute("SET max_parallel_workers_per_gather = 0")
        queries = {
            "scan floor: SELECT sum(features[1])": f"SELECT sum(features[1]) FROM {t}",
            "corgipile_evaluate": f"SELECT corgipile_evaluate({m}, '{t}')",
            "corgipile_confusion_matrix": f"SELECT count(*) FROM corgipile_confusion_matrix({m}, '{t}')",
            "corgipile_roc_curve": f"SELECT count(*) FROM corgipile_roc_curve({m}, '{t}')",
            "corgipile_calibration": f"SELECT count(*) FROM corgipile_calibration({m}, '{t}')",
            "corgipile_evaluate, softmax of 10 classes": f"SELECT corgipile_evaluate({m10}, '{t}')",
            "corgipile_roc_curve, softmax of 10 classes": f"SELECT count(*) FROM corgipile_roc_curve({m10}, '{t}')",
            "corgipile_feature_importance (10,000-row sample, 8 columns × 5 repeats)":
                f"SELECT count(*) FROM corgipile_feature_importance({m}, '{t}')",
            "corgipile_predict of 10,000 rows": f"SELECT sum(corgipile_predict({m}, features)) FROM (SELECT * FROM {t} LIMIT 10000) s",
            "corgipile_explain_predict of 10,000 rows": f"SELECT count(*) FROM (SELECT * FROM {t} LIMIT 10000) s, corgipile_explain_predict({m}, s.features)",
        }
        for q in queries.values():  # warm the cache
            conn.execute(q).fetchall()
        times = {k: [] for k in queries}
        names = list(queries)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                started = time.perf_counter()
                conn.execute(queries[k]).fetchall()
                times[k].append(time.perf_counter() - started)
        med = {k: statistics.median(v) for k, v in times.items()}
        floor = med[names[0]]
        lines = [
            f"# Evaluation functions vs a plain scan ({args.rows:,} rows × 8 features)",
            "",
            f"{args.rounds} rounds, rotated order, no parallel workers. Each function is one scan of the table.",
            "",
            "| statement | median s | range s | ÷ scan floor | ÷ corgipile_evaluate of the same model |",
            "|---|---|---|---|---|",
        ]
        for k in names:
            if "predict of 10,000" in k:
                lines.append(f"| {k} | {med[k]:.3f} | {min(times[k]):.3f}–{max(times[k]):.3f} | – | "
                             f"{med[k] / med['corgipile_predict of 10,000 rows']:.2f} (÷ predict) |")
                continue
            base = med["corgipile_evaluate, softmax of 10 classes"] if "softmax" in k else med["corgipile_evaluate"]
            lines.append(f"| {k} | {med[k]:.3f} | {min(times[k]):.3f}–{max(times[k]):.3f} | "
                         f"{med[k] / floor:.2f} | {med[k] / base:.2f} |")
        text = "\n".join(lines) + "\n"
        print(text)
        provenance.write(args.out, text, "bench-tables", DBNAME)
        figures = {}
        for k in names:
            if "predict of 10,000" in k:
                figures[k] = {**records.median_range(times[k]),
                              "div_predict": med[k] / med["corgipile_predict of 10,000 rows"]}
            else:
                base = med["corgipile_evaluate, softmax of 10 classes"] if "softmax" in k else med["corgipile_evaluate"]
                figures[k] = {**records.median_range(times[k]), "div_floor": med[k] / floor, "div_evaluate": med[k] / base}
        records.append_record("evaluation_tables", figures, make_target="bench-tables", results_file=args.out,
                              config={"rows": args.rows, "rounds": args.rounds}, conn=conn)


if __name__ == "__main__":
    main()
