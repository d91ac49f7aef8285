#!/usr/bin/env python3
"""Predicting from a whole row against a plain scan that touches the same columns.

A table of --rows rows with 20 feature columns (8 float8, 4 int, 2 numeric, 2 boolean, 4 text of
3 to 500 categories, 5% NULLs) and a boolean label; a logistic model trained on all 20 columns.
Timed, side by side in every round (rotated order, --rounds rounds, medians and ranges):

  floor:    SELECT sum(num_nonnulls(c1, ..., c20)) FROM t        -- deforms the same 20 columns
  wholerow: SELECT sum(num_nonnulls(t.*)) FROM t t               -- also builds the row value
  predict:  SELECT sum(corgipile_predict(m, t)) FROM t t         -- what users write: the planner
            rewrites it into corgipile_predict_columns(m, '{c1,...}', t.c1, ...) (the model's
            columns only, matched by name, encoded)
  predict_row: SELECT sum(corgipile_predict(m, s)) FROM (SELECT * FROM t OFFSET 0) s
            -- the same prediction from the row value, which the planner cannot rewrite
            (the row of a subquery): the row form before the rewrite existed

without parallel workers (max_parallel_workers_per_gather = 0), so the ratios are per-row costs.

Reported: seconds per statement and predict / floor (the README's "predict from a row" ratio), of
the medians and of the minimums (steadier when other work shares the machine).

Usage: bench/predict_row.py [--rows 1000000] [--rounds 5] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-predict does it).
Uses (and creates) the database corgipile_bench_predict; the table is rebuilt when --rows changes."""

import argparse
import datetime
import json
import statistics
import time

import psycopg

import provenance
import records
from psycopg import sql

from cancel_latency import git_head, installed_library, machine

DBNAME = "corgipile_bench_predict"
NUMBERS = [f"x{i}" for i in range(1, 9)] + ["n1", "n2", "n3", "n4", "d1", "d2", "b1", "b2"]
TEXTS = ["t3", "t20", "t100", "t500"]
COLUMNS = NUMBERS + TEXTS


def connect(dbname=DBNAME):
    return psycopg.connect(dbname=dbname, autocommit=True)


def build(conn, rows):
    table = f"rows_{rows}"
    if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
        return table
    nul = "CASE WHEN random() < 0.05 THEN NULL ELSE {} END"
    parts = [nul.format(f"(random() * {10 ** (i % 6)})::float8") + f" AS x{i}" for i in range(1, 9)]
    parts += [nul.format(f"(random() * {10 ** i})::int") + f" AS n{i}" for i in range(1, 5)]
    parts += [nul.format("(random() * 1000)::numeric(10, 2)") + f" AS d{i}" for i in (1, 2)]
    parts += [nul.format("random() < 0.3") + f" AS b{i}" for i in (1, 2)]
    parts += [nul.format(f"'c' || floor(power(random(), 2) * {k})::int") + f" AS t{k}" for k in (3, 20, 100, 500)]
    conn.execute("SELECT setseed(0.25)")
    conn.execute(sql.SQL(
        "CREATE TABLE {} AS SELECT g AS id, {}, random() < 0.2 + 0.6 * (g %% 2) AS label "
        "FROM generate_series(1, %s) g").format(sql.Identifier(table), sql.SQL(", ".join(parts))), (rows,))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    return table


def timed(conn, query):
    start = time.perf_counter()
    conn.execute(query).fetchall()
    return time.perf_counter() - start


def figures(times):
    """The figures of the results file, from its raw numbers, for the run's record."""
    med = {k: statistics.median(v) for k, v in times.items()}
    return {k: {**records.median_range(v), "div_floor": med[k] / med["floor"],
                "min_div_floor_min": min(v) / min(times["floor"])} for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/predict_row.md")
    args = ap.parse_args()
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        table = build(conn, args.rows)
        model = conn.execute(
            "SELECT corgipile_train(%s, 'logistic', %s)",
            (table, json.dumps({"features": COLUMNS, "label": "label", "epochs": 1, "seed": 1,
                                "verbose": False}))).fetchone()[0]
        t = sql.Identifier(table)
        queries = {
            "floor": sql.SQL("SELECT sum(num_nonnulls({})) FROM {}").format(
                sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), t),
            "wholerow": sql.SQL("SELECT sum(num_nonnulls(t.*)) FROM {} t").format(t),
            "predict": sql.SQL("SELECT sum(corgipile_predict({}, t)) FROM {} t").format(sql.Literal(model), t),
            "predict_row": sql.SQL("SELECT sum(corgipile_predict({}, s)) FROM (SELECT * FROM {} OFFSET 0) s").format(
                sql.Literal(model), t),
        }
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN VERBOSE ") + queries["predict"]).fetchall())
        if "corgipile_predict_columns" not in plan:
            raise SystemExit(f"the predict statement was not rewritten:\n{plan}")
        # One process each: the ratio is per-row cost (all three run parallel alike otherwise).
        conn.execute("SET max_parallel_workers_per_gather = 0")
        for q in queries.values():  # warm the cache and the plan
            timed(conn, q)
        times = {k: [] for k in queries}
        names = list(queries)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(timed(conn, queries[k]))
        med = {k: statistics.median(v) for k, v in times.items()}
        lines = [
            f"# Predict from a row vs a plain scan ({args.rows:,} rows, 20 feature columns)",
            "",
            f"{datetime.date.today()}, commit {git_head()}, library {installed_library(conn)}, {machine()}; "
            f"{args.rounds} rounds, rotated order, no parallel workers; `python bench/predict_row.py --rows {args.rows}`.",
            "",
            "| statement | median s | min s | max s | ÷ floor | min ÷ floor's min |",
            "|---|---|---|---|---|---|",
        ]
        least = {k: min(v) for k, v in times.items()}
        for k in names:
            lines.append(f"| {k} | {med[k]:.3f} | {least[k]:.3f} | {max(times[k]):.3f} | "
                         f"{med[k] / med['floor']:.2f} | {least[k] / least['floor']:.2f} |")
        lines += ["", "÷ floor: medians. On a machine shared with other work the minimums are the steadier ratio."]
        text = "\n".join(lines) + "\n"
        print(text)
        provenance.write(args.out, text, "bench-predict", DBNAME)
        with open(args.out + ".json", "w") as f:
            json.dump({"rows": args.rows, "times": times}, f, indent=1)
        records.append_record("predict_row", figures(times), make_target="bench-predict", results_file=args.out,
                              config={"rows": args.rows, "rounds": args.rounds}, conn=conn)


if __name__ == "__main__":
    main()
