#!/usr/bin/env python3
"""Incremental training (`"since"`) next to full retraining on a table that grows by 10% a day
for 10 days, retrained every night: accuracy on the next day's rows, and the share of the table
each retraining reads, for several `replay` fractions (how the default was chosen).

Usage: bench/incremental.py [--rows 200000] [--days 10] [--epochs 5] [--out FILE]

The rows: 8 numeric features and a 5-category column; the label is a noisy linear function of
them. Two scenarios (see `rows_sql`): a slow drift, and days whose rows are 90% one class.
Day 0 is `--rows` rows; each day adds 10% of the table's size, appended. Every night: a full
retraining from zeros on the whole table, and for each replay fraction a training `since` that
variant's model of the night before (warm-started from it). Each model is scored on 20,000 rows
of the next day's distribution. Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile
installed (make bench-incremental does it)."""

import argparse
import statistics
import time

import psycopg
from psycopg.types.json import Jsonb

import provenance
import records

REPLAYS = [0.0, 0.1, 0.2]
SCENARIOS = ["drift", "one class a day"]
TEST_ROWS = 20_000


def rows_sql(table, day, first_id, n, seed, scenario, test=False):
    """INSERT of n rows of day `day`'s distribution under `scenario` ("drift": feature means and
    the label's boundary move a little every day, so old rows mislead; "one class a day": no
    drift, but 90% of each day's rows have one label, alternating, so the new rows alone
    mislead; its test rows are the plain distribution)."""
    drift = 0.04 * day if scenario == "drift" else 0.0
    feats = ", ".join(f"(random() * 2 - 1 + {drift} * {(-1) ** j})::float8 AS x{j}" for j in range(1, 9))
    skewed = scenario != "drift" and not test and day > 0
    keep = f"WHERE label = {day % 2} OR random() < 0.1" if skewed else ""
    return f"""INSERT INTO {table}
        SELECT * FROM (
          SELECT id, x1, x2, x3, x4, x5, x6, x7, x8, cat,
                 (0.9 * x1 - 0.7 * x2 + 0.5 * x3 + 0.4 * x4 - 0.3 * x5 + 0.2 * x6 + 0.1 * x7 - 0.1 * x8
                  + (ARRAY[0.6, -0.4, 0.2, -0.1, 0.0])[1 + (ascii(cat) - 97)] - {drift}
                  + 0.3 * (random() * 2 - 1) > 0)::int AS label
          FROM (SELECT setseed({(seed % 1000) / 1000.0}) ) s,
               LATERAL (SELECT g AS id, {feats}, chr(97 + floor(random() * 5)::int) AS cat
                        FROM generate_series({first_id}, {first_id + 3 * n - 1}) g) r) labelled
        {keep} LIMIT {n}"""


def create(conn, table):
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    cols = ", ".join(f"x{j} float8" for j in range(1, 9))
    conn.execute(f"CREATE TABLE {table} (id bigint, {cols}, cat text, label int)")


def nights(conn, scenario, table, test, base, args):
    """Day 0's training, then every night a full retraining and one `since` training per
    replay fraction; each day's accuracies and shares read."""
    create(conn, table)
    conn.execute(rows_sql(table, 0, 1, args.rows, 1, scenario))
    conn.execute(f"VACUUM ANALYZE {table}")
    names = {r: f"bench_inc_{int(r * 100)}" for r in REPLAYS}
    conn.execute("DELETE FROM corgipile.models WHERE name LIKE 'bench_inc_%'")
    for r in REPLAYS:
        conn.execute("SELECT corgipile_train(%s, 'logistic', %s)", (table, Jsonb(dict(base, name=names[r]))))
    rows = []
    next_id = args.rows + 1
    for day in range(1, args.days + 1):
        total = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        add = total // 10
        conn.execute(rows_sql(table, day, next_id, add, 100 + day, scenario))
        next_id += 3 * add
        create(conn, test)
        conn.execute(rows_sql(test, day + 1, 1, TEST_ROWS, 5000 + day, scenario, test=True))
        total += add
        started = time.perf_counter()
        full = conn.execute("SELECT corgipile_train(%s, 'logistic', %s)", (table, Jsonb(base))).fetchone()[0]
        row = {"day": day, "rows": total, "full": accuracy(conn, full, test),
               "seconds": {"full": time.perf_counter() - started}}
        for r in REPLAYS:
            p = dict(base, since=names[r], replay=r)
            del p["features"]
            started = time.perf_counter()
            m = conn.execute("SELECT corgipile_train(%s, 'logistic', %s)", (table, Jsonb(p))).fetchone()[0]
            row["seconds"][r] = time.perf_counter() - started
            trained, skipped = conn.execute("SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = %s",
                                            (m,)).fetchone()
            assert skipped == 0
            row[r] = (accuracy(conn, m, test), trained / total)
        rows.append(row)
        print(scenario, row, flush=True)
    return rows


def accuracy(conn, model, test):
    return conn.execute("SELECT (corgipile_evaluate(%s, %s)->>'accuracy')::float8", (model, test)).fetchone()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--out", default="bench/results/incremental.md")
    args = ap.parse_args()
    table, test = "bench_incremental", "bench_incremental_test"
    features = [f"x{j}" for j in range(1, 9)] + ["cat"]
    base = {"features": features, "epochs": args.epochs, "seed": 7, "verbose": False}
    results = {}
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        conn.execute("ALTER EXTENSION corgipile UPDATE")
        conn.execute("SET max_parallel_workers_per_gather = 0")
        for scenario in SCENARIOS:
            results[scenario] = nights(conn, scenario, table, test, base, args)
        server = conn.execute("SHOW server_version").fetchone()[0]
        origin = provenance.line(conn, "bench-incremental")
        installed = records.server(conn)
    lines = [
        origin, "",
        f"Table `{table}`: {args.rows:,} rows on day 0 (8 float8 features, a 5-category text column), growing by "
        f"10% a day for {args.days} days; logistic, {args.epochs} epochs, default params otherwise; every model scored "
        f"on {TEST_ROWS:,} rows of the next day's distribution. Full = a retraining from zeros on the whole table; "
        f"since = a training `since` the night before's model (warm-started from it) reading the pages added since "
        f"and a `replay` sample of the older blocks. Read = rows trained ÷ the table's rows. Two scenarios: "
        f"*drift* (feature means and the label's boundary move a little every day: old rows mislead) and *one "
        f"class a day* (no drift, but 90% of each day's rows have one label, alternating: new rows alone mislead). "
        f"PostgreSQL {server}.",
    ]
    for scenario, rows in results.items():
        lines += ["", f"**{scenario}**", "",
                  "| day | rows | full: accuracy | " + " | ".join(f"since, replay {r}: accuracy (Δ points), read" for r in REPLAYS) + " |",
                  "|---|---|---|" + "---|" * len(REPLAYS)]
        for row in rows:
            cells = [f"{row[r][0]:.4f} ({(row[r][0] - row['full']) * 100:+.2f}), {row[r][1] * 100:.0f}%" for r in REPLAYS]
            lines.append(f"| {row['day']} | {row['rows']:,} | {row['full']:.4f} | " + " | ".join(cells) + " |")
    lines += ["", "| replay | scenario | worst Δ vs full (points) | median Δ | largest share read | target: within 1 point, ≤ 25% read |",
              "|---|---|---|---|---|---|"]
    for r in REPLAYS:
        for scenario, rows in results.items():
            deltas = [(row[r][0] - row["full"]) * 100 for row in rows]
            reads = [row[r][1] for row in rows]
            ok = min(deltas) >= -1.0 and max(reads) <= 0.25
            lines.append(f"| {r} | {scenario} | {min(deltas):+.2f} | {statistics.median(deltas):+.2f} | "
                         f"{max(reads) * 100:.0f}% | {'PASS' if ok else 'FAIL'} |")
    lines += ["", "Training time (median over the days and scenarios; the full retraining is from zeros on the "
              "whole table, 5 epochs and a statistics pass; a `since` training reuses the stored preprocessing, "
              "so it has no statistics pass):", "",
              "| training | median s | ÷ full retraining |", "|---|---|---|"]
    every = [row for rows in results.values() for row in rows]
    full = statistics.median(row["seconds"]["full"] for row in every)
    lines.append(f"| full retraining | {full:.3f} | 1.00 |")
    for r in REPLAYS:
        t = statistics.median(row["seconds"][r] for row in every)
        lines.append(f"| since, replay {r} | {t:.3f} | {t / full:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    figures = {}
    for r in REPLAYS:
        for scenario, rows in results.items():
            deltas = [(row[r][0] - row["full"]) * 100 for row in rows]
            reads = [row[r][1] for row in rows]
            figures[f"replay {r} / {scenario}"] = {
                "worst_delta_points": min(deltas), "median_delta_points": statistics.median(deltas),
                "largest_share_read": max(reads),
                "target": "PASS" if min(deltas) >= -1.0 and max(reads) <= 0.25 else "FAIL"}
    figures["full_retraining_s"] = full
    figures["since_div_full"] = {f"replay {r}": statistics.median(row["seconds"][r] for row in every) / full
                                 for r in REPLAYS}
    records.append_record("incremental", figures, make_target="bench-incremental", results_file=args.out,
                          config={"rows": args.rows, "days": args.days, "epochs": args.epochs}, **installed)


if __name__ == "__main__":
    main()
