#!/usr/bin/env python3
"""What training on a query costs next to training on a table: `corgipile_train_query` over a
join (its rows spilled through the pile shuffle into a temporary table, then trained) against
the same join materialized once (`CREATE TABLE AS`) and trained, and against running the query
alone, side by side in one run.

Usage: bench/spill_cost.py [--customers 500000] [--orders 3] [--epochs 3] [--rounds 3] [--out FILE]

Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-spill does it)."""

import argparse
import statistics
import time

import psycopg
from psycopg.types.json import Jsonb

import provenance
import records

JOIN = """SELECT c.age, c.plan, o.total, o.items, c.churned
          FROM bench_spill_customers c JOIN bench_spill_orders o USING (customer_id)"""


def timed(conn, sql, params=None):
    started = time.perf_counter()
    conn.execute(sql, params)
    return time.perf_counter() - started


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--customers", type=int, default=500_000)
    ap.add_argument("--orders", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/spill_cost.md")
    args = ap.parse_args()
    params = {"features": ["age", "plan", "total", "items"], "label": "churned", "epochs": args.epochs,
              "seed": 1, "verbose": False}
    runs = {"query alone: SELECT count(*) FROM (join)": [], "CREATE TABLE AS join": [],
            "corgipile_train on the table made": [], "corgipile_train_query(join)": []}
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        conn.execute("ALTER EXTENSION corgipile UPDATE")
        conn.execute("SET max_parallel_workers_per_gather = 0")
        conn.execute("DROP TABLE IF EXISTS bench_spill_customers, bench_spill_orders, bench_spill_join")
        conn.execute(f"""CREATE TABLE bench_spill_customers AS
            SELECT i AS customer_id, 18 + (i * 7) % 60 AS age, (ARRAY['basic', 'plus', 'pro'])[1 + i % 3] AS plan,
                   ((i * 7) % 60 + (i % 3) * 10 > 45)::int AS churned
            FROM generate_series(1, {args.customers}) i ORDER BY 4""")
        conn.execute(f"""CREATE TABLE bench_spill_orders AS
            SELECT c.customer_id, (c.customer_id * 13 + k * 7) % 500 AS total, 1 + (c.customer_id + k) % 9 AS items
            FROM bench_spill_customers c, generate_series(1, {args.orders}) k""")
        conn.execute("VACUUM ANALYZE bench_spill_customers, bench_spill_orders")
        rows = conn.execute(f"SELECT count(*) FROM ({JOIN}) j").fetchone()[0]
        for _ in range(args.rounds):
            runs["query alone: SELECT count(*) FROM (join)"].append(timed(conn, f"SELECT count(*) FROM ({JOIN}) j"))
            conn.execute("DROP TABLE IF EXISTS bench_spill_join")
            runs["CREATE TABLE AS join"].append(timed(conn, f"CREATE TABLE bench_spill_join AS {JOIN}"))
            conn.execute("VACUUM ANALYZE bench_spill_join")
            runs["corgipile_train on the table made"].append(
                timed(conn, "SELECT corgipile_train('bench_spill_join', 'logistic', %s)", (Jsonb(params),)))
            runs["corgipile_train_query(join)"].append(
                timed(conn, "SELECT corgipile_train_query(%s, 'logistic', %s)", (JOIN, Jsonb(params))))
        size = conn.execute("SELECT pg_size_pretty(pg_table_size('bench_spill_join'))").fetchone()[0]
        server = conn.execute("SHOW server_version").fetchone()[0]
        origin = provenance.line(conn, "bench-spill")
        installed = records.server(conn)
    med = {k: statistics.median(v) for k, v in runs.items()}
    table_path = med["CREATE TABLE AS join"] + med["corgipile_train on the table made"]
    lines = [
        origin, "",
        f"A join of {args.customers:,} customers (stored clustered by label) and {args.orders} orders each: {rows:,} rows "
        f"({size} as a table); logistic on 4 columns (2 numbers, a category, an integer), {args.epochs} epochs, "
        f"{args.rounds} interleaved rounds, medians (ranges); PostgreSQL {server}, parallel workers off.", "",
        "| what | median s | range s |", "|---|---|---|",
    ]
    for k, v in runs.items():
        lines.append(f"| {k} | {med[k]:.3f} | {min(v):.3f}–{max(v):.3f} |")
    lines += ["",
              f"Training on the query costs {med['corgipile_train_query(join)'] / med['corgipile_train on the table made']:.2f}× "
              f"training on the table already made, and {med['corgipile_train_query(join)'] / table_path:.2f}× making the "
              f"table (CREATE TABLE AS) and training on it; the spill itself (training on the query minus training on "
              f"the table) is {med['corgipile_train_query(join)'] - med['corgipile_train on the table made']:.3f} s, "
              f"{(med['corgipile_train_query(join)'] - med['corgipile_train on the table made']) / med['query alone: SELECT count(*) FROM (join)']:.2f}× "
              f"running the query alone."]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    query, on_table = med["corgipile_train_query(join)"], med["corgipile_train on the table made"]
    records.append_record("spill_cost", {
        "steps_s": {k: records.median_range(v) for k, v in runs.items()},
        "rows": rows,
        "query_div_table": query / on_table,
        "query_div_create_and_train": query / table_path,
        "spill_s": query - on_table,
        "spill_div_query_alone": (query - on_table) / med["query alone: SELECT count(*) FROM (join)"],
    }, make_target="bench-spill", results_file=args.out,
        config={"customers": args.customers, "orders": args.orders, "epochs": args.epochs, "rounds": args.rounds},
        **installed)


if __name__ == "__main__":
    main()
