#!/usr/bin/env python3
"""An epoch of a training with a "where" filter next to `SELECT sum(features[1]) FROM t WHERE
<the same filter>`, at 10% and 90% selectivity, measured side by side in one run.

Usage: bench/where_epochs.py [--rows 4500000] [--features 18] [--epochs 3] [--rounds 3] [--out FILE]

The table is bench-epochs' (label-clustered, float8[] features; made if missing). The filters
select rows by `id`, spread evenly over every page: `id % 10 = 0` (10%) and `id % 10 <> 0`
(90%), so every page is read either way and the filter's cost is what differs. Each round
trains once per filter (and once without), each next to its floor measured just before. An
epoch's cost is the whole training's wall time divided by its epochs (`"normalize": false`, so
there is no statistics pass; double buffering overlaps one epoch's reading with the last one's
training, which makes the per-epoch times in corgipile.epochs uneven); medians over rounds. Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed
(make bench-where does it)."""

import statistics
import time

import psycopg
from psycopg.types.json import Jsonb

import provenance
import records
from epoch_times import prepare, table_args, timed

FILTERS = [("10%", "id % 10 = 0"), ("90%", "id % 10 <> 0"), ("100% (no filter)", None)]


def main():
    args = table_args(__doc__.splitlines()[0], 3, "bench/results/where_epochs.md")
    with psycopg.connect(autocommit=True) as conn:
        table, size = prepare(conn, args)
        timed(conn, f"SELECT count(*) FROM {table}", 1)  # warm the cache
        floors = {name: [] for name, _ in FILTERS}
        epochs = {name: [] for name, _ in FILTERS}
        rows = {}
        for _ in range(args.rounds):
            for name, where in FILTERS:
                clause = f" WHERE {where}" if where else ""
                floors[name] += timed(conn, f"SELECT sum(features[1]) FROM {table}{clause}", 2)
                p = {"epochs": args.epochs, "seed": 1, "verbose": False, "normalize": False,
                     **({"where": where} if where else {})}
                started = time.perf_counter()
                model_id = conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (table, Jsonb(p))).fetchone()[0]
                epochs[name].append((time.perf_counter() - started) / args.epochs)
                rows[name] = conn.execute("SELECT rows_trained FROM corgipile.models WHERE id = %s",
                                          (model_id,)).fetchone()[0]
                conn.execute("SELECT corgipile_drop_model(%s)", (model_id,))
        server = conn.execute("SHOW server_version").fetchone()[0]
        origin = provenance.line(conn, "bench-where")
        installed = records.server(conn)
    lines = [
        origin,
        "",
        f"Table `{table}`: {args.rows:,} rows x {args.features} float8 features, {size}, clustered by label; "
        f"svm, CorgiPile, double buffered, `normalize` off, {args.epochs} epochs x {args.rounds} interleaved rounds; "
        f"epoch = a training's wall time ÷ its epochs; the floor twice before each training; medians (ranges) over rounds; "
        f"PostgreSQL {server}, parallel workers off.",
        "",
        "| rows selected | filter | rows trained | floor `SELECT sum(features[1]) ... WHERE` median s (range) "
        "| epoch median s (range) | epoch ÷ floor | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, where in FILTERS:
        f, e = floors[name], epochs[name]
        ratio = statistics.median(e) / statistics.median(f)
        target = ("≤ 1.30: " + ("PASS" if ratio <= 1.3 else "FAIL")) if where else ""
        lines.append(
            f"| {name} | `{where or ''}` | {rows[name]:,} | {statistics.median(f):.3f} ({min(f):.3f}–{max(f):.3f}) "
            f"| {statistics.median(e):.3f} ({min(e):.3f}–{max(e):.3f}) | {ratio:.2f} | {target} |")
    provenance.write_report(lines, args.out)
    records.append_record("where_epochs", {
        name: {"rows_trained": rows[name], "floor_s": records.median_range(floors[name]),
               "epoch_s": records.median_range(epochs[name]),
               "epoch_div_floor": statistics.median(epochs[name]) / statistics.median(floors[name]),
               **({"target": "PASS" if statistics.median(epochs[name]) / statistics.median(floors[name]) <= 1.3 else "FAIL"}
                  if where else {})}
        for name, where in FILTERS
    }, make_target="bench-where", results_file=args.out,
        config={"rows": args.rows, "features": args.features, "epochs": args.epochs, "rounds": args.rounds}, **installed)


if __name__ == "__main__":
    main()
